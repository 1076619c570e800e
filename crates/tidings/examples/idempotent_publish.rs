//! Idempotent publish on the embedded log (R-DEL-7): the retry recipe.
//!
//! A publisher that does not know whether its publish was stored (the call failed, the
//! process died before it saw the answer) publishes again **with the same id**. Within the
//! stream's duplicate window (`StreamConfig::duplicate_window`, default 2 minutes) the
//! stream stores nothing the second time and the report says so — also after a restart:
//! the window is rebuilt from the log's tail. Past the window the retry is a new message:
//! retry within it.
//!
//! The window follows the broker's clock; this example uses a `ManualClock` to step past
//! it instead of waiting two minutes.
//!
//! ```text
//! cargo run -p tidings --example idempotent_publish
//! ```

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tidings::embedded::EmbeddedBackend;
use tidings::{Broker, ManualClock, Message, MessageId, PublishReport, StreamConfig};

fn open(dir: &Path, clock: &ManualClock) -> Result<Broker, Box<dyn std::error::Error>> {
    let broker = Broker::builder()
        .durable_backend(Arc::new(EmbeddedBackend::new(dir)))
        .clock(clock.clone())
        .build()?;
    broker.create_stream(
        StreamConfig::new("payments", ["payments.#"]).duplicate_window(Duration::from_secs(120)),
    )?;
    Ok(broker)
}

fn capture(broker: &Broker, id: MessageId) -> Result<PublishReport, Box<dyn std::error::Error>> {
    // The id is chosen once, before the first attempt, and kept with the request.
    Ok(broker.publish(
        Message::to("payments.captured")
            .id(id)
            .payload("order-42: 19.99 EUR"),
    )?)
}

fn stored(broker: &Broker) -> u64 {
    broker.stream("payments").map_or(0, |s| s.end_offset())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let id = MessageId::new();

    // 1. Publish, then retry (the answer was lost): stored once.
    let clock = ManualClock::new();
    {
        let broker = open(tmp.path(), &clock)?;
        let first = capture(&broker, id)?;
        let retry = capture(&broker, id)?;
        println!(
            "first: duplicate_in {:?}; retry: duplicate_in {:?}",
            first.duplicate_in, retry.duplicate_in
        );
        assert!(!first.is_duplicate());
        assert_eq!(retry.duplicate_in, ["payments"]);
        assert_eq!(stored(&broker), 1);
        broker.close(Duration::from_secs(5));
    }

    // 2. The publisher restarts and retries once more, a minute later: still stored once.
    let clock = ManualClock::new();
    let broker = open(tmp.path(), &clock)?;
    clock.advance(Duration::from_secs(60));
    let after_restart = capture(&broker, id)?;
    println!(
        "after a restart: duplicate_in {:?}",
        after_restart.duplicate_in
    );
    assert!(after_restart.is_duplicate());
    assert_eq!(stored(&broker), 1);

    // 3. Where the recipe stops: a retry later than the window is stored again.
    clock.advance(Duration::from_secs(121));
    let too_late = capture(&broker, id)?;
    println!(
        "after the window: duplicate_in {:?} (stored again)",
        too_late.duplicate_in
    );
    assert!(!too_late.is_duplicate());
    assert_eq!(stored(&broker), 2);
    broker.close(Duration::from_secs(5));
    println!("ok: one payment per retry within the window");
    Ok(())
}
