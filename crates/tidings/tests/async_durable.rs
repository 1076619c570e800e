//! Async handlers on durable subscriptions of the embedded log (R-EXE-3), through the one
//! `Broker::subscribe` (R-PAT-2): the handler's future is awaited by the tokio driver, and
//! the durable rules hold around the await — the commit waits for the future to complete,
//! a failure is retried in place before the messages behind it, a rejection is stored in
//! the durable DLQ and committed past, per-key order holds, the counters are conserved, and
//! a restart resumes at the commit.
//!
//! Every wait is bounded and every assertion is about order, positions and counters, never
//! about time. The whole conformance suite also runs its durable cases with async handlers
//! (`tidings-testkit`, the `tokio_async` module of `tests/conformance.rs`).
#![cfg(feature = "tokio")]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tidings::{
    Broker, Concurrency, DeadLetterReason, Driver, DurableSpec, HandlerError, Message, Retry,
    StreamConfig, StreamError, StreamErrorKind, SubscribeError, SubscribeOptions,
};
use tidings_testkit::helpers::{text, wait_until};

/// Generous bound on every wait (never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(60);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A tokio-driver broker on the embedded log in `dir`, with the stream `orders` open.
fn broker(rt: &tokio::runtime::Runtime, dir: &std::path::Path) -> Broker {
    let broker = Broker::builder()
        .driver(Driver::Tokio(rt.handle().clone()))
        .data_dir(dir)
        .build()
        .expect("valid configuration");
    broker
        .create_stream(StreamConfig::new("orders", ["orders.#"]))
        .expect("the stream opens");
    broker
}

fn publish(broker: &Broker, key: &str, payload: &str) {
    let report = broker
        .publish(
            Message::to("orders.created")
                .key(key)
                .payload(payload.to_owned()),
        )
        .expect("published");
    assert_eq!(report.streams, ["orders"]);
}

/// Payloads the handler finished with `Ok`, in the order it finished them.
#[derive(Clone, Default)]
struct Done(Arc<Mutex<Vec<String>>>);

impl Done {
    fn push(&self, m: &Message) {
        self.0.lock().push(text(m));
    }
    fn list(&self) -> Vec<String> {
        self.0.lock().clone()
    }
    fn len(&self) -> usize {
        self.0.lock().len()
    }
}

// R-EXE-3, R-LOG-3: the commit of a durable subscription waits for the async handler's
// future — a message whose future is pending holds the commit, whatever finished behind
// it never passes it — and every message is committed once its future completes.
#[test]
fn an_async_handler_on_the_embedded_log_commits_only_completed_futures() {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let broker = broker(&rt, dir.path());
    for i in 0..6 {
        publish(&broker, "k", &format!("m{i}"));
    }
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let started = Arc::new(AtomicBool::new(false));
    let done = Done::default();
    let (g, s, d) = (gate.clone(), started.clone(), done.clone());
    let sub = broker
        .subscribe(
            DurableSpec::new("orders").name("billing"),
            SubscribeOptions::default(),
            move |m: Arc<Message>| {
                let (g, s, d) = (g.clone(), s.clone(), d.clone());
                async move {
                    if text(&m) == "m2" {
                        s.store(true, Ordering::SeqCst);
                        // Pending until the test lets it go: the future is suspended here.
                        g.acquire().await.expect("the gate stays open").forget();
                    }
                    d.push(&m);
                    Ok::<(), HandlerError>(())
                }
            },
        )
        .expect("an async handler subscribes durably under the tokio driver");
    wait_until("m2's future is pending", PATIENCE, || {
        started.load(Ordering::SeqCst) && sub.committed() == 2
    });
    // One dispatcher: nothing behind m2 has run, and the commit stops below it (R-LOG-3).
    assert_eq!(done.list(), ["m0", "m1"]);
    assert_eq!(sub.committed(), 2); // R-EXE-3: not past the pending future
    assert_eq!(sub.stats().in_flight, 1);
    gate.add_permits(1);
    wait_until("all six committed", PATIENCE, || sub.committed() == 6);
    assert_eq!(done.list(), ["m0", "m1", "m2", "m3", "m4", "m5"]); // R-ORD-1
    assert_eq!(sub.lag(), 0); // R-BP-3
    let stats = sub.stats();
    assert_eq!(stats.delivered, 6);
    assert!(stats.is_conserved()); // R-DEL-6
    drop(sub);
    assert!(broker.close(Duration::from_secs(10)).is_clean()); // R-CORE-6
}

