//! Async handlers on JetStream durable subscriptions (R-EXE-3), through the one
//! `Broker::subscribe` (R-PAT-2), on a real `nats-server`: a plain durable subscription
//! (retry in place, dead letters with reasons stored durably, a caught panic, the commit,
//! a restart that resumes) and a keyed consumer group of two brokers (per-key order and the
//! start gate across a member joining). The handler's future is awaited by the tokio
//! driver; nothing here blocks a runtime thread to run it.
//!
//! The conformance suite also runs every durable case with async handlers on JetStream
//! (`tests/conformance.rs`, module `jetstream::tokio_async`). Every wait is bounded and
//! every assertion is about order, positions and counters, never about time.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidings::{
    Broker, Concurrency, DeadLetterReason, Driver, DurableSpec, HandlerError, Message, Retry,
    StreamConfig, SubscribeOptions,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

/// Generous bound on every wait (never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(120);

fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn text(m: &Message) -> String {
    String::from_utf8_lossy(m.payload()).into_owned()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A tokio-driver broker on JetStream with the stream `orders` open.
fn broker(server: &NatsServer, rt: &tokio::runtime::Runtime, ack_wait: Duration) -> Broker {
    let backend = JetStreamBackend::builder()
        .ack_wait(ack_wait)
        .connect(
            ConnectOptions::new(server.url())
                .connect_timeout(Duration::from_secs(5))
                .request_timeout(Duration::from_secs(5)),
        )
        .expect("connects to the test server");
    let broker = Broker::builder()
        .driver(Driver::Tokio(rt.handle().clone()))
        .durable_backend(Arc::new(backend))
        .build()
        .expect("valid configuration");
    broker
        .create_stream(StreamConfig::new("orders", ["orders.#"]))
        .expect("the stream opens");
    broker
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

// R-EXE-3, R-DIST-1: an async handler on a JetStream durable subscription has the
// guarantees of a sync one — a failure retried in place before the messages behind it
// (R-DEL-3, R-ORD-1), a rejection stored in the durable DLQ with its reason (R-DEL-4), a
// panic inside the future caught and retried (R-DEL-1), every message committed once
// its future completed (R-LOG-3), the counters conserved (R-DEL-6) — and a restart resumes
// with nothing delivered twice.
#[test]
fn an_async_handler_on_a_jetstream_durable_retries_in_place_dead_letters_and_resumes() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let rt = runtime();
    let broker = broker(&server, &rt, Duration::from_secs(5));
    for p in ["ok-0", "flaky-1", "rej-2", "panic-3", "ok-4"] {
        broker
            .publish(Message::to("orders.created").payload(p))
            .expect("published");
    }
    let done: Arc<Mutex<Vec<String>>> = Arc::default();
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
                lock(&d).push(t);
                Ok(())
            }
        }
    };
    let options = || SubscribeOptions::new().retry(Retry::fixed(Duration::from_millis(5), 5));
    let sub = broker
        .subscribe(
            DurableSpec::new("orders").name("billing"),
            options(),
            handler.clone(),
        )
        .expect("an async handler subscribes durably on JetStream");
    until("every message finished and committed", || {
        let s = sub.stats();
        s.delivered == 4 && s.dead_lettered.rejected == 1 && sub.lag() == 0
    });
    assert_eq!(*lock(&done), ["ok-0", "flaky-1", "panic-3", "ok-4"]); // R-DEL-3, R-ORD-1
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    let stats = sub.stats();
    assert_eq!((stats.attempts, stats.failures), (8, 4)); // R-DEL-1
    assert!(stats.is_conserved(), "{stats:?}"); // R-DEL-6
    let dead = sub.durable_dead_letters().expect("the durable DLQ reads");
    let dead: Vec<(String, DeadLetterReason)> = dead
        .iter()
        .map(|e| (text(&e.message), e.reason.clone()))
        .collect();
    assert_eq!(
        dead,
        [(
            "rej-2".to_owned(),
            DeadLetterReason::Rejected {
                error: "bad order".into()
            }
        )]
    ); // R-DEL-4
    drop(sub);
    assert!(broker.close(Duration::from_secs(10)).is_clean()); // R-CORE-6
    drop(broker);

    // A restart: the same durable name resumes after everything finished; only the new
    // message is delivered, and the dead letter is still stored (R-LOG-3, R-DEL-4).
    let broker = self::broker(&server, &rt, Duration::from_secs(5));
    broker
        .publish(Message::to("orders.created").payload("ok-5"))
        .expect("published");
    let sub = broker
        .subscribe(
            DurableSpec::new("orders").name("billing"),
            options(),
            handler,
        )
        .expect("subscribed again");
    until("the new message finished", || {
        sub.stats().delivered == 1 && sub.lag() == 0
    });
    assert_eq!(*lock(&done), ["ok-0", "flaky-1", "panic-3", "ok-4", "ok-5"]); // R-LOG-3: none twice, none lost
    assert_eq!(sub.durable_dead_letters().expect("reads").len(), 1); // R-DEL-4
    drop(sub);
    assert!(broker.close(Duration::from_secs(10)).is_clean());
}

