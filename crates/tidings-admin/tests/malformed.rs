//! Every error answer of the admin API carries its documented JSON body
//! `{"error": "<code>", "message": "<text>"}`, whoever refuses the request: a handler,
//! axum's extractors (bad JSON, bad query, bad path, body too large), the router (unknown
//! method or path) or the HTTP parser underneath (bad request line or header, URI too long,
//! head too large) — R-SEC-2 (an HTTP request is untrusted bytes: a typed answer, never a
//! panic).
//!
//! A real listening server; each malformed request is sent as raw bytes over its own TCP
//! connection, over every route.

mod support;

use support::{Answer, TOKEN, World, raw_request};
use tidings_admin::AdminConfig;

/// What a case expects.
#[derive(Debug, Clone, Copy)]
enum Expect {
    Status(u16),
    /// Not an error for this route (the part it ignores); the answer is only checked to
    /// be JSON when it is one.
    Whatever,
}

struct Route {
    method: &'static str,
    /// With `{id}` where the subscription id goes.
    path: &'static str,
    /// Takes a JSON body (and the bearer token).
    json: bool,
}

const ROUTES: [Route; 9] = [
    Route {
        method: "GET",
        path: "/",
        json: false,
    },
    Route {
        method: "GET",
        path: "/api/info",
        json: false,
    },
    Route {
        method: "GET",
        path: "/api/snapshot",
        json: false,
    },
    Route {
        method: "GET",
        path: "/api/subscriptions/{id}/dead-letters",
        json: false,
    },
    Route {
        method: "POST",
        path: "/api/subscriptions/{id}/dead-letters/redrive",
        json: true,
    },
    Route {
        method: "POST",
        path: "/api/subscriptions/{id}/dead-letters/purge",
        json: false,
    },
    Route {
        method: "POST",
        path: "/api/subscriptions/{id}/seek",
        json: true,
    },
    Route {
        method: "GET",
        path: "/metrics",
        json: false,
    },
    Route {
        method: "GET",
        path: "/no/such/route",
        json: false,
    },
];

