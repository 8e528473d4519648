//! [`worker_python`]: the Python the LiveKit worker runs in, a private venv in the cargo
//! target directory into which pip installs the pinned `livekit-agents` (with
//! `python/constraints.txt` pinning everything it pulls in). The tests and the example use
//! it; a deployment installs the worker its own way (`docs/livekit.md`).
//!
//! The install runs at most once per target directory at a time: a file lock serialises
//! test binaries that start together, and a stamp file written last (holding the
//! constraints it installed) marks an install as complete, so one interrupted halfway, or
//! made from other constraints, is redone. A failure is an error naming every step tried:
//! nothing is skipped quietly.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The LiveKit Agents release the worker is written against.
pub const LIVEKIT_AGENTS: &str = "livekit-agents==1.8.9";

/// The pins of everything `livekit-agents` pulls in.
const CONSTRAINTS: &str = include_str!("../python/constraints.txt");

/// Why no worker Python could be had.
#[derive(Debug, thiserror::Error)]
#[error("cannot install the LiveKit worker's Python venv; tried:\n  {}", tried.join("\n  "))]
pub struct VenvError {
    /// Each step, and what it said.
    pub tried: Vec<String>,
}

/// The venv's interpreter and the worker package's directory.
#[derive(Debug, Clone)]
pub struct WorkerPython {
    /// The venv's `python`.
    pub python: PathBuf,
    /// `bridges/livekit/python`, which holds the `switchboard_livekit` package.
    pub package_dir: PathBuf,
}

impl WorkerPython {
    /// `python <args>` with the worker package importable and output unbuffered.
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.python);
        command
            .env("PYTHONPATH", &self.package_dir)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null());
        command
    }
}

/// The worker's Python, installing it into `<target>/livekit-worker/venv` first if needed
/// (about half a minute with a warm pip cache; `PYTHON` names the interpreter that makes
/// the venv, default `python3`, 3.10 or newer).
pub fn worker_python() -> Result<WorkerPython, VenvError> {
    let mut tried = Vec::new();
    let package_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("python");
    let home = target_dir(&mut tried).join("livekit-worker");
    let io = |what: String, error: std::io::Error, tried: &mut Vec<String>| {
        tried.push(format!("{what}: {error}"));
        VenvError {
            tried: std::mem::take(tried),
        }
    };
    fs::create_dir_all(&home)
        .map_err(|e| io(format!("create {}", home.display()), e, &mut tried))?;
    let lock_path = home.join("install.lock");
    let lock = File::create(&lock_path)
        .map_err(|e| io(format!("create {}", lock_path.display()), e, &mut tried))?;
    // Blocks while another test binary installs; released when `lock` drops.
    lock.lock()
        .map_err(|e| io(format!("lock {}", lock_path.display()), e, &mut tried))?;
    let venv = home.join("venv");
    let python = venv.join("bin").join("python");
    let stamp = home.join("installed");
    let wanted = format!("{LIVEKIT_AGENTS}\n{CONSTRAINTS}");
    if fs::read_to_string(&stamp).is_ok_and(|installed| installed == wanted) && python.exists() {
        return Ok(WorkerPython {
            python,
            package_dir,
        });
    }
    tried.push(format!(
        "{}: not installed yet, or from other pins",
        venv.display()
    ));
    if venv.exists() {
        fs::remove_dir_all(&venv).map_err(|e| {
            io(
                format!("remove the old venv {}", venv.display()),
                e,
                &mut tried,
            )
        })?;
    }
    let _ = fs::remove_file(&stamp);
    let constraints = home.join("constraints.txt");
    fs::write(&constraints, CONSTRAINTS)
        .map_err(|e| io(format!("write {}", constraints.display()), e, &mut tried))?;
    let maker = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    run(
        &mut tried,
        Command::new(&maker).args(["-m", "venv"]).arg(&venv),
    )?;
    run(
        &mut tried,
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--quiet",
                "--no-input",
                "-c",
            ])
            .arg(&constraints)
            .arg(LIVEKIT_AGENTS),
    )?;
    run(
        &mut tried,
        Command::new(&python).args(["-c", "import livekit.agents, aiohttp"]),
    )?;
    fs::write(&stamp, wanted)
        .map_err(|e| io(format!("write {}", stamp.display()), e, &mut tried))?;
    Ok(WorkerPython {
        python,
        package_dir,
    })
}

/// Runs an install step; a failure ends the install with everything tried so far.
fn run(tried: &mut Vec<String>, command: &mut Command) -> Result<(), VenvError> {
    let line = format!("{command:?}");
    match command.stdin(Stdio::null()).output() {
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
            Err(VenvError {
                tried: std::mem::take(tried),
            })
        }
        Err(error) => {
            tried.push(format!("{line}: cannot run it ({error})"));
            Err(VenvError {
                tried: std::mem::take(tried),
            })
        }
    }
}

/// The cargo target directory of the running build: `CARGO_TARGET_DIR` when absolute,
/// else the nearest ancestor of the running executable that cargo marked as a target
/// directory (it writes `CACHEDIR.TAG` there), else `target/` of the workspace.
fn target_dir(tried: &mut Vec<String>) -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from) {
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
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target")
}
