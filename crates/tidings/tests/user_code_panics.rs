//! A panic in any user-supplied code — handler, retry policy, predicate, dedup store — is
//! contained: the message is accounted with a reason and the subscription keeps working,
//! under every driver (R-DEL-1, R-DEL-6).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use tidings::*;
use tidings_testkit::helpers::{Recorder, drive, text, wait_until};

const WAIT: Duration = Duration::from_secs(30);

/// A retry policy that panics the first time it is asked, then retries after 1 ms.
#[derive(Default)]
struct PanicsOnce(AtomicBool);

impl RetryPolicy for PanicsOnce {
    fn retry_after(&self, _: u32, _: &HandlerError, _: &Message) -> Option<Duration> {
        assert!(self.0.swap(true, Ordering::SeqCst), "policy bug");
        Some(Duration::from_millis(1))
    }
}

/// Fails "bad" (retryably), panics on "boom", records everything else.
fn handler(
    rec: &Recorder,
) -> impl Fn(&Message) -> Result<(), HandlerError> + Send + Sync + 'static {
    let ok = rec.handler();
    move |m: &Message| match m.payload().as_ref() {
        b"bad" => Err(HandlerError::retry("bad payload")),
        b"boom" => panic!("handler bug"),
        _ => ok(m),
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Manual,
    Thread,
    Pool,
}

fn broker(kind: Kind) -> (Broker, ManualClock) {
    let clock = ManualClock::new();
    let driver = match kind {
        Kind::Manual => Driver::Manual,
        Kind::Thread => Driver::Thread,
        Kind::Pool => Driver::Pool { workers: 2 },
    };
    let b = Broker::builder().driver(driver);
    let b = match kind {
        Kind::Manual => b.clock(clock.clone()),
        _ => b,
    };
    (b.build().unwrap(), clock)
}

/// Deliver everything: the manual driver in this thread; the live ones by waiting
/// (bounded) for `done`.
fn settle(
    kind: Kind,
    broker: &Broker,
    clock: &ManualClock,
    what: &str,
    done: impl FnMut() -> bool,
) {
    if let Kind::Manual = kind {
        drive(broker, clock);
    }
    wait_until(what, WAIT, done);
}

fn panicking_retry_policy(kind: Kind) {
    let (broker, clock) = broker(kind);
    let rec = Recorder::default();
    let sub = broker
        .subscribe(
            "t",
            SubscribeOptions::new().retry(Retry::custom(PanicsOnce::default())),
            handler(&rec),
        )
        .unwrap();
    broker.publish(Message::to("t").payload("bad")).unwrap();
    broker.publish(Message::to("t").payload("next")).unwrap();
    settle(kind, &broker, &clock, "next delivered", || rec.len() == 1);
    assert_eq!(rec.take(), vec!["next"]); // R-DEL-1: the subscription keeps working
    wait_until("ledger closed", WAIT, || sub.stats().in_flight == 0);
    let dlq = sub.dead_letters();
    assert_eq!(dlq.len(), 1);
    match &dlq[0].reason {
        DeadLetterReason::RetriesExhausted {
            attempts: 1,
            last_error,
        } => assert!(
            last_error.contains("retry policy panicked: policy bug"),
            "{last_error}"
        ),
        other => panic!("unexpected reason {other:?}"),
    } // R-DEL-1: accounted with a reason
    // The policy works from now on: a later failure is retried, not stuck.
    broker.publish(Message::to("t").payload("later")).unwrap();
    settle(kind, &broker, &clock, "later delivered", || rec.len() == 1);
    assert_eq!(rec.take(), vec!["later"]);
    let s = sub.stats();
    assert_eq!((s.in_flight, s.queued, s.delivered), (0, 0, 2));
    assert!(s.is_conserved()); // R-DEL-6
    assert!(broker.close(WAIT).is_clean());
}

#[test]
fn panicking_retry_policy_manual() {
    panicking_retry_policy(Kind::Manual);
}

#[test]
fn panicking_retry_policy_thread() {
    panicking_retry_policy(Kind::Thread);
}

#[test]
fn panicking_retry_policy_pool() {
    panicking_retry_policy(Kind::Pool);
}

fn panicking_predicate(kind: Kind) {
    let (broker, clock) = broker(kind);
    let rec = Recorder::default();
    let sub = broker
        .subscribe(
            "t",
            SubscribeOptions::new().predicate(Predicate::new(|m: &Message| {
                assert!(m.payload().as_ref() != b"trap", "predicate bug");
                true
            })),
            handler(&rec),
        )
        .unwrap();
    // R-DEL-1: the publisher does not unwind; the message is accounted.
    let report = broker.publish(Message::to("t").payload("trap")).unwrap();
    assert!(report.refused.is_empty());
    broker.publish(Message::to("t").payload("next")).unwrap();
    settle(kind, &broker, &clock, "next delivered", || rec.len() == 1);
    assert_eq!(rec.take(), vec!["next"]);
    let dlq = sub.dead_letters();
    assert_eq!(dlq.len(), 1);
    assert_eq!(text(&dlq[0].message), "trap");
    assert_eq!(dlq[0].attempts, 0);
    match &dlq[0].reason {
        DeadLetterReason::Rejected { error } => {
            assert!(
                error.contains("predicate panicked: predicate bug"),
                "{error}"
            );
        }
        other => panic!("unexpected reason {other:?}"),
    } // R-DEL-1
    let s = sub.stats();
    assert_eq!((s.offered, s.accepted, s.dead_lettered.rejected), (2, 2, 1));
    assert!(s.is_conserved()); // R-DEL-6
    assert!(broker.close(WAIT).is_clean());
}

