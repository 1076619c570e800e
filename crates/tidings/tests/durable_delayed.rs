//! Delayed messages on a durable subscription (R-TIME-2, R-BP-2): a backlog of messages
//! delayed into the future does not hold back the messages due now behind it, and the
//! memory spent on held messages is bounded.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tidings::*;

#[path = "support/embedded.rs"]
mod embedded;
use embedded::jobs_broker;

fn recorder() -> (Arc<Mutex<Vec<String>>>, impl Handler) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let handler = move |m: &Message| -> Result<(), HandlerError> {
        s.lock()
            .push(String::from_utf8_lossy(m.payload()).into_owned());
        Ok(())
    };
    (seen, handler)
}

// R-TIME-2, R-BP-2: a window's worth (and more) of delayed messages, then one due now: the
// one due now is delivered at once, the delayed ones exactly when due.
#[test]
fn delayed_messages_do_not_hold_back_messages_due_now() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::new();
    let broker = jobs_broker(dir.path(), &clock);
    let window = 8;
    for i in 0..(window * 4) {
        broker
            .publish(
                Message::to("jobs.later")
                    .payload(format!("later-{i}"))
                    .delay(Duration::from_secs(12)),
            )
            .expect("publish");
    }
    broker
        .publish(Message::to("jobs.now").payload("now"))
        .expect("publish");
    let (seen, handler) = recorder();
    let sub = broker
        .subscribe(
            DurableSpec::new("jobs").name("worker"),
            SubscribeOptions::new().capacity(window),
            handler,
        )
        .expect("subscribe");
    broker.run_until_idle();
    assert_eq!(
        *seen.lock(),
        ["now"],
        "the message due now is not held back"
    );

    clock.advance(Duration::from_secs(11));
    broker.run_until_idle();
    assert_eq!(seen.lock().len(), 1, "nothing delayed is early");

    clock.advance(Duration::from_secs(1));
    broker.settle();
    let seen = seen.lock().clone();
    assert_eq!(
        seen.len(),
        window * 4 + 1,
        "every delayed message, once due"
    );
    let stats = sub.stats();
    assert_eq!(stats.delivered, (window * 4 + 1) as u64);
    broker.close(Duration::from_secs(5));
}

// R-BP-2: held messages are bounded (4,096 for a small window): with that many waiting, the
// feeder fetches nothing more — the subscription lags, nothing is refused or lost — and
// fetches again as they fall due.
#[test]
fn held_messages_are_bounded_and_nothing_is_lost() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = ManualClock::new();
    let broker = jobs_broker(dir.path(), &clock);
    let held_limit = 4096;
    for i in 0..held_limit {
        broker
            .publish(
                Message::to("jobs.later")
                    .payload(format!("later-{i}"))
                    .delay(Duration::from_secs(60)),
            )
            .expect("publish");
    }
    broker
        .publish(Message::to("jobs.now").payload("now"))
        .expect("publish");
    let (seen, handler) = recorder();
    let sub = broker
        .subscribe(
            DurableSpec::new("jobs").name("worker"),
            SubscribeOptions::new().capacity(8),
            handler,
        )
        .expect("subscribe");
    broker.run_until_idle();
    assert!(seen.lock().is_empty(), "behind the held limit: lags");
    assert!(sub.lag() > 0);

    clock.advance(Duration::from_secs(60));
    broker.settle();
    let seen = seen.lock().clone();
    assert_eq!(seen.len(), held_limit + 1, "nothing lost");
    assert!(seen.contains(&"now".to_owned()));
    broker.close(Duration::from_secs(5));
}
