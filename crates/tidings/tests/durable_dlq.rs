//! The durable dead-letter queue of a durable subscription: listed, drained and redriven,
//! across restarts, loss-safe (R-DEL-4, R-LOG-3).
//!
//! Manual driver and manual clock, real files in a temp dir.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tidings::{
    Broker, DeadLetterReason, Driver, DurableSpec, DurableSubscription, HandlerError, ManualClock,
    Message, StreamConfig, StreamError, SubscribeOptions,
};

fn broker(dir: &Path, clock: &ManualClock) -> Broker {
    let b = Broker::builder()
        .data_dir(dir)
        .clock(clock.clone())
        .driver(Driver::Manual)
        .build()
        .unwrap();
    b.create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap();
    b
}

/// A durable subscription that rejects payloads starting with `bad` while `failing`, and
/// records the payloads it accepted.
fn subscribe(
    b: &Broker,
    name: &str,
    failing: &Arc<AtomicBool>,
    seen: &Arc<Mutex<Vec<String>>>,
) -> DurableSubscription {
    let (f, s) = (failing.clone(), seen.clone());
    b.subscribe(
        DurableSpec::new("orders").name(name),
        SubscribeOptions::default(),
        move |m: &Message| {
            let p = String::from_utf8(m.payload().to_vec()).unwrap();
            if f.load(Ordering::SeqCst) && p.starts_with("bad") {
                return Err(HandlerError::reject("refused"));
            }
            s.lock().push(p);
            Ok(())
        },
    )
    .unwrap()
}

fn payloads(d: &DurableSubscription) -> Vec<String> {
    d.durable_dead_letters()
        .unwrap()
        .iter()
        .map(|e| String::from_utf8(e.message.payload().to_vec()).unwrap())
        .collect()
}

#[test]
fn durable_dlq_is_listed_redriven_and_drained_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let failing = Arc::new(AtomicBool::new(true));
    let (seen, other_seen) = (Arc::default(), Arc::default());
    {
        let b = broker(dir.path(), &clock);
        for p in ["ok-0", "bad-1", "bad-2", "ok-3", "bad-4"] {
            b.publish(Message::to("orders.created").payload(p)).unwrap();
        }
        let d = subscribe(&b, "bill", &failing, &seen);
        let other = subscribe(&b, "audit", &Arc::new(AtomicBool::new(false)), &other_seen);
        b.run_until_idle();
        // R-DEL-4: listed with reasons and attempts; the position passed them (R-LOG-3).
        assert_eq!(payloads(&d), ["bad-1", "bad-2", "bad-4"]);
        let dl = d.durable_dead_letters().unwrap();
        assert!(
            dl.iter().all(|e| matches!(
                &e.reason,
                DeadLetterReason::Rejected { error } if error == "refused"
            ) && e.attempts == 1),
            "{dl:?}"
        );
        assert_eq!(d.committed(), 5);

        failing.store(false, Ordering::SeqCst);
        let n = d
            .redrive_durable_dead_letters(|e| e.message.payload().as_ref() != b"bad-2")
            .unwrap();
        assert_eq!(n, 2);
        // R-DEL-4: redriven entries left the DLQ; the other stays.
        assert_eq!(payloads(&d), ["bad-2"]);
        b.run_until_idle();
        assert_eq!(*seen.lock(), ["ok-0", "ok-3", "bad-1", "bad-4"]);
        // The copies were appended to the stream (offsets 5, 6) and committed past.
        assert_eq!((d.committed(), d.lag()), (7, 0)); // R-LOG-3
        // Another durable subscription of the stream skips copies reserved for "bill".
        assert_eq!(other_seen.lock().len(), 5);
        assert_eq!(other.committed(), 7);
        assert!(d.stats().is_conserved()); // R-DEL-6
        drop((d, other));
        b.close(Duration::from_secs(5));
    }
    // Restart: nothing redelivered, the DLQ is as it was left.
    let b = broker(dir.path(), &clock);
    let d = subscribe(&b, "bill", &failing, &seen);
    b.run_until_idle();
    assert_eq!(seen.lock().len(), 4); // R-LOG-3: nothing redelivered
    assert_eq!(payloads(&d), ["bad-2"]); // R-DEL-4: durable across restarts
    let drained = d.drain_durable_dead_letters().unwrap();
    assert_eq!(drained.len(), 1);
    assert_eq!(drained[0].message.offset(), Some(2)); // its offset in the stream
    assert!(d.durable_dead_letters().unwrap().is_empty()); // R-DEL-4
    drop(d);
    b.close(Duration::from_secs(5));
    let b = broker(dir.path(), &clock);
    let d = subscribe(&b, "bill", &failing, &seen);
    assert!(d.durable_dead_letters().unwrap().is_empty()); // R-DEL-4: the drain is durable
}

#[test]
fn a_redrive_that_cannot_append_keeps_every_entry() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    let failing = Arc::new(AtomicBool::new(true));
    let seen = Arc::default();
    let b = broker(dir.path(), &clock);
    for p in ["bad-0", "bad-1"] {
        b.publish(Message::to("orders.created").payload(p)).unwrap();
    }
    let d = subscribe(&b, "bill", &failing, &seen);
    b.run_until_idle();
    assert_eq!(payloads(&d).len(), 2);
    // After close the stream cannot be appended to: the redrive fails...
    b.close(Duration::from_secs(5));
    assert!(matches!(
        d.redrive_durable_dead_letters(|_| true),
        Err(StreamError::Closed | StreamError::Append { .. })
    ));
    assert!(d.drain_durable_dead_letters().is_err());
    // ...and R-DEL-4: no entry it did not re-offer left the DLQ.
    assert_eq!(payloads(&d), ["bad-0", "bad-1"]);
    drop(d);
    let b = broker(dir.path(), &clock);
    let d = subscribe(&b, "bill", &failing, &seen);
    assert_eq!(payloads(&d), ["bad-0", "bad-1"]); // R-DEL-4
}