#[test]
fn panicking_predicate_manual() {
    panicking_predicate(Kind::Manual);
}

#[test]
fn panicking_predicate_thread() {
    panicking_predicate(Kind::Thread);
}

fn panicking_handler(kind: Kind) {
    let (broker, clock) = broker(kind);
    let rec = Recorder::default();
    let sub = broker
        .subscribe(
            "t",
            SubscribeOptions::new().retry(Retry::fixed(Duration::from_millis(1), 2)),
            handler(&rec),
        )
        .unwrap();
    broker.publish(Message::to("t").payload("boom")).unwrap();
    broker.publish(Message::to("t").payload("next")).unwrap();
    settle(kind, &broker, &clock, "next delivered", || rec.len() == 1);
    wait_until("ledger closed", WAIT, || sub.stats().in_flight == 0);
    let dlq = sub.dead_letters();
    assert!(matches!(
        &dlq[0].reason,
        DeadLetterReason::RetriesExhausted { attempts: 2, last_error }
            if last_error.contains("handler panicked: handler bug")
    )); // R-DEL-1
    assert!(sub.stats().is_conserved()); // R-DEL-6
    assert!(broker.close(WAIT).is_clean());
}

#[test]
fn panicking_handler_manual() {
    panicking_handler(Kind::Manual);
}

#[test]
fn panicking_handler_thread() {
    panicking_handler(Kind::Thread);
}

/// A dedup store that panics on its first lookup.
struct FlakyStore {
    calls: AtomicU32,
    inner: InMemoryDedupStore,
}

impl DedupStore for FlakyStore {
    fn contains(&self, id: MessageId) -> bool {
        assert!(self.calls.fetch_add(1, Ordering::SeqCst) > 0, "store bug");
        self.inner.contains(id)
    }
    fn record(&self, id: MessageId) {
        self.inner.record(id);
    }
}

#[test]
fn panicking_dedup_store_is_retried() {
    let (broker, clock) = broker(Kind::Manual);
    let rec = Recorder::default();
    let store = Arc::new(FlakyStore {
        calls: AtomicU32::new(0),
        inner: InMemoryDedupStore::new(16),
    });
    let sub = broker
        .subscribe(
            "t",
            SubscribeOptions::new().retry(Retry::fixed(Duration::from_millis(5), 3)),
            Deduplicating::with_store(rec.handler(), store),
        )
        .unwrap();
    broker.publish(Message::to("t").payload("once")).unwrap();
    assert_eq!(drive(&broker, &clock), vec![Duration::from_millis(5)]);
    assert_eq!(rec.take(), vec!["once"]); // R-DEL-1: the panic was a retryable failure
    let s = sub.stats();
    assert_eq!((s.attempts, s.failures, s.delivered), (2, 1, 1));
    assert!(s.is_conserved()); // R-DEL-6
}

/// A manual clock whose wall clock panics while armed.
#[derive(Clone)]
struct TrapClock {
    inner: ManualClock,
    armed: Arc<AtomicBool>,
}

impl Clock for TrapClock {
    fn now(&self) -> std::time::Instant {
        self.inner.now()
    }
    fn wall(&self) -> std::time::SystemTime {
        assert!(!self.armed.load(Ordering::SeqCst), "clock bug");
        self.inner.wall()
    }
    fn wait_hint(&self, deadline: std::time::Instant) -> Option<Duration> {
        self.inner.wait_hint(deadline)
    }
}

#[test]
fn panicking_clock_leaves_the_ledger_intact() {
    let clock = TrapClock {
        inner: ManualClock::new(),
        armed: Arc::new(AtomicBool::new(false)),
    };
    let broker = Broker::builder()
        .driver(Driver::Manual)
        .clock(clock.clone())
        .build()
        .unwrap();
    let rec = Recorder::default();
    let sub = broker
        .subscribe(
            "t",
            SubscribeOptions::new().ttl(Duration::from_secs(60)),
            rec.handler(),
        )
        .unwrap();
    clock.armed.store(true, Ordering::SeqCst);
    // Publish stamps with the wall clock, and dequeue checks the TTL with it.
    broker.publish(Message::to("t").payload("a")).unwrap(); // R-DEL-1: no unwind
    broker.run_until_idle();
    clock.armed.store(false, Ordering::SeqCst);
    broker.publish(Message::to("t").payload("b")).unwrap();
    broker.run_until_idle();
    assert_eq!(rec.take(), vec!["a", "b"]); // R-DEL-1: the subscription keeps working
    assert!(sub.stats().is_conserved()); // R-DEL-6
}
