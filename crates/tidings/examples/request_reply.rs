//! Request-reply: a responder answers on the request's reply-to topic with the same
//! correlation id; `Broker::request` waits for the matching reply or times out.
//!
//! ```text
//! cargo run -p tidings --example request_reply
//! ```

use std::time::Duration;

use tidings::{Broker, HandlerError, Message, RequestError, SubscribeOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let broker = Broker::builder().build()?;

    // The responder holds a weak handle: the broker owns the subscription, so a strong one
    // would keep the broker alive forever.
    let weak = broker.downgrade();
    let _doubler = broker.subscribe(
        "math.double",
        SubscribeOptions::default(),
        move |m: &Message| {
            let n: i64 = std::str::from_utf8(m.payload())?.trim().parse()?;
            let (Some(broker), Some(reply)) = (weak.upgrade(), m.reply()) else {
                return Err(HandlerError::reject("not a request, or the broker is gone"));
            };
            broker.publish(reply.payload((2 * n).to_string()))?;
            Ok(())
        },
    )?;
    // A subscriber that never answers.
    let _silent = broker.subscribe("math.silent", SubscribeOptions::default(), |_: &Message| {
        Ok::<(), HandlerError>(())
    })?;

    for n in [21, -4, 1_000_000] {
        let reply = broker.request(
            Message::to("math.double").payload(n.to_string()),
            Duration::from_secs(5),
        )?;
        let text = std::str::from_utf8(reply.payload())?;
        println!(
            "double({n}) = {text} (correlation id {:?})",
            reply.correlation_id()
        );
        assert_eq!(text, (2 * n).to_string());
    }

    let e = broker
        .request(Message::to("math.silent"), Duration::from_millis(100))
        .unwrap_err();
    println!("no reply in time: {e}");
    assert!(matches!(e, RequestError::Timeout));
    let e = broker
        .request(Message::to("math.nobody"), Duration::from_secs(1))
        .unwrap_err();
    println!("no subscriber:    {e}");
    assert!(matches!(e, RequestError::NoResponders));
    assert_eq!(broker.pending_requests(), 0);

    assert!(broker.close(Duration::from_secs(5)).is_clean());
    Ok(())
}
