//! R-SEC-2 fuzz target for the admin API: arbitrary method, path, query, headers and body,
//! sent over a real TCP connection to a running `AdminServer` (hyper's parser, axum's
//! router, every handler) in front of a broker with subscriptions, dead letters and a
//! durable subscription. The engine is `tidings-fuzz` (README, "Fuzzing"); the target runs
//! for `TIDINGS_FUZZ_SECS` over the kept corpus `fuzz/corpus/admin_http/` and its
//! mutations.
//!
//! Properties, per request: the server's thread never panics (its panics are watched by
//! thread name — a handler's panic would only drop the connection); the answer, when there
//! is one, is a well-formed HTTP status line and never a 5xx; a JSON answer parses; no
//! request hangs (the engine's watchdog); and the server still answers `/api/info` after
//! every 64 requests and at the end.
//!
//! Input fields: `[method, request target, header lines, body]`. The target writes
//! `{method} {target} HTTP/1.1`, `Host`, `Connection: close` and the body's
//! `Content-Length`, then the input's header lines, verbatim, and the blank line. A request that gets no
//! answer within a quarter of a second (it claims more body than it has) is half-closed, which ends it.

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use support::{TOKEN, World, get};
use tidings_admin::AdminConfig;
use tidings_fuzz::fields::join;
use tidings_fuzz::{Fields, Outcome, Target};

/// Sends one request; returns the status code (None: the server closed without answering)
/// and the body.
fn exchange(addr: SocketAddr, raw: &[u8]) -> (Option<u16>, Vec<u8>, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the admin server");
    // The server may close before reading everything (a 400 on a bad request line).
    let _ = s.write_all(raw);
    let mut answer = Vec::new();
    // First without half-closing: a complete request is answered (and the connection
    // closed, `Connection: close`) with the request still in flight. Only a request that
    // gets nothing for a quarter of a second — one claiming more body than it has — is half-closed,
    // which ends it. The long timeout after that is far above any answer's time; the
    // engine's watchdog is the hang check.
    s.set_read_timeout(Some(Duration::from_millis(250)))
        .expect("timeout");
    let mut chunk = [0u8; 4096];
    let mut half_closed = false;
    loop {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(e)
                if !half_closed
                    && answer.is_empty()
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
            {
                half_closed = true;
                let _ = s.shutdown(Shutdown::Write);
                s.set_read_timeout(Some(Duration::from_secs(60)))
                    .expect("timeout");
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("reading the answer: {e}"),
        }
    }
    if answer.is_empty() {
        return (None, Vec::new(), String::new());
    }
    let text = String::from_utf8_lossy(&answer);
    let (head, _) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("an answer without a header end: {text:?}"));
    let status = head
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {head:?}"));
    let body_at = head.len() + 4;
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(&answer[body_at..])
    } else {
        answer[body_at..].to_vec()
    };
    (Some(status), body, head.to_ascii_lowercase())
}

fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(nl) = rest.windows(2).position(|w| w == b"\r\n") else {
            panic!("a chunk without its size line");
        };
        let size = std::str::from_utf8(&rest[..nl]).expect("chunk size");
        let n = usize::from_str_radix(size.trim(), 16).expect("hex chunk size");
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&rest[nl + 2..nl + 2 + n]);
        rest = &rest[nl + 2 + n + 2..];
    }
}

fn request(method: &str, target: &str, headers: &str, body: &str) -> Vec<u8> {
    join([method, target, headers, body])
}

