//! The `tidings-bench` binary as a command-line tool: no benchmark runs here.

use std::process::Command;

use tidings_testkit::process::with_closed_stdout;

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
    assert!(text.lines().any(|l| l == "transport/nats/1to1"), "{text}");
}

/// A reader that stops reading (`tidings-bench --list | head -1`) ends the run quietly: no
/// panic, no error, success.
#[test]
fn a_closed_output_ends_the_run_quietly() {
    let (code, stderr) = with_closed_stdout(bench().arg("--list"));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A run whose reader left still writes the files it was asked for: the results of a long
/// run are not lost to a closed pipe.
#[test]
fn a_closed_output_still_gets_the_files_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("run.json");
    let (code, stderr) = with_closed_stdout(
        bench()
            .args(["--quick", "--json"])
            .arg(&json)
            .arg("scale/subs=1000/pool/bytes-per-sub"),
    );
    assert_eq!(code, Some(0), "{stderr}");
    let text = std::fs::read_to_string(&json).expect("the JSON file is written");
    assert!(
        text.contains("scale/subs=1000/pool/bytes-per-sub"),
        "{text}"
    );
}

/// `soak` is a subcommand with arguments of its own; a bad one is a usage error (exit 2)
/// before anything starts, never a run.
#[test]
fn soak_has_its_own_arguments() {
    let out = bench()
        .args(["soak", "--help"])
        .output()
        .expect("run tidings-bench");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    assert!(
        text.contains("--max-age-secs") && text.contains("R-LIM-3"),
        "{text}"
    );
    for bad in [
        &["soak", "--secs", "0"][..],
        &["soak", "--warmup", "0.95"][..],
    ] {
        let out = bench().args(bad).output().expect("run tidings-bench");
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {out:?}");
        assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
    }
}
