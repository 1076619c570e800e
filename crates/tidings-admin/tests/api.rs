//! The admin HTTP API (R-OPS-4): JSON answers, bad input, the token, concurrent redrives.

mod support;

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use support::{TOKEN, World, get, post, request};
use tidings_admin::AdminConfig;

fn actions() -> AdminConfig {
    AdminConfig::new().enable_actions(TOKEN)
}

#[test]
fn snapshot_dead_letter_pages_and_the_dashboard_page_are_served() {
    let w = World::start(actions());
    w.orders(3);
    let snap = get(w.addr(), "/api/snapshot");
    assert_eq!(snap.status, 200);
    let served: tidings::ops::BrokerSnapshot = serde_json::from_str(&snap.body).unwrap();
    assert_eq!(served, w.broker.snapshot()); // R-OPS-4 serves the snapshot (manual clock: unchanged)
    assert_eq!(served.subscriptions.len(), 3);

    let page = get(w.addr(), &w.billing_path("dead-letters?offset=1&limit=1"));
    assert_eq!(page.status, 200);
    let p = page.json();
    assert_eq!(
        (p["total"].as_u64(), p["offset"].as_u64()),
        (Some(3), Some(1))
    ); // R-OPS-4 paged
    let e = &p["entries"][0];
    assert_eq!(p["entries"].as_array().unwrap().len(), 1);
    assert_eq!(e["payload_preview"], "order-1"); // R-OPS-4 payload preview
    assert_eq!(e["reason"], "rejected"); // R-OPS-4 reason
    assert_eq!(e["last_error"], "card declined"); // R-OPS-4 last error
    assert_eq!(e["attempts"], 1); // R-OPS-4 attempts
    assert!(e["at_ms"].as_u64().is_some()); // R-OPS-4 time
    let headers = e["headers"].as_array().unwrap();
    assert!(headers.iter().any(|h| h[0] == "customer" && h[1] == "c-1")); // R-OPS-4 headers

    let page = get(w.addr(), "/");
    assert_eq!(page.status, 200);
    assert!(page.headers.to_ascii_lowercase().contains("text/html"));
    assert!(page.body.contains("<title>tidings dashboard</title>"));
    // Self-contained: no script, style or image is loaded from anywhere else (R-OPS-4).
    for outside in [
        "src=\"http",
        "href=\"http",
        "src=\"//",
        "@import",
        "url(http",
    ] {
        assert!(!page.body.contains(outside), "the page loads {outside}");
    }
    let info = get(w.addr(), "/api/info").json();
    assert_eq!(info["actions_enabled"], true);
    // No metrics renderer configured: a JSON 404.
    let m = get(w.addr(), "/metrics");
    assert_eq!((m.status, m.error()), (404, "not_found".to_owned()));
}