#[test]
fn fuzz_admin_http() {
    // R-SEC-2, R-OPS-4
    let w = World::start(AdminConfig::new().enable_actions(TOKEN));
    w.orders(6);
    let addr = w.addr();
    let auth = format!("Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n");
    let bill = |tail: &str| w.billing_path(tail);
    let ship = format!("/api/subscriptions/{}/seek", w.ship.id().get());
    let seeds = vec![
        request("GET", "/", "", ""),
        request("GET", "/api/info", "", ""),
        request("GET", "/api/snapshot", "Accept: */*\r\n", ""),
        request("GET", "/metrics", "", ""),
        request("GET", &bill("dead-letters?offset=1&limit=2"), "", ""),
        request("GET", &bill("dead-letters?limit=100000"), "", ""),
        request(
            "POST",
            &bill("dead-letters/redrive"),
            &auth,
            r#"{"all":true}"#,
        ),
        request(
            "POST",
            &bill("dead-letters/redrive"),
            &auth,
            r#"{"ids":["0123456789abcdef0123456789abcdef"]}"#,
        ),
        request("POST", &bill("dead-letters/purge"), &auth, ""),
        request("POST", &ship, &auth, r#"{"to":"earliest"}"#),
        request("POST", &ship, &auth, r#"{"offset":3}"#),
        request("POST", &ship, &auth, r#"{"time_ms":18446744073709551615}"#),
        request(
            "POST",
            &bill("dead-letters/purge"),
            "Authorization: Bearer x\r\n",
            "",
        ),
        request("DELETE", "/api/snapshot", "", ""),
        request("GET", "/api/subscriptions/%ff/dead-letters", "", ""),
    ];
    let watch = tidings_fuzz::watch("tidings-admin");
    let check_alive = move || {
        let info = get(addr, "/api/info");
        assert_eq!(info.status, 200, "the server stopped answering: {info:?}");
    };
    let n = std::sync::atomic::AtomicU64::new(0);
    let report = Target::new("admin_http", "-p tidings-admin --test fuzz_http")
        .seeds(seeds)
        .dictionary([
            "GET",
            "POST",
            "HEAD",
            "OPTIONS",
            "/api/subscriptions/",
            "/dead-letters",
            "/redrive",
            "/purge",
            "/seek",
            "?offset=",
            "&limit=",
            "%",
            "%00",
            "..",
            "//",
            "\r\n",
            "Authorization: Bearer ",
            "Content-Length: ",
            "Transfer-Encoding: chunked\r\n",
            "Content-Type: application/json\r\n",
            "\"all\":",
            "\"ids\":[",
            "\"to\":",
            "\"offset\":",
            "\"time_ms\":",
            "18446744073709551616",
            "-1",
            "null",
            "true",
        ])
        .max_len(8 << 10)
        .run(move |data| {
            let mut f = Fields::new(data);
            let method = f.next_or_empty();
            let target = f.next_or_empty();
            let headers = f.next_or_empty();
            let body = f.next_or_empty();
            let mut raw = Vec::with_capacity(data.len() + 128);
            raw.extend_from_slice(method);
            raw.push(b' ');
            raw.extend_from_slice(target);
            raw.extend_from_slice(b" HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n");
            raw.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
            // The header block always ends, whatever the lines hold.
            let end = headers
                .iter()
                .rposition(|b| !matches!(b, b'\r' | b'\n'))
                .map_or(0, |i| i + 1);
            raw.extend_from_slice(&headers[..end]);
            raw.extend_from_slice(if end > 0 { b"\r\n\r\n" } else { b"\r\n" });
            raw.extend_from_slice(body);
            let before = watch.seen().0;
            let (status, body, head) = exchange(addr, &raw);
            let (panics, last) = watch.seen();
            assert_eq!(panics, before, "the admin server panicked: {last}");
            let mut code = String::new();
            if let Some(s) = status {
                assert!(s < 500, "a {s} answer: {}", String::from_utf8_lossy(&body));
                // An answer to HEAD has the headers of the GET answer and no body.
                if head.contains("content-type: application/json") && method != b"HEAD" {
                    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_else(|e| {
                        panic!("a JSON answer that does not parse ({e}): {body:?}")
                    });
                    if s >= 400 {
                        assert!(v["error"].is_string(), "a JSON error without its code: {v}");
                        code = v["error"].as_str().unwrap_or("").to_owned();
                    }
                }
            }
            let sent = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            if sent.is_multiple_of(64) {
                check_alive();
            }
            Outcome::of((status, head.contains("application/json"), code))
        });
    check_alive();
    assert!(report.execs > 0);
}
