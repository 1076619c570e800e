//! The durable cases of the conformance suite on NATS JetStream (R-DIST-2), under every
//! driver, against a `nats-server` started per case by the testkit launcher.
//!
//! JetStream cannot keep a priority, stamps `StartAt::Time` with the server's clock, and
//! numbers offsets from 1: the cases needing the first two skip, naming the capability.
//!
//! One case runs in a JetStream form instead: `resume_after_restart` asserts the embedded
//! log's contiguous commit — after a restart *every* offset from the commit on comes again,
//! those already finished above it included. JetStream acknowledges each message on its
//! own, so only the unfinished ones come again; `resume_after_restart_on_jetstream` below
//! asserts that (nothing lost, nothing finished handled twice), under every driver.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tidings::{
    Broker, BrokerBuilder, Concurrency, Driver, HandlerError, ManualClock, Message, Retry, StartAt,
    StreamConfig, StreamError, SubscribeOptions,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};
use tidings_testkit::{
    Backend, DurableBackend, DurableCaps, DurableStore, ManualBackend, Outcome, ThreadedBackend,
    durable_suite,
};

/// JetStream on a fresh server per case.
struct JetStream;

/// One case's server and the backend connected to it (dropped first).
struct Store {
    backend: Arc<JetStreamBackend>,
    _server: NatsServer,
}

impl DurableBackend for JetStream {
    fn name(&self) -> String {
        "jetstream".into()
    }
    fn caps(&self) -> DurableCaps {
        DurableCaps::all()
            .without_priority()
            .without_manual_time()
            .first_offset(1)
    }
    fn open(&self) -> Box<dyn DurableStore> {
        let server = NatsServer::start(NatsServerOptions::new())
            .unwrap_or_else(|e| panic!("could not start nats-server: {e}"));
        let backend = JetStreamBackend::connect(
            ConnectOptions::new(server.url()).request_timeout(Duration::from_secs(5)),
        )
        .expect("connects");
        Box::new(Store {
            backend: Arc::new(backend),
            _server: server,
        })
    }
}

impl DurableStore for Store {
    fn attach(&self, builder: BrokerBuilder) -> BrokerBuilder {
        builder
            .durable_backend(Arc::clone(&self.backend) as Arc<dyn tidings::durable::DurableBackend>)
    }
    fn create_stream(
        &self,
        broker: &Broker,
        name: &str,
        patterns: &[&str],
    ) -> Result<(), StreamError> {
        broker
            .create_stream(StreamConfig::new(name, patterns.iter().copied()))
            .map(drop)
    }
}

fn run(backend: &dyn Backend, name: &str, case: durable_suite::DurableCaseFn) {
    if NatsServer::binary().is_none() {
        // Skipped with a notice, or failed under TIDINGS_REQUIRE_NATS=1.
        let _ = NatsServer::for_test(NatsServerOptions::new());
        return;
    }
    let outcome = durable_suite::run(name, case, backend, &JetStream);
    if let Outcome::Skipped(why) = &outcome {
        assert!(
            why.contains("priority") || why.contains("manual_time"),
            "{name} skipped for a capability JetStream has: {why}"
        );
    }
}

