//! The durable dedup store (R-DEL-5 "durable with the log"): a message redelivered by a
//! durable subscription after a restart is skipped by `Deduplicating`.
//!
//! Manual driver, manual clock, real files in a temp dir.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tidings::{
    Broker, Deduplicating, Driver, DurableSpec, HandlerError, ManualClock, Message, StreamConfig,
    StreamError, SubscribeOptions,
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

/// One run: a durable subscription whose handler counts real work, deduplicated by the
/// durable store "bill"; returns how many duplicates it skipped.
fn run(dir: &Path, clock: &ManualClock, work: &Arc<AtomicU64>) -> u64 {
    let b = broker(dir, clock);
    let store = b.durable_dedup_store("bill", 1000).unwrap();
    // One store directory is open once at a time.
    assert!(matches!(
        b.durable_dedup_store("bill", 1000),
        Err(StreamError::Open { .. })
    ));
    let w = work.clone();
    let handler = Arc::new(Deduplicating::with_store(
        move |_: &Message| {
            w.fetch_add(1, Ordering::SeqCst);
            Ok::<(), HandlerError>(())
        },
        store,
    ));
    let d = b
        .subscribe(
            DurableSpec::new("orders").name("bill"),
            SubscribeOptions::default(),
            handler.clone(),
        )
        .unwrap();
    b.run_until_idle();
    let skipped = handler.skipped();
    drop(d);
    b.close(Duration::from_secs(5));
    skipped
}

#[test]
fn a_message_redelivered_after_a_restart_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new();
    {
        let b = broker(dir.path(), &clock);
        for i in 0..3 {
            b.publish(Message::to("orders.created").payload(format!("{i}")))
                .unwrap();
        }
        b.close(Duration::from_secs(5));
    }
    let work = Arc::new(AtomicU64::new(0));
    assert_eq!(run(dir.path(), &clock, &work), 0);
    assert_eq!(work.load(Ordering::SeqCst), 3);
    // A crash after the handlers succeeded but before the position was committed: the
    // offset file still says 0, so all three are delivered again after the restart.
    std::fs::write(
        dir.path().join("consumers/orders/bill.offset"),
        "tidings-offset 1 0\n",
    )
    .unwrap();
    let skipped = run(dir.path(), &clock, &work);
    assert_eq!(skipped, 3); // R-DEL-5: durable across the restart
    assert_eq!(work.load(Ordering::SeqCst), 3); // R-DEL-5: no message processed twice
}
