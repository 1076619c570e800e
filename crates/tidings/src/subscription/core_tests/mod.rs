//! The sans-IO core's own cases, run by the deterministic [`harness`]: each drives a
//! [`Core`](super::core::Core) with an explicit clock and compares what it answered —
//! deliveries and effects — exactly. The harness checks conservation (R-DEL-6) and the
//! concurrency rules after every step, so every case checks them too.

mod defer;
mod harness;

use std::time::Duration;

use crate::dlq::DeadLetterReason;
use crate::handler::HandlerError;
use crate::message::{Message, Priority};
use crate::options::{Concurrency, DeadLetterOptions, DeliveryMode, Overflow, SubscribeOptions};
use crate::retry::Retry;

use super::core::{Offered, Refusal};
use super::lanes::fnv1a;
use harness::{Event, Harness, Polled, dead_letter, deliver, finished, ms};

/// Options whose dead letters are forwarded, so every dead letter is an effect the
/// harness records.
fn opts() -> SubscribeOptions {
    SubscribeOptions::new().dead_letter(DeadLetterOptions::new().topic("dlq"))
}

fn exhausted(attempts: u32, last_error: &str) -> DeadLetterReason {
    DeadLetterReason::RetriesExhausted {
        attempts,
        last_error: last_error.into(),
    }
}

fn rejected(error: &str) -> DeadLetterReason {
    DeadLetterReason::Rejected {
        error: error.into(),
    }
}

fn plain(payload: &str) -> crate::message::MessageBuilder {
    Message::to("t").payload(payload.to_owned())
}

fn keyed(payload: &str, key: &str) -> crate::message::MessageBuilder {
    plain(payload).key(key)
}

/// The first of `k0`, `k1`, … that hashes to `lane` of `lanes`.
fn key_in_lane(lane: usize, lanes: usize) -> String {
    (0..)
        .map(|i| format!("k{i}"))
        .find(|k| (fnv1a(k.as_bytes()) % lanes as u64) as usize == lane)
        .expect("some key lands in every lane")
}

// R-DEL-3, R-DEL-1, R-ORD-1: the waits are exactly the policy's ([100ms, 200ms]), the
// failing message holds the head of the queue meanwhile, and after the last attempt it is
// dead-lettered `RetriesExhausted` with its attempts and last error.
#[test]
fn exponential_backoff_waits_exactly_the_policy_then_dead_letters() {
    let mut h = Harness::new(opts().retry(Retry::exponential(ms(100), 2.0).max_attempts(3)));
    h.handler(|msg, attempt| match msg {
        "a" => Err(HandlerError::retry(format!("down {attempt}"))),
        _ => Ok(()),
    });
    h.offer_all(&["a", "b"]);

    // By hand: the first failure asks for a wake-up exactly one initial wait later.
    assert_eq!(
        h.poll(0),
        Polled::Deliver {
            msg: "a".into(),
            attempt: 1
        }
    );
    h.complete(0, Err(HandlerError::retry("down 1")));
    assert_eq!(h.poll(0), Polled::WakeAt(ms(100)));
    assert_eq!(h.core().next_wake(), Some(h.instant(ms(100))));

    h.drive();
    assert_eq!(
        h.take_events(),
        vec![
            deliver(0, 0, "a", 1),
            deliver(100, 0, "a", 2),
            deliver(300, 0, "a", 3),
            dead_letter(300, "a", exhausted(3, "down 3"), 3),
            deliver(300, 0, "b", 1),
        ]
    );
    let s = h.stats();
    assert_eq!((s.attempts, s.failures, s.delivered), (4, 3, 1));
    assert_eq!(s.dead_lettered.retries_exhausted, 1);
    assert_eq!(h.core().next_wake(), None);
}

