//! The dashboard in a real browser (R-OPS-4, issue 13 test 1): Debian's
//! `chromium-headless-shell` loads the page from a live admin server and the test asserts
//! on the rendered DOM (`--dump-dom`) after the page's own JavaScript ran.
//!
//! The browser is `$TIDINGS_CHROMIUM`, else `chromium-headless-shell` on `PATH`, else
//! `/usr/lib/chromium/chromium-headless-shell`. Without one the test prints a notice and
//! passes, unless `TIDINGS_REQUIRE_BROWSER=1` (CI sets it), which makes it fail.
//! `TIDINGS_SAVE_SCREENSHOT=1` also writes the screenshot to `docs/dashboard.png`.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
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
    let mut child = Command::new(browser)
        .args([
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--no-first-run",
            "--hide-scrollbars",
            // Lets the page's JavaScript run (fetches, timers) before the dump.
            "--virtual-time-budget=4000",
        ])
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
            Some(status) => {
                assert!(status.success(), "the browser exited with {status}");
                break;
            }
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the browser did not finish within 90 s");
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    reader.join().unwrap().expect("the browser's output")
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
    if std::env::var("TIDINGS_SAVE_SCREENSHOT").is_ok_and(|v| v == "1") {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/dashboard.png");
        std::fs::write(&docs, &png).unwrap();
        eprintln!("wrote {}", docs.display());
    }

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
        .subscribe_durable(
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
