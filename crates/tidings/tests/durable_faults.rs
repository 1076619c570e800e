//! Fault injection through `tidings_log::Storage` on a durable subscription's offset store
//! and durable DLQ (R-LOG-3, R-LOG-2): a failed commit fsync poisons the cursor, is
//! reported, is not retried, and loses no acknowledged message after reopening.
//!
//! Manual driver, manual clock, everything on a `SimStorage`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tidings::embedded::{EmbeddedBackend, EmbeddedStreamOptions};
use tidings::{
    Broker, Driver, DurableSpec, DurableSubscription, HandlerError, ManualClock, Message, StartAt,
    StreamConfig, StreamError, SubscribeOptions,
};
use tidings_log::testing::{CrashMode, SimOp, SimStorage};

const DATA: &str = "/data";

fn broker(sim: &SimStorage, clock: &ManualClock) -> Broker {
    let backend = EmbeddedBackend::with_storage(DATA, Arc::new(sim.clone()))
        .stream_defaults(EmbeddedStreamOptions::new().commit_every(1));
    let b = Broker::builder()
        .durable_backend(Arc::new(backend))
        .clock(clock.clone())
        .driver(Driver::Manual)
        .build()
        .unwrap();
    b.create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap();
    b
}

fn publish(b: &Broker, range: std::ops::Range<u64>) {
    for i in range {
        b.publish(Message::to("orders.created").payload(i.to_string()))
            .unwrap();
    }
}

fn subscribe(b: &Broker, seen: &Arc<Mutex<Vec<u64>>>, reject: Option<u64>) -> DurableSubscription {
    let s = seen.clone();
    b.subscribe(
        DurableSpec::new("orders").name("bill"),
        SubscribeOptions::default(),
        move |m: &Message| {
            let offset = m.offset().unwrap();
            if Some(offset) == reject {
                return Err(HandlerError::reject("no"));
            }
            s.lock().push(offset);
            Ok(())
        },
    )
    .unwrap()
}

fn offset_file(sim: &SimStorage) -> String {
    let bytes = sim
        .read_file(&Path::new(DATA).join("consumers/orders/bill.offset"))
        .unwrap();
    String::from_utf8(bytes).unwrap()
}

#[test]
fn a_failed_commit_fsync_poisons_reports_and_loses_nothing_after_reopening() {
    let sim = SimStorage::new();
    let clock = ManualClock::new();
    let b = broker(&sim, &clock);
    let seen = Arc::new(Mutex::new(Vec::new()));
    publish(&b, 0..10);
    let d = subscribe(&b, &seen, None);
    b.run_until_idle();
    assert_eq!(d.committed(), 10);
    assert_eq!(offset_file(&sim), "tidings-offset 1 10\n"); // through the Storage

    publish(&b, 10..15);
    sim.fail_nth(SimOp::Sync, 0); // the next fsync fails: the offset file's
    b.run_until_idle();
    // R-LOG-3: poisoned, reported as a typed error, the old position kept on disk.
    let p = d.poisoned().expect("the failed fsync poisons the cursor");
    assert_eq!(p.position, 11);
    assert!(p.path.ends_with("bill.offset"), "{}", p.path.display());
    assert!(d.error().is_some()); // the halt shows; its cause is the typed `poisoned()`
    assert_eq!(d.committed(), 10);
    assert_eq!(offset_file(&sim), "tidings-offset 1 10\n");
    // Not retried: with the fault gone, nothing more is read or committed.
    sim.clear_faults();
    publish(&b, 15..17);
    b.run_until_idle();
    assert_eq!(d.committed(), 10); // R-LOG-3
    assert_eq!(offset_file(&sim), "tidings-offset 1 10\n");
    assert!(!seen.lock().contains(&15));
    assert!(matches!(d.commit(), Err(StreamError::Poisoned(_))));
    assert!(matches!(
        d.seek(StartAt::Earliest),
        Err(StreamError::Poisoned(_))
    ));
    drop(d);
    b.close(Duration::from_secs(5));

    // Reopen after a power cut: resume from the last commit, redeliver what followed.
    sim.power_cut(CrashMode::DropUnsynced);
    let b = broker(&sim, &clock);
    let again = Arc::new(Mutex::new(Vec::new()));
    let d = subscribe(&b, &again, None);
    b.run_until_idle();
    assert_eq!(d.poisoned(), None);
    assert_eq!(*again.lock(), (10..17).collect::<Vec<_>>()); // R-LOG-3: nothing lost
    assert_eq!(d.committed(), 17);
}

#[test]
fn a_failed_durable_dlq_append_keeps_the_message_for_after_reopening() {
    let sim = SimStorage::new();
    let clock = ManualClock::new();
    let b = broker(&sim, &clock);
    let seen = Arc::new(Mutex::new(Vec::new()));
    publish(&b, 0..3);
    let d = subscribe(&b, &seen, Some(1));
    sim.fail_from(SimOp::Sync, 0); // every fsync fails: the DLQ append (Fsync::Always) too
    b.run_until_idle();
    // R-DEL-4 + R-LOG-3: the dead letter is not durable, so the position never passes it.
    assert_eq!(*seen.lock(), [0, 2]);
    assert!(d.error().is_some());
    assert!(d.committed() <= 1);
    drop(d);
    b.close(Duration::from_secs(5));
    sim.clear_faults();
    sim.power_cut(CrashMode::DropUnsynced);
    let b = broker(&sim, &clock);
    let d = subscribe(&b, &seen, Some(1));
    b.run_until_idle();
    // After reopening, offset 1 is dead-lettered durably this time.
    let dl = d.durable_dead_letters().unwrap();
    assert_eq!(dl.len(), 1);
    assert_eq!(dl[0].message.offset(), Some(1)); // R-DEL-4
    assert_eq!(d.committed(), 3); // R-LOG-3
}