// R-DEL-3: an exponential wait is capped at the policy's max; a fixed one is the same
// every time; a message that succeeds on a retry is delivered, never dead-lettered.
#[test]
fn backoff_is_capped_and_fixed_waits_repeat() {
    let mut h = Harness::new(
        opts().retry(
            Retry::exponential(ms(100), 10.0)
                .max_delay(ms(500))
                .max_attempts(4),
        ),
    );
    h.handler(|_, attempt| match attempt {
        4 => Ok(()),
        _ => Err(HandlerError::retry("not yet")),
    });
    h.offer_all(&["a"]);
    h.drive();
    assert_eq!(
        h.take_events(),
        vec![
            deliver(0, 0, "a", 1),
            deliver(100, 0, "a", 2),
            deliver(600, 0, "a", 3),
            deliver(1100, 0, "a", 4),
        ]
    );
    assert_eq!(h.stats().delivered, 1);

    let mut h = Harness::new(opts().retry(Retry::fixed(ms(250), 3)));
    h.handler(|_, _| Err(HandlerError::retry("never")));
    h.offer_all(&["a"]);
    h.drive();
    assert_eq!(
        h.take_events(),
        vec![
            deliver(0, 0, "a", 1),
            deliver(250, 0, "a", 2),
            deliver(500, 0, "a", 3),
            dead_letter(500, "a", exhausted(3, "never"), 3),
        ]
    );
}

// R-DEL-1: a non-retryable error goes straight to the DLQ as `Rejected`, whatever the
// retry policy; nothing waits to retry.
#[test]
fn a_non_retryable_error_is_rejected_at_once() {
    let mut h = Harness::new(opts()); // the default policy retries 5 times
    h.handler(|msg, _| match msg {
        "bad" => Err(HandlerError::reject("malformed")),
        _ => Ok(()),
    });
    h.offer_all(&["bad", "good"]);
    assert_eq!(h.drive(), 2);
    assert_eq!(
        h.take_events(),
        vec![
            deliver(0, 0, "bad", 1),
            dead_letter(0, "bad", rejected("malformed"), 1),
            deliver(0, 0, "good", 1),
        ]
    );
    assert_eq!(h.stats().dead_lettered.rejected, 1);
    assert_eq!(h.core().next_wake(), None);
}

// R-DEL-2: at-most-once makes one attempt whatever the policy says; the failure is still
// counted, as `RetriesExhausted { attempts: 1 }`.
#[test]
fn at_most_once_never_redelivers() {
    let mut h = Harness::new(
        opts()
            .delivery(DeliveryMode::AtMostOnce)
            .retry(Retry::fixed(ms(1), 10)),
    );
    h.handler(|_, _| Err(HandlerError::retry("nope")));
    h.offer_all(&["a", "b"]);
    assert_eq!(h.drive(), 2);
    assert_eq!(
        h.take_events(),
        vec![
            deliver(0, 0, "a", 1),
            dead_letter(0, "a", exhausted(1, "nope"), 1),
            deliver(0, 0, "b", 1),
            dead_letter(0, "b", exhausted(1, "nope"), 1),
        ]
    );
    assert_eq!(h.elapsed(), Duration::ZERO, "no retry was ever scheduled");
    assert_eq!(h.stats().attempts, 2);
}

// R-TIME-1: expiry is checked when a message is dequeued. Messages that expire while
// queued behind a retry are dead-lettered `Expired` (0 attempts) and never delivered;
// a message whose expiry is exactly now has expired; one without a TTL is delivered.
#[test]
fn a_message_expiring_while_queued_is_dead_lettered_expired() {
    let mut h = Harness::new(opts().retry(Retry::fixed(ms(100), 2)));
    h.handler(|msg, attempt| match (msg, attempt) {
        ("head", 1) => Err(HandlerError::retry("once")),
        _ => Ok(()),
    });
    h.offer_all(&["head"]);
    for m in [
        plain("short").ttl(ms(50)),
        plain("exact").ttl(ms(100)),
        plain("long").ttl(ms(101)),
        plain("forever"),
    ] {
        assert_eq!(h.offer(m), Offered::Accepted(None));
    }
    h.drive();
    assert_eq!(
        h.take_events(),
        vec![
            deliver(0, 0, "head", 1),
            deliver(100, 0, "head", 2),
            dead_letter(100, "short", DeadLetterReason::Expired, 0),
            dead_letter(100, "exact", DeadLetterReason::Expired, 0),
            deliver(100, 0, "long", 1),
            deliver(100, 0, "forever", 1),
        ]
    );
    assert_eq!(h.stats().dead_lettered.expired, 2);
}

// R-TIME-1: a subscription's default TTL applies too, and age is checked before every
// attempt, retries included: the retry due after the TTL is dead-lettered `Expired` with
// the attempts made.
#[test]
fn a_retry_past_the_default_ttl_is_dead_lettered_expired() {
    let mut h = Harness::new(
        opts()
            .ttl(ms(150))
            .retry(Retry::exponential(ms(100), 2.0).max_attempts(5)),
    );
    h.handler(|_, _| Err(HandlerError::retry("down")));
    h.offer_all(&["a"]);
    h.drive();
    assert_eq!(
        h.take_events(),
        vec![
            deliver(0, 0, "a", 1),
            deliver(100, 0, "a", 2),
            dead_letter(300, "a", DeadLetterReason::Expired, 2),
        ]
    );
}

