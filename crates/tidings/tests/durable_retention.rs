//! Retention runs on idle streams too, on the broker's timer (R-LOG-1, R-BP-2): a stream
//! that stopped receiving messages sheds its old segments once they are older than
//! `max_age`, without another append or an explicit `apply_retention`.
//!
//! Manual clock; the manual driver (exact) and the thread driver (bounded wait).

use std::time::Duration;

use std::sync::Arc;

use tidings::embedded::Fsync;
use tidings::embedded::{EmbeddedBackend, EmbeddedStreamOptions};
use tidings::{Broker, Driver, ManualClock, Message, Retention, StreamConfig};

const HOUR: Duration = Duration::from_secs(3600);

fn idle_stream_sheds_old_segments(driver: Driver) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    // The log's own settings live with the embedded backend; retention is neutral.
    let backend = EmbeddedBackend::new(dir.path()).stream_options(
        "orders",
        EmbeddedStreamOptions::new()
            .fsync(Fsync::Never)
            .segment_bytes(256)
            .retention_interval(Duration::from_secs(60)),
    );
    let b = Broker::builder()
        .durable_backend(Arc::new(backend))
        .clock(clock.clone())
        .driver(driver.clone())
        .build()
        .unwrap();
    let s = b
        .create_stream(
            StreamConfig::new("orders", ["orders.#"]).retention(Retention::new().max_age(HOUR)),
        )
        .unwrap();
    for i in 0..20 {
        b.publish(Message::to("orders.created").payload(format!("order number {i:04}")))
            .unwrap();
    }
    let end = s.end_offset();
    assert_eq!(s.start_offset(), 0);
    // The stream goes idle; two hours pass.
    clock.advance(2 * HOUR);
    let shed = || s.start_offset() > 0;
    if matches!(driver, Driver::Manual) {
        b.run_until_idle();
        assert!(
            shed(),
            "R-LOG-1: the idle stream's old segments are removed"
        );
    } else {
        tidings_testkit::helpers::wait_until(
            "R-LOG-1: the idle stream's old segments are removed",
            Duration::from_secs(20),
            shed,
        );
    }
    // Only sealed segments go: the active segment, and the end, stay.
    assert!(s.start_offset() < end); // R-LOG-1
    assert_eq!(s.end_offset(), end);
    b.close(Duration::from_secs(5));
}

#[test]
fn idle_streams_shed_old_segments_under_the_manual_driver() {
    idle_stream_sheds_old_segments(Driver::Manual);
}

#[test]
fn idle_streams_shed_old_segments_under_the_thread_driver() {
    idle_stream_sheds_old_segments(Driver::Thread);
}

#[test]
fn nothing_is_removed_before_it_is_old_enough() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let backend = EmbeddedBackend::new(dir.path())
        .stream_defaults(EmbeddedStreamOptions::new().segment_bytes(256));
    let b = Broker::builder()
        .durable_backend(Arc::new(backend))
        .clock(clock.clone())
        .driver(Driver::Manual)
        .build()
        .unwrap();
    let s = b
        .create_stream(
            StreamConfig::new("orders", ["orders.#"]).retention(Retention::new().max_age(HOUR)),
        )
        .unwrap();
    for i in 0..20 {
        b.publish(Message::to("orders.created").payload(format!("order number {i:04}")))
            .unwrap();
    }
    clock.advance(HOUR / 2);
    b.run_until_idle();
    assert_eq!(s.start_offset(), 0); // R-LOG-1: younger than max_age, kept
}
