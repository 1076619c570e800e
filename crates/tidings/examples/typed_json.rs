//! Typed payloads (R-PAT-3): publish your own types as JSON, handle them typed, and watch a
//! payload that does not decode go to the dead-letter queue as `Rejected` — once, with the
//! decoder's error, never retried. The thread driver (the default) runs the handler; the
//! example waits for it and asserts what it prints.
//!
//! ```text
//! cargo run -p tidings --features serde --example typed_json
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tidings::{
    Broker, DeadLetterReason, HandlerError, Message, Retry, SubscribeOptions, json_handler,
};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u64,
    item: String,
    cents: u64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let broker = Broker::new();

    let billed: Arc<Mutex<Vec<Order>>> = Arc::default();
    let log = billed.clone();
    let billing = broker.subscribe(
        "orders.*",
        SubscribeOptions::new().retry(Retry::fixed(Duration::from_millis(10), 5)),
        json_handler(move |order: Order, msg: &Message| {
            if order.cents == 0 {
                return Err(HandlerError::reject(format!("order {} is free", order.id)));
            }
            println!(
                "billing order {} ({} x {} cents), content-type {:?}",
                order.id,
                order.item,
                order.cents,
                msg.header("content-type")
            );
            log.lock().expect("not poisoned").push(order);
            Ok(())
        }),
    )?;

    // Typed in: the payload is JSON and the content type travels in a header.
    let order = Order {
        id: 42,
        item: "socks".into(),
        cents: 1250,
    };
    broker.publish(Message::to("orders.created").json(&order)?)?;
    // A foreign producer's bytes: truncated JSON.
    broker.publish(Message::to("orders.created").payload(r#"{"id": 43, "item": "ha"#))?;

    assert!(
        broker.wait_idle(Duration::from_secs(10)),
        "not idle in time"
    );
    assert_eq!(*billed.lock().expect("not poisoned"), vec![order]);

    let dead = billing.dead_letters();
    assert_eq!(dead.len(), 1);
    let entry = &dead[0];
    println!(
        "dead-lettered after {} attempt(s): {}",
        entry.attempts, entry.reason
    );
    assert_eq!(entry.attempts, 1); // never retried
    assert_eq!(
        entry.reason,
        DeadLetterReason::Rejected {
            error: "cannot decode the application/json payload: EOF while parsing a string \
                    at line 1 column 22"
                .into()
        }
    );

    let report = broker.close(Duration::from_secs(5));
    assert!(report.is_clean(), "{report:?}");
    println!("ok");
    Ok(())
}