// R-ORD-3, R-CORE-3: with 2 lanes each key keeps its publish order on its own lane, and
// the lanes run at the same time; no lane ever runs two handlers at once (checked by the
// harness at every delivery).
#[test]
fn lanes_keep_each_keys_order_and_run_keys_concurrently() {
    let (a, b) = (key_in_lane(0, 2), key_in_lane(1, 2));
    let mut h = Harness::new(opts().concurrency(Concurrency::Lanes(2)));
    // Every slot finds nothing and sleeps: each offer must wake its lane's slot.
    assert_eq!(h.drive(), 0);
    for (payload, key) in [("a1", &a), ("a2", &a), ("b1", &b), ("a3", &a), ("b2", &b)] {
        h.accept(keyed(payload, key));
    }
    // Unkeyed messages go to lane 0 (R-ORD-3).
    h.accept(plain("u1"));
    h.drive();
    assert_eq!(
        h.take_events(),
        vec![
            deliver(0, 0, "a1", 1),
            deliver(0, 1, "b1", 1),
            deliver(0, 0, "a2", 1),
            deliver(0, 1, "b2", 1),
            deliver(0, 0, "a3", 1),
            deliver(0, 0, "u1", 1),
        ]
    );
    assert_eq!(h.max_running(), 2, "the two lanes ran at once");
}

// R-ORD-3, R-ORD-1: a retry holds the head of its own lane only; the other lane goes on.
#[test]
fn a_parked_retry_blocks_only_its_lane() {
    let (a, b) = (key_in_lane(0, 2), key_in_lane(1, 2));
    let mut h = Harness::new(
        opts()
            .concurrency(Concurrency::Lanes(2))
            .retry(Retry::fixed(ms(100), 3)),
    );
    h.handler(|msg, attempt| match (msg, attempt) {
        ("a1", 1) => Err(HandlerError::retry("once")),
        _ => Ok(()),
    });
    for (payload, key) in [("a1", &a), ("a2", &a), ("b1", &b), ("b2", &b)] {
        h.accept(keyed(payload, key));
    }
    h.drive();
    assert_eq!(
        h.take_events(),
        vec![
            deliver(0, 0, "a1", 1),
            deliver(0, 1, "b1", 1),
            deliver(0, 1, "b2", 1),
            deliver(100, 0, "a1", 2),
            deliver(100, 0, "a2", 1),
        ]
    );
}

// R-ORD-4, R-ORD-5: per-key concurrency parks a failing key alone: its later messages wait
// for its retry, in order, while other keys use every slot; a parked retry holds no slot.
#[test]
fn a_failing_key_parks_only_itself() {
    let mut h = Harness::new(
        opts()
            .concurrency(Concurrency::PerKey { max_in_flight: 2 })
            .retry(Retry::fixed(ms(100), 3)),
    );
    assert_eq!(h.drive(), 0); // both slots asleep: offers wake them
    h.handler(|msg, attempt| match (msg, attempt) {
        ("a1", 1 | 2) => Err(HandlerError::retry("a is down")),
        _ => Ok(()),
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
            // a1 waits to retry: a2 waits behind it, b and c take both slots.
            deliver(0, 0, "b2", 1),
            deliver(0, 1, "c1", 1),
            deliver(0, 0, "b3", 1),
            deliver(100, 0, "a1", 2),
            deliver(200, 0, "a1", 3),
            deliver(200, 0, "a2", 1),
        ]
    );
    assert_eq!(h.max_running(), 2);
}

