//! Delayed messages on a JetStream durable subscription (R-TIME-2, R-BP-2), against a real
//! `nats-server` (installed by the testkit launcher when missing; skipped, with a notice,
//! only under `TIDINGS_SKIP_NATS=1`): more delayed messages than the server lets a consumer
//! hold unacknowledged by default (1,000) do not hold back a message due now behind them.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidings::durable::DurableBackend;
use tidings::{Broker, Driver, DurableSpec, Message, StreamConfig, SubscribeOptions};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

/// Far beyond any wait below: the delayed messages are never due during the test.
const DELAY: Duration = Duration::from_secs(600);
/// Generous bound for the message due now (never asserted as a speed: it is the bound of
/// "not held back until the delayed ones are due").
const PATIENCE: Duration = Duration::from_secs(60);

// R-TIME-2, R-BP-2: 1,100 messages delayed by 10 minutes, then one due now: the one due
// now is handled long before any delayed one could be.
#[test]
fn a_backlog_of_delayed_messages_does_not_hold_back_one_due_now() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let backend = JetStreamBackend::builder()
        .connect(ConnectOptions::new(server.url()))
        .expect("connects");
    let broker = Broker::builder()
        .driver(Driver::Thread)
        .durable_backend(Arc::new(backend) as Arc<dyn DurableBackend>)
        .build()
        .expect("valid configuration");
    broker
        .create_stream(StreamConfig::new("jobs", ["jobs.#"]))
        .expect("stream");
    for i in 0..1_100 {
        broker
            .publish(
                Message::to("jobs.later")
                    .payload(format!("later-{i}"))
                    .delay(DELAY),
            )
            .expect("publish");
    }
    broker
        .publish(Message::to("jobs.now").payload("now"))
        .expect("publish");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let _sub = broker
        .subscribe(
            DurableSpec::new("jobs").name("worker"),
            SubscribeOptions::default(),
            move |m: &Message| {
                s.lock()
                    .expect("lock")
                    .push(String::from_utf8_lossy(m.payload()).into_owned());
                Ok(())
            },
        )
        .expect("subscribe");
    let deadline = Instant::now() + PATIENCE;
    while seen.lock().expect("lock").is_empty() {
        assert!(
            Instant::now() < deadline,
            "the message due now was held back behind the delayed ones"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(*seen.lock().expect("lock"), ["now"]);
    broker.close(Duration::from_secs(5));
}
