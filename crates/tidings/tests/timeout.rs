//! The `Timeout` decorator for async handlers (R-PAT-2): deterministic under tokio's paused
//! time, and under a live multi-thread tokio driver; composed with `Deduplicating` and the
//! typed adaptor. Run with `--features tokio` (CI: `--all-features`).
#![cfg(feature = "tokio")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use tidings::{
    AsyncHandler, Broker, Clock, DeadLetterReason, Deduplicating, Driver, HandlerError, Message,
    MessageId, Retry, SubscribeOptions, Subscription, Timeout,
};
use tokio::time::Instant;

/// The broker's clock read from tokio's clock, so that under paused time the retry
/// backoff (broker clock) and the timeout (tokio timer) run on one time line: the broker's
/// [`ManualClock`](tidings::ManualClock) cannot drive a tokio timer, but tokio's clock can
/// drive the broker (R-TIME-3).
struct TokioClock {
    std_base: std::time::Instant,
    tokio_base: Instant,
    wall_base: SystemTime,
}

impl TokioClock {
    fn new() -> Self {
        Self {
            std_base: std::time::Instant::now(),
            tokio_base: Instant::now(),
            wall_base: SystemTime::now(),
        }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> std::time::Instant {
        self.std_base + (Instant::now() - self.tokio_base)
    }
    fn wall(&self) -> SystemTime {
        self.wall_base + (Instant::now() - self.tokio_base)
    }
}

/// A tokio-driver broker on the current runtime, its clock tokio's.
fn tokio_broker() -> Broker {
    Broker::builder()
        .driver(Driver::Tokio(tokio::runtime::Handle::current()))
        .clock(TokioClock::new())
        .build()
        .unwrap()
}

fn retry(attempts: u32) -> SubscribeOptions {
    SubscribeOptions::new().retry(Retry::fixed(Duration::from_secs(1), attempts))
}

/// Wait until `sub` has delivered or dead-lettered `n` messages, on tokio's clock (paused
/// time auto-advances while this sleeps).
async fn finished(sub: &Subscription, n: u64) {
    for _ in 0..100_000 {
        let s = sub.stats();
        if s.delivered + s.dlq_len >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not finished: {:?}", sub.stats());
}

/// Sets its flag when dropped: proves a timed-out future was dropped, not left running.
struct DropFlag(Arc<AtomicU32>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

// R-PAT-2 + R-DEL-1: an attempt longer than the limit is cancelled (its future dropped,
// the rest of it never runs) and fails retryably; the policy retries it, then dead-letters
// it `RetriesExhausted` naming the limit. Paused time: attempts start at exactly
// t, t+5s+1s, t+12s.
#[tokio::test(start_paused = true)]
async fn slow_attempts_are_cancelled_and_retried_then_dead_lettered() {
    let broker = tokio_broker();
    let starts: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let (dropped, finished_sleep) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let (s, d, f) = (starts.clone(), dropped.clone(), finished_sleep.clone());
    let handler = Arc::new(Timeout::new(
        move |_m: Arc<Message>| {
            let (s, d, f) = (s.clone(), d.clone(), f.clone());
            async move {
                let _guard = DropFlag(d);
                s.lock().push(Instant::now());
                tokio::time::sleep(Duration::from_secs(3600)).await;
                f.fetch_add(1, Ordering::SeqCst); // never reached
                Ok::<(), HandlerError>(())
            }
        },
        Duration::from_secs(5),
    ));
    let sub = broker.subscribe("jobs", retry(3), handler.clone()).unwrap();
    broker.publish(Message::to("jobs")).unwrap();
    finished(&sub, 1).await;

    let dead = sub.dead_letters();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].reason,
        DeadLetterReason::RetriesExhausted {
            attempts: 3,
            last_error: "handler timed out after 5s".into()
        }
    ); // R-PAT-2: a retryable failure naming the limit
    assert_eq!(handler.timed_out(), 3);
    assert_eq!(dropped.load(Ordering::SeqCst), 3); // each attempt's future was dropped
    assert_eq!(finished_sleep.load(Ordering::SeqCst), 0); // and never resumed
    let starts = starts.lock().clone();
    let gaps: Vec<Duration> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    // 5 s limit + 1 s backoff between attempts, exactly: one paused time line.
    assert_eq!(gaps, [Duration::from_secs(6), Duration::from_secs(6)]);
    assert!(broker.close_async(Duration::from_secs(1)).await.is_clean());
}

// R-PAT-2: an attempt within the limit returns the inner outcome unchanged — success, a
// rejection (not retried), a retryable error — and is not counted as timed out.
#[tokio::test(start_paused = true)]
async fn attempts_within_the_limit_keep_their_outcome() {
    let broker = tokio_broker();
    let handler = Arc::new(Timeout::new(
        |m: Arc<Message>| async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            match m.payload().as_ref() {
                b"ok" => Ok(()),
                b"reject" => Err(HandlerError::reject("bad input")),
                _ => Err(HandlerError::retry("flaky")),
            }
        },
        Duration::from_secs(5),
    ));
    let sub = broker.subscribe("jobs", retry(2), handler.clone()).unwrap();
    for p in ["ok", "reject", "flaky"] {
        broker.publish(Message::to("jobs").payload(p)).unwrap();
    }
    finished(&sub, 3).await;
    assert_eq!(sub.stats().delivered, 1);
    let dead = sub.dead_letters();
    assert_eq!(
        dead[0].reason,
        DeadLetterReason::Rejected {
            error: "bad input".into()
        }
    );
    assert_eq!(
        dead[1].reason,
        DeadLetterReason::RetriesExhausted {
            attempts: 2,
            last_error: "flaky".into()
        }
    );
    assert_eq!(handler.timed_out(), 0);
    assert!(broker.close_async(Duration::from_secs(1)).await.is_clean());
}

