//! The admin API on a durable subscription's durable dead-letter log (R-OPS-4, R-DEL-4):
//! list, redrive and purge through the same endpoints as the in-memory DLQ, loss-safe.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{TOKEN, get, post, request};
use tidings::{
    Broker, Driver, DurableSpec, DurableSubscription, HandlerError, ManualClock, Message,
    StreamConfig, SubscribeOptions,
};
use tidings_admin::{AdminConfig, AdminServer};

struct World {
    broker: Broker,
    failing: Arc<AtomicBool>,
    delivered: Arc<Mutex<Vec<String>>>,
    pay: DurableSubscription,
    server: AdminServer,
    _dir: tempfile::TempDir,
}

impl World {
    /// A manual-driver broker with stream `orders` and durable subscription `pay`, which
    /// rejects what it gets while `failing` is set.
    fn start() -> World {
        let dir = tempfile::tempdir().unwrap();
        let broker = Broker::builder()
            .driver(Driver::Manual)
            .clock(ManualClock::new())
            .data_dir(dir.path())
            .build()
            .unwrap();
        broker
            .create_stream(StreamConfig::new("orders", ["orders.#"]))
            .unwrap();
        let failing = Arc::new(AtomicBool::new(true));
        let delivered = Arc::new(Mutex::new(Vec::new()));
        let (f, d) = (failing.clone(), delivered.clone());
        let pay = broker
            .subscribe(
                DurableSpec::new("orders").name("pay").filter("orders.*"),
                SubscribeOptions::default(),
                move |m: &Message| {
                    if f.load(Ordering::SeqCst) {
                        return Err(HandlerError::reject("card declined"));
                    }
                    d.lock().unwrap().push(m.id().to_string());
                    Ok(())
                },
            )
            .unwrap();
        let server = AdminServer::start(
            broker.clone(),
            AdminConfig::new()
                .enable_actions(TOKEN)
                .bind(SocketAddr::from(([127, 0, 0, 1], 0))),
        )
        .unwrap();
        World {
            broker,
            failing,
            delivered,
            pay,
            server,
            _dir: dir,
        }
    }

    fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    fn path(&self, tail: &str) -> String {
        format!("/api/subscriptions/{}/{tail}", self.pay.id().get())
    }

    /// Publish orders `from..to` and run until their durable DLQ appends (or deliveries)
    /// are done.
    fn orders(&self, from: usize, to: usize, dead: usize) {
        for i in from..to {
            self.broker
                .publish(
                    Message::to("orders.created")
                        .payload(format!("order-{i}"))
                        .header("customer", format!("c-{i}")),
                )
                .unwrap();
        }
        self.settle(|| self.durable_len() == dead);
    }

    fn durable_len(&self) -> usize {
        self.pay.durable_dead_letters().unwrap().len()
    }

