//! A broker keeping its durable streams on JetStream, on the system clock and a real
//! server (R-DIST-1): the same handler as on the embedded log, retried in place with
//! backoff past the consumer's ack wait, dead letters with reasons, `Expired`, a delayed
//! message, and the priority JetStream cannot keep refused at publish.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tidings::durable::DurableBackend;
use tidings::{
    Broker, DeadLetterReason, Driver, DurableSpec, HandlerError, Message, Priority, PublishError,
    Retry, StreamConfig, StreamError, StreamErrorKind, SubscribeOptions,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

/// Generous bound for waits (never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(30);

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

fn start(server: &NatsServer, ack_wait: Duration) -> Broker {
    let backend = JetStreamBackend::builder()
        .ack_wait(ack_wait)
        .connect(ConnectOptions::new(server.url()))
        .expect("connects");
    let broker = Broker::builder()
        .driver(Driver::Thread)
        .durable_backend(Arc::new(backend) as Arc<dyn DurableBackend>)
        .build()
        .expect("valid configuration");
    broker
        .create_stream(StreamConfig::new("orders", ["orders.#"]))
        .expect("stream");
    broker
}

/// What the handler saw: attempt times per payload, and successes in order.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Seen>>);

#[derive(Default)]
struct Seen {
    attempts: HashMap<String, Vec<Instant>>,
    done: Vec<String>,
}

impl Log {
    fn attempts(&self, p: &str) -> Vec<Instant> {
        self.0
            .lock()
            .expect("lock")
            .attempts
            .get(p)
            .cloned()
            .unwrap_or_default()
    }
    fn done(&self) -> Vec<String> {
        self.0.lock().expect("lock").done.clone()
    }
}

/// The handler, as any tidings application writes it: fails `flaky` twice, rejects `bad`,
/// always fails `down`, succeeds otherwise.
fn handler(log: Log) -> impl Fn(&Message) -> Result<(), HandlerError> + Send + Sync + 'static {
    move |m: &Message| {
        let p = text(m);
        let n = {
            let mut g = log.0.lock().expect("lock");
            let v = g.attempts.entry(p.clone()).or_default();
            v.push(Instant::now());
            v.len()
        };
        match p.as_str() {
            "flaky" if n <= 2 => Err(HandlerError::retry(format!("flaky {n}"))),
            "bad" => Err(HandlerError::reject("bad input")),
            "down" => Err(HandlerError::retry(format!("down {n}"))),
            _ => {
                log.0.lock().expect("lock").done.push(p);
                Ok(())
            }
        }
    }
}

