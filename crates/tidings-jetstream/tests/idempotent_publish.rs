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