// R-EXE-3, R-DEL-1, R-DEL-3, R-DEL-4, R-LOG-3: an async handler's failure is retried in
// place (the messages behind it wait), a rejection goes to the durable DLQ with its
// reason, a panic inside the future is caught and retried; the commit passes the
// dead-lettered message; after a restart the subscription resumes at the commit and the
// durable DLQ still holds the entry.
#[test]
fn an_async_handler_on_the_embedded_log_retries_in_place_dead_letters_and_resumes() {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let broker = broker(&rt, dir.path());
    for p in ["ok-0", "flaky-1", "rej-2", "panic-3", "ok-4"] {
        publish(&broker, "k", p);
    }
    let done = Done::default();
    let attempts = Arc::new(AtomicU32::new(0));
    let panicked = Arc::new(AtomicBool::new(false));
    let handler = {
        let (d, a, p) = (done.clone(), attempts.clone(), panicked.clone());
        move |m: Arc<Message>| {
            let (d, a, p) = (d.clone(), a.clone(), p.clone());
            async move {
                tokio::task::yield_now().await;
                let t = text(&m);
                if t == "flaky-1" && a.fetch_add(1, Ordering::SeqCst) < 2 {
                    return Err(HandlerError::retry("not yet"));
                }
                if t == "rej-2" {
                    return Err(HandlerError::reject("bad order"));
                }
                if t == "panic-3" && !p.swap(true, Ordering::SeqCst) {
                    panic!("once");
                }
                d.push(&m);
                Ok(())
            }
        }
    };
    let options = || SubscribeOptions::new().retry(Retry::fixed(Duration::from_millis(1), 5));
    let sub = broker
        .subscribe(
            DurableSpec::new("orders").name("billing"),
            options(),
            handler.clone(),
        )
        .expect("subscribed");
    wait_until("every message finished and committed", PATIENCE, || {
        sub.committed() == 5
    });
    // Retried in place: flaky-1 before everything behind it (R-DEL-3, R-ORD-1).
    assert_eq!(done.list(), ["ok-0", "flaky-1", "panic-3", "ok-4"]);
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    let stats = sub.stats();
    // Two errors, the rejection and one caught panic (R-DEL-1).
    assert_eq!(stats.failures, 4);
    assert_eq!(stats.attempts, 8); // five first attempts, three retries
    assert_eq!(stats.dead_lettered.rejected, 1);
    assert!(stats.is_conserved()); // R-DEL-6
    let dead = sub.durable_dead_letters().expect("the durable DLQ reads");
    assert_eq!(dead.len(), 1);
    assert_eq!(text(&dead[0].message), "rej-2");
    assert_eq!(
        dead[0].reason,
        DeadLetterReason::Rejected {
            error: "bad order".into()
        }
    ); // R-DEL-4
    drop(sub);
    assert!(broker.close(Duration::from_secs(10)).is_clean());
    drop(broker);

    // A restart: the same name resumes at the commit, nothing is delivered twice, and the
    // dead letter is still stored (R-LOG-3, R-DEL-4).
    let broker = self::broker(&rt, dir.path());
    publish(&broker, "k", "ok-5");
    let sub = broker
        .subscribe(
            DurableSpec::new("orders").name("billing"),
            options(),
            handler,
        )
        .expect("subscribed again");
    wait_until("the new message committed", PATIENCE, || {
        sub.committed() == 6
    });
    assert_eq!(done.list(), ["ok-0", "flaky-1", "panic-3", "ok-4", "ok-5"]);
    assert_eq!(sub.durable_dead_letters().expect("reads").len(), 1);
    drop(sub);
    assert!(broker.close(Duration::from_secs(10)).is_clean());
}

// R-EXE-3, R-ORD-3: per-key concurrency with an async handler on a durable subscription:
// keys run at once (their futures overlap), each key's messages finish in publish order.
#[test]
fn an_async_handler_on_the_embedded_log_keeps_per_key_order() {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let broker = broker(&rt, dir.path());
    const N: usize = 40;
    for i in 0..N {
        publish(&broker, &format!("k{}", i % 4), &format!("{}:{i}", i % 4));
    }
    let done = Done::default();
    let d = done.clone();
    let sub = broker
        .subscribe(
            DurableSpec::new("orders").name("keyed"),
            SubscribeOptions::new()
                .concurrency(Concurrency::PerKey { max_in_flight: 4 })
                .capacity(16),
            move |m: Arc<Message>| {
                let d = d.clone();
                async move {
                    tokio::task::yield_now().await;
                    d.push(&m);
                    Ok::<(), HandlerError>(())
                }
            },
        )
        .expect("subscribed");
    wait_until("every message committed", PATIENCE, || {
        sub.committed() == N as u64
    });
    assert_eq!(done.len(), N);
    for key in 0..4 {
        let seq: Vec<usize> = done
            .list()
            .iter()
            .filter_map(|p| p.split_once(':'))
            .filter(|(k, _)| k.parse::<usize>() == Ok(key))
            .map(|(_, i)| i.parse().expect("a number"))
            .collect();
        assert!(seq.is_sorted(), "key {key} out of order: {seq:?}"); // R-ORD-3
        assert_eq!(seq.len(), N / 4);
    }
    assert!(sub.stats().is_conserved()); // R-DEL-6
    drop(sub);
    assert!(broker.close(Duration::from_secs(10)).is_clean());
}