fn head(method: &str, target: &str, extra: &str, body: &[u8]) -> Vec<u8> {
    let mut req = format!(
        "{method} {target} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\
         Authorization: Bearer {TOKEN}\r\nContent-Length: {}\r\n{extra}\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    req
}

/// The malformed requests for one route: (what, bytes, expectation).
fn cases(r: &Route, id: u64) -> Vec<(String, Vec<u8>, Expect)> {
    let path = r.path.replace("{id}", &id.to_string());
    let m = r.method;
    let mut out: Vec<(String, Vec<u8>, Expect)> = Vec::new();
    let mut add = |what: &str, bytes: Vec<u8>, expect: Expect| {
        out.push((what.to_owned(), bytes, expect));
    };
    // Bad JSON bodies.
    let bad_json = if r.json {
        Expect::Status(400)
    } else {
        Expect::Whatever
    };
    add(
        "truncated JSON",
        head(m, &path, "", br#"{"all":"#),
        bad_json,
    );
    add(
        "JSON of the wrong shape",
        head(m, &path, "", br#"[1,2,3]"#),
        bad_json,
    );
    add("not UTF-8", head(m, &path, "", b"\xff\xfe\x00"), bad_json);
    // Bad queries.
    let query_matters = if r.path.ends_with("dead-letters") {
        Expect::Status(400)
    } else {
        Expect::Whatever
    };
    add(
        "limit=x",
        head(m, &format!("{path}?limit=x"), "", b""),
        query_matters,
    );
    add(
        "offset=-1",
        head(m, &format!("{path}?offset=-1"), "", b""),
        query_matters,
    );
    let huge = format!("{path}?limit={}", "9".repeat(60_000));
    add(
        "limit of 60,000 digits",
        head(m, &huge, "", b""),
        query_matters,
    );
    add(
        "bad percent-escape",
        head(m, &format!("{path}?limit=%zz"), "", b""),
        query_matters,
    );
    // Bad paths.
    if r.path.contains("{id}") {
        for bad in ["abc", "-1", "18446744073709551616", "%FF%FE", "%00"] {
            let p = r.path.replace("{id}", bad);
            add(
                &format!("id {bad}"),
                head(m, &p, "", b""),
                Expect::Status(400),
            );
        }
        // An id of 60,000 bytes reaches the handler, whose message quotes it bounded.
        let p = r.path.replace("{id}", &"7".repeat(60_000));
        add(
            "id of 60,000 digits",
            head(m, &p, "", b""),
            Expect::Status(400),
        );
    } else {
        add(
            "path with invalid UTF-8",
            head(m, &format!("{path}/%FF"), "", b""),
            Expect::Status(404),
        );
    }
    // Too long a URI (the parser's limit is 65,534 bytes).
    let long = format!("{path}?{}", "a".repeat(70_000));
    add(
        "URI of 70,000 bytes",
        head(m, &long, "", b""),
        Expect::Status(414),
    );
    // Too large a head: too many headers.
    let many: String = (0..150).map(|i| format!("X-H{i}: v\r\n")).collect();
    add(
        "150 headers",
        head(m, &path, &many, b""),
        Expect::Status(431),
    );
    // A header value beyond the parser's buffer (about 400 KB).
    let big = format!("X-Big: {}\r\n", "b".repeat(500_000));
    add(
        "a 500 KB header",
        head(m, &path, &big, b""),
        Expect::Status(431),
    );
    // Unknown and invalid methods.
    let unknown = if r.path.starts_with("/no/") { 404 } else { 405 };
    add(
        "method BREW",
        head("BREW", &path, "", b""),
        Expect::Status(unknown),
    );
    let other = if m == "GET" { "DELETE" } else { "GET" };
    if other == "DELETE" || r.path != "/" {
        add(
            "another method",
            head(other, &path, "", b""),
            Expect::Status(unknown),
        );
    }
    add(
        "method with a bad byte",
        head("G(T", &path, "", b""),
        Expect::Status(400),
    );
    // A body beyond the limit (2 MB).
    if m == "POST" && r.json {
        let body = vec![b' '; 3 << 20];
        add("3 MB body", head(m, &path, "", &body), Expect::Status(413));
    }
    // Requests the HTTP parser refuses.
    let syntax: Vec<(&str, Vec<u8>)> = vec![
        ("space in the target", format!("{m} {path} x HTTP/1.1\r\nHost: a\r\n\r\n").into_bytes()),
        ("control byte in the target", format!("{m} {path}\x01 HTTP/1.1\r\nHost: a\r\n\r\n").into_bytes()),
        ("non-ASCII target", [format!("{m} {path}").as_bytes(), b"\xff HTTP/1.1\r\nHost: a\r\n\r\n"].concat()),
        ("header without a colon", format!("{m} {path} HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n").into_bytes()),
        ("header name with a space", format!("{m} {path} HTTP/1.1\r\nHost: a\r\nBad Name: v\r\n\r\n").into_bytes()),
        ("HTTP/9.9", format!("{m} {path} HTTP/9.9\r\nHost: a\r\n\r\n").into_bytes()),
        ("Content-Length: x", format!("{m} {path} HTTP/1.1\r\nHost: a\r\nContent-Length: x\r\n\r\n").into_bytes()),
        ("two Content-Lengths", format!("{m} {path} HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab").into_bytes()),
        ("Transfer-Encoding: gzip", format!("{m} {path} HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n").into_bytes()),
        ("Transfer-Encoding in HTTP/1.0", format!("{m} {path} HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n").into_bytes()),
        ("bad chunk size", format!("{m} {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\nAuthorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").into_bytes()),
    ];
    for (what, bytes) in syntax {
        // A bad chunk is refused when the body is read: only by routes that read it.
        let expect = if what == "bad chunk size" && !(m == "POST" && r.json) {
            Expect::Whatever
        } else {
            Expect::Status(400)
        };
        add(what, bytes, expect);
    }
    out
}

/// Why the answer to a case is wrong, if it is.
fn check(a: &Answer, expect: Expect) -> Result<(), String> {
    if let Expect::Status(s) = expect
        && a.status != s
    {
        return Err(format!("status {} instead of {s}", a.status));
    }
    if a.status < 400 {
        return Ok(());
    }
    // The documented error body, for every error answer.
    if !a
        .headers
        .to_ascii_lowercase()
        .contains("content-type: application/json")
    {
        return Err(format!("{} without a JSON content type", a.status));
    }
    let v: serde_json::Value = serde_json::from_str(&a.body)
        .map_err(|e| format!("{}: the body is not JSON ({e})", a.status))?;
    if !(v["error"].as_str().is_some_and(|c| !c.is_empty())
        && v["message"].as_str().is_some_and(|m| !m.is_empty()))
    {
        return Err(format!("{}: not {{\"error\", \"message\"}}", a.status));
    }
    // Bounded (R-SEC-2): a 60 KB id or limit, a 70 KB URI, a 500 KB header are not echoed.
    if a.body.len() > 1024 {
        return Err(format!(
            "{}: an error body of {} bytes",
            a.status,
            a.body.len()
        ));
    }
    Ok(())
}

#[test]
fn every_error_answer_on_every_route_carries_the_json_error_body() {
    let w = World::start(
        AdminConfig::new()
            .enable_actions(TOKEN)
            .metrics(String::new),
    );
    w.orders(2);
    let id = w.billing.id().get();
    let (mut checked, mut errors) = (0, 0);
    let mut wrong = Vec::new();
    for r in &ROUTES {
        for (what, bytes, expect) in cases(r, id) {
            let a = raw_request(w.addr(), &bytes);
            checked += 1;
            if a.status >= 400 {
                errors += 1;
            }
            if let Err(why) = check(&a, expect) {
                wrong.push(format!("{} {}: {what}: {why}", r.method, r.path));
            }
        }
    }
    eprintln!(
        "{checked} malformed requests, {errors} error answers, {} wrong",
        wrong.len()
    );
    assert!(
        wrong.is_empty(),
        "{} wrong answers:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert!(errors >= checked * 3 / 4, "{errors} of {checked}");
    // The server still serves after all that.
    let a = raw_request(w.addr(), &head("GET", "/api/info", "", b""));
    assert_eq!(a.status, 200, "{a:?}");
}
