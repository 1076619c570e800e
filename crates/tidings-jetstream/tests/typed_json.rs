//! Typed payloads on JetStream (R-PAT-3, R-DIST-1): a real server. The JSON payload is
//! still bytes on the wire, the `content-type` header travels as a NATS header, and a
//! payload that does not decode is dead-lettered `Rejected` with the decoder's error,
//! after one attempt, exactly as on the embedded log.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tidings::durable::DurableBackend;
use tidings::{
    Broker, CONTENT_TYPE_HEADER, DeadLetterReason, Driver, DurableSpec, JSON_CONTENT_TYPE, Message,
    Retry, StartAt, StreamConfig, SubscribeOptions, json_handler,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

const PATIENCE: Duration = Duration::from_secs(30);

fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u64,
    item: String,
}

/// What the handler got: the order and the message's content type.
type Delivered = (Order, Option<String>);

fn broker_on(server: &NatsServer) -> Broker {
    let backend = JetStreamBackend::builder()
        .connect(ConnectOptions::new(server.url()))
        .expect("connects");
    Broker::builder()
        .driver(Driver::Thread)
        .durable_backend(Arc::new(backend) as Arc<dyn DurableBackend>)
        .build()
        .expect("valid configuration")
}

// R-PAT-3 + R-DIST-1: typed in, typed out over JetStream; the content type survives the
// server; a truncated payload is dead-lettered `Rejected` once, with serde_json's error.
#[test]
fn typed_json_on_jetstream() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let broker = broker_on(&server);
    broker
        .create_stream(StreamConfig::new("orders", ["orders.#"]))
        .expect("stream");
    let order = Order {
        id: 7,
        item: "socks".into(),
    };
    broker
        .publish(Message::to("orders.created").json(&order).expect("encodes"))
        .expect("publish");
    broker
        .publish(
            Message::to("orders.created")
                .header(CONTENT_TYPE_HEADER, JSON_CONTENT_TYPE)
                .payload(r#"{"id":8,"item":"sh"#),
        )
        .expect("publish");

    let got: Arc<Mutex<Vec<Delivered>>> = Arc::default();
    let g = got.clone();
    let sub = broker
        .subscribe(
            DurableSpec::new("orders")
                .name("billing")
                .start(StartAt::Earliest),
            SubscribeOptions::new().retry(Retry::fixed(Duration::from_millis(10), 5)),
            json_handler(move |o: Order, m: &Message| {
                let ct = m.header(CONTENT_TYPE_HEADER).map(str::to_owned);
                g.lock().expect("lock").push((o, ct));
                Ok(())
            }),
        )
        .expect("subscribe");
    until("one delivered, one dead-lettered", || {
        let s = sub.stats();
        s.delivered == 1 && s.dlq_len == 1
    });
    assert_eq!(
        *got.lock().expect("lock"),
        vec![(order, Some(JSON_CONTENT_TYPE.to_owned()))]
    );
    let dead = sub.subscription().dead_letters();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].attempts, 1); // never retried
    let expected = format!(
        "cannot decode the application/json payload: {}",
        serde_json::from_slice::<Order>(br#"{"id":8,"item":"sh"#).expect_err("truncated")
    );
    assert_eq!(
        dead[0].reason,
        DeadLetterReason::Rejected { error: expected }
    );
    assert_eq!(
        dead[0].message.header(CONTENT_TYPE_HEADER),
        Some(JSON_CONTENT_TYPE)
    );
    assert_eq!(sub.stats().attempts, 2, "{:?}", sub.stats());
    drop(sub);
    let report = broker.close(Duration::from_secs(10));
    assert!(report.unjoined.is_empty(), "{report:?}"); // R-CORE-6
}
