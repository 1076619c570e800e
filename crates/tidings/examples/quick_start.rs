//! Quick start: a broker, two subscriptions on wildcard patterns, a failing message that
//! ends in the dead-letter queue, and a clean close.
//!
//! ```text
//! cargo run -p tidings --example quick_start
//! ```

use std::time::Duration;

use tidings::{Broker, HandlerError, Message, Retry, SubscribeOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Thread driver and system clock: the defaults.
    let broker = Broker::builder().build()?;

    // `*` matches one word, `#` zero or more (AMQP topic-exchange rules).
    let billing = broker.subscribe(
        "orders.*",
        SubscribeOptions::new()
            .name("billing")
            .retry(Retry::fixed(Duration::from_millis(10), 2)),
        |m: &Message| {
            let amount: u64 = std::str::from_utf8(m.payload())?.parse()?;
            if amount > 1_000 {
                return Err(HandlerError::reject("over the credit limit"));
            }
            println!("billing: charged {amount} for {}", m.topic());
            Ok(())
        },
    )?;
    let audit = broker.subscribe("orders.#", SubscribeOptions::default(), |m: &Message| {
        println!("audit:   {} {:?}", m.topic(), m.payload());
        Ok::<(), HandlerError>(())
    })?;

    for (topic, amount) in [
        ("orders.created", "25"),
        ("orders.created", "5000"),
        ("orders.paid", "x"),
    ] {
        let report = broker.publish(Message::to(topic).payload(amount))?;
        println!(
            "published {topic} {amount}: accepted by {} subscription(s)",
            report.accepted
        );
    }

    // Wait (bounded) until billing has finished all three: "x" is retried once, 10 ms
    // later. `close` would abandon a retry still waiting and report it as undelivered.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while billing.stats().delivered + billing.stats().dead_lettered.total() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "billing did not finish"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Close delivers what is queued (up to the drain deadline) and reports what was left.
    let report = broker.close(Duration::from_secs(5));
    assert!(report.is_clean(), "{report:?}");

    let stats = billing.stats();
    println!(
        "billing: delivered {}, dead-lettered {}, attempts {}",
        stats.delivered,
        stats.dead_lettered.total(),
        stats.attempts
    );
    for dl in billing.dead_letters() {
        println!(
            "  dead letter {:?}: {} ({} attempt(s))",
            dl.message.payload(),
            dl.reason,
            dl.attempts
        );
    }
    assert_eq!(stats.delivered, 1);
    // "5000" was rejected at once; "x" failed to parse twice (a retryable error).
    assert_eq!(stats.dead_lettered.total(), 2);
    assert_eq!(audit.stats().delivered, 3);
    assert!(stats.is_conserved()); // every message accounted for (R-DEL-6)
    Ok(())
}
