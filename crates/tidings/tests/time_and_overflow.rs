//! TTL, delayed delivery and overflow policies on the manual clock: exact, no sleeps.

use std::time::Duration;

use tidings::*;
use tidings_testkit::helpers::{Recorder, manual, text, wait_until};

const MS: Duration = Duration::from_millis(1);

// R-TIME-1: expiry is checked at dequeue; expired messages go to the DLQ as Expired.
#[test]
fn ttl_expires_at_dequeue() {
    let (broker, clock) = manual();
    let rec = Recorder::default();
    let sub = broker
        .subscribe("t", SubscribeOptions::new().ttl(100 * MS), rec.handler())
        .unwrap();
    broker
        .publish(Message::to("t").payload("own-50").ttl(50 * MS))
        .unwrap();
    broker
        .publish(Message::to("t").payload("default-100"))
        .unwrap();
    broker
        .publish(Message::to("t").payload("own-500").ttl(500 * MS))
        .unwrap();
    clock.advance(60 * MS);
    broker
        .publish(Message::to("t").payload("fresh-default"))
        .unwrap();
    clock.advance(40 * MS); // t = 100ms: default-100 expired exactly now
    broker.run_until_idle();
    assert_eq!(rec.take(), vec!["own-500", "fresh-default"]);
    let dlq: Vec<_> = sub
        .dead_letters()
        .iter()
        .map(|d| (text(&d.message), d.reason.clone(), d.attempts))
        .collect();
    assert_eq!(
        dlq,
        vec![
            ("own-50".into(), DeadLetterReason::Expired, 0),
            ("default-100".into(), DeadLetterReason::Expired, 0),
        ]
    );
    let s = sub.stats();
    assert_eq!((s.delivered, s.dead_lettered.expired), (2, 2));
    assert!(s.is_conserved()); // R-DEL-6
}

// R-TIME-2: delayed messages are offered when due, in due order, ties in publish order;
// a zero delay is immediate.
#[test]
fn delayed_messages_in_due_order() {
    let (broker, clock) = manual();
    let rec = Recorder::default();
    let _sub = broker
        .subscribe("t", SubscribeOptions::default(), rec.handler())
        .unwrap();
    let r = broker
        .publish(Message::to("t").payload("d300").delay(300 * MS))
        .unwrap();
    assert!(r.scheduled);
    assert_eq!(r.accepted, 0);
    broker
        .publish(Message::to("t").payload("d100-a").delay(100 * MS))
        .unwrap();
    broker
        .publish(Message::to("t").payload("d100-b").delay(100 * MS))
        .unwrap();
    broker
        .publish(Message::to("t").payload("d200").delay(200 * MS))
        .unwrap();
    let now = broker
        .publish(Message::to("t").payload("zero").delay(Duration::ZERO))
        .unwrap();
    assert!(!now.scheduled);
    assert_eq!(now.accepted, 1);
    assert_eq!(broker.scheduled(), 4);
    broker.run_until_idle();
    assert_eq!(rec.take(), vec!["zero"]);
    clock.advance(99 * MS);
    broker.run_until_idle();
    assert!(rec.take().is_empty());
    assert_eq!(broker.next_wake(), Some(Clock::now(&clock) + MS));
    clock.advance(MS);
    broker.run_until_idle();
    assert_eq!(rec.take(), vec!["d100-a", "d100-b"]);
    clock.advance(250 * MS);
    broker.run_until_idle();
    assert_eq!(rec.take(), vec!["d200", "d300"]);
    assert_eq!(broker.scheduled(), 0);
}

// R-TIME-2: close cancels what is still scheduled and reports it.
#[test]
fn close_reports_scheduled_messages() {
    let (broker, _clock) = manual();
    let _sub = broker
        .subscribe("t", SubscribeOptions::default(), |_m: &Message| Ok(()))
        .unwrap();
    broker
        .publish(
            Message::to("t")
                .payload("later")
                .delay(Duration::from_secs(60)),
        )
        .unwrap();
    broker
        .publish(
            Message::to("t")
                .payload("sooner")
                .delay(Duration::from_secs(1)),
        )
        .unwrap();
    let report = broker.close(Duration::ZERO);
    let left: Vec<_> = report
        .undelivered
        .iter()
        .map(|u| (text(&u.message), u.subscription))
        .collect();
    assert_eq!(left, vec![("sooner".into(), None), ("later".into(), None)]);
}

/// Capacity 4, 100 publishes, nothing dispatched in between: exact counts per policy.
fn flood(overflow: Overflow) -> (SubscriptionStats, Vec<String>, Vec<DeadLetter>) {
    let (broker, _clock) = manual();
    let rec = Recorder::default();
    let sub = broker
        .subscribe(
            "t",
            SubscribeOptions::new().capacity(4).overflow(overflow),
            rec.handler(),
        )
        .unwrap();
    let mut refused = 0;
    for i in 0..100 {
        refused += broker
            .publish(Message::to("t").payload(i.to_string()))
            .unwrap()
            .refused_for(Refusal::Overflow);
    }
    broker.run_until_idle();
    let s = sub.stats();
    assert_eq!(s.refused.overflow, refused as u64);
    assert!(s.is_conserved()); // R-DEL-6
    (s, rec.take(), sub.dead_letters())
}

