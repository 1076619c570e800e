//! Regression tests for durable streams and subscriptions:
//! spoofed durable DLQ metadata (R-DEL-4), redrive stealing a durable window (R-BP-2),
//! re-subscribing right after a drop (R-LOG-3), and a committed offset beyond the end of the
//! stream (R-LOG-3, R-LIM-2).
//!
//! Real files in a temp dir; the manual driver where the outcome must be exact, every other
//! wait bounded.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use tidings::{
    Broker, DeadLetterReason, Driver, DurableSpec, HandlerError, ManualClock, Message,
    StreamConfig, SubscribeOptions,
};

const WAIT: Duration = Duration::from_secs(20);

fn wait_until(what: &str, cond: impl FnMut() -> bool) {
    tidings_testkit::helpers::wait_until(what, WAIT, cond);
}

fn broker_on(dir: &Path, clock: &ManualClock, driver: Driver) -> Broker {
    Broker::builder()
        .data_dir(dir)
        .clock(clock.clone())
        .driver(driver)
        .build()
        .unwrap()
}

fn orders(b: &Broker) -> tidings::Stream {
    b.create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap()
}

fn publish_n(b: &Broker, range: std::ops::Range<u64>) {
    for i in range {
        b.publish(Message::to("orders.created").payload(i.to_string()))
            .unwrap();
    }
}

#[test]
fn user_headers_cannot_spoof_durable_dlq_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let b = broker_on(dir.path(), &clock, Driver::Manual);
    // A publisher cannot set tidings' headers at all (R-DEL-4) ...
    let spoof = b.publish(
        Message::to("orders.created")
            .header("tidings-dlq-reason", "spoofed")
            .payload("hostile"),
    );
    assert!(
        matches!(spoof, Err(tidings::PublishError::ReservedHeader { .. })),
        "{spoof:?}"
    );
    // ... but a forwarded dead letter carries `tidings-dlq-reason` by design, and a stream
    // may capture the dead-letter topic. A durable subscriber that dead-letters it must
    // record its own reason, attempts and offset, not the forwarded headers.
    b.create_stream(StreamConfig::new("dead", ["dlq.#"]))
        .unwrap();
    let mut opts = SubscribeOptions::default();
    opts.dead_letter.topic = Some("dlq.orders".into());
    opts.retry = tidings::Retry::None;
    let _orders = b
        .subscribe("orders.*", opts, |_: &Message| {
            Err(HandlerError::reject("spoofed"))
        })
        .unwrap();
    let d = b
        .subscribe(
            DurableSpec::new("dead").name("audit"),
            SubscribeOptions::default(),
            |_: &Message| Err(HandlerError::reject("bad order")),
        )
        .unwrap();
    publish_n(&b, 0..1);
    b.run_until_idle();
    let dl = d.durable_dead_letters().unwrap();
    assert_eq!(dl.len(), 1);
    let e = &dl[0];
    // R-DEL-4: the metadata is tidings' own, whatever headers the message carried.
    assert!(
        e.reason.to_string().contains("bad order"),
        "reason {:?}",
        e.reason
    );
    assert_eq!(e.attempts, 1); // R-DEL-4
    assert_eq!(e.message.offset(), Some(0)); // R-DEL-4
    // The message's headers are kept as they were, nothing added to them.
    assert!(
        e.message
            .header("tidings-dlq-reason")
            .is_some_and(|r| r.contains("spoofed"))
    );
    assert_eq!(
        e.message.header("tidings-dlq-original-topic"),
        Some("orders.created")
    );
    // And after a restart, read back from the file.
    drop(d);
    b.close(Duration::from_secs(5));
    let b = broker_on(dir.path(), &clock, Driver::Manual);
    b.create_stream(StreamConfig::new("dead", ["dlq.#"]))
        .unwrap();
    let d = b
        .subscribe(
            DurableSpec::new("dead").name("audit"),
            SubscribeOptions::default(),
            |_: &Message| Ok(()),
        )
        .unwrap();
    let dl = d.durable_dead_letters().unwrap();
    assert!(dl[0].reason.to_string().contains("bad order")); // R-DEL-4
    assert_eq!((dl[0].attempts, dl[0].message.offset()), (1, Some(0))); // R-DEL-4
}