/// `resume_after_restart` of the suite, as JetStream acknowledges: a message held in retry
/// keeps the commit below it while later keys finish; after a restart exactly the
/// unfinished messages come again, in key order, and nothing is lost (R-LOG-3).
fn resume_after_restart(b: &dyn Backend) {
    let store = JetStream.open();
    let clock = ManualClock::new();
    let start = || {
        let broker = store
            .attach(b.builder().clock(clock.clone()))
            .build()
            .expect("valid configuration");
        store
            .create_stream(&broker, "suite", &["suite.#"])
            .expect("stream");
        broker
    };
    let broker = start();
    for i in 0..20u64 {
        broker
            .publish(
                Message::to("suite.orders")
                    .key(format!("k{}", i % 4))
                    .payload(format!("m{i}")),
            )
            .expect("publish");
    }
    let opts = || SubscribeOptions {
        capacity: 32,
        concurrency: Concurrency::PerKey { max_in_flight: 4 },
        // Longer than the case runs: the clock only moves when the case moves it.
        retry: Retry::fixed(Duration::from_secs(3600), 1_000),
        ..Default::default()
    };
    let seen: Arc<Mutex<Vec<u64>>> = Arc::default();
    let s = Arc::clone(&seen);
    let sub = broker
        .subscribe_durable(
            "resume",
            "suite",
            "#",
            StartAt::Earliest,
            opts(),
            move |m: &Message| {
                if m.payload() == "m8" {
                    return Err(HandlerError::retry("held"));
                }
                s.lock().expect("lock").push(m.offset().expect("offset"));
                Ok(())
            },
        )
        .expect("subscribe");
    // m8 (key k0) waits an hour to retry; m12 and m16 (k0) wait behind it (R-ORD-3).
    b.settle(&broker, "all but key k0 from m8 finished", &mut || {
        seen.lock().expect("lock").len() == 17 && sub.committed() == 9
    });
    assert_eq!(sub.stats().failures, 1);
    assert_eq!(sub.lag(), 12); // R-BP-3: every stored offset from the commit on
    drop(sub);
    let report = broker.close(Duration::from_secs(10));
    assert!(report.unjoined.is_empty(), "{report:?}"); // R-CORE-6
    drop(broker);

    let broker = start();
    let again: Arc<Mutex<Vec<u64>>> = Arc::default();
    let a = Arc::clone(&again);
    let sub = broker
        .subscribe_durable(
            "resume",
            "suite",
            "#",
            StartAt::Latest,
            opts(),
            move |m: &Message| {
                a.lock().expect("lock").push(m.offset().expect("offset"));
                Ok(())
            },
        )
        .expect("subscribe");
    b.settle(&broker, "the rest after restart", &mut || {
        again.lock().expect("lock").len() == 3 && sub.committed() == 21
    });
    // Exactly the unfinished, in key order (R-LOG-3, R-ORD-3) ...
    assert_eq!(*again.lock().expect("lock"), [9, 13, 17]);
    // ... and nothing lost (R-LOG-3).
    let all: BTreeSet<u64> = seen
        .lock()
        .expect("lock")
        .iter()
        .chain(again.lock().expect("lock").iter())
        .copied()
        .collect();
    assert_eq!(all.len(), 20);
    assert_eq!(sub.lag(), 0); // R-BP-3
    assert!(sub.stats().is_conserved()); // R-DEL-6
    drop(sub);
    let report = broker.close(Duration::from_secs(10));
    assert!(report.is_clean(), "{report:?}"); // R-CORE-6
}

/// One `#[test]` per named durable case, under the enclosing module's `backend()`.
macro_rules! durable_tests {
    ($($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                run(backend().as_ref(), stringify!($case), durable_suite::$case);
            }
        )*
    };
}

/// Every durable case on JetStream under one driver.
macro_rules! durable_cases {
    ($module:ident, $backend:expr) => {
        mod $module {
            use super::*;
            fn backend() -> Box<dyn Backend> {
                Box::new($backend)
            }
            durable_tests!(
                replay_by_offset,
                replay_by_time,
                durable_dlq_reasons,
                durable_dlq_redrive_and_drain,
                lag_and_slow_consumer,
                durable_filter,
                durable_message_fields,
                many_durables_progress,
                seek_while_outstanding,
                delayed_durable_message,
                resubscribe_resumes,
                seek_survives_restart,
            );
            #[test]
            fn resume_after_restart_on_jetstream() {
                if NatsServer::binary().is_none() {
                    let _ = NatsServer::for_test(NatsServerOptions::new());
                    return;
                }
                resume_after_restart(backend().as_ref());
            }
        }
    };
}

durable_cases!(manual, ManualBackend::default());
durable_cases!(thread, ThreadedBackend::new("thread", Driver::Thread));
durable_cases!(
    pool,
    ThreadedBackend::new("pool", Driver::Pool { workers: 2 })
);
durable_cases!(tokio, tidings_testkit::TokioBackend::new());
