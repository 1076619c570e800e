//! The dashboard in a real browser (R-OPS-4): Debian's
//! `chromium-headless-shell` loads the page from a live admin server and the test asserts
//! on the rendered DOM (`--dump-dom`) after the page's own JavaScript ran.
//!
//! The browser is `$TIDINGS_CHROMIUM`, else `chromium-headless-shell` on `PATH`, else
//! `/usr/lib/chromium/chromium-headless-shell`. Without one the test prints a notice and
//! passes, unless `TIDINGS_REQUIRE_BROWSER=1` (CI sets it), which makes it fail.
//! The chart test saves a screenshot of the moving charts to
//! `target/tmp/dashboard-charts.png`; `TIDINGS_SAVE_SCREENSHOT=1` also writes it to
//! `docs/dashboard.png`.

mod support;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use support::{TOKEN, World, post};
use tidings::{DurableSpec, Message};
use tidings_admin::AdminConfig;

fn browser() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TIDINGS_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("chromium-headless-shell"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        let p = PathBuf::from("/usr/lib/chromium/chromium-headless-shell");
        p.is_file().then_some(p)
    })
}

/// Run the headless shell with `args` then `url`; its stdout. Bounded: killed after 90 s.
fn run(browser: &Path, profile: &Path, args: &[&str], url: &str) -> String {
    run_for(browser, profile, 4000, args, url)
}

/// [`run`], letting the page's JavaScript run for `budget_ms` of virtual time.
///
/// One browser at a time (the tests of this file run on several threads, and several
/// headless shells at once on a 2-core machine are what crashed one). A browser killed by a
/// signal (a crash of the browser itself, not an answer about the page) is started again,
/// at most twice, with a notice; a page it cannot render fails on every try.
fn run_for(browser: &Path, profile: &Path, budget_ms: u32, args: &[&str], url: &str) -> String {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    for attempt in 1.. {
        match run_once(browser, profile, budget_ms, args, url) {
            Ok(out) => return out,
            Err(status) if status.signal().is_some() && attempt < 3 => {
                eprintln!("NOTICE: the headless browser crashed ({status}); starting it again");
            }
            Err(status) => panic!("the browser exited with {status}"),
        }
    }
    unreachable!("the loop returns or panics")
}

