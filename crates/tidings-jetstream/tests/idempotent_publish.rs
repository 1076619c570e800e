//! Publishing with the caller's own id on JetStream (issue-level promise of
//! `MessageBuilder::id`, R-DEL-7): a publish retried with the same id — because the first
//! attempt failed or its answer was lost — is stored once, whichever broker retries it.
//! Real server, started and stopped by the test.

use std::sync::Arc;

use tidings::durable::DurableBackend;
use tidings::{Broker, Driver, Message, MessageId, StreamConfig};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

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

// R-DEL-7: the retry recipe. Same id → stored once (within the duplicate window), from the
// same broker or another one; a fresh id → stored again.
#[test]
fn a_publish_retried_with_its_id_is_stored_once() {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let first = broker_on(&server);
    let stream = first
        .create_stream(StreamConfig::new("payments", ["payments.#"]))
        .expect("stream");
    let id = MessageId::new();
    let publish = |broker: &Broker| {
        broker
            .publish(Message::to("payments.captured").id(id).payload("42"))
            .expect("publish")
    };
    let start = stream.end_offset();
    publish(&first);
    publish(&first); // the retry after a lost answer
    // Another process retrying the same publish (say, after the first one died).
    let second = broker_on(&server);
    second
        .create_stream(StreamConfig::new("payments", ["payments.#"]))
        .expect("the same stream");
    publish(&second);
    let stored = first
        .stream("payments")
        .expect("open")
        .read(start, 10)
        .expect("read");
    assert_eq!(stored.len(), 1, "stored once: {stored:?}");
    assert_eq!(stored[0].id(), id);

    first
        .publish(Message::to("payments.captured").payload("43"))
        .expect("publish");
    let stored = first
        .stream("payments")
        .expect("open")
        .read(start, 10)
        .expect("read");
    assert_eq!(stored.len(), 2, "a new id is a new message");
    first.close(std::time::Duration::from_secs(5));
    second.close(std::time::Duration::from_secs(5));
}

// R-DEL-7, R-LOG-5: the neutral duplicate window is the JetStream stream's: the publish
// report names the stream that held the message already; another window on reopen is a
// ConfigMismatch; a window JetStream cannot keep (zero, longer than max_age) is refused.
#[test]
fn the_duplicate_window_is_the_streams_and_is_reported() {
    use std::time::Duration;
    use tidings::{Retention, StreamError};
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let broker = broker_on(&server);
    let config =
        StreamConfig::new("refunds", ["refunds.#"]).duplicate_window(Duration::from_secs(30));
    broker.create_stream(config.clone()).expect("stream");
    let id = MessageId::new();
    let publish = || {
        broker
            .publish(Message::to("refunds.issued").id(id).payload("1"))
            .expect("publish")
    };
    assert!(!publish().is_duplicate());
    assert_eq!(publish().duplicate_in, ["refunds"]);
    let other = broker_on(&server);
    let err = other
        .create_stream(StreamConfig::new("refunds", ["refunds.#"]))
        .expect_err("another window");
    assert!(
        matches!(
            &err,
            StreamError::ConfigMismatch {
                setting: "duplicate_window",
                ..
            }
        ),
        "{err:?}"
    );
    other
        .create_stream(config)
        .expect("its own window opens it");
    for refused in [
        StreamConfig::new("zero", ["zero.#"]).duplicate_window(Duration::ZERO),
        StreamConfig::new("endless", ["endless.#"]).duplicate_window(Duration::MAX),
        StreamConfig::new("short", ["short.#"])
            .retention(Retention::new().max_age(Duration::from_secs(10)))
            .duplicate_window(Duration::from_secs(60)),
    ] {
        let err = broker.create_stream(refused).expect_err("refused");
        assert!(matches!(err, StreamError::Unsupported { .. }), "{err:?}");
    }
    // The default with a short max_age is max_age (the server's own rule): accepted.
    broker
        .create_stream(
            StreamConfig::new("brief", ["brief.#"])
                .retention(Retention::new().max_age(Duration::from_secs(10))),
        )
        .expect("default window shortened to max_age");
    broker.close(Duration::from_secs(5));
    other.close(Duration::from_secs(5));
}