// R-PAT-2 + R-LIM-1: `Duration::MAX` never times out (no overflow panic), even for an
// attempt that waits ten years of (paused) tokio time.
#[tokio::test(start_paused = true)]
async fn duration_max_never_times_out() {
    let broker = tokio_broker();
    let handler = Arc::new(Timeout::new(
        |_m: Arc<Message>| async {
            tokio::time::sleep(Duration::from_secs(10 * 365 * 86_400)).await;
            Ok::<(), HandlerError>(())
        },
        Duration::MAX,
    ));
    let sub = broker.subscribe("jobs", retry(1), handler.clone()).unwrap();
    broker.publish(Message::to("jobs")).unwrap();
    while sub.stats().delivered == 0 {
        tokio::time::sleep(Duration::from_secs(86_400)).await;
    }
    assert!(sub.dead_letters().is_empty());
    assert_eq!(handler.timed_out(), 0);
    assert!(broker.close_async(Duration::from_secs(1)).await.is_clean());
}

// R-PAT-2: a zero limit means "complete at the first poll": a handler that is ready at once
// succeeds; one that waits at all (even one yield) times out, with no timer involved.
#[tokio::test(start_paused = true)]
async fn zero_limit_allows_exactly_one_poll() {
    let broker = tokio_broker();
    let handler = Arc::new(Timeout::new(
        |m: Arc<Message>| async move {
            if m.payload().as_ref() == b"wait" {
                tokio::task::yield_now().await;
            }
            Ok::<(), HandlerError>(())
        },
        Duration::ZERO,
    ));
    let sub = broker.subscribe("jobs", retry(1), handler.clone()).unwrap();
    broker
        .publish(Message::to("jobs").payload("ready"))
        .unwrap();
    broker.publish(Message::to("jobs").payload("wait")).unwrap();
    finished(&sub, 2).await;
    assert_eq!(sub.stats().delivered, 1);
    let dead = sub.dead_letters();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].message.payload().as_ref(), b"wait");
    assert_eq!(dead[0].last_error(), Some("handler timed out after 0ns"));
    assert_eq!(handler.timed_out(), 1);
    assert!(broker.close_async(Duration::from_secs(1)).await.is_clean());
}