// R-ORD-4: an offer wakes a slot that is free. A slot woken by its timer (not by an offer)
// and now running a retry must not be the one an offer claims, or the offered message waits
// for that handler while the other slot sleeps.
#[test]
fn an_offer_wakes_a_free_slot_not_a_busy_one() {
    let mut h = Harness::new(
        opts()
            .concurrency(Concurrency::PerKey { max_in_flight: 2 })
            .retry(Retry::fixed(ms(100), 3)),
    );
    assert_eq!(h.poll(0), Polled::Idle);
    assert_eq!(h.poll(1), Polled::Idle);
    assert_eq!(h.offer(keyed("a1", "a")), Offered::Accepted(Some(0)));
    assert!(matches!(h.poll(0), Polled::Deliver { .. }));
    h.complete(0, Err(HandlerError::retry("down")));
    assert_eq!(h.poll(0), Polled::WakeAt(ms(100)));
    h.advance(ms(100));
    // Slot 0's timer fires: it takes the retry.
    assert_eq!(
        h.poll(0),
        Polled::Deliver {
            msg: "a1".into(),
            attempt: 2
        }
    );
    assert_eq!(h.offer(keyed("b1", "b")), Offered::Accepted(Some(1)));
    assert_eq!(
        h.poll(1),
        Polled::Deliver {
            msg: "b1".into(),
            attempt: 1
        }
    );
    assert_eq!(h.max_running(), 2);
}

// R-CORE-6: close reports exactly what was left: the retry waiting and the queued messages
// (in that order), each a `Shutdown` dead letter with its attempts; handlers running at
// close finish — delivered if they succeed, abandoned (and reported later) if they fail
// retryably; later offers are refused `Closed` and every slot stops.
#[test]
fn close_reports_exactly_what_was_queued_or_waiting() {
    let mut h = Harness::new(
        opts()
            .concurrency(Concurrency::PerKey { max_in_flight: 3 })
            .retry(Retry::fixed(ms(100), 3)),
    );
    for (payload, key) in [
        ("a1", "a"),
        ("b1", "b"),
        ("c1", "c"),
        ("a2", "a"),
        ("b2", "b"),
    ] {
        h.accept(keyed(payload, key));
    }
    assert!(matches!(h.poll(0), Polled::Deliver { msg, .. } if msg == "a1"));
    assert!(matches!(h.poll(1), Polled::Deliver { msg, .. } if msg == "b1"));
    assert!(matches!(h.poll(2), Polled::Deliver { msg, .. } if msg == "c1"));
    h.complete(0, Err(HandlerError::retry("down")));
    h.take_events();

    h.advance(ms(10));
    assert_eq!(h.close(), vec!["a1", "a2", "b2"]);
    assert_eq!(
        h.take_events(),
        vec![
            dead_letter(10, "a1", DeadLetterReason::Shutdown, 1),
            dead_letter(10, "a2", DeadLetterReason::Shutdown, 0),
            dead_letter(10, "b2", DeadLetterReason::Shutdown, 0),
            // Close wakes every blocked publisher, to be refused.
            Event::Room { at: ms(10) },
        ]
    );
    assert_eq!(h.offer(plain("late")), Offered::Refused(Refusal::Closed));
    assert_eq!(h.poll(0), Polled::Stopped);

    h.complete(1, Err(HandlerError::retry("interrupted")));
    h.complete(2, Ok(()));
    assert_eq!(
        h.take_events(),
        vec![dead_letter(10, "b1", DeadLetterReason::Shutdown, 1)]
    );
    assert_eq!(h.take_shutdown(), vec!["b1"]);
    assert_eq!(h.drive(), 0);

    let s = h.stats();
    assert_eq!(s.dead_lettered.shutdown, 4);
    assert_eq!((s.delivered, s.refused.closed), (1, 1));
    assert_eq!((s.queued, s.in_flight), (0, 0));
}

// R-CORE-6: a drain abandons the waiting retry at once, refuses new offers, delivers what
// is queued until its deadline, then stops; close reports everything abandoned since the
// drain began.
#[test]
fn drain_delivers_until_its_deadline_and_close_reports_the_rest() {
    let mut h = Harness::new(opts().retry(Retry::fixed(ms(100), 3)));
    h.offer_all(&["r", "q1", "q2"]);
    assert!(matches!(h.poll(0), Polled::Deliver { msg, .. } if msg == "r"));
    h.complete(0, Err(HandlerError::retry("down")));
    h.take_events();

    h.begin_drain(Some(ms(50)));
    assert_eq!(
        h.take_events(),
        vec![dead_letter(0, "r", DeadLetterReason::Shutdown, 1)]
    );
    assert_eq!(h.offer(plain("late")), Offered::Refused(Refusal::Closed));
    assert!(matches!(h.poll(0), Polled::Deliver { msg, .. } if msg == "q1"));
    h.complete(0, Ok(()));
    h.advance(ms(50));
    assert_eq!(h.poll(0), Polled::Stopped);

    assert_eq!(h.close(), vec!["r", "q2"]);
    assert_eq!(
        h.take_events(),
        vec![
            deliver(0, 0, "q1", 1),
            dead_letter(50, "q2", DeadLetterReason::Shutdown, 0),
            Event::Room { at: ms(50) },
        ]
    );
}

