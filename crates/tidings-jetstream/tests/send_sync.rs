//! Public handles are `Send + Sync` and their futures are `Send`, so they work from
//! `tokio::spawn`ed tasks on a multi-threaded runtime.

use std::time::Duration;

use tidings::StartAt;
use tidings_jetstream::{
    ConnectOptions, ConsumerSpec, Delivery, Durable, Fetched, JetStream, JetStreamError, Record,
    StreamSpec,
};

fn send_sync<T: Send + Sync>() {}
fn send<T: Send>(_: &T) {}

#[test]
fn handles_are_send_and_sync() {
    send_sync::<JetStream>();
    send_sync::<Durable>();
    send_sync::<Delivery>();
    send_sync::<Fetched>();
    send_sync::<ConnectOptions>();
    send_sync::<Record>();
    send_sync::<StreamSpec>();
    send_sync::<ConsumerSpec>();
    // The seam's error source: a `StreamError` holding it stays `Send + Sync`.
    send_sync::<JetStreamError>();
    send_sync::<tidings::StreamError>();
    send_sync::<tidings::PublishError>();
    // Compiling this function is the check that the futures are `Send`.
    let _ = futures_are_send;
}

/// Never called: only compiled, to check the futures are `Send`.
fn futures_are_send(
    js: &JetStream,
    durable: &mut Durable,
    delivery: &Delivery,
    record: &Record,
    stream: &StreamSpec,
    spec: ConsumerSpec,
) {
    send(&ConnectOptions::new("nats://127.0.0.1:4222").connect());
    send(&js.append(record));
    send(&js.ensure_stream(stream));
    send(&js.durable(spec));
    send(&delivery.ack());
    send(&durable.fetch(1, Duration::ZERO));
    send(&durable.lag());
    send(&durable.seek(StartAt::Earliest));
}
