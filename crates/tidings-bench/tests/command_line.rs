//! The `tidings-bench` binary as a command-line tool: no benchmark runs here.

use std::io::Read;
use std::process::{Command, Stdio};

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tidings-bench"))
}

/// `--list` prints every case name and runs nothing.
#[test]
fn list_prints_the_case_names() {
    let out = bench().arg("--list").output().expect("run tidings-bench");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    assert!(text.lines().any(|l| l == "fanout/n=1/pool"), "{text}");
    assert!(text.lines().any(|l| l == "log/read"), "{text}");
}

/// A reader that stops reading (`tidings-bench --list | head -1`) ends the run quietly: no
/// panic, no error, success.
#[test]
fn a_closed_output_ends_the_run_quietly() {
    let mut child = bench()
        .arg("--list")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tidings-bench");
    // Close the read end before the child has started writing.
    drop(child.stdout.take());
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
