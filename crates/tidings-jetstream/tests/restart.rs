//! Server restart under load (R-DIST-5): the NATS server is killed (SIGKILL, a crash) while
//! a broker publishes to a JetStream-backed stream and a durable subscription consumes it,
//! then started again on the same store dir. Publishing fails with a typed error while the
//! server is away, the client reconnects by itself, and every message whose publish was
//! acknowledged is handled.
//!
//! A missing `nats-server` is installed by the launcher (the test skips, with a notice, only
//! under `TIDINGS_SKIP_NATS=1`). The server it starts is stopped when it ends.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tidings::{
    Broker, DurableSpec, Message, MessageBuilder, PublishError, StreamConfig, StreamError,
    StreamErrorKind, SubscribeOptions,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

/// Messages the publisher gets acknowledged in all.
const MESSAGES: u64 = 3_000;
/// The bound on each request to the server, so a publish while it is down fails soon.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Generous bound on every wait (never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(120);

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "not within {PATIENCE:?}: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What the publisher thread saw.
#[derive(Default)]
struct Published {
    /// Indexes whose publish returned `Ok`: stored and acknowledged by the server.
    acknowledged: Mutex<BTreeSet<u64>>,
    /// Publishes that failed (each retried with the same index until one succeeds).
    failures: AtomicU64,
    /// The first failure, to check it is the typed error R-DIST-5 promises.
    first_failure: Mutex<Option<PublishError>>,
    done: AtomicBool,
}

#[test]
fn acknowledged_messages_survive_a_server_restart_and_the_client_reconnects() {
    let Some(mut server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let backend = JetStreamBackend::builder()
        .connect(
            ConnectOptions::new(server.url())
                .connect_timeout(Duration::from_secs(5))
                .request_timeout(REQUEST_TIMEOUT)
                .name("tidings-restart-test"),
        )
        .expect("connects");
    let broker = Broker::builder()
        .durable_backend(Arc::new(backend))
        .build()
        .expect("valid configuration");
    broker
        .create_stream(StreamConfig::new("work", ["work.#"]))
        .expect("stream");

    // How often each index was handled.
    let handled: Arc<Mutex<BTreeMap<u64, u32>>> = Arc::default();
    let seen = Arc::clone(&handled);
    let _subscription = broker
        .subscribe(
            DurableSpec::new("work").name("restart").filter("work.#"),
            SubscribeOptions::default(),
            move |m: &Message| {
                // Slower than publishing usually is, so a backlog is outstanding when the
                // server dies (the counts printed at the end say how large it was).
                std::thread::sleep(Duration::from_millis(2));
                let index: u64 = std::str::from_utf8(m.payload())
                    .expect("utf-8")
                    .parse()
                    .expect("an index");
                *seen
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(index)
                    .or_insert(0) += 1;
                Ok(())
            },
        )
        .expect("subscribe");
    let handled_count = || handled.lock().unwrap_or_else(PoisonError::into_inner).len();

    let published = Arc::new(Published::default());
    let publisher = {
        let (broker, published) = (broker.clone(), Arc::clone(&published));
        std::thread::spawn(move || {
            for i in 0..MESSAGES {
                loop {
                    match broker.publish(MessageBuilder::new("work.items").payload(i.to_string())) {
                        Ok(_) => break,
                        Err(e) => {
                            published.failures.fetch_add(1, Ordering::Relaxed);
                            published
                                .first_failure
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .get_or_insert(e);
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    }
                }
                published
                    .acknowledged
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(i);
            }
            published.done.store(true, Ordering::Release);
        })
    };
    let acknowledged = || {
        published
            .acknowledged
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    };

    // Kill the server while both publishing and consuming are under way.
    wait_until("a third published and some handled", || {
        acknowledged().len() as u64 >= MESSAGES / 3 && handled_count() > 0
    });

    server.kill().expect("SIGKILL the server");
    let acknowledged_at_kill = acknowledged().len();
    let handled_at_kill = handled_count();
    wait_until("a publish fails while the server is away", || {
        published.failures.load(Ordering::Relaxed) > 0
    });
    server.restart().expect("restart on the same store dir");

    wait_until("the publisher finished after the restart", || {
        published.done.load(Ordering::Acquire)
    });
    publisher.join().expect("publisher thread");
    let acknowledged = acknowledged();
    wait_until("every acknowledged message handled", || {
        let handled = handled.lock().unwrap_or_else(PoisonError::into_inner);
        acknowledged.iter().all(|i| handled.contains_key(i))
    });

    let handled = handled
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let twice = handled.values().filter(|n| **n > 1).count();
    let failures = published.failures.load(Ordering::Relaxed);
    eprintln!(
        "server SIGKILLed after {acknowledged_at_kill} acknowledged / {handled_at_kill} handled, \
         restarted: {} acknowledged, {failures} publishes failed while it was away, {} handled, \
         {twice} handled more than once",
        acknowledged.len(),
        handled.len()
    );
    // R-DIST-5: publishing while the server is away fails with a typed error naming the
    // stream and the backend...
    let first = published
        .first_failure
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    assert!(
        matches!(&first, Some(PublishError::Stream { stream, error, .. })
            if stream == "work"
                && matches!(**error, StreamError::Backend { backend: "jetstream", .. })
                && matches!(error.kind(), StreamErrorKind::Unavailable | StreamErrorKind::TimedOut)),
        "{first:?}"
    );
    // ...the client reconnected (publishing resumed: every index was acknowledged in the
    // end)...
    assert_eq!(acknowledged.len() as u64, MESSAGES);
    // ...and no acknowledged message is lost: each was handled.
    assert!(acknowledged.iter().all(|i| handled.contains_key(i)));
    broker.close(Duration::from_secs(10));
}
