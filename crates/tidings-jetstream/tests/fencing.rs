//! Keyed groups and durable names under ordinary trouble (R-DIST-8): a stalled server, two
//! groups whose names escape alike. Real nats-server, the public API only.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidings::{
    Broker, Concurrency, DurableSpec, Message, MessageBuilder, StreamConfig, StreamError,
    SubscribeOptions,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

/// Generous bound on every wait (never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(120);

fn broker(url: &str, ack_wait: Duration) -> Broker {
    let backend = JetStreamBackend::builder()
        .ack_wait(ack_wait)
        .connect(
            ConnectOptions::new(url)
                .connect_timeout(Duration::from_secs(5))
                .request_timeout(Duration::from_secs(5))
                .name("tidings-fencing-test"),
        )
        .expect("connects to the test server");
    Broker::builder()
        .durable_backend(Arc::new(backend))
        .build()
        .expect("valid configuration")
}

fn per_key() -> SubscribeOptions {
    SubscribeOptions::new().concurrency(Concurrency::PerKey { max_in_flight: 4 })
}

fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !f() {
        assert!(Instant::now() < deadline, "not within {PATIENCE:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// R-DIST-8: a subscribe waiting on a stalled server (SIGSTOP: sockets open, nothing
/// answers) delays only itself. Another durable call on the same broker — one that needs
/// no network, a name already active — answers while the server is still stopped and the
/// stalled subscribe has not returned. (Before: the broker held its registry lock across
/// opening the cursor, and the second call waited for the first.)
#[test]
fn a_subscribe_on_a_stalled_server_blocks_no_other_durable_call() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let broker = broker(&server.url(), Duration::from_secs(3));
    broker
        .create_stream(StreamConfig::new("orders", ["orders.#"]))
        .expect("stream");
    let _busy = broker
        .subscribe(
            DurableSpec::new("orders").name("busy"),
            SubscribeOptions::default(),
            |_: &Message| Ok(()),
        )
        .expect("first subscription");
    server.pause(true).expect("stop the server");
    let stalled_returned = Arc::new(AtomicBool::new(false));
    let stalled = std::thread::spawn({
        let broker = broker.clone();
        let returned = Arc::clone(&stalled_returned);
        move || {
            let r = broker.subscribe(
                DurableSpec::new("orders").name("keyed"),
                per_key(),
                |_: &Message| Ok(()),
            );
            returned.store(true, Ordering::SeqCst);
            r.map(drop)
        }
    });
    // A head start for the stalled call to reach the backend. Too short a start could only
    // make this test pass on a broken broker, never fail on a sound one.
    std::thread::sleep(Duration::from_millis(500));
    let second = broker.subscribe(
        DurableSpec::new("orders").name("busy"),
        SubscribeOptions::default(),
        |_: &Message| Ok(()),
    );
    let answered_while_stalled = !stalled_returned.load(Ordering::SeqCst);
    server.pause(false).expect("resume the server");
    let _ = stalled.join().expect("the stalled subscribe's thread");
    assert!(
        matches!(second, Err(StreamError::DurableInUse { .. })),
        "{second:?}"
    );
    assert!(
        answered_while_stalled,
        "the second call waited for the stalled subscribe"
    );
}

/// R-DIST-8: stream `a_` + durable `b` and stream `a` + durable `_b` are two groups with two
/// lease buckets. (Before: both used `TIDINGS_g_a___b`; the second group handled 55–60 of
/// 160 messages in 60 s and 20 of its 32 keys never ran.)
#[test]
fn two_groups_whose_names_escape_alike_each_handle_every_key() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let broker = broker(&server.url(), Duration::from_secs(2));
    let pairs = [("a_", "b", "one.#"), ("a", "_b", "two.#")];
    let (keys, per) = (32u32, 5u32);
    let handled: Arc<Mutex<BTreeMap<&str, usize>>> = Arc::default();
    let mut subs = Vec::new();
    for (stream, durable, pattern) in pairs {
        broker
            .create_stream(StreamConfig::new(stream, [pattern]))
            .expect("stream");
        let handled = Arc::clone(&handled);
        subs.push(
            broker
                .subscribe(
                    DurableSpec::new(stream).name(durable),
                    per_key(),
                    move |_: &Message| {
                        *handled.lock().expect("lock").entry(stream).or_default() += 1;
                        Ok(())
                    },
                )
                .expect("subscribe"),
        );
    }
    for seq in 0..per {
        for key in 0..keys {
            for topic in ["one.x", "two.x"] {
                broker
                    .publish(
                        MessageBuilder::new(topic)
                            .key(format!("k{key}"))
                            .payload(format!("{key}:{seq}")),
                    )
                    .expect("publish");
            }
        }
    }
    let want = (keys * per) as usize;
    until("both groups handled every message", || {
        let h = handled.lock().expect("lock");
        h.get("a_").copied().unwrap_or(0) >= want && h.get("a").copied().unwrap_or(0) >= want
    });
}
