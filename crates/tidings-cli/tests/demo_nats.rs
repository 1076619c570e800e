//! `tidings demo --nats URL`: the durable part of the demo on NATS JetStream, against a
//! server the testkit starts (installed when missing; skipped, with a notice, only under
//! `TIDINGS_SKIP_NATS=1`).

use std::process::Command;

use tidings_testkit::nats::{NatsServer, NatsServerOptions};

fn demo(args: &[&str]) -> (bool, Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tidings"))
        .arg("demo")
        .args(args)
        .output()
        .expect("the tidings binary runs");
    (
        out.status.success(),
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_durable_demo_runs_on_jetstream_and_cleans_up() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let (ok, _, stdout, stderr) = demo(&["--nats", &server.url()]);
    assert!(ok, "demo failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    for line in [
        "JetStream at nats://127.0.0.1:",
        // R-DIST-1: the same scenario on JetStream, offsets from 1.
        "offsets 1..51 (JetStream sequences start at 1)",
        "[ok] durable: after the restart billing resumed at offset 31, order 31 (R-LOG-3)",
        "[ok] durable: all 50 orders billed, none twice (commit at close)",
        "[ok] durable: replay by time delivered exactly orders 26..=50 (R-LOG-4)",
        "[ok] durable: fraud dead-lettered exactly the 5 orders divisible by 10 (R-DEL-4)",
        "and its dead-letter streams from the server",
        "14 of 14 checks passed",
    ] {
        assert!(stdout.contains(line), "missing {line:?}:\n{stdout}");
    }
}

#[test]
fn an_unreachable_server_is_reported_not_hung_on() {
    // Port 1 on loopback: nothing listens there.
    let (ok, code, stdout, stderr) = demo(&["--nats", "nats://127.0.0.1:1"]);
    assert!(!ok, "{stdout}");
    assert_eq!(code, Some(1), "a failed run exits 1\n{stderr}");
    assert!(
        stderr.contains("nats://127.0.0.1:1"),
        "the error names the server:\n{stderr}"
    );
}

#[test]
fn nats_and_data_dir_do_not_go_together() {
    let (ok, code, _, stderr) = demo(&["--nats", "nats://127.0.0.1:4222", "--data-dir", "x"]);
    assert!(!ok);
    assert_eq!(code, Some(2), "a usage error exits 2\n{stderr}");
    assert!(stderr.contains("--nats"), "{stderr}");
}