// R-DEL-6: every way in and out is counted by its reason, and the ledger balances at every
// step (the harness checks `offered = accepted + refused` and `accepted = delivered +
// dead-lettered + queued + in flight` after each one).
#[test]
fn every_path_is_counted_by_its_reason() {
    let mut h = Harness::new(opts().capacity(4).retry(Retry::fixed(ms(10), 2)));
    h.handler(|msg, _| match msg {
        "rejected" => Err(HandlerError::reject("no")),
        "exhausted" | "parked" => Err(HandlerError::retry("down")),
        _ => Ok(()),
    });
    h.filtered();
    h.filter_panicked(plain("panicked"), "predicate panicked: boom");
    h.offer_all(&["ok", "rejected", "exhausted"]);
    assert_eq!(
        h.offer(plain("expired").ttl(ms(5))),
        Offered::Accepted(None)
    );
    assert_eq!(h.offer(plain("full")), Offered::Refused(Refusal::Overflow));
    h.advance(ms(5));
    h.drive();
    h.offer_all(&["parked", "queued"]);
    assert!(matches!(h.poll(0), Polled::Deliver { msg, .. } if msg == "parked"));
    h.complete(0, Err(HandlerError::retry("down")));
    assert_eq!(h.close(), vec!["parked", "queued"]);
    assert_eq!(h.offer(plain("closed")), Offered::Refused(Refusal::Closed));

    let s = h.stats();
    assert_eq!((s.offered, s.accepted, s.refused.total()), (10, 7, 3));
    assert_eq!(
        (s.refused.filtered, s.refused.overflow, s.refused.closed),
        (1, 1, 1)
    );
    assert_eq!(s.delivered, 1);
    let d = &s.dead_lettered;
    assert_eq!(
        (d.rejected, d.retries_exhausted, d.expired, d.shutdown),
        (2, 1, 1, 2)
    );
    assert_eq!((s.queued, s.in_flight), (0, 0));
    // The overflow refusal is a dead letter too, though not an accepted message.
    assert_eq!(s.dlq_len, 7);
}

// R-BP-1, R-DEL-6: `DropOldest` evicts the oldest of the lowest priority to make room;
// the eviction is counted even when the message is not kept.
#[test]
fn drop_oldest_evicts_and_counts_without_keeping() {
    let mut h = Harness::new(
        opts()
            .capacity(2)
            .overflow(Overflow::DropOldest { keep: false }),
    );
    h.accept(plain("high").priority(Priority::High));
    h.offer_all(&["n1", "n2", "n3"]);
    h.drive();
    assert_eq!(
        h.take_events(),
        vec![deliver(0, 0, "high", 1), deliver(0, 0, "n3", 1)]
    );
    let s = h.stats();
    assert_eq!((s.accepted, s.delivered), (4, 2));
    assert_eq!((s.dead_lettered.dropped_oldest, s.dlq_len), (2, 0));
}

// R-BP-1: under `Block`, a full queue answers `Full` without counting (the publisher waits
// and offers again); taking messages reports room once a quarter of the queue is free
// while a publisher is blocked; an offer that may no longer wait is refused as overflow.
#[test]
fn block_reports_room_once_a_quarter_is_free() {
    let mut h = Harness::new(
        opts()
            .capacity(8)
            .overflow(Overflow::Block { timeout: ms(50) }),
    );
    h.offer_all(&["1", "2", "3", "4", "5", "6", "7", "8"]);
    assert_eq!(h.offer(plain("waits")), Offered::Full);
    assert_eq!(h.stats().offered, 8, "a wait is not an offer yet");
    h.core().set_blocked(true);
    for _ in 0..2 {
        assert!(matches!(h.poll(0), Polled::Deliver { .. }));
        h.complete(0, Ok(()));
    }
    assert_eq!(
        h.take_events(),
        vec![
            deliver(0, 0, "1", 1),
            Event::Room { at: ms(0) },
            deliver(0, 0, "2", 1),
        ]
    );
    assert_eq!(
        h.offer_with(plain("waited"), false),
        Offered::Accepted(None)
    );
    assert_eq!(h.offer_with(plain("in"), false), Offered::Accepted(None));
    h.core().set_blocked(false);
    assert_eq!(
        h.offer_with(plain("timed out"), false),
        Offered::Refused(Refusal::Overflow)
    );
    assert_eq!(
        h.take_events(),
        vec![dead_letter(0, "timed out", DeadLetterReason::Overflow, 0)]
    );
}