#[test]
fn bad_requests_get_typed_4xx_json_errors_and_never_a_panic() {
    let w = World::start(actions());
    w.orders(2);
    let addr = w.addr();
    let ship = w.ship.id().get();
    // (method, what, path, body, status, error code)
    type Case<'a> = (&'a str, &'a str, String, Option<&'a str>, u16, &'a str);
    let cases: Vec<Case> = vec![
        // Unknown subscription, for reads and actions.
        (
            "GET",
            "dl 999",
            "/api/subscriptions/999/dead-letters".into(),
            None,
            404,
            "unknown_subscription",
        ),
        (
            "POST",
            "redrive 999",
            "/api/subscriptions/999/dead-letters/redrive".into(),
            Some(r#"{"all":true}"#),
            404,
            "unknown_subscription",
        ),
        (
            "POST",
            "purge 999",
            "/api/subscriptions/999/dead-letters/purge".into(),
            Some(""),
            404,
            "unknown_subscription",
        ),
        (
            "POST",
            "seek 999",
            "/api/subscriptions/999/seek".into(),
            Some(r#"{"to":"earliest"}"#),
            404,
            "unknown_subscription",
        ),
        // Ids that are not ids.
        (
            "GET",
            "id abc",
            "/api/subscriptions/abc/dead-letters".into(),
            None,
            400,
            "bad_request",
        ),
        (
            "GET",
            "id -1",
            "/api/subscriptions/-1/dead-letters".into(),
            None,
            400,
            "bad_request",
        ),
        (
            "GET",
            "id 2^64",
            "/api/subscriptions/18446744073709551616/dead-letters".into(),
            None,
            400,
            "bad_request",
        ),
        // Huge, negative or garbage page sizes and offsets.
        (
            "GET",
            "limit 10^6",
            w.billing_path("dead-letters?limit=1000000"),
            None,
            400,
            "page_too_large",
        ),
        (
            "GET",
            "limit 1001",
            w.billing_path("dead-letters?limit=1001"),
            None,
            400,
            "page_too_large",
        ),
        (
            "GET",
            "limit 2^70",
            w.billing_path("dead-letters?limit=1180591620717411303424"),
            None,
            400,
            "bad_request",
        ),
        (
            "GET",
            "limit -5",
            w.billing_path("dead-letters?limit=-5"),
            None,
            400,
            "bad_request",
        ),
        (
            "GET",
            "offset x",
            w.billing_path("dead-letters?offset=x"),
            None,
            400,
            "bad_request",
        ),
        // Bad JSON and bad shapes.
        (
            "POST",
            "redrive {",
            w.billing_path("dead-letters/redrive"),
            Some("{"),
            400,
            "bad_json",
        ),
        (
            "POST",
            "redrive empty",
            w.billing_path("dead-letters/redrive"),
            Some(""),
            400,
            "bad_json",
        ),
        (
            "POST",
            "redrive []",
            w.billing_path("dead-letters/redrive"),
            Some("[]"),
            400,
            "bad_request",
        ),
        (
            "POST",
            "redrive unknown field",
            w.billing_path("dead-letters/redrive"),
            Some(r#"{"every":true}"#),
            400,
            "bad_json",
        ),
        (
            "POST",
            "redrive all+ids",
            w.billing_path("dead-letters/redrive"),
            Some(r#"{"all":true,"ids":["0000000000000000000000000000002a"]}"#),
            400,
            "bad_request",
        ),
        (
            "POST",
            "redrive no ids",
            w.billing_path("dead-letters/redrive"),
            Some(r#"{"ids":[]}"#),
            400,
            "bad_request",
        ),
        (
            "POST",
            "redrive bad id",
            w.billing_path("dead-letters/redrive"),
            Some(r#"{"ids":["not-an-id"]}"#),
            400,
            "bad_request",
        ),
        (
            "POST",
            "redrive ids=7",
            w.billing_path("dead-letters/redrive"),
            Some(r#"{"ids":7}"#),
            400,
            "bad_json",
        ),
        (
            "POST",
            "seek nowhere",
            format!("/api/subscriptions/{ship}/seek"),
            Some(r#"{"to":"middle"}"#),
            400,
            "bad_request",
        ),
        (
            "POST",
            "seek two",
            format!("/api/subscriptions/{ship}/seek"),
            Some(r#"{"offset":0,"time_ms":0}"#),
            400,
            "bad_request",
        ),
        (
            "POST",
            "seek -1",
            format!("/api/subscriptions/{ship}/seek"),
            Some(r#"{"offset":-1}"#),
            400,
            "bad_json",
        ),
        // Valid requests the state refuses.
        (
            "POST",
            "redrive gone",
            w.billing_path("dead-letters/redrive"),
            Some(r#"{"ids":["0000000000000000000000000000002a"]}"#),
            409,
            "gone",
        ),
        (
            "POST",
            "seek buffered",
            w.billing_path("seek"),
            Some(r#"{"to":"latest"}"#),
            422,
            "not_durable",
        ),
        (
            "POST",
            "seek beyond",
            format!("/api/subscriptions/{ship}/seek"),
            Some(r#"{"offset":99}"#),
            422,
            "out_of_range",
        ),
        // No such endpoint or method.
        (
            "GET",
            "nowhere",
            "/api/nowhere".into(),
            None,
            404,
            "not_found",
        ),
    ];
    for (method, what, path, body, status, code) in cases {
        let a = request(addr, method, &path, Some(&format!("Bearer {TOKEN}")), body);
        assert_eq!(a.status, status, "{what}: {a:?}"); // R-OPS-4: a typed 4xx
        assert_eq!(a.error(), code, "{what}: {a:?}"); // R-OPS-4: a JSON error
        assert!(
            a.json()["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}"
        );
    }
    // A method the route does not have, and a body beyond the limit, are JSON 4xx too.
    let a = request(addr, "DELETE", "/api/snapshot", None, None);
    assert_eq!(
        (a.status, a.error()),
        (405, "method_not_allowed".to_owned())
    ); // R-OPS-4
    let huge = format!(r#"{{"ids":["{}"]}}"#, "0".repeat(3 << 20));
    let a = request(
        addr,
        "POST",
        &w.billing_path("dead-letters/redrive"),
        Some(&format!("Bearer {TOKEN}")),
        Some(&huge),
    );
    assert_eq!((a.status, a.error()), (413, "body_too_large".to_owned())); // R-OPS-4
    // The server is still serving, nothing changed.
    assert_eq!(get(addr, "/api/snapshot").status, 200);
    assert_eq!(w.billing.stats().dlq_len, 2);
    assert_eq!(w.ship.committed(), 2);
}

#[test]
fn actions_without_the_right_token_get_401_and_change_nothing() {
    let w = World::start(actions());
    w.orders(3);
    let ship = w.ship.id().get();
    let before = w.broker.snapshot();
    let actions = [
        (w.billing_path("dead-letters/redrive"), r#"{"all":true}"#),
        (w.billing_path("dead-letters/purge"), ""),
        (
            format!("/api/subscriptions/{ship}/seek"),
            r#"{"to":"earliest"}"#,
        ),
    ];
    let wrong = [
        None,
        Some("Bearer wrong".to_owned()),
        Some(format!("Bearer {TOKEN}x")),
        Some(format!("Basic {TOKEN}")),
        Some(TOKEN.to_owned()),
        Some("Bearer ".to_owned()),
    ];
    for (path, body) in &actions {
        for auth in &wrong {
            let a = request(w.addr(), "POST", path, auth.as_deref(), Some(body));
            assert_eq!(a.status, 401, "{path} with {auth:?}: {a:?}"); // R-OPS-4
            assert_eq!(a.error(), "unauthorized");
            assert!(a.headers.contains("www-authenticate: Bearer"), "{a:?}");
        }
    }
    assert_eq!(w.broker.snapshot(), before); // R-OPS-4: nothing changed
    assert_eq!(w.billing.stats().dlq_len, 3);

    // With the token, the same actions work (the scheme is case-insensitive).
    let a = request(
        w.addr(),
        "POST",
        &actions[2].0,
        Some(&format!("bearer {TOKEN}")),
        Some(actions[2].1),
    );
    assert_eq!((a.status, a.json()["position"].as_u64()), (200, Some(0)));
    let a = post(w.addr(), &actions[1].0, "");
    assert_eq!((a.status, a.json()["purged"].as_u64()), (200, Some(3)));
    assert_eq!(w.billing.stats().dlq_len, 0);

    // A read-only server (no token configured) refuses every action, token or not.
    let ro = World::start(AdminConfig::new());
    ro.orders(1);
    for auth in [None, Some(format!("Bearer {TOKEN}"))] {
        let a = request(
            ro.addr(),
            "POST",
            &ro.billing_path("dead-letters/redrive"),
            auth.as_deref(),
            Some(r#"{"all":true}"#),
        );
        assert_eq!((a.status, a.error()), (403, "actions_disabled".to_owned())); // R-OPS-4 read-only
    }
    assert_eq!(ro.billing.stats().dlq_len, 1);
    assert_eq!(get(ro.addr(), "/api/info").json()["actions_enabled"], false);
}

#[test]
fn concurrent_redrives_lose_and_duplicate_nothing() {
    const N: usize = 120;
    let w = World::start(actions());
    w.orders(N);
    assert_eq!(w.billing.stats().dlq_len, N as u64);
    let page = get(w.addr(), &w.billing_path("dead-letters?limit=1000")).json();
    let ids: Vec<String> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), N);
    w.failing.store(false, Ordering::SeqCst);

    // Eight clients at once: some redrive everything, others overlapping slices by id.
    let addr = w.addr();
    let path = w.billing_path("dead-letters/redrive");
    let outcomes: Vec<(u16, serde_json::Value)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let (ids, path) = (&ids, &path);
                s.spawn(move || {
                    let mut out = Vec::new();
                    for round in 0..4 {
                        let body = if (t + round) % 3 == 0 {
                            r#"{"all":true}"#.to_owned()
                        } else {
                            let from = (t * 13 + round * 29) % N;
                            let slice: Vec<&String> =
                                ids.iter().cycle().skip(from).take(40).collect();
                            serde_json::json!({ "ids": slice }).to_string()
                        };
                        let a = post(addr, path, &body);
                        out.push((a.status, a.json()));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("client thread"))
            .collect()
    });
    let mut accepted = 0;
    for (status, body) in &outcomes {
        match status {
            200 => accepted += body["accepted"].as_u64().unwrap(),
            409 => assert_eq!(body["error"], "gone"),
            other => panic!("unexpected answer {other}: {body}"),
        }
    }
    assert_eq!(accepted, N as u64); // R-OPS-4: every entry re-offered exactly once
    assert_eq!(w.billing.stats().dlq_len, 0); // nothing left behind
    w.broker.run_until_idle();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for id in w.delivered.lock().unwrap().iter() {
        *seen.entry(id.clone()).or_default() += 1;
    }
    assert_eq!(seen.len(), N); // R-OPS-4: nothing lost
    assert!(seen.values().all(|&n| n == 1), "a duplicate: {seen:?}"); // R-OPS-4: nothing duplicated
    assert!(ids.iter().all(|i| seen.contains_key(i)));
    let stats = w.billing.stats();
    assert!(stats.is_conserved()); // R-DEL-6
    assert_eq!(stats.delivered, N as u64);
}

#[test]
fn the_metrics_endpoint_serves_prometheus_text_equal_to_the_snapshot() {
    use std::sync::{Arc, OnceLock};
    let recorder = Arc::new(metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder());
    let handle = recorder.handle();
    let broker: Arc<OnceLock<tidings::WeakBroker>> = Arc::default();
    let (b, in_test) = (broker.clone(), recorder.clone());
    // A recorder local to the scrape, so the test does not install a global one.
    let w = World::start(actions().metrics(move || {
        if let Some(b) = b.get().and_then(tidings::WeakBroker::upgrade) {
            let _ = metrics::with_local_recorder(&*recorder, || b.export_metrics());
        }
        handle.render()
    }));
    assert!(broker.set(w.broker.downgrade()).is_ok());
    // Handler calls run here (manual driver): their duration samples go to the same recorder.
    metrics::with_local_recorder(&*in_test, || {
        w.orders(3);
        w.failing.store(false, Ordering::SeqCst);
        w.orders(2);
    });
    let text = get(w.addr(), "/metrics");
    assert_eq!(text.status, 200);
    assert!(text.headers.contains("text/plain"), "{text:?}");
    let value = |name: &str, labels: &[&str]| -> f64 {
        let line = text
            .body
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{")) && labels.iter().all(|x| l.contains(x)))
            .unwrap_or_else(|| panic!("{name} {labels:?} not in\n{}", text.body));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let snap = w.broker.snapshot();
    for s in &snap.subscriptions {
        let l = format!(r#"subscription="{}""#, s.name);
        let c = &s.counters;
        assert_eq!(
            value("messaging_client_sent_messages", &[&l]),
            c.offered as f64
        ); // R-OPS-2
        assert_eq!(
            value("messaging_client_consumed_messages", &[&l]),
            c.attempts as f64
        ); // R-OPS-2
        assert_eq!(
            value("tidings_subscription_delivered", &[&l]),
            c.delivered as f64
        ); // R-OPS-2
        assert_eq!(value("tidings_subscription_depth", &[&l]), c.queued as f64); // R-OPS-2
    }
    let billing = r#"subscription="billing""#;
    assert_eq!(
        value(
            "tidings_subscription_dlq_size",
            &[billing, r#"reason="rejected""#]
        ),
        3.0
    ); // R-OPS-2
    assert_eq!(value("tidings_subscription_delivered", &[billing]), 2.0);
    let calls = value("messaging_process_duration_count", &[billing]);
    assert_eq!(
        calls,
        snap.subscription_named("billing")
            .unwrap()
            .counters
            .attempts as f64
    ); // R-OPS-2
    let lag = value("tidings_subscription_lag", &[r#"stream="orders""#]);
    assert_eq!(
        lag,
        snap.subscription_named("durable:orders/ship")
            .unwrap()
            .durable
            .as_ref()
            .unwrap()
            .lag as f64
    ); // R-OPS-2
}

#[test]
fn the_snapshot_carries_every_figure_the_charts_draw_and_any_poll_value_gets_the_page() {
    let w = World::start(actions());
    w.orders(2);
    let snap = get(w.addr(), "/api/snapshot").json();
    assert!(snap["taken_at_ms"].as_u64().is_some()); // the x axis: the broker's clock
    for s in snap["subscriptions"].as_array().unwrap() {
        let c = &s["counters"];
        // Rates from deltas of these counters, depth as it is (R-OPS-4 charts).
        for counter in ["offered", "delivered", "redelivered", "queued"] {
            assert!(c[counter].as_u64().is_some(), "{counter} missing: {s}");
        }
        assert!(c["dead_lettered"].as_object().is_some(), "{s}");
        assert!(s["id"].as_u64().is_some() && s["name"].is_string(), "{s}");
    }
    // Lag, for the durable subscription.
    let ship = w.ship.id().get();
    let ship = snap["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == ship)
        .unwrap();
    assert!(ship["durable"]["lag"].as_u64().is_some(), "{ship}");
    // The poll interval is the page's own business: whatever `poll` says, the page is served
    // (it clamps the value itself), and nothing panics.
    for query in [
        "?poll=200",
        "?poll=abc",
        "?poll=-5",
        "?poll=99999999999999999999999",
        "?poll=%00",
        "?poll",
    ] {
        let page = get(w.addr(), &format!("/{query}"));
        assert_eq!(page.status, 200, "{query}");
        assert!(
            page.body.contains("<title>tidings dashboard</title>"),
            "{query}"
        );
    }
}