#[test]
fn redrive_on_a_durable_subscription_never_overflows_its_stream_messages() {
    redrive_then_stream(Driver::Manual);
}

#[test]
fn redrive_on_a_durable_subscription_never_overflows_under_the_thread_driver() {
    redrive_then_stream(Driver::Thread);
}

/// Run the manual driver, or wait (bounded) for a live one.
fn settle(b: &Broker, driver: &Driver, what: &str, mut cond: impl FnMut() -> bool) {
    if matches!(driver, Driver::Manual) {
        b.run_until_idle();
        assert!(cond(), "{what}");
    } else {
        wait_until(what, cond);
    }
}

fn redrive_then_stream(driver: Driver) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let b = broker_on(dir.path(), &clock, driver.clone());
    orders(&b);
    publish_n(&b, 0..2);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let failing = Arc::new(AtomicBool::new(true));
    let (s, f) = (seen.clone(), failing.clone());
    let d = b
        .subscribe(
            DurableSpec::new("orders").name("bill"),
            SubscribeOptions::new().capacity(2),
            move |m: &Message| {
                if f.load(Ordering::SeqCst) {
                    return Err(HandlerError::reject("down"));
                }
                s.lock().push(m.offset().unwrap());
                Ok(())
            },
        )
        .unwrap();
    settle(&b, &driver, "two dead letters", || {
        d.subscription().dead_letters().len() == 2 && d.committed() == 2
    });
    failing.store(false, Ordering::SeqCst);
    // The redrive fills the queue (capacity 2); then four more stream messages arrive.
    let r = d.subscription().redrive(|_| true);
    assert_eq!(r.accepted, 2);
    publish_n(&b, 2..6);
    settle(&b, &driver, "six deliveries", || {
        seen.lock().len() >= 6 && d.committed() == 6
    });
    let mut got = seen.lock().clone();
    got.sort_unstable();
    // R-BP-2: a durable subscription never overflows; every stream message is delivered.
    assert_eq!(got, [0, 1, 2, 3, 4, 5]);
    let stats = d.stats();
    assert_eq!(stats.refused.overflow, 0); // R-BP-2
    assert!(
        !d.subscription()
            .dead_letters()
            .iter()
            .any(|e| matches!(e.reason, DeadLetterReason::Overflow)),
        "R-BP-2: no Overflow dead letter"
    );
    assert_eq!(d.committed(), 6); // R-LOG-3
    assert!(stats.is_conserved()); // R-DEL-6
}

/// A gate a handler waits at (bounded) until the test opens it.
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn wait(&self) {
        let (open, cv) = &*self.0;
        let mut open = open.lock();
        let deadline = std::time::Instant::now() + WAIT;
        while !*open && !cv.wait_until(&mut open, deadline).timed_out() {}
    }
    fn open(&self) {
        *self.0.0.lock() = true;
        self.0.1.notify_all();
    }
}

fn resubscribe_cycles(driver: Driver) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let b = broker_on(dir.path(), &clock, driver);
    orders(&b);
    let delivered = Arc::new(Mutex::new(Vec::new()));
    let mut previous: Option<Gate> = None;
    for cycle in 0..30u64 {
        publish_n(&b, cycle..cycle + 1);
        let (seen, gate) = (delivered.clone(), Gate::default());
        let g = gate.clone();
        // The previous handle was dropped while its handler was still running: the
        // dispatcher still holds the subscription. R-LOG-3: the drop released the durable
        // DLQ log and the offsets anyway, before it returned.
        let d = b
            .subscribe(
                DurableSpec::new("orders").name("bill"),
                SubscribeOptions::default(),
                move |m: &Message| {
                    let offset = m.offset().unwrap();
                    seen.lock().push(offset);
                    if offset == cycle {
                        g.wait(); // in flight when the handle is dropped
                    }
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("cycle {cycle}: {e}"));
        if let Some(g) = previous.replace(gate) {
            g.open();
        }
        wait_until("this cycle's message in flight", || {
            delivered.lock().contains(&cycle)
        });
        drop(d);
    }
    if let Some(g) = previous {
        g.open();
    }
    let mut got = delivered.lock().clone();
    got.sort_unstable();
    got.dedup();
    assert_eq!(got, (0..30).collect::<Vec<_>>()); // R-LOG-3: nothing lost across the cycles
}

