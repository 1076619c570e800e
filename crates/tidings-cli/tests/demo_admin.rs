//! `tidings demo --admin`: the demo broker stays up with the admin API (R-OPS-4).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn tidings() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tidings"))
}

/// `GET path` over a plain HTTP/1.1 connection; the whole answer as text.
fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect to the admin server");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    raw
}

#[test]
fn demo_admin_serves_the_demo_broker_until_for_ends_then_exits_0() {
    let mut child = tidings()
        .args([
            "demo",
            "--orders",
            "20",
            "--admin",
            "127.0.0.1:0",
            "--for",
            "8",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read stdout on a thread (so the pipe never fills) and pass the lines on.
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    let addr: SocketAddr = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no dashboard URL printed; output so far: {seen:#?}"));
        if let Some(rest) = line.split("dashboard at http://").nth(1) {
            break rest
                .trim_end_matches('/')
                .parse()
                .expect("an address in the URL");
        }
        seen.push(line);
    };
    assert!(addr.ip().is_loopback());

    let answer = http_get(addr, "/api/snapshot");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let body = answer.split_once("\r\n\r\n").unwrap().1;
    // Subscriptions of the demo are listed by name (R-OPS-4 serves the snapshot).
    for name in [
        "fast",
        "slow",
        "flaky",
        "dedup",
        "gated",
        "reminders",
        "pricing",
    ] {
        assert!(
            body.contains(&format!("\"name\":\"{name}\"")),
            "{name} missing from {body}"
        ); // R-OPS-4
    }
    // The demo's durable part is on the same broker: its stream, with the 50
    // orders, and its three durable subscriptions over it, fraud's durable DLQ included.
    let snap: serde_json::Value = serde_json::from_str(body).expect("snapshot JSON");
    let streams = snap["streams"].as_array().expect("streams");
    assert_eq!(streams.len(), 1, "{body}"); // R-OPS-4 the demo's stream is shown
    assert_eq!(streams[0]["name"], "orders", "{body}");
    assert_eq!(streams[0]["records"], 50, "{body}");
    let subscriptions = snap["subscriptions"].as_array().expect("subscriptions");
    let durable = |name: &str| {
        subscriptions
            .iter()
            .find(|s| s["name"] == name && s["kind"] == "durable")
            .unwrap_or_else(|| panic!("no durable subscription {name} in {body}"))
    };
    for name in ["billing", "audit", "fraud"] {
        let s = durable(name);
        assert_eq!(s["durable"]["stream"], "orders", "{s}"); // R-OPS-1 its stream
        assert_eq!(s["durable"]["lag"], 0, "{s}"); // caught up
    }
    assert_eq!(
        durable("fraud")["durable"]["dead_letter_log_len"],
        5,
        "{body}"
    ); // R-DEL-4 fraud's durable DLQ
    let page = http_get(addr, "/");
    assert!(page.starts_with("HTTP/1.1 200"), "{page}"); // R-OPS-4 the dashboard page
    let metrics = http_get(addr, "/metrics");
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(
        metrics.contains("messaging_client_consumed_messages"),
        "{metrics}"
    ); // R-OPS-2

    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the demo did not stop after --for"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let rest: Vec<String> = rx.iter().collect();
    reader.join().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(
        status.success(),
        "exit {status:?}; stderr {err}; stdout {rest:#?}"
    );
    assert!(
        rest.iter().any(|l| l.contains("checks passed")),
        "{rest:#?}"
    );
}

#[test]
fn demo_admin_refuses_a_public_address_without_admin_public() {
    let out = tidings()
        .args(["demo", "--admin", "0.0.0.0:0", "--for", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--admin-public"), "{err}");
    // Nothing ran: no scenario output.
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