/// One run of the browser: its stdout, or how it exited when that was not a success.
fn run_once(
    browser: &Path,
    profile: &Path,
    budget_ms: u32,
    args: &[&str],
    url: &str,
) -> Result<String, ExitStatus> {
    let mut child = Command::new(browser)
        .args([
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        // Lets the page's JavaScript run (fetches, timers) before the dump.
        .arg(format!("--virtual-time-budget={budget_ms}"))
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the headless browser");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut s).map(|_| s)
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        match child.try_wait().unwrap() {
            Some(status) if status.success() => break,
            Some(status) => return Err(status),
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the browser did not finish within 90 s");
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    Ok(reader.join().unwrap().expect("the browser's output"))
}

/// The `<tr>` element whose attributes contain `marker`, as text.
fn row<'a>(dom: &'a str, marker: &str) -> &'a str {
    let at = dom
        .find(marker)
        .unwrap_or_else(|| panic!("{marker} is not in the page:\n{dom}"));
    let start = dom[..at].rfind("<tr").unwrap();
    let end = at + dom[at..].find("</tr>").unwrap();
    &dom[start..end]
}

#[test]
fn the_dashboard_renders_subscriptions_counts_and_dead_letters_in_a_browser() {
    let Some(browser) = browser() else {
        let required = std::env::var("TIDINGS_REQUIRE_BROWSER").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "TIDINGS_REQUIRE_BROWSER=1 but no chromium-headless-shell was found"
        );
        eprintln!(
            "NOTICE: dashboard browser test skipped: no chromium-headless-shell \
             (apt-get install -y --no-install-recommends chromium-headless-shell)"
        );
        return;
    };
    let w = World::start(AdminConfig::new().enable_actions(TOKEN));
    // One order billing rejects (its dead letter), then three orders and a payment it
    // takes; audit sees all five; ship (durable) reads the four orders.
    w.orders(1);
    w.failing.store(false, Ordering::SeqCst);
    w.orders(3);
    w.broker
        .publish(Message::to("orders.paid").payload("order-0"))
        .unwrap();
    w.broker.run_until_idle();
    let dead = w.billing.dead_letters();
    assert_eq!(dead.len(), 1);
    let dead_id = dead[0].message.id().to_string();
    let billing = w.billing.id().get();
    let profile = tempfile::tempdir().unwrap();

    let dom = run(&browser, profile.path(), &["--dump-dom"], &w.server.url());
    assert!(
        dom.contains(r#"data-loaded="true""#),
        "the page never loaded:\n{dom}"
    );
    // Every subscription, with its counts (R-OPS-4).
    let b = row(&dom, &format!(r#"id="sub-{billing}""#));
    assert!(b.contains(">billing<"), "{b}"); // R-OPS-4
    assert!(b.contains(r#"data-delivered="4""#), "{b}"); // R-OPS-4 counts
    assert!(b.contains(r#"data-dlq="1""#), "{b}"); // R-OPS-4 DLQ size
    let a = row(&dom, &format!(r#"id="sub-{}""#, w.audit.id().get()));
    assert!(
        a.contains(">audit<") && a.contains(r#"data-delivered="5""#),
        "{a}"
    ); // R-OPS-4
    let s = row(&dom, &format!(r#"id="sub-{}""#, w.ship.id().get()));
    assert!(
        s.contains("durable:orders/ship") && s.contains(r#"data-lag="0""#),
        "{s}"
    ); // R-OPS-4 lag
    // The stream.
    let st = row(&dom, r#"id="stream-orders""#);
    assert!(st.contains("orders.#"), "{st}");
    // The dead-letter entry, with its reason, error and redrive button (R-OPS-4).
    let e = row(&dom, &format!(r#"class="dlq-entry" data-id="{dead_id}""#));
    assert!(e.contains("rejected") && e.contains("card declined"), "{e}"); // R-OPS-4
    assert!(e.contains("order-0") && e.contains("customer: c-0"), "{e}");
    assert!(e.contains(r#"class="redrive""#), "{e}");

    let shot = profile.path().join("dashboard.png");
    run(
        &browser,
        profile.path(),
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1500,900",
        ],
        &w.server.url(),
    );
    let png = std::fs::read(&shot).expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");

    // Redrive through the API: the entry leaves the DLQ, is delivered, and the page shows it.
    let r = post(
        w.addr(),
        &format!("/api/subscriptions/{billing}/dead-letters/redrive"),
        &format!(r#"{{"ids":["{dead_id}"]}}"#),
    );
    assert_eq!(
        (r.status, r.json()["accepted"].as_u64()),
        (200, Some(1)),
        "{r:?}"
    );
    w.broker.run_until_idle();
    let dom = run(
        &browser,
        profile.path(),
        &["--dump-dom"],
        &format!("{}?dlq={billing}", w.server.url()),
    );
    assert!(
        dom.contains(r#"data-loaded="true""#),
        "the page never loaded:\n{dom}"
    );
    assert!(!dom.contains(&dead_id), "the redriven entry is still shown"); // R-OPS-4
    assert!(dom.contains(r#"id="dlq-empty""#), "no empty DLQ notice"); // R-OPS-4
    let b = row(&dom, &format!(r#"id="sub-{billing}""#));
    assert!(b.contains(r#"data-dlq="0""#), "{b}"); // R-OPS-4
    assert!(b.contains(r#"data-delivered="5""#), "{b}"); // R-OPS-4: redriven and delivered
}

#[test]
fn the_dashboard_shows_a_durable_subscriptions_durable_dead_letters() {
    let Some(browser) = browser() else {
        let required = std::env::var("TIDINGS_REQUIRE_BROWSER").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "TIDINGS_REQUIRE_BROWSER=1 but no chromium-headless-shell was found"
        );
        eprintln!("NOTICE: durable dashboard browser test skipped: no chromium-headless-shell");
        return;
    };
    let w = World::start(AdminConfig::new().enable_actions(TOKEN));
    w.failing.store(false, Ordering::SeqCst);
    // A durable subscription that rejects every refund: its entry lands in its durable log.
    let refunds = w
        .broker
        .subscribe(
            DurableSpec::new("orders")
                .name("refunds")
                .filter("orders.refund"),
            tidings::SubscribeOptions::default(),
            |_: &Message| Err::<(), _>(tidings::HandlerError::reject("refund window closed")),
        )
        .unwrap();
    w.broker
        .publish(Message::to("orders.refund").payload("refund-7"))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let dead = loop {
        w.broker.run_until_idle();
        let dead = refunds.durable_dead_letters().unwrap();
        if !dead.is_empty() {
            break dead;
        }
        assert!(Instant::now() < deadline, "no durable dead letter in 30 s");
        std::thread::sleep(Duration::from_millis(5));
    };
    let dead_id = dead[0].message.id().to_string();
    let offset = dead[0].message.offset().unwrap();
    let id = refunds.id().get();
    let profile = tempfile::tempdir().unwrap();
    let url = format!("{}?dlq={id}", w.server.url());

    let dom = run(&browser, profile.path(), &["--dump-dom"], &url);
    assert!(
        dom.contains(r#"data-loaded="true""#),
        "the page never loaded:\n{dom}"
    );
    let e = row(&dom, &format!(r#"class="dlq-entry" data-id="{dead_id}""#));
    assert!(e.contains(r#"data-durable="true""#), "{e}"); // R-OPS-4 the durable log's entry
    assert!(e.contains(&format!("durable @{offset}")), "{e}"); // R-DEL-4 its stream offset
    assert!(
        e.contains("rejected") && e.contains("refund window closed"),
        "{e}"
    ); // R-OPS-4
    assert!(
        e.contains("refund-7") && e.contains(r#"class="redrive""#),
        "{e}"
    );

    // Redrive it through the API: out of the durable log, and the page shows that.
    let r = post(
        w.addr(),
        &format!("/api/subscriptions/{id}/dead-letters/redrive"),
        &format!(r#"{{"ids":["{dead_id}"]}}"#),
    );
    assert_eq!(
        (r.status, r.json()["accepted"].as_u64()),
        (200, Some(1)),
        "{r:?}"
    );
    let dom = run(&browser, profile.path(), &["--dump-dom"], &url);
    assert!(
        dom.contains(r#"data-loaded="true""#),
        "the page never loaded:\n{dom}"
    );
    // The copy waits in the stream (the manual driver has not run): the log is empty.
    assert!(!dom.contains(&dead_id), "the redriven entry is still shown"); // R-OPS-4
    assert!(dom.contains(r#"id="dlq-empty""#), "no empty DLQ notice"); // R-OPS-4
    assert!(refunds.durable_dead_letters().unwrap().is_empty()); // R-DEL-4
    drop(refunds);
}

/// The element that starts with `<tag` and contains `marker` in its attributes, up to its
/// closing tag, as text.
fn element<'a>(dom: &'a str, tag: &str, marker: &str) -> &'a str {
    let at = dom
        .find(marker)
        .unwrap_or_else(|| panic!("{marker} is not in the page:\n{dom}"));
    let start = dom[..at].rfind(&format!("<{tag}")).unwrap();
    let end = at + dom[at..].find(&format!("</{tag}>")).unwrap();
    &dom[start..end]
}

/// The value of attribute `name` of the first element in `text` that has it.
fn attr<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let at = text.find(&key)? + key.len();
    Some(&text[at..at + text[at..].find('"')?])
}

/// A number attribute of the first element in `text` that has it.
fn number(text: &str, name: &str) -> f64 {
    attr(text, name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no number {name} in {text}"))
}

/// The `<path>` of chart series `key` in a chart card.
fn series<'a>(card: &'a str, key: &str) -> &'a str {
    let marker = format!(r#"data-series="{key}" data-points="#);
    let at = card
        .find(&marker)
        .unwrap_or_else(|| panic!("no {key} series in {card}"));
    let start = card[..at].rfind("<path").unwrap();
    &card[start..at + card[at..].find('>').unwrap()]
}

#[test]
fn the_dashboard_charts_each_subscriptions_rates_depth_and_lag_while_messages_flow() {
    let Some(browser) = browser() else {
        let required = std::env::var("TIDINGS_REQUIRE_BROWSER").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "TIDINGS_REQUIRE_BROWSER=1 but no chromium-headless-shell was found"
        );
        eprintln!("NOTICE: dashboard chart browser test skipped: no chromium-headless-shell");
        return;
    };
    // A live broker (thread driver, system clock): `fast` takes every order, `flaky` fails
    // every 4th order once (redelivered) and rejects every 10th (dead-lettered), `ship`
    // reads the orders stream durably, 1 ms per order (lag).
    let dir = tempfile::tempdir().unwrap();
    let broker = tidings::Broker::builder()
        .data_dir(dir.path())
        .build()
        .unwrap();
    broker
        .create_stream(tidings::StreamConfig::new("orders", ["orders.#"]))
        .unwrap();
    let named = |name: &str| {
        tidings::SubscribeOptions::new()
            .name(name)
            .capacity(100_000)
    };
    let fast = broker
        .subscribe("orders.*", named("fast"), |_: &Message| {
            Ok::<(), tidings::HandlerError>(())
        })
        .unwrap();
    let retried = std::sync::Mutex::new(std::collections::HashSet::new());
    let flaky = broker
        .subscribe(
            "orders.*",
            named("flaky").retry(tidings::Retry::fixed(Duration::from_millis(1), 3)),
            move |m: &Message| {
                let n: u64 = m.header("n").and_then(|v| v.parse().ok()).unwrap_or(0);
                if n.is_multiple_of(10) {
                    return Err(tidings::HandlerError::reject("flagged"));
                }
                if n % 4 == 1 && retried.lock().unwrap().insert(n) {
                    return Err(tidings::HandlerError::retry("gateway timeout"));
                }
                Ok(())
            },
        )
        .unwrap();
    let ship = broker
        .subscribe(
            DurableSpec::new("orders")
                .name("ship")
                .filter("orders.created")
                .start(tidings::StartAt::Earliest),
            named("ship"),
            |_: &Message| {
                std::thread::sleep(Duration::from_millis(1));
                Ok::<(), tidings::HandlerError>(())
            },
        )
        .unwrap();
    let server = tidings_admin::AdminServer::start(
        broker.clone(),
        AdminConfig::new().bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0))),
    )
    .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publisher = {
        let (broker, stop) = (broker.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                broker
                    .publish(Message::to("orders.created").header("n", n.to_string()))
                    .unwrap();
                std::thread::sleep(Duration::from_micros(500));
            }
            n
        })
    };
    // Traffic is flowing before the page opens.
    let deadline = Instant::now() + Duration::from_secs(30);
    while fast.stats().delivered < 50 || ship.lag() == 0 && ship.stats().delivered < 50 {
        assert!(Instant::now() < deadline, "no traffic in 30 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    let before = broker.snapshot();
    let profile = tempfile::tempdir().unwrap();
    // Poll every 200 ms (of the browser's virtual time): about 40 snapshots.
    let url = format!("{}?poll=200", server.url());
    let dom = run_for(&browser, profile.path(), 8000, &["--dump-dom"], &url);
    assert!(
        dom.contains(r#"data-loaded="true""#),
        "the page never loaded:\n{dom}"
    );
    let polls = number(element(&dom, "body", "data-polls="), "data-polls");
    assert!(polls >= 5.0, "only {polls} polls"); // R-OPS-4 live: it polls

    for s in &before.subscriptions {
        // One chart card per subscription, with a sample per poll (R-OPS-4).
        let card = element(&dom, "figure", &format!(r#"id="chart-{}""#, s.id));
        assert!(card.contains(&format!(">{}<", s.name)), "{card}");
        assert!(
            card.contains(r#"role="img""#) && card.contains("aria-label="),
            "{card}"
        );
        let samples = number(card, "data-samples");
        assert!(samples >= 3.0, "{}: {samples} samples\n{card}", s.name);
        for key in ["offered", "delivered", "redelivered", "dead", "depth"] {
            let path = series(card, key);
            // Rates are never negative; each series has a point per interval.
            assert!(number(path, "data-min") >= 0.0, "{}: {path}", s.name);
            assert!(number(path, "data-points") >= 2.0, "{}: {path}", s.name);
        }
        assert_eq!(
            card.contains(r#"data-series="lag" data-points="#),
            s.durable.is_some(),
            "{card}"
        ); // a lag chart for a durable subscription only
    }
    // While traffic runs, messages are published to and delivered by `fast` at a non-zero
    // rate, and its counts grew while the page watched.
    let card = element(
        &dom,
        "figure",
        &format!(r#"id="chart-{}""#, fast.id().get()),
    );
    assert!(number(series(card, "offered"), "data-max") > 0.0, "{card}");
    assert!(
        number(series(card, "delivered"), "data-max") > 0.0,
        "{card}"
    );
    let row = row(&dom, &format!(r#"id="sub-{}""#, fast.id().get()));
    let shown = number(row, "data-delivered");
    let was = before
        .subscription(fast.id().get())
        .unwrap()
        .counters
        .delivered;
    assert!(shown > was as f64, "delivered {shown}, before {was}");
    // `flaky` redelivers and dead-letters while it runs: those counts are charted too.
    let card = element(
        &dom,
        "figure",
        &format!(r#"id="chart-{}""#, flaky.id().get()),
    );
    assert!(number(series(card, "dead"), "data-max") > 0.0, "{card}");
    let card = element(
        &dom,
        "figure",
        &format!(r#"id="chart-{}""#, ship.id().get()),
    );
    assert!(number(series(card, "lag"), "data-points") >= 2.0, "{card}");

    // A picture of the moving charts, under target/.
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-charts.png");
    let _ = std::fs::remove_file(&shot);
    run_for(
        &browser,
        profile.path(),
        8000,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1500,1250",
        ],
        &url,
    );
    let png = std::fs::read(&shot).expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    eprintln!("screenshot: {}", shot.display());
    if std::env::var("TIDINGS_SAVE_SCREENSHOT").is_ok_and(|v| v == "1") {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/dashboard.png");
        std::fs::write(&docs, &png).unwrap();
        eprintln!("wrote {}", docs.display());
    }
    stop.store(true, Ordering::SeqCst);
    assert!(publisher.join().unwrap() > 0);
    server.shutdown();
    drop((fast, flaky, ship));
    broker.close(Duration::from_secs(5));
}

/// One subscription of a scripted snapshot: the figures the page reads.
fn scripted_sub(id: u64, name: &str, delivered: u64, queued: u64) -> serde_json::Value {
    serde_json::json!({
        "id": id, "name": name, "pattern": "orders.*", "kind": "buffered",
        "options": {"capacity": 100, "overflow": "reject", "retry": "none", "concurrency": "serial"},
        "counters": {
            "offered": delivered + queued, "accepted": delivered + queued, "refused": {},
            "delivered": delivered, "dead_lettered": {"rejected": delivered / 10},
            "queued": queued, "in_flight": 0, "attempts": delivered, "failures": 0,
            "redelivered": delivered / 5, "blocked_publishers": 0
        },
        "depth_by_priority": [0, queued, 0, 0], "oldest_age_ms": null,
        "dead_letters": {"len": 0, "by_reason": {}, "evicted": 0}, "durable": null
    })
}

/// Serve the dashboard page with `/api/snapshot` answering `script` in order (then its last
/// entry again and again), on a loopback port of its own; its URL.
fn scripted_server(script: Vec<serde_json::Value>) -> String {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut next = 0;
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut request = String::new();
            if reader.read_line(&mut request).is_err() {
                continue;
            }
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let path = request.split(' ').nth(1).unwrap_or("/");
            let (kind, body) = if path == "/" || path.starts_with("/?") {
                (
                    "text/html",
                    include_str!("../src/dashboard.html").to_owned(),
                )
            } else if path == "/api/snapshot" {
                let s = &script[next.min(script.len() - 1)];
                next += 1;
                ("application/json", s.to_string())
            } else if path == "/api/info" {
                (
                    "application/json",
                    r#"{"actions_enabled":false}"#.to_owned(),
                )
            } else {
                ("application/json", r#"{"error":"not_found"}"#.to_owned())
            };
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

#[test]
fn the_charts_survive_counter_resets_and_subscriptions_that_come_and_go() {
    let Some(browser) = browser() else {
        let required = std::env::var("TIDINGS_REQUIRE_BROWSER").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "TIDINGS_REQUIRE_BROWSER=1 but no chromium-headless-shell was found"
        );
        eprintln!("NOTICE: scripted chart browser test skipped: no chromium-headless-shell");
        return;
    };
    // One snapshot a second (the broker's clock): alpha delivers 10 a second, its counters
    // reset between the 4th and 5th snapshot (delivered 30 -> 2); beta is gone from the
    // 6th on, when gamma appears.
    let alpha = [0, 10, 20, 30, 2, 12, 22];
    let script: Vec<serde_json::Value> = (0..7)
        .map(|i| {
            let mut subs = vec![scripted_sub(1, "alpha", alpha[i], i as u64)];
            if i < 5 {
                subs.push(scripted_sub(2, "beta", 100 * i as u64, 0));
            } else {
                subs.push(scripted_sub(3, "gamma", 7 * i as u64, 1));
            }
            serde_json::json!({
                "taken_at_ms": 1_700_000_000_000u64 + 1000 * i as u64,
                "driver": "manual", "closed": false, "scheduled": 0,
                "subscriptions": subs, "streams": []
            })
        })
        .collect();
    let url = scripted_server(script);
    let profile = tempfile::tempdir().unwrap();
    // `poll=1` is below the floor: the page polls every 100 ms instead.
    let dom = run_for(
        &browser,
        profile.path(),
        4000,
        &["--dump-dom"],
        &format!("{url}?poll=1"),
    );
    assert!(
        dom.contains(r#"data-loaded="true""#),
        "the page never loaded:\n{dom}"
    );
    assert!(number(element(&dom, "body", "data-polls="), "data-polls") >= 8.0);
    assert!(dom.contains("a sample every 0.1 s"), "poll not clamped"); // bounded ?poll

    // alpha: 7 samples, one reset; no rate is drawn across it (two segments, 10/s each).
    let a = element(&dom, "figure", r#"id="chart-1""#);
    assert_eq!(attr(a, "data-samples"), Some("7"), "{a}");
    assert_eq!(attr(a, "data-resets"), Some("1"), "{a}");
    let d = series(a, "delivered");
    assert_eq!(
        (
            attr(d, "data-points"),
            attr(d, "data-segments"),
            attr(d, "data-min"),
            attr(d, "data-max")
        ),
        (Some("5"), Some("2"), Some("10"), Some("10")),
        "{d}"
    );
    assert_eq!(attr(series(a, "depth"), "data-points"), Some("7"), "{a}");
    // beta is gone, card and row; gamma appeared with its own, fresh ring.
    assert!(!dom.contains(r#"id="chart-2""#) && !dom.contains(r#"id="sub-2""#));
    let g = element(&dom, "figure", r#"id="chart-3""#);
    assert_eq!(attr(g, "data-samples"), Some("2"), "{g}");
    assert_eq!(attr(series(g, "delivered"), "data-max"), Some("7"), "{g}");
    assert!(!g.contains(r#"data-series="lag" data-points="#), "{g}");
}