// R-EXE-3, R-PAT-3: the async durable JSON cell — a typed async handler on a durable
// subscription; a payload that does not decode is dead-lettered `Rejected` durably and
// committed past, never retried.
#[cfg(feature = "serde")]
#[test]
fn a_typed_async_handler_on_the_embedded_log_decodes_and_rejects_bad_payloads() {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Order {
        id: u64,
    }
    let rt = runtime();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let broker = broker(&rt, dir.path());
    broker
        .publish(
            Message::to("orders.created")
                .json(&Order { id: 7 })
                .expect("encodes"),
        )
        .expect("published");
    publish(&broker, "k", "{\"id\": -1}");
    let ids = Arc::new(Mutex::new(Vec::new()));
    let seen = ids.clone();
    let sub = broker
        .subscribe(
            DurableSpec::new("orders").name("typed"),
            SubscribeOptions::new().retry(Retry::fixed(Duration::from_millis(1), 5)),
            tidings::json_handler(move |order: Order, _m: Arc<Message>| {
                let seen = seen.clone();
                async move {
                    tokio::task::yield_now().await;
                    seen.lock().push(order.id);
                    Ok::<(), HandlerError>(())
                }
            }),
        )
        .expect("subscribed");
    wait_until("both committed", PATIENCE, || sub.committed() == 2);
    assert_eq!(*ids.lock(), [7]);
    let dead = sub.durable_dead_letters().expect("reads");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].attempts, 1); // R-PAT-3: not retried
    assert!(matches!(dead[0].reason, DeadLetterReason::Rejected { .. }));
    drop(sub);
    assert!(broker.close(Duration::from_secs(10)).is_clean());
}

// R-EXE-3: under a driver that cannot await it, an async handler is refused at subscribe —
// on a durable target before the cursor opens, so the name stays free — with a typed
// error of kind `Unsupported`; a pattern target refuses it the same way.
#[test]
fn an_async_handler_is_refused_without_the_tokio_driver_and_the_name_stays_free() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let broker = Broker::builder()
        .driver(Driver::Thread)
        .data_dir(dir.path())
        .build()
        .expect("valid configuration");
    broker
        .create_stream(StreamConfig::new("orders", ["orders.#"]))
        .expect("the stream opens");
    let handler = |_m: Arc<Message>| async { Ok::<(), HandlerError>(()) };
    let err = broker
        .subscribe(
            DurableSpec::new("orders").name("billing"),
            SubscribeOptions::default(),
            handler,
        )
        .expect_err("refused");
    assert_eq!(err.kind(), StreamErrorKind::Unsupported);
    assert!(matches!(
        err,
        StreamError::Subscribe(SubscribeError::AsyncHandlerNeedsTokio)
    ));
    assert!(matches!(
        broker.subscribe("orders.*", SubscribeOptions::default(), handler),
        Err(SubscribeError::AsyncHandlerNeedsTokio)
    ));
    // Nothing was opened: the same name subscribes with a sync handler at once.
    let sub = broker
        .subscribe(
            DurableSpec::new("orders").name("billing"),
            SubscribeOptions::default(),
            |_m: &Message| Ok(()),
        )
        .expect("the name is free");
    assert_eq!(sub.committed(), 0);
    drop(sub);
    assert!(broker.close(Duration::from_secs(10)).is_clean());
}

// R-PAT-2: one `subscribe` takes every pattern spelling; the target decides the handle.
#[test]
fn one_subscribe_takes_every_pattern_spelling() {
    let broker = Broker::builder()
        .driver(Driver::Manual)
        .build()
        .expect("valid configuration");
    let owned = String::from("a.*");
    let pattern = tidings::Pattern::new("c.#").expect("a valid pattern");
    let subs = [
        broker.subscribe("x", SubscribeOptions::default(), |_: &Message| ()),
        broker.subscribe(&owned, SubscribeOptions::default(), |_: &Message| ()),
        broker.subscribe(owned.clone(), SubscribeOptions::default(), |_: &Message| ()),
        broker.subscribe(&pattern, SubscribeOptions::default(), |_: &Message| ()),
        broker.subscribe(
            pattern.clone(),
            SubscribeOptions::default(),
            |_: &Message| (),
        ),
    ]
    .map(|s| s.expect("subscribed"));
    assert_eq!(broker.subscriptions().len(), subs.len());
    assert!(matches!(
        broker.subscribe("a..b", SubscribeOptions::default(), |_: &Message| ()),
        Err(SubscribeError::InvalidPattern(_))
    ));
}