// R-BP-1: Reject keeps the first 4, refuses 96 into the DLQ.
#[test]
fn overflow_reject_counts() {
    let (s, got, dlq) = flood(Overflow::Reject);
    assert_eq!((s.accepted, s.refused.overflow, s.delivered), (4, 96, 4));
    assert_eq!(got, vec!["0", "1", "2", "3"]);
    assert_eq!(dlq.len(), 96);
    assert!(dlq.iter().all(|d| d.reason == DeadLetterReason::Overflow));
}

// R-BP-1: DropOldest accepts all 100, evicts 96, the newest 4 are delivered.
#[test]
fn overflow_drop_oldest_counts() {
    let (s, got, dlq) = flood(Overflow::DropOldest { keep: false });
    assert_eq!(
        (
            s.accepted,
            s.refused.overflow,
            s.dead_lettered.dropped_oldest
        ),
        (100, 0, 96)
    );
    assert_eq!(got, vec!["96", "97", "98", "99"]);
    assert!(dlq.is_empty());
    let (s, _, dlq) = flood(Overflow::DropOldest { keep: true });
    assert_eq!(s.dead_lettered.dropped_oldest, 96);
    assert_eq!(dlq.len(), 96);
    assert_eq!(text(&dlq[0].message), "0");
    assert!(
        dlq.iter()
            .all(|d| d.reason == DeadLetterReason::DroppedOldest)
    );
}

// R-BP-1: Block on the manual clock times out exactly at the timeout, then refuses as
// Overflow. (Its wake-up-on-room behaviour is tested with the thread driver.)
#[test]
fn overflow_block_times_out_exactly_on_the_manual_clock() {
    let (broker, clock) = manual();
    let sub = broker
        .subscribe(
            "t",
            SubscribeOptions::new()
                .capacity(4)
                .overflow(Overflow::Block { timeout: 250 * MS }),
            |_m: &Message| Ok(()),
        )
        .unwrap();
    for _ in 0..4 {
        assert_eq!(broker.publish(Message::to("t")).unwrap().accepted, 1);
    }
    std::thread::scope(|s| {
        let b = broker.clone();
        let blocked = s.spawn(move || b.publish(Message::to("t").payload("fifth")).unwrap());
        // Advance in steps; the publisher must still be waiting until exactly 250ms.
        wait_until("publisher is blocked", Duration::from_secs(30), || {
            sub.stats().blocked_publishers == 1 // R-BP-3
        });
        clock.advance(249 * MS);
        std::thread::sleep(Duration::from_millis(20)); // give a wrong early wake-up a chance
        assert!(!blocked.is_finished(), "woke before the timeout");
        clock.advance(MS);
        let report = blocked.join().unwrap();
        assert_eq!(report.refused_for(Refusal::Overflow), 1);
    });
    let s = sub.stats();
    assert_eq!((s.accepted, s.refused.overflow, s.dlq_len), (4, 1, 1));
    assert!(s.is_conserved());
}

// R-BP-3: depth, oldest-message age and counters are visible at any time.
#[test]
fn depth_and_oldest_age_are_visible() {
    let (broker, clock) = manual();
    let sub = broker
        .subscribe("t", SubscribeOptions::default(), |_m: &Message| Ok(()))
        .unwrap();
    assert_eq!(sub.stats().oldest_age, None);
    broker.publish(Message::to("t")).unwrap();
    clock.advance(70 * MS);
    broker.publish(Message::to("t")).unwrap();
    clock.advance(30 * MS);
    let s = sub.stats();
    assert_eq!(s.queued, 2);
    assert_eq!(s.oldest_age, Some(100 * MS));
    broker.run_until_idle();
    let s = sub.stats();
    assert_eq!((s.queued, s.delivered, s.oldest_age), (0, 2, None));
}

/// A clock whose wall time the test sets by hand, independently of its monotonic time (which
/// stands still): a wall clock stepped by an administrator or NTP.
#[derive(Clone)]
struct SteppedWall(std::sync::Arc<parking_lot::Mutex<std::time::SystemTime>>);

impl Clock for SteppedWall {
    fn now(&self) -> std::time::Instant {
        static BASE: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        *BASE.get_or_init(std::time::Instant::now)
    }
    fn wall(&self) -> std::time::SystemTime {
        *self.0.lock()
    }
    fn wait_hint(&self, _deadline: std::time::Instant) -> Option<Duration> {
        None
    }
}

// R-BP-3: the oldest-message age is measured on the wall clock that stamped the message; a
// wall clock stepped back reads as zero age (never a panic, never a negative or huge age), one
// stepped forward as the step.
#[test]
fn oldest_age_survives_a_stepped_wall_clock() {
    let t0 = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let wall = SteppedWall(std::sync::Arc::new(parking_lot::Mutex::new(t0)));
    let broker = Broker::builder()
        .driver(Driver::Manual)
        .clock(wall.clone())
        .build()
        .unwrap();
    let sub = broker
        .subscribe("t", SubscribeOptions::default(), |_m: &Message| Ok(()))
        .unwrap();
    broker.publish(Message::to("t")).unwrap();
    *wall.0.lock() = t0 + 5 * MS;
    assert_eq!(sub.stats().oldest_age, Some(5 * MS));
    *wall.0.lock() = t0 - Duration::from_secs(3_600);
    assert_eq!(sub.stats().oldest_age, Some(Duration::ZERO));
    *wall.0.lock() = std::time::SystemTime::UNIX_EPOCH - Duration::from_secs(1);
    assert_eq!(sub.stats().oldest_age, Some(Duration::ZERO));
    broker.run_until_idle();
    let s = sub.stats();
    assert_eq!((s.queued, s.delivered, s.oldest_age), (0, 1, None));
}
