//! Running the project's binaries as a user's shell would.

use std::io::Read;
use std::process::{Command, Stdio};

/// Runs `command` with its standard output closed before it writes (as when `… | head` has
/// read enough): its exit code and what it wrote to standard error.
///
/// # Panics
/// When the command cannot be started or waited for.
#[must_use]
pub fn with_closed_stdout(command: &mut Command) -> (Option<i32>, String) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the command starts");
    // Close the read end before the child has started writing.
    drop(child.stdout.take());
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    (child.wait().expect("wait").code(), stderr)
}
