//! End-to-end tests of the `tidings` binary: exit codes and the lines a user relies on.

use std::path::Path;
use std::process::{Command, Output};

use tidings_log::{Fsync, Log, LogConfig, Record};
use tidings_testkit::process::with_closed_stdout;

fn tidings(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tidings"))
        .args(args)
        .output()
        .expect("the tidings binary runs")
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A stream directory with `n` records in one segment, closed cleanly.
fn write_log(dir: &Path, n: u64) {
    let config = LogConfig::new().fsync(Fsync::Always);
    let (log, _) = Log::open(dir, config).expect("open a fresh log");
    for i in 0..n {
        let record = Record::new(1_700_000_000_000 + i, format!("order {i} payload bytes"))
            .with_key(format!("customer-{i}"))
            .with_header("region", "eu");
        assert_eq!(log.append(&record).expect("append"), i);
    }
    log.close().expect("close");
}

fn segment_file(dir: &Path) -> std::path::PathBuf {
    std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").path())
        .find(|p| p.extension().is_some_and(|e| e == "seg"))
        .expect("a .seg file")
}

#[test]
fn demo_prints_tables_and_conserves() {
    let out = tidings(&["demo"]);
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "demo failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    for header in [
        "subscription",
        "pattern",
        "offered",
        "accepted",
        "refused",
        "delivered",
        "dead-lettered",
        "in-flight",
        "attempts",
        "failures",
        "conserved",
    ] {
        assert!(
            stdout.contains(header),
            "missing column {header}:\n{stdout}"
        );
    }
    for name in [
        "fast",
        "slow",
        "flaky",
        "dedup",
        "gated",
        "reminders",
        "pricing",
    ] {
        let row = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(name) && l.trim_end().ends_with("yes"))
            .unwrap_or_else(|| panic!("no conserved table row for {name}:\n{stdout}"));
        assert!(!row.contains("NO"), "{row}");
    }
    // R-DEL-6: every message offered to each subscription is accounted for.
    assert!(
        stdout.contains("conservation (R-DEL-6)") && stdout.contains("holds for 7 of 7"),
        "{stdout}"
    );
    // The DLQ table names each reason the scenario produces (R-DEL-4, R-TIME-1, R-BP-1).
    for reason in ["retries_exhausted", "rejected", "expired", "overflow"] {
        assert!(stdout.contains(reason), "missing DLQ reason {reason}");
    }
    // R-CORE-6: close reports what it left behind: here only the reminder due in 1 h.
    assert!(stdout.contains("undelivered: 1;"), "{stdout}");
    assert!(stdout.contains("reminders.review id"), "{stdout}");
    assert!(stdout.contains("14 of 14 checks passed"), "{stdout}");
    // R-LOG-3, R-LOG-4: the durable part crashes, resumes at its commit, replays by time.
    assert!(
        stdout.contains("billing resumed at offset 30") && stdout.contains("0 billed twice"),
        "{stdout}"
    );
    assert!(stdout.contains("25 orders (26..=50)"), "{stdout}");
}

#[test]
fn log_verify_ok_on_a_good_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_log(dir.path(), 5);
    let out = tidings(&["log", "verify", dir.path().to_str().expect("utf-8 path")]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.starts_with("OK:"), "{stdout}");
    assert!(stdout.contains("5 record(s)"), "{stdout}");
}

#[test]
fn log_inspect_and_dump_a_good_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_log(dir.path(), 5);
    let path = dir.path().to_str().expect("utf-8 path");
    let out = tidings(&["log", "inspect", path]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("1 segment(s), offsets 0..5, 5 record(s)"),
        "{stdout}"
    );

    let out = tidings(&["log", "dump", path, "--from", "1", "--max", "3"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let records: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("offset="))
        .collect();
    assert_eq!(records.len(), 3, "{stdout}");
    assert!(records[0].starts_with("offset=1 "), "{stdout}");
    assert!(stdout.contains("3 record(s) from offset 1"), "{stdout}");
}

#[test]
fn log_verify_fails_on_a_corrupt_record_and_names_the_file() {
    // R-LIM-2: a damaged file is a typed finding with its path and byte offset, never a panic.
    let dir = tempfile::tempdir().expect("tempdir");
    write_log(dir.path(), 10);
    let seg = segment_file(dir.path());
    let mut bytes = std::fs::read(&seg).expect("read segment");
    // Inside the first record (the 32-byte header comes first); valid records follow it, so
    // this is corruption in the middle, not a torn tail.
    bytes[32 + 30] ^= 0xff;
    std::fs::write(&seg, &bytes).expect("write segment");

    let out = tidings(&["log", "verify", dir.path().to_str().expect("utf-8 path")]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.starts_with("CORRUPT:"), "{stdout}");
    let name = seg
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    assert!(stdout.contains(&name), "path missing:\n{stdout}");
    assert!(stdout.contains("at byte 32"), "{stdout}");

    let out = tidings(&["log", "dump", dir.path().to_str().expect("utf-8 path")]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stderr.contains(&name), "{stderr}");
}

#[test]
fn log_tools_on_bad_paths_exit_2_with_a_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("no-such-stream");
    let missing = missing.to_str().expect("utf-8 path");
    for tool in ["inspect", "verify", "dump"] {
        let out = tidings(&["log", tool, missing]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{tool}: {stdout}{stderr}");
        assert!(
            stderr.contains("no such directory") && stderr.contains(missing),
            "{tool}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }

    let file = dir.path().join("plain.txt");
    std::fs::write(&file, "not a log").expect("write");
    let out = tidings(&["log", "inspect", file.to_str().expect("utf-8 path")]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("not a directory"), "{stderr}");
}

#[test]
fn bench_accepts_the_bench_options() {
    // `--list` prints the case names without running anything.
    let out = tidings(&["bench", "--list", "fanout"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(!stdout.is_empty());
    assert!(stdout.lines().all(|l| l.contains("fanout")), "{stdout}");

    let out = tidings(&["bench", "--no-such-option"]);
    assert_eq!(out.status.code(), Some(2));
}

/// A reader that stops reading is not a failure of the command: no panic, the usual exit
/// code (the demo, the log tools and the benchmark list all print a lot).
#[test]
fn a_closed_output_is_not_a_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_log(dir.path(), 50);
    let path = dir.path().to_str().expect("utf-8 path");
    for args in [
        &["demo"][..],
        &["log", "dump", path],
        &["log", "inspect", path],
        &["bench", "--list"],
    ] {
        let (code, stderr) =
            with_closed_stdout(Command::new(env!("CARGO_BIN_EXE_tidings")).args(args));
        assert_eq!(code, Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