#[test]
fn the_same_handler_runs_on_jetstream() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let ack_wait = Duration::from_secs(1);
    let broker = start(&server, ack_wait);
    // A second process sharing the durable name: it must never see a message the first
    // one is retrying in place.
    let other = start(&server, ack_wait);

    // R-TIME-1: expired before anyone received it.
    let report = broker
        .publish(
            Message::to("orders.x")
                .payload("stale")
                .expires_at(SystemTime::UNIX_EPOCH),
        )
        .expect("publish");
    assert_eq!(report.streams, ["orders"]);
    for p in ["ok-1", "flaky", "bad", "down", "ok-2"] {
        broker
            .publish(Message::to("orders.x").payload(p))
            .expect("publish");
    }
    // R-TIME-2: delivered no earlier than its delay, which outlasts the ack wait.
    let delay = ack_wait * 2;
    let delayed_at = Instant::now();
    broker
        .publish(Message::to("orders.x").payload("later").delay(delay))
        .expect("publish");
    // R-DIST-1, R-DIST-4: priority cannot be kept by JetStream: refused, naming it.
    let err = broker
        .publish(
            Message::to("orders.x")
                .payload("vip")
                .priority(Priority::Urgent),
        )
        .expect_err("refused");
    assert!(
        matches!(&err, PublishError::Stream { error, .. }
            if matches!(**error, StreamError::Unsupported { feature: "message priority", backend: "jetstream" })),
        "{err:?}"
    );
    assert_eq!(
        err.stream_error().map(StreamError::kind),
        Some(StreamErrorKind::Unsupported)
    );

    let backoff = Duration::from_millis(700);
    let opts = || SubscribeOptions::new().retry(Retry::fixed(backoff, 3));
    let log = Log::default();
    let sub = broker
        .subscribe(
            DurableSpec::new("orders")
                .name("billing")
                .filter("orders.#"),
            opts(),
            handler(log.clone()),
        )
        .expect("subscribe");
    let other_log = Log::default();
    let other_sub = other
        .subscribe(
            DurableSpec::new("orders")
                .name("billing")
                .filter("orders.#"),
            opts(),
            handler(other_log.clone()),
        )
        .expect("subscribe");

    until("every message finished", || {
        let st = sub.stats();
        let ost = other_sub.stats();
        st.delivered + ost.delivered == 4
            && st.dead_lettered.rejected + ost.dead_lettered.rejected == 1
            && st.dead_lettered.retries_exhausted + ost.dead_lettered.retries_exhausted == 1
            && st.dead_lettered.expired + ost.dead_lettered.expired == 1
            && sub.lag() == 0
    });
    // Whichever process took a message handled it alone, retries included (R-ORD-1, R-DIST-3).
    for p in ["flaky", "down"] {
        let (mine, theirs) = (log.attempts(p), other_log.attempts(p));
        assert!(
            mine.is_empty() || theirs.is_empty(),
            "{p}: retried in two places"
        );
        let tries = if mine.is_empty() { theirs } else { mine };
        assert_eq!(tries.len(), 3, "{p}"); // R-DEL-3
        // R-DEL-3: the backoff separates the attempts; together they outlast the ack wait,
        // so in-progress acks kept the message in place.
        for w in tries.windows(2) {
            assert!(w[1] - w[0] >= backoff, "{p}: {:?}", w[1] - w[0]);
        }
        assert!(tries[2] - tries[0] > ack_wait, "{p}");
    }
    let mut done: Vec<String> = log.done().into_iter().chain(other_log.done()).collect();
    done.sort();
    assert_eq!(done, ["flaky", "later", "ok-1", "ok-2"]);
    let later = log
        .attempts("later")
        .into_iter()
        .chain(other_log.attempts("later"))
        .next();
    assert!(later.expect("handled") - delayed_at >= delay); // R-TIME-2

    // R-DEL-4: the durable DLQ, shared by both processes, with reasons and attempts.
    let mut dead: Vec<(String, DeadLetterReason, u32)> = sub
        .durable_dead_letters()
        .expect("dlq")
        .into_iter()
        .map(|e| (text(&e.message), e.reason, e.attempts))
        .collect();
    dead.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        dead,
        [
            (
                "bad".to_owned(),
                DeadLetterReason::Rejected {
                    error: "bad input".into()
                },
                1
            ),
            (
                "down".to_owned(),
                DeadLetterReason::RetriesExhausted {
                    attempts: 3,
                    last_error: "down 3".into()
                },
                3
            ),
            ("stale".to_owned(), DeadLetterReason::Expired, 0),
        ]
    );
    drop((sub, other_sub));
    let report = broker.close(Duration::from_secs(10));
    assert!(report.unjoined.is_empty(), "{report:?}"); // R-CORE-6
    let report = other.close(Duration::from_secs(10));
    assert!(report.unjoined.is_empty(), "{report:?}"); // R-CORE-6
}

#[test]
fn durable_spec_defaults_on_jetstream() {
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
        .create_stream(StreamConfig::new("shop", ["orders.#", "refunds.*"]))
        .expect("stream");
    let topics = [
        "orders.created",
        "refunds.issued",
        "orders.eu.paid",
        "refunds.denied",
    ];
    for t in topics {
        broker.publish(Message::to(t)).expect("publish");
    }

    // R-LIM-1: without a name, a typed error (the name check), not a server error.
    let err = broker
        .subscribe(
            DurableSpec::new("shop"),
            SubscribeOptions::default(),
            |_: &Message| Ok(()),
        )
        .expect_err("refused");
    assert!(
        matches!(&err, tidings::StreamError::InvalidName { what: "durable subscription", name, .. } if name.is_empty()),
        "{err:?}"
    );

    // No filter and no start: the server accepts the whole-stream filter, and every
    // message of both patterns arrives, from the first one.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let sub = broker
        .subscribe(
            DurableSpec::new("shop").name("audit"),
            SubscribeOptions::default(),
            move |m: &Message| {
                s.lock().expect("lock").push(m.topic().as_str().to_owned());
                Ok(())
            },
        )
        .expect("subscribe");
    until("every message of the stream", || {
        seen.lock().expect("lock").len() == topics.len()
    });
    // R-LOG-3: the default filter is the whole stream; R-LOG-4: the default start is the
    // earliest record, although every message was stored before the subscription existed.
    assert_eq!(*seen.lock().expect("lock"), topics);
    drop(sub);
    let report = broker.close(Duration::from_secs(10));
    assert!(report.unjoined.is_empty(), "{report:?}"); // R-CORE-6
}