    /// Run the manual driver until `done` holds (bounded).
    fn settle(&self, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            self.broker.run_until_idle();
            if done() {
                return;
            }
            assert!(Instant::now() < deadline, "did not settle in 30 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

#[test]
fn durable_dead_letters_are_listed_redriven_and_purged_through_the_admin_api() {
    let w = World::start();
    w.orders(0, 3, 3);
    let ids: Vec<String> = w
        .pay
        .durable_dead_letters()
        .unwrap()
        .iter()
        .map(|e| e.message.id().to_string())
        .collect();

    // List: the durable log's entries, with their stream offsets.
    let page = get(w.addr(), &w.path("dead-letters?offset=0&limit=10"));
    assert_eq!(page.status, 200, "{}", page.body);
    let p = page.json();
    assert_eq!(p["total"], 3); // R-OPS-4 durable DLQ listed
    assert_eq!(p["by_reason"]["rejected"], 3); // R-OPS-4
    let entries = p["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 3);
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e["durable"], true); // R-OPS-4, R-DEL-4 the durable log, not the in-memory copy
        assert_eq!(e["id"], ids[i]);
        assert_eq!(e["stream_offset"], i as u64); // R-DEL-4 offset in the stream
        assert_eq!(e["payload_preview"], format!("order-{i}"));
        assert_eq!(e["reason"], "rejected");
        assert_eq!(e["last_error"], "card declined"); // R-OPS-4 last error
        assert_eq!(e["attempts"], 1);
    }

    // Without the token: 401, and the durable log is unchanged.
    let r = request(
        w.addr(),
        "POST",
        &w.path("dead-letters/redrive"),
        None,
        Some(r#"{"all":true}"#),
    );
    assert_eq!(r.status, 401);
    let r = request(
        w.addr(),
        "POST",
        &w.path("dead-letters/purge"),
        Some("Bearer wrong"),
        Some(""),
    );
    assert_eq!(r.status, 401);
    assert_eq!(w.durable_len(), 3); // R-OPS-4 nothing changed

    // Redrive one entry: appended to the stream, then out of the log; delivered once.
    w.failing.store(false, Ordering::SeqCst);
    let end_before = w.broker.snapshot().streams[0].end_offset;
    let body = format!(r#"{{"ids":["{}"]}}"#, ids[1]);
    let r = post(w.addr(), &w.path("dead-letters/redrive"), &body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["accepted"], 1); // R-OPS-4
    assert_eq!(w.broker.snapshot().streams[0].end_offset, end_before + 1); // R-DEL-4 appended again
    w.settle(|| w.delivered.lock().unwrap().len() == 1);
    assert_eq!(*w.delivered.lock().unwrap(), vec![ids[1].clone()]); // R-DEL-4 redelivered
    let left: Vec<String> = w
        .pay
        .durable_dead_letters()
        .unwrap()
        .iter()
        .map(|e| e.message.id().to_string())
        .collect();
    assert_eq!(left, vec![ids[0].clone(), ids[2].clone()]); // R-OPS-4 only that one left
    let snap = w.broker.snapshot();
    let sub = snap.subscription(w.pay.id().get()).unwrap();
    assert_eq!(sub.dead_letters.len, 2); // the in-memory copy went with it
    // The same entry again: gone.
    let r = post(w.addr(), &w.path("dead-letters/redrive"), &body);
    assert_eq!((r.status, r.error()), (409, "gone".to_owned())); // R-OPS-4

    // Two concurrent redrives of all: each entry appended once, none lost.
    let (addr, path) = (w.addr(), w.path("dead-letters/redrive"));
    let racers: Vec<_> = (0..2)
        .map(|_| {
            let path = path.clone();
            std::thread::spawn(move || post(addr, &path, r#"{"all":true}"#))
        })
        .collect();
    let accepted: u64 = racers
        .into_iter()
        .map(|t| {
            let a = t.join().unwrap();
            assert_eq!(a.status, 200, "{}", a.body);
            a.json()["accepted"].as_u64().unwrap()
        })
        .sum();
    assert_eq!(accepted, 2); // R-OPS-4 no duplicate, no loss
    w.settle(|| w.delivered.lock().unwrap().len() == 3);
    let mut got = w.delivered.lock().unwrap().clone();
    got.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(got, want); // R-DEL-4 each exactly once
    assert_eq!(w.durable_len(), 0);

    // Purge: drains the durable log (durably) and the in-memory copies.
    w.failing.store(true, Ordering::SeqCst);
    w.orders(3, 5, 2);
    let r = post(w.addr(), &w.path("dead-letters/purge"), "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["purged"], 2); // R-OPS-4 purge
    assert_eq!(w.durable_len(), 0); // R-DEL-4 drained
    let p = get(w.addr(), &w.path("dead-letters")).json();
    assert_eq!(p["total"], 0);
    let snap = w.broker.snapshot();
    assert_eq!(
        snap.subscription(w.pay.id().get())
            .unwrap()
            .dead_letters
            .len,
        0
    );
}