// R-LOG-3: a durable subscription hears of every message that finished, in the order they
// finished — delivered or dead-lettered with reason and attempts — and never of one
// abandoned at close (its offset must not be committed).
#[test]
fn finished_reports_name_every_end_but_shutdown() {
    let mut h = Harness::new(
        opts()
            .retry(Retry::fixed(ms(10), 2))
            .dead_letter(DeadLetterOptions::default()),
    )
    .reporting_finished();
    h.handler(|msg, _| match msg {
        "bad" => Err(HandlerError::reject("no")),
        "down" => Err(HandlerError::retry("down")),
        _ => Ok(()),
    });
    h.offer_all(&["ok", "bad", "down"]);
    h.accept(plain("stale").ttl(ms(1)));
    h.drive();
    h.offer_all(&["left"]);
    assert_eq!(h.close(), vec!["left"]);
    assert_eq!(
        h.take_events(),
        vec![
            deliver(0, 0, "ok", 1),
            finished(0, "ok", None),
            deliver(0, 0, "bad", 1),
            finished(0, "bad", Some((rejected("no"), 1))),
            deliver(0, 0, "down", 1),
            deliver(10, 0, "down", 2),
            finished(10, "down", Some((exhausted(2, "down"), 2))),
            finished(10, "stale", Some((DeadLetterReason::Expired, 0))),
            // "left" was abandoned at close: no report; close wakes blocked publishers.
            Event::Room { at: ms(10) },
        ]
    );
}

/// R-DIST-6: a message the start gate refuses (its key moved to another process) is
/// released: no handler attempt, no finished report (its cursor delivers it again
/// elsewhere), its key free for the next message, counted in `released`. A retry is
/// asked again before its next attempt.
#[test]
fn a_released_delivery_is_not_an_attempt_frees_its_key_and_is_never_reported_finished() {
    let refuse = std::sync::Arc::new(std::sync::Mutex::new(vec!["a1".to_owned()]));
    let gate_refuses = refuse.clone();
    let mut h = Harness::new(
        opts()
            .concurrency(Concurrency::PerKey { max_in_flight: 2 })
            .retry(Retry::fixed(ms(10), 3))
            .dead_letter(DeadLetterOptions::default()),
    )
    .gated(move |payload| !gate_refuses.lock().unwrap().iter().any(|r| r == payload));
    h.handler(|msg, attempt| match (msg, attempt) {
        ("c1", 1) => Err(HandlerError::retry("down")),
        _ => Ok(()),
    });
    h.accept(keyed("a1", "a"));
    h.accept(keyed("a2", "a"));
    h.accept(keyed("c1", "c"));
    // The first attempt fails; the key moves away before the retry is due.
    assert_eq!(
        h.poll(0),
        Polled::Deliver {
            msg: "a2".into(),
            attempt: 1
        },
        "a1 released, its key free at once"
    );
    assert_eq!(
        h.poll(1),
        Polled::Deliver {
            msg: "c1".into(),
            attempt: 1
        }
    );
    h.complete(0, Ok(()));
    h.complete(1, Err(HandlerError::retry("down")));
    refuse.lock().unwrap().push("c1".into());
    h.drive();
    h.accept(keyed("c2", "c"));
    h.drive();
    assert_eq!(
        h.take_events(),
        vec![
            deliver(0, 0, "a2", 1),
            deliver(0, 1, "c1", 1),
            finished(0, "a2", None),
            // c1's retry fell due at 10 ms and was released: its key is free for c2.
            deliver(10, 0, "c2", 1),
            finished(10, "c2", None),
        ],
        "nothing of a1 or c1 after their release: no attempt, no report"
    );
    let s = h.stats();
    assert_eq!((s.released, s.attempts, s.delivered), (2, 3, 2), "{s:?}");
    assert_eq!((s.queued, s.in_flight), (0, 0), "{s:?}");
    assert!(s.is_conserved(), "{s:?}");
}
