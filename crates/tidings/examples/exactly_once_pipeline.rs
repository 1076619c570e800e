//! A stream-to-stream pipeline with exactly-once effects (R-DEL-7).
//!
//! A durable subscription on `orders` publishes two outputs per order to `invoices`, each
//! with an id derived from the order's (`MessageBuilder::caused_by(&input, n)`). Delivery
//! is at-least-once: after a crash, the orders handled since the last commit come again.
//! Their outputs carry the same ids as the first time, so the `invoices` stream's duplicate
//! window drops them: each output is stored once.
//!
//! The redelivery is simulated in one process: after the stage handled every order, it is
//! moved back to the first one (`DurableSubscription::seek`), so every order comes again,
//! as after a crash before the commit (`tests/exactly_once_pipeline.rs` does it with real
//! SIGKILLs).
//!
//! Where it stops: a redelivery later than the window (default 2 minutes) would store the
//! outputs again. The defaults keep well inside it: the embedded log commits every 64
//! completions and whenever the subscription is idle; JetStream redelivers after its ack
//! wait (30 s).
//!
//! ```text
//! cargo run -p tidings --example exactly_once_pipeline
//! ```

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tidings::embedded::{EmbeddedBackend, EmbeddedStreamOptions};
use tidings::{
    Broker, DurableSpec, DurableSubscription, HandlerError, Message, StartAt, StreamConfig,
    SubscribeOptions,
};

const ORDERS: u64 = 5;

fn open(dir: &Path, commit_every: usize) -> Result<Broker, Box<dyn std::error::Error>> {
    let backend = EmbeddedBackend::new(dir)
        .stream_defaults(EmbeddedStreamOptions::new().commit_every(commit_every));
    let broker = Broker::builder()
        .durable_backend(Arc::new(backend))
        .build()?;
    broker.create_stream(StreamConfig::new("orders", ["orders.#"]))?;
    broker.create_stream(StreamConfig::new("invoices", ["invoices.#"]))?;
    Ok(broker)
}

/// The pipeline stage: every order becomes an invoice and a receipt, ids derived from it.
fn run_stage(
    broker: &Broker,
    handled: &Arc<AtomicUsize>,
    dropped: &Arc<AtomicUsize>,
) -> Result<DurableSubscription, Box<dyn std::error::Error>> {
    let weak = broker.downgrade();
    let (handled, dropped) = (handled.clone(), dropped.clone());
    Ok(broker.subscribe(
        DurableSpec::new("orders").name("invoicing"),
        SubscribeOptions::default(),
        move |order: &Message| {
            let broker = weak.upgrade().ok_or(HandlerError::retry("closing"))?;
            for (n, kind) in ["invoice", "receipt"].into_iter().enumerate() {
                let report = broker
                    .publish(
                        Message::to(format!("invoices.{kind}"))
                            .caused_by(order, n as u32)
                            .payload(order.payload().clone()),
                    )
                    .map_err(|e| HandlerError::retry(e.to_string()))?;
                if report.is_duplicate() {
                    dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
            handled.fetch_add(1, Ordering::Relaxed);
            Ok(())
        },
    )?)
}

fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within 20 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let (handled, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));

    let broker = open(tmp.path(), 1_000)?;
    for i in 0..ORDERS {
        broker.publish(Message::to("orders.created").payload(format!("order-{i}")))?;
    }

    // 1. The stage handles every order, but commits nothing yet (commit_every 1000, and it
    //    never goes idle long enough to matter here)...
    let stage = run_stage(&broker, &handled, &dropped)?;
    wait_for("first handling", || {
        handled.load(Ordering::Relaxed) == ORDERS as usize
    });
    println!("first run: handled {ORDERS} orders");

    // 2. ... and every order comes again, as after a crash before the commit: the stage
    //    moves back to the first order and publishes the same outputs again.
    stage.seek(StartAt::Earliest)?;
    wait_for("redelivery", || {
        handled.load(Ordering::Relaxed) == 2 * ORDERS as usize
    });
    println!(
        "redelivered: handled {ORDERS} orders again, {} outputs dropped by the window",
        dropped.load(Ordering::Relaxed)
    );
    assert_eq!(dropped.load(Ordering::Relaxed), 2 * ORDERS as usize);

    // 3. Each output exists once.
    let invoices = broker.stream("invoices").ok_or("no invoices stream")?;
    let stored = invoices.read(invoices.start_offset(), 100)?;
    let ids: HashSet<_> = stored.iter().map(Message::id).collect();
    println!(
        "invoices stream: {} outputs, {} distinct ids",
        stored.len(),
        ids.len()
    );
    assert_eq!(stored.len(), 2 * ORDERS as usize);
    assert_eq!(ids.len(), stored.len());
    stage.commit()?;
    drop(stage);
    broker.close(Duration::from_secs(5));
    println!("ok: each output once, whatever was handled twice");
    Ok(())
}
