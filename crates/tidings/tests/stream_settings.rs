//! A stream's settings on the embedded log: what the neutral `StreamConfig` asks for is
//! honoured or refused, never changed implicitly (R-LOG-5, R-DIST-4), the log's own settings
//! live with the embedded backend, and every refusal is matched by its kind, never its text.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tidings::embedded::{EmbeddedBackend, EmbeddedStreamOptions};
use tidings::{Broker, Driver, Message, Retention, StreamConfig, StreamError, StreamErrorKind};

const HOUR: Duration = Duration::from_secs(3600);

fn broker(dir: &Path) -> Broker {
    Broker::builder()
        .data_dir(dir)
        .driver(Driver::Manual)
        .build()
        .unwrap()
}

fn publish(b: &Broker, topic: &str, n: usize) {
    for i in 0..n {
        b.publish(Message::to(topic).payload(format!("message number {i:04}")))
            .unwrap();
    }
}

#[test]
fn reopening_a_stream_with_other_patterns_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    {
        let a = broker(dir.path());
        a.create_stream(StreamConfig::new("shared", ["sh.#"]))
            .unwrap();
        publish(&a, "sh.us.order", 1);
        a.close(Duration::from_secs(5));
    }
    let b = broker(dir.path());
    let err = b
        .create_stream(StreamConfig::new("shared", ["sh.eu.#"]))
        .unwrap_err();
    // R-LOG-5: refused with a typed error naming both pattern sets.
    assert!(
        matches!(
            &err,
            StreamError::ConfigMismatch { stream, setting: "patterns", existing, requested }
                if stream == "shared"
                    && *existing == format!("{:?}", ["sh.#"])
                    && *requested == format!("{:?}", ["sh.eu.#"])
        ),
        "{err:?}"
    );
    assert_eq!(err.kind(), StreamErrorKind::ConfigMismatch);
    assert!(b.stream("shared").is_none());
    // Nothing changed: the stored patterns still open it, and still capture sh.us.*.
    let s = b
        .create_stream(StreamConfig::new("shared", ["sh.#"]))
        .unwrap();
    publish(&b, "sh.us.order", 1);
    assert_eq!(s.end_offset(), 2); // R-LOG-5
    // The same patterns in another order, or repeated, are the same set.
    b.close(Duration::from_secs(5));
    let c = broker(dir.path());
    c.create_stream(StreamConfig::new("shared", ["sh.#", "sh.#"]))
        .unwrap();
}

