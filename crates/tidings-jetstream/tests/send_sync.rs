//! Public handles are `Send + Sync`, so they work from any thread, and the seam's errors
//! holding this crate's error stay `Send + Sync`.

use tidings_jetstream::{
    ConnectError, ConnectOptions, JetStreamBackend, JetStreamError, NatsConnection, NatsTransport,
};

fn send_sync<T: Send + Sync>() {}

#[test]
fn handles_are_send_and_sync() {
    send_sync::<ConnectOptions>();
    send_sync::<NatsConnection>();
    send_sync::<JetStreamBackend>();
    send_sync::<NatsTransport>();
    send_sync::<ConnectError>();
    // The seam's error source: a `StreamError` holding it stays `Send + Sync`.
    send_sync::<JetStreamError>();
    send_sync::<tidings::StreamError>();
    send_sync::<tidings::PublishError>();
}
