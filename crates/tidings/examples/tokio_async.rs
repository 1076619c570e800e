//! Async handlers on the tokio driver: each subscription runs as a tokio task; an async
//! handler may `.await` (here a timer standing in for an HTTP call), a sync one runs inline
//! and must not block.
//!
//! ```text
//! cargo run -p tidings --features tokio --example tokio_async
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tidings::{Broker, Driver, HandlerError, Message, SubscribeOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let broker = Broker::builder()
        .driver(Driver::Tokio(rt.handle().clone()))
        .build()?;

    let shipped = Arc::new(AtomicU64::new(0));
    let s = shipped.clone();
    let _shipping = broker.subscribe(
        "orders.paid",
        SubscribeOptions::default(),
        move |m: Arc<Message>| {
            let s = s.clone();
            async move {
                // An await point: the task yields, the worker thread runs other tasks.
                tokio::time::sleep(Duration::from_millis(5)).await;
                println!("shipping {:?}", m.payload());
                s.fetch_add(1, Ordering::SeqCst);
                Ok::<(), HandlerError>(())
            }
        },
    )?;
    let counted = Arc::new(AtomicU64::new(0));
    let c = counted.clone();
    let _counter = broker.subscribe(
        "orders.#",
        SubscribeOptions::default(),
        move |_: &Message| {
            c.fetch_add(1, Ordering::SeqCst);
            Ok::<(), HandlerError>(())
        },
    )?;

    // Publish from async code: `publish_async` never blocks a runtime thread.
    rt.block_on({
        let broker = broker.clone();
        async move {
            for i in 0..10 {
                broker
                    .publish_async(Message::to("orders.paid").payload(format!("order-{i}")))
                    .await?;
            }
            Ok::<(), tidings::PublishError>(())
        }
    })?;

    // Close from outside the runtime: drains what is queued, joins every task.
    let report = broker.close(Duration::from_secs(10));
    assert!(report.is_clean(), "{report:?}");
    println!(
        "shipped {}, counted {}",
        shipped.load(Ordering::SeqCst),
        counted.load(Ordering::SeqCst)
    );
    assert_eq!(shipped.load(Ordering::SeqCst), 10);
    assert_eq!(counted.load(Ordering::SeqCst), 10);
    Ok(())
}