/// One handler event in the shared log: `(what, member, key, seq)`, `what` being `S`
/// (started), `F` (failed) or `D` (done: succeeded).
type Event = (char, &'static str, u32, u32);

/// An async handler for member `who` of the keyed group: logs its start, yields to the
/// runtime (so the future is suspended while it holds its key), fails the first attempt of
/// every fifth message (retried in place), and logs its success.
fn member(who: &'static str, log: &Arc<Mutex<Vec<Event>>>) -> impl tidings::AsyncHandler {
    let log = log.clone();
    let failed: Arc<Mutex<std::collections::BTreeSet<(u32, u32)>>> = Arc::default();
    move |m: Arc<Message>| {
        let (log, failed) = (log.clone(), failed.clone());
        async move {
            let (key, seq) = text(&m)
                .split_once(':')
                .map(|(k, s)| (k.parse().expect("key"), s.parse().expect("seq")))
                .expect("key:seq");
            lock(&log).push(('S', who, key, seq));
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(1)).await;
            if seq % 5 == 0 && lock(&failed).insert((key, seq)) {
                lock(&log).push(('F', who, key, seq));
                return Err(HandlerError::retry("first attempt of every fifth"));
            }
            lock(&log).push(('D', who, key, seq));
            Ok::<(), HandlerError>(())
        }
    }
}

// R-EXE-3, R-DIST-6: async handlers in a JetStream keyed consumer group — two brokers
// sharing one durable name with per-key concurrency, the second joining mid-run so
// partitions move by hand-over. Per key, across both members: never two handlers at once,
// no start before every earlier message of the key succeeded (the start gate holds for
// async handlers as for sync ones), and every message succeeds.
#[test]
fn async_handlers_in_a_jetstream_keyed_group_keep_per_key_order_across_a_join() {
    // Enough keys to land on every one of the 16 key partitions (with 8, all of them can
    // hash to partitions the rendezvous gives member a, and b would never get work).
    const KEYS: u32 = 64;
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let rt = runtime();
    let ack_wait = Duration::from_secs(3);
    let (a, b) = (
        broker(&server, &rt, ack_wait),
        broker(&server, &rt, ack_wait),
    );
    let log: Arc<Mutex<Vec<Event>>> = Arc::default();
    let options = || {
        SubscribeOptions::new()
            .concurrency(Concurrency::PerKey { max_in_flight: 8 })
            .retry(Retry::fixed(Duration::from_millis(5), 1_000))
    };
    let spec = || DurableSpec::new("orders").name("keyed").filter("orders.#");
    let sub_a = a
        .subscribe(spec(), options(), member("a", &log))
        .expect("member a subscribes");
    let mut next = 0u32;
    let publish = |seq: u32| {
        for key in 0..KEYS {
            a.publish(
                Message::to("orders.created")
                    .key(format!("k{key}"))
                    .payload(format!("{key}:{seq}")),
            )
            .expect("published");
        }
    };
    for _ in 0..3 {
        publish(next);
        next += 1;
    }
    // Member b joins: the group hands partitions over to it. Keep publishing, a round per
    // key at a time, until b has handled something (bounded).
    let sub_b = b
        .subscribe(spec(), options(), member("b", &log))
        .expect("member b subscribes");
    let deadline = Instant::now() + PATIENCE;
    while !lock(&log).iter().any(|e| e.1 == "b" && e.0 == 'D') {
        assert!(
            Instant::now() < deadline,
            "member b never got a partition: a {:?}, b {:?}",
            sub_a.stats(),
            sub_b.stats()
        );
        publish(next);
        next += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    for _ in 0..3 {
        publish(next);
        next += 1;
    }
    let total = u64::from(KEYS * next);
    until("every message succeeded in the group", || {
        let successes: std::collections::BTreeSet<(u32, u32)> = lock(&log)
            .iter()
            .filter(|e| e.0 == 'D')
            .map(|e| (e.2, e.3))
            .collect();
        successes.len() as u64 == total
    });

    // The verdict, per key, over the one log both members wrote in one order.
    let events = lock(&log).clone();
    let mut running: BTreeMap<u32, Option<(&str, u32)>> = BTreeMap::new();
    let mut succeeded: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    let mut spread: BTreeMap<&str, usize> = BTreeMap::new();
    for (what, who, key, seq) in &events {
        let slot = running.entry(*key).or_default();
        // The key's successes so far: always exactly 0..n (checked as they come).
        let ok = succeeded.entry(*key).or_default();
        match what {
            'S' => {
                assert!(
                    slot.is_none(),
                    "key {key}: {who} started {seq} while {slot:?} ran"
                ); // R-DIST-6: one handler per key at a time
                // R-DIST-6: no start before every earlier message of the key succeeded.
                assert!(
                    *seq as usize <= ok.len(),
                    "key {key}: {who} started {seq}, but only 0..{} had succeeded",
                    ok.len()
                );
                *slot = Some((*who, *seq));
            }
            _ => {
                assert_eq!(
                    *slot,
                    Some((*who, *seq)),
                    "key {key}: an end without its start"
                );
                *slot = None;
                if *what == 'D' {
                    if *seq as usize == ok.len() {
                        ok.push(*seq);
                    }
                    *spread.entry(*who).or_default() += 1;
                }
            }
        }
    }
    for (key, seqs) in &succeeded {
        let want: Vec<u32> = (0..next).collect();
        assert_eq!(
            seqs, &want,
            "key {key}: first successes out of publish order"
        ); // R-ORD-3
    }
    eprintln!("keyed group with async handlers: successes per member {spread:?}");
    assert!(spread.get("b").copied().unwrap_or(0) > 0);
    for s in [&sub_a, &sub_b] {
        assert!(s.stats().is_conserved(), "{:?}", s.stats()); // R-DEL-6
    }
    drop((sub_a, sub_b));
    assert!(a.close(Duration::from_secs(10)).unjoined.is_empty());
    assert!(b.close(Duration::from_secs(10)).unjoined.is_empty());
}
