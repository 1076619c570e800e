//! The core's deferral outcome ([`HandlerError::defer_until`], R-PAT-2): a handler call
//! taken back, the message parked at the head of its lane or key until it is due, then
//! delivered again with the same attempt number.

use std::time::Duration;

use crate::dlq::DeadLetterReason;
use crate::handler::HandlerError;
use crate::options::Concurrency;
use crate::retry::Retry;

use super::harness::{Harness, Polled, dead_letter, deliver};
use super::{key_in_lane, keyed, opts};

// R-PAT-2, R-ORD-1: a deferral holds the head of its lane until it is due (the message
// behind it waits), comes back with the same attempt number, and is neither an attempt nor
// a failure: with no retry allowed at all, a deferred message is still delivered.
#[test]
fn a_deferred_message_waits_at_the_head_of_its_lane_and_keeps_its_attempt_number() {
    let mut h = Harness::new(opts().retry(Retry::None));
    let start = h.instant(Duration::ZERO);
    // Deferred once by hand below (to 50 ms), then once by the script (to 100 ms).
    let mut deferred = false;
    h.handler(move |msg, _| {
        if msg == "a" && !deferred {
            deferred = true;
            return Err(HandlerError::defer_until(start + ms(100)));
        }
        Ok(())
    });
    h.offer_all(&["a", "b"]);

    // By hand: the deferral asks for a wake-up exactly at its due time.
    assert_eq!(
        h.poll(0),
        Polled::Deliver {
            msg: "a".into(),
            attempt: 1
        }
    );
    h.complete(0, Err(HandlerError::defer_until(start + ms(50))));
    assert_eq!(h.poll(0), Polled::WakeAt(ms(50)));
    assert_eq!(h.core().next_wake(), Some(h.instant(ms(50))));
    let s = h.stats();
    assert_eq!((s.attempts, s.failures, s.in_flight), (0, 0, 1));

    h.drive();
    assert_eq!(
        h.take_events(),
        vec![
            deliver(0, 0, "a", 1),
            deliver(50, 0, "a", 1),
            deliver(100, 0, "a", 1),
            deliver(100, 0, "b", 1),
        ]
    );
    let s = h.stats();
    assert_eq!((s.attempts, s.failures, s.delivered), (2, 0, 2));
    assert_eq!(s.dead_lettered.total(), 0);
    assert_eq!(h.core().next_wake(), None);
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

// R-PAT-2, R-DEL-3: a deferral after a failure keeps the retry's attempt number; only the
// failure counts.
#[test]
fn a_deferred_retry_keeps_its_attempt_number() {
    let mut h = Harness::new(opts().retry(Retry::fixed(ms(100), 3)));
    let start = h.instant(Duration::ZERO);
    let mut deferred = false;
    h.handler(move |_, attempt| match attempt {
        1 => Err(HandlerError::retry("down")),
        _ if !deferred => {
            deferred = true;
            Err(HandlerError::defer_until(start + ms(130)))
        }
        _ => Ok(()),
    });
    h.offer_all(&["a"]);
    h.drive();
    assert_eq!(
        h.take_events(),
        vec![
            deliver(0, 0, "a", 1),
            deliver(100, 0, "a", 2),
            deliver(130, 0, "a", 2),
        ]
    );
    let s = h.stats();
    assert_eq!((s.attempts, s.failures, s.delivered), (2, 1, 1));
}

// R-PAT-2, R-ORD-4: under per-key concurrency a deferred key blocks only itself and holds
// no slot while it waits: the other keys use both slots. A deferral already due is
// delivered again at the next poll.
#[test]
fn a_deferred_key_blocks_only_itself_and_holds_no_slot() {
    let mut h = Harness::new(opts().concurrency(Concurrency::PerKey { max_in_flight: 2 }));
    let start = h.instant(Duration::ZERO);
    let mut calls = 0;
    h.handler(move |msg, _| {
        if msg == "a1" {
            calls += 1;
            match calls {
                // Already due: taken again at once.
                1 => return Err(HandlerError::defer_until(start)),
                2 => return Err(HandlerError::defer_until(start + ms(100))),
                _ => {}
            }
        }
        Ok(())
    });
    for (payload, key) in [
        ("a1", "a"),
        ("a2", "a"),
        ("b1", "b"),
        ("b2", "b"),
        ("b3", "b"),
        ("c1", "c"),
    ] {
        h.accept(keyed(payload, key));
    }
    h.drive();
    assert_eq!(
        h.take_events(),
        vec![
            deliver(0, 0, "a1", 1),
            deliver(0, 1, "b1", 1),
            deliver(0, 0, "a1", 1),
            deliver(0, 1, "b2", 1),
            // a1 is deferred to 100: a2 waits behind it, b and c take both slots.
            deliver(0, 0, "b3", 1),
            deliver(0, 1, "c1", 1),
            deliver(100, 0, "a1", 1),
            deliver(100, 0, "a2", 1),
        ]
    );
    assert_eq!(h.max_running(), 2);
    let s = h.stats();
    assert_eq!((s.attempts, s.failures, s.delivered), (6, 0, 6));
}

// R-CORE-6, R-PAT-2: a drain keeps a deferred message (it was never started): delivered
// when due before the deadline; one due later makes its slot wake at the deadline and
// stop, and close abandons it as `Shutdown` with the attempts made (none), in the report.
// A deferral returned after close began is abandoned at once.
#[test]
fn a_drain_keeps_a_deferral_and_close_abandons_it_like_a_waiting_retry() {
    let (a, b) = (key_in_lane(0, 2), key_in_lane(1, 2));
    let mut h = Harness::new(
        opts()
            .concurrency(Concurrency::Lanes(2))
            .retry(Retry::fixed(ms(10), 3)),
    );
    let start = h.instant(Duration::ZERO);
    h.accept(keyed("a1", &a));
    h.accept(keyed("b1", &b));
    assert!(matches!(h.poll(0), Polled::Deliver { msg, .. } if msg == "a1"));
    assert!(matches!(h.poll(1), Polled::Deliver { msg, .. } if msg == "b1"));
    h.complete(0, Err(HandlerError::defer_until(start + ms(30))));
    h.complete(1, Err(HandlerError::defer_until(start + ms(80))));
    h.take_events();

    h.begin_drain(Some(ms(50)));
    assert_eq!(h.take_events(), vec![], "a drain abandons no deferral");
    h.drive();
    assert_eq!(h.take_events(), vec![deliver(30, 0, "a1", 1)]);
    assert_eq!(
        h.elapsed(),
        ms(50),
        "b1's slot woke at the drain's deadline"
    );
    assert_eq!(h.poll(1), Polled::Stopped);

    assert_eq!(h.close(), vec!["b1"]);
    assert_eq!(
        h.take_events(),
        vec![
            dead_letter(50, "b1", DeadLetterReason::Shutdown, 0),
            super::Event::Room { at: ms(50) },
        ]
    );

    // Closed while running: the deferral cannot wait, so it is abandoned.
    let mut h = Harness::new(opts());
    h.accept(keyed("c1", &a));
    assert!(matches!(h.poll(0), Polled::Deliver { .. }));
    assert_eq!(h.close(), Vec::<String>::new());
    h.take_events();
    h.complete(0, Err(HandlerError::defer_until(start)));
    assert_eq!(
        h.take_events(),
        vec![dead_letter(0, "c1", DeadLetterReason::Shutdown, 0)]
    );
    assert_eq!(h.take_shutdown(), vec!["c1"]);
    let s = h.stats();
    assert_eq!((s.attempts, s.failures, s.in_flight), (0, 0, 0));
    assert_eq!(s.dead_lettered.shutdown, 1);
}

// R-CORE-6, R-ORD-4: the drain's other half — a waiting retry is abandoned at once, and
// under per-key concurrency its key is free again, so the messages queued behind it are
// delivered during the drain (as they are in a lane). Before, the key stayed unready and
// they waited for close.
#[test]
fn a_drain_frees_the_key_of_an_abandoned_retry() {
    let mut h = Harness::new(
        opts()
            .concurrency(Concurrency::PerKey { max_in_flight: 2 })
            .retry(Retry::fixed(ms(100), 3)),
    );
    h.accept(keyed("a1", "a"));
    h.accept(keyed("a2", "a"));
    assert!(matches!(h.poll(0), Polled::Deliver { msg, .. } if msg == "a1"));
    h.complete(0, Err(HandlerError::retry("down")));
    h.take_events();

    h.begin_drain(None);
    h.drive();
    assert_eq!(
        h.take_events(),
        vec![
            dead_letter(0, "a1", DeadLetterReason::Shutdown, 1),
            deliver(0, 0, "a2", 1),
        ]
    );
    assert_eq!(h.close(), vec!["a1"]);
}