#[test]
fn resubscribe_right_after_drop_under_the_thread_driver() {
    resubscribe_cycles(Driver::Thread);
}

#[test]
fn resubscribe_right_after_drop_under_the_pool_driver() {
    resubscribe_cycles(Driver::Pool { workers: 4 });
}

fn offset_path(dir: &Path, name: &str) -> std::path::PathBuf {
    dir.join("consumers")
        .join("orders")
        .join(format!("{name}.offset"))
}

#[test]
fn a_committed_offset_beyond_the_end_is_clamped_and_nothing_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let b = broker_on(dir.path(), &clock, Driver::Manual);
    orders(&b);
    publish_n(&b, 0..40);
    std::fs::create_dir_all(dir.path().join("consumers").join("orders")).unwrap();
    std::fs::write(offset_path(dir.path(), "bill"), "tidings-offset 1 1000\n").unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let d = b
        .subscribe(
            DurableSpec::new("orders").name("bill"),
            SubscribeOptions::default(),
            move |m: &Message| {
                s.lock().push(m.offset().unwrap());
                Ok(())
            },
        )
        .unwrap();
    // R-LOG-3 / R-LIM-2: the stated policy — clamp to the end, say so, skip nothing new.
    assert_eq!(d.position(), 40);
    assert_eq!(d.committed(), 40);
    assert_eq!(d.clamped_from(), Some(1000));
    let text = std::fs::read_to_string(offset_path(dir.path(), "bill")).unwrap();
    assert_eq!(text, "tidings-offset 1 40\n"); // R-LOG-3: the clamp is committed
    publish_n(&b, 40..45);
    b.run_until_idle();
    assert_eq!(*seen.lock(), [40, 41, 42, 43, 44]); // R-LOG-3: no new message skipped
    assert_eq!(d.committed(), 45);
}

#[test]
fn a_stream_cut_below_the_commit_by_a_power_cut_skips_nothing_new() {
    // Fsync::Never and a power cut: the stream lost its tail, the offset file did not.
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    {
        let b = broker_on(dir.path(), &clock, Driver::Manual);
        orders(&b);
        publish_n(&b, 0..10);
        let d = b
            .subscribe(
                DurableSpec::new("orders").name("bill"),
                SubscribeOptions::default(),
                |_: &Message| Ok(()),
            )
            .unwrap();
        b.run_until_idle();
        assert_eq!(d.committed(), 10);
        drop(d);
        b.close(Duration::from_secs(5));
    }
    // The simulated cut: a fresh stream directory holding 6 of the 10 records.
    let streams = dir.path().join("streams");
    std::fs::remove_dir_all(&streams).unwrap();
    {
        let b = broker_on(dir.path(), &clock, Driver::Manual);
        b.create_stream(StreamConfig::new("orders", ["orders.#"]))
            .unwrap();
        publish_n(&b, 0..6);
        b.close(Duration::from_secs(5));
    }
    let b = broker_on(dir.path(), &clock, Driver::Manual);
    orders(&b);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let d = b
        .subscribe(
            DurableSpec::new("orders").name("bill"),
            SubscribeOptions::default(),
            move |m: &Message| {
                s.lock().push(m.offset().unwrap());
                Ok(())
            },
        )
        .unwrap();
    assert_eq!(d.clamped_from(), Some(10)); // R-LIM-2: reported, not silent
    publish_n(&b, 6..9); // reuses offsets 6..9, which the old commit (10) covered
    b.run_until_idle();
    assert_eq!(*seen.lock(), [6, 7, 8]); // R-LOG-3: none skipped
}