#[test]
fn reopening_a_stream_with_another_retention_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let kept = Retention::new().max_age(HOUR);
    {
        let a = broker(dir.path());
        a.create_stream(StreamConfig::new("orders", ["orders.#"]).retention(kept))
            .unwrap();
        a.close(Duration::from_secs(5));
    }
    let b = broker(dir.path());
    let err = b
        .create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap_err();
    // R-LOG-5: another retention is never applied implicitly.
    assert!(
        matches!(
            &err,
            StreamError::ConfigMismatch {
                setting: "retention",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.kind(), StreamErrorKind::ConfigMismatch);
    b.create_stream(StreamConfig::new("orders", ["orders.#"]).retention(kept))
        .unwrap();
}

#[test]
fn a_stream_from_a_build_without_metadata_adopts_the_requested_patterns() {
    let dir = tempfile::tempdir().unwrap();
    {
        let a = broker(dir.path());
        a.create_stream(StreamConfig::new("orders", ["orders.#"]))
            .unwrap();
        publish(&a, "orders.created", 3);
        a.close(Duration::from_secs(5));
    }
    // An older build wrote no META file.
    let meta = dir
        .path()
        .join("streams")
        .join("orders")
        .join(tidings_log::META_FILE);
    std::fs::remove_file(&meta).unwrap();
    {
        let b = broker(dir.path());
        let s = b
            .create_stream(StreamConfig::new("orders", ["orders.eu.#"]))
            .unwrap();
        assert_eq!(s.end_offset(), 3); // the same log, recovered
        b.close(Duration::from_secs(5));
    }
    assert!(meta.is_file());
    // From now on those patterns are the stream's (R-LOG-5).
    let c = broker(dir.path());
    let err = c
        .create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap_err();
    assert_eq!(err.kind(), StreamErrorKind::ConfigMismatch, "{err:?}");
}

#[test]
fn a_corrupt_metadata_file_is_a_corrupt_error() {
    let dir = tempfile::tempdir().unwrap();
    {
        let a = broker(dir.path());
        a.create_stream(StreamConfig::new("orders", ["orders.#"]))
            .unwrap();
        a.close(Duration::from_secs(5));
    }
    let meta = dir
        .path()
        .join("streams/orders")
        .join(tidings_log::META_FILE);
    std::fs::write(&meta, b"not ours").unwrap();
    let err = broker(dir.path())
        .create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap_err();
    // R-LIM-2: reported, never trusted or overwritten.
    assert_eq!(err.kind(), StreamErrorKind::Corrupt, "{err:?}");
    assert_eq!(std::fs::read(&meta).unwrap(), b"not ours");
}

#[test]
fn the_logs_own_settings_live_with_the_embedded_backend_per_stream() {
    let dir = tempfile::tempdir().unwrap();
    let backend = EmbeddedBackend::new(dir.path()).stream_options(
        "small",
        EmbeddedStreamOptions::new().segment_bytes(tidings_log::MIN_SEGMENT_BYTES),
    );
    let b = Broker::builder()
        .driver(Driver::Manual)
        .durable_backend(Arc::new(backend.clone()))
        .build()
        .unwrap();
    let small = b
        .create_stream(StreamConfig::new("small", ["small.#"]))
        .unwrap();
    let big = b
        .create_stream(StreamConfig::new("big", ["big.#"]))
        .unwrap();
    publish(&b, "small.x", 20);
    publish(&b, "big.x", 20);
    // R-LOG-1: the override applies to its stream only; the default to the others.
    assert!(
        small.storage_info().segments > 1,
        "{:?}",
        small.storage_info()
    );
    assert_eq!(big.storage_info().segments, 1, "{:?}", big.storage_info());
    assert_eq!(big.storage_info().durability, "always");
    assert_eq!(
        backend.stream_dir("small").display().to_string(),
        small.storage_info().location
    );
    // The broker lends the embedded backend it was given.
    assert_eq!(b.data_dir(), Some(dir.path()));
    assert!(
        b.embedded_backend()
            .unwrap()
            .recovery("small")
            .unwrap()
            .created
    );
    assert!(backend.recovery("big").is_some());
    assert_eq!(
        backend
            .offset_file("small", "billing")
            .strip_prefix(dir.path())
            .unwrap(),
        Path::new("consumers/small/billing.offset")
    );
}

#[test]
fn a_log_held_by_another_broker_is_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let a = broker(dir.path());
    a.create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap();
    let err = broker(dir.path())
        .create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap_err();
    assert_eq!(err.kind(), StreamErrorKind::InUse, "{err:?}");
    // One broker, the same name twice: already exists.
    let again = a
        .create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap_err();
    assert_eq!(again.kind(), StreamErrorKind::AlreadyExists, "{again:?}");
}

#[test]
fn the_embedded_log_keeps_one_replica_and_refuses_more() {
    // R-DIST-4, R-DIST-7: one log on one disk; asking for copies elsewhere is refused, naming
    // the option and the backend, and creates nothing.
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path());
    let err = b
        .create_stream(StreamConfig::new("copies", ["c.#"]).replicas(3))
        .unwrap_err();
    assert_eq!(err.kind(), StreamErrorKind::Unsupported);
    assert!(
        matches!(&err, StreamError::Unsupported { feature, backend: "embedded-log" }
            if feature.starts_with("StreamConfig::replicas")),
        "{err:?}"
    );
    // One replica is what the log is: accepted, also when asked for explicitly.
    let s = b
        .create_stream(StreamConfig::new("copies", ["c.#"]).replicas(1))
        .unwrap();
    assert_eq!(s.config().replica_count(), 1);
    b.close(Duration::from_secs(5));
}