// R-PAT-2 + R-DEL-5: `Deduplicating` around `Timeout` records an id only after an attempt
// succeeded within the limit: the timed-out first attempt is retried for real, a
// redelivery after success is skipped. `Timeout` around `Deduplicating` also composes.
#[tokio::test(start_paused = true)]
async fn composes_with_deduplicating() {
    let broker = tokio_broker();
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let handler = Arc::new(Deduplicating::new(Timeout::new(
        move |_m: Arc<Message>| {
            let first = c.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                if first {
                    tokio::time::sleep(Duration::from_secs(60)).await; // times out
                }
                Ok::<(), HandlerError>(())
            }
        },
        Duration::from_secs(5),
    )));
    let sub = broker.subscribe("jobs", retry(3), handler.clone()).unwrap();
    let id = MessageId::new();
    broker.publish(Message::to("jobs").id(id)).unwrap();
    finished(&sub, 1).await;
    assert_eq!(sub.stats().delivered, 1);
    assert_eq!(sub.stats().attempts, 2); // timed out once, then succeeded
    assert_eq!(handler.skipped(), 0);
    broker.publish(Message::to("jobs").id(id)).unwrap();
    finished(&sub, 2).await;
    assert_eq!(handler.skipped(), 1); // R-DEL-5: recorded after the successful attempt
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // The other order: the limit covers the store lookups too.
    fn assert_async<H: AsyncHandler>(_: &H) {}
    let inner_dedup = Timeout::new(
        Deduplicating::new(|_m: Arc<Message>| async { Ok::<(), HandlerError>(()) }),
        Duration::from_secs(1),
    );
    assert_async(&inner_dedup);
    assert!(broker.close_async(Duration::from_secs(1)).await.is_clean());
}

// R-PAT-2 + R-PAT-3: `Timeout` around the typed adaptor: a slow typed attempt times out and
// is retried; an undecodable payload is still `Rejected` at once (decoding is not timed).
#[cfg(feature = "serde")]
#[tokio::test(start_paused = true)]
async fn composes_with_the_typed_adaptor() {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Job {
        seconds: u64,
    }
    let broker = tokio_broker();
    let handler = Arc::new(Timeout::new(
        tidings::json_handler(|job: Job, _m: Arc<Message>| async move {
            tokio::time::sleep(Duration::from_secs(job.seconds)).await;
            Ok::<(), HandlerError>(())
        }),
        Duration::from_secs(5),
    ));
    let sub = broker.subscribe("jobs", retry(2), handler.clone()).unwrap();
    broker
        .publish(Message::to("jobs").json(&Job { seconds: 1 }).unwrap())
        .unwrap();
    broker
        .publish(Message::to("jobs").json(&Job { seconds: 9 }).unwrap())
        .unwrap();
    broker
        .publish(Message::to("jobs").payload("{\"seconds\":-1}"))
        .unwrap();
    finished(&sub, 3).await;
    assert_eq!(sub.stats().delivered, 1);
    let dead = sub.dead_letters();
    assert_eq!(dead.len(), 2);
    assert_eq!(
        dead[0].reason,
        DeadLetterReason::RetriesExhausted {
            attempts: 2,
            last_error: "handler timed out after 5s".into()
        }
    );
    assert!(matches!(dead[1].reason, DeadLetterReason::Rejected { .. }));
    assert_eq!(dead[1].attempts, 1);
    assert_eq!(handler.timed_out(), 2);
    assert!(broker.close_async(Duration::from_secs(1)).await.is_clean());
}

// R-PAT-2 + R-EXE-1: under a live multi-thread tokio driver in real time, a hung attempt
// is cancelled after the limit and the subscription goes on with the next message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_driver_cancels_a_hung_attempt_and_goes_on() {
    let broker = tokio_broker();
    let handler = Arc::new(Timeout::new(
        |m: Arc<Message>| async move {
            if m.payload().as_ref() == b"hang" {
                std::future::pending::<()>().await;
            }
            Ok::<(), HandlerError>(())
        },
        Duration::from_millis(50),
    ));
    let sub = broker
        .subscribe(
            "jobs",
            SubscribeOptions::new().retry(Retry::None),
            handler.clone(),
        )
        .unwrap();
    let started = std::time::Instant::now();
    broker.publish(Message::to("jobs").payload("hang")).unwrap();
    broker.publish(Message::to("jobs").payload("fine")).unwrap();
    while sub.stats().delivered + sub.stats().dlq_len < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{:?}",
            sub.stats()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(started.elapsed() >= Duration::from_millis(50)); // the limit was waited out
    assert_eq!(sub.stats().delivered, 1);
    let dead = sub.dead_letters();
    assert_eq!(dead[0].message.payload().as_ref(), b"hang");
    assert_eq!(dead[0].last_error(), Some("handler timed out after 50ms"));
    assert_eq!(handler.timed_out(), 1);
    assert!(broker.close_async(Duration::from_secs(5)).await.is_clean());
}
