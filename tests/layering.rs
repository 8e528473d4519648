//! The engine's layers, checked on its source: engine code never holds the host's handle,
//! user-facing types never reach into an actor, plumbing names no actor, and vocabulary
//! names only vocabulary. A module a file names is any `crate::<module>` path in its code
//! (a `use` or an inline path; comments and unit tests left out); `super::` inside an
//! actor's own folder stays in that actor. The rules and why are in ARCHITECTURE.md
//! ("Crates and layers").
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::Path;

/// The host's side: its handle on a session, the engine, the mailbox inspector.
const HOST_SIDE: &[&str] = &[
    "session_handle",
    "host_session",
    "runtime",
    "inspector",
    "audio_input",
];
/// The actor modules: the session, an activity, a toolset, a tool run.
const ACTORS: &[&str] = &["session", "activity", "toolset", "tool_run"];
/// The host's handle.
const HOST: &str = "session_handle";
/// Types a user writes agents and tools with.
const USER_DEFINED: &[&str] = &[
    "agent",
    "tool",
    "run_context",
    "control",
    "speech",
    "handoff",
    "restore",
    "snapshot_store",
    "host_input",
    "turn_handling",
];
/// The engine's plumbing.
const PLUMBING: &[&str] = &[
    "mailbox",
    "lifecycle",
    "outcome",
    "shared",
    "call_ids",
    "llm_guard",
    "reentry",
    "memory",
    "idle_release",
    "delivery",
    "registry",
    "telemetry",
    "heartbeat",
    "realtime_link",
];
/// The words everything else is written in.
const VOCABULARY: &[&str] = &[
    "chat",
    "llm",
    "output",
    "ids",
    "events",
    "error",
    "error_policy",
    "prompts",
    "history",
    "starting_chat",
    "snapshot",
    "snapshot_chain",
    "input_ledger",
    "usage",
    "latency",
    "realtime",
];

/// The crate modules a source file names, other than itself.
fn named_modules(source: &str, own: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (at, _) in source.match_indices("crate::") {
        let rest = &source[at + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() && name != own {
            names.insert(name);
        }
    }
    // `use crate::{a::X, b::Y}`: the names inside the braces.
    for (at, _) in source.match_indices("use crate::{") {
        let rest = &source[at + "use crate::{".len()..];
        let Some(end) = rest.find("};") else { continue };
        for part in rest[..end].split(',') {
            let name: String = part
                .trim()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && name != own {
                names.insert(name);
            }
        }
    }
    names
}

/// Every source file of module `module` (its file and, for a folder module, its children)
/// with the modules it names, test code left out.
fn module_imports(module: &str) -> Vec<(String, BTreeSet<String>)> {
    let src = source_root();
    let mut files = vec![src.join(format!("{module}.rs"))];
    files.extend(rust_files(&src.join(module)));
    files
        .into_iter()
        .filter(|path| path.extension().is_some_and(|e| e == "rs"))
        .map(|path| {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            // Unit tests may build whatever they need, and doc links are not imports.
            let code: String = text
                .split("#[cfg(test)]")
                .next()
                .unwrap_or(&text)
                .lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            let shown = path
                .strip_prefix(&src)
                .unwrap_or(&path)
                .display()
                .to_string();
            (shown, named_modules(&code, module))
        })
        .collect()
}

fn source_root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("actors/src")
}

/// Every `.rs` file under `dir`, at any depth, in a stable order.
fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut paths: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
    paths.sort();
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// Checks that no file of the `modules` names anything in `forbidden`; lists every breach.
fn check(modules: &[&str], forbidden: impl Fn(&str, &str) -> bool, rule: &str) {
    let mut breaches = Vec::new();
    for module in modules {
        let files = module_imports(module);
        assert!(!files.is_empty(), "no source for module {module}");
        for (file, names) in files {
            for name in names {
                if forbidden(module, &name) {
                    breaches.push(format!("{file} names crate::{name}"));
                }
            }
        }
    }
    assert!(breaches.is_empty(), "{rule}:\n{}", breaches.join("\n"));
}

#[test]
fn no_actor_holds_the_host_handle() {
    check(
        ACTORS,
        |_, name| name == HOST,
        "an actor file names the host handle",
    );
}

#[test]
fn user_defined_types_name_no_actor_and_not_the_host_handle() {
    check(
        USER_DEFINED,
        |_, name| name == HOST || ACTORS.contains(&name),
        "a user-facing type names an actor or the host handle",
    );
}

#[test]
fn plumbing_names_no_actor() {
    check(
        PLUMBING,
        |_, name| name == HOST || ACTORS.contains(&name),
        "plumbing names an actor or the host handle",
    );
}

#[test]
fn vocabulary_names_only_vocabulary() {
    check(
        VOCABULARY,
        // The one exception: a `SpeechCreated` event hands subscribers the speech's handle.
        |module, name| !VOCABULARY.contains(&name) && (module != "events" || name != "speech"),
        "vocabulary names something above it",
    );
}

#[test]
fn every_source_file_of_the_engine_is_in_a_layer() {
    let src = source_root();
    let layers: Vec<&str> = HOST_SIDE
        .iter()
        .chain(ACTORS)
        .chain(USER_DEFINED)
        .chain(PLUMBING)
        .chain(VOCABULARY)
        .copied()
        .collect();
    let mut outside = Vec::new();
    for file in rust_files(&src) {
        let relative = file.strip_prefix(&src).unwrap();
        let top = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        if top != "lib" && !layers.contains(&top.as_str()) {
            outside.push(relative.display().to_string());
        }
    }
    assert!(
        outside.is_empty(),
        "files in no layer (add each to one in this test and in ARCHITECTURE.md):\n{}",
        outside.join("\n")
    );
}

#[test]
fn the_host_side_is_reached_by_nothing_below_it() {
    check(
        &ACTORS
            .iter()
            .chain(USER_DEFINED)
            .chain(PLUMBING)
            .chain(VOCABULARY)
            .copied()
            .collect::<Vec<_>>(),
        |_, name| HOST_SIDE.contains(&name),
        "a file below the host side names it",
    );
}

#[test]
fn the_checker_sees_inline_paths_and_braced_imports() {
    let source = "use crate::{chat::ChatItem, mailbox::Mailbox};\nfn f() { crate::session::x(); }";
    let names = named_modules(source, "tool");
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["chat", "mailbox", "session"]
    );
}
