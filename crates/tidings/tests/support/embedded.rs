//! A manual-driver broker on the embedded log, for tests that need one durable stream
//! (included with `#[path = "support/embedded.rs"] mod embedded;`).

use std::sync::Arc;

use tidings::embedded::{EmbeddedBackend, EmbeddedStreamOptions, Fsync};
use tidings::{Broker, Driver, ManualClock, StreamConfig};

/// A manual-driver broker on `clock` with the embedded log in `dir` (no fsync) and the
/// stream `jobs` (`jobs.#`).
pub fn jobs_broker(dir: &std::path::Path, clock: &ManualClock) -> Broker {
    let backend =
        EmbeddedBackend::new(dir).stream_defaults(EmbeddedStreamOptions::new().fsync(Fsync::Never));
    let broker = Broker::builder()
        .driver(Driver::Manual)
        .clock(clock.clone())
        .durable_backend(Arc::new(backend))
        .build()
        .expect("valid configuration");
    broker
        .create_stream(StreamConfig::new("jobs", ["jobs.#"]))
        .expect("stream");
    broker
}
