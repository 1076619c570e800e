//! The `RateLimited` decorator (R-PAT-2): exact on a manual clock, composed with
//! `Deduplicating` and a retry policy, under a live pool driver, and under the tokio driver
//! with `Timeout` inside it. A message without a token waits through
//! `HandlerError::defer_until`, so it holds no thread: the tests check that a neighbour
//! subscription is not held up, and that a deferral is neither an attempt nor a failure.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tidings::{
    Broker, Deduplicating, Driver, HandlerError, ManualClock, Message, MessageId, RateLimited,
    Retry, SubscribeOptions, Subscription,
};

/// 1 s / 3, rounded up to whole nanoseconds: the token interval of 3 per second.
const THIRD: Duration = Duration::from_nanos(333_333_334);

fn manual() -> (ManualClock, Broker) {
    let clock = ManualClock::new();
    let broker = Broker::builder()
        .driver(Driver::Manual)
        .clock(clock.clone())
        .build()
        .unwrap();
    (clock, broker)
}

/// Handler starts as (payload, time since the clock started).
type Starts = Arc<Mutex<Vec<(String, Duration)>>>;

/// A handler that records each start's payload and manual-clock time, then succeeds.
fn recording(clock: &ManualClock, starts: &Starts) -> impl Fn(&Message) + Send + Sync + 'static {
    let (clock, starts) = (clock.clone(), starts.clone());
    move |m: &Message| {
        let payload = String::from_utf8(m.payload().to_vec()).unwrap();
        starts.lock().push((payload, clock.elapsed()));
    }
}

fn started(starts: &Starts) -> usize {
    starts.lock().len()
}

// R-PAT-2, R-TIME-3: 10 messages at 3 per second on a manual clock: the burst of 3 starts at
// t = 0, then exactly one start per 333,333,334 ns — none a nanosecond early, in publish
// order. The waits are deferrals, not attempts or failures; a second subscription on the
// same (manual, single-threaded) driver handles all of its messages at t = 0.
#[test]
fn ten_messages_at_three_per_second_start_exactly_on_the_token_schedule() {
    let (clock, broker) = manual();
    let t0 = broker.clock().now();
    let starts = Starts::default();
    let limited = Arc::new(
        RateLimited::new(
            recording(&clock, &starts),
            3,
            Duration::from_secs(1),
            broker.clock().clone(),
        )
        .unwrap(),
    );
    let sub = broker
        .subscribe("limited.*", SubscribeOptions::default(), limited.clone())
        .unwrap();
    let neighbour_starts = Starts::default();
    let neighbour = broker
        .subscribe(
            "free.*",
            SubscribeOptions::default(),
            recording(&clock, &neighbour_starts),
        )
        .unwrap();
    for i in 0..10 {
        broker
            .publish(Message::to("limited.x").payload(i.to_string()))
            .unwrap();
        broker
            .publish(Message::to("free.x").payload(i.to_string()))
            .unwrap();
    }

    broker.run_until_idle();
    assert_eq!(started(&starts), 3, "the burst");
    assert_eq!(neighbour.stats().delivered, 10);
    assert!(
        neighbour_starts
            .lock()
            .iter()
            .all(|(_, at)| *at == Duration::ZERO)
    );

    for k in 3..10u32 {
        let due = THIRD * (k - 2);
        assert_eq!(broker.next_wake(), Some(t0 + due), "token {k}");
        clock.advance(due - Duration::from_nanos(1) - clock.elapsed());
        broker.run_until_idle();
        assert_eq!(started(&starts), k as usize, "token {k}: 1 ns early");
        clock.advance(Duration::from_nanos(1));
        broker.run_until_idle();
        assert_eq!(started(&starts), k as usize + 1, "token {k}: on time");
    }
    assert_eq!(broker.next_wake(), None);

    let expected: Vec<(String, Duration)> = (0..10u32)
        .map(|i| (i.to_string(), THIRD * i.saturating_sub(2)))
        .collect();
    assert_eq!(*starts.lock(), expected);
    let s = sub.stats();
    assert_eq!((s.delivered, s.attempts, s.failures), (10, 10, 0));
    assert_eq!(s.dead_lettered.total(), 0);
    assert!(limited.deferred() >= 7, "{}", limited.deferred());
}

// R-PAT-2, R-DEL-5: with `Deduplicating` outside, a duplicate is skipped before it reaches
// the limiter and spends no token: two distinct messages start in the burst of 2 although
// two duplicates came between them.
#[test]
fn duplicates_spend_no_token_when_deduplicating_is_outside() {
    let (clock, broker) = manual();
    let starts = Starts::default();
    let limited = Arc::new(
        RateLimited::new(
            recording(&clock, &starts),
            2,
            Duration::from_secs(1),
            broker.clock().clone(),
        )
        .unwrap(),
    );
    let dedup = Arc::new(Deduplicating::new(limited.clone()));
    let sub = broker
        .subscribe("jobs", SubscribeOptions::default(), dedup.clone())
        .unwrap();
    let x = MessageId::new();
    for (payload, id) in [
        ("x", x),
        ("x again", x),
        ("y", MessageId::new()),
        ("x once more", x),
        ("z", MessageId::new()),
    ] {
        broker
            .publish(Message::to("jobs").payload(payload).id(id))
            .unwrap();
    }
    broker.run_until_idle();
    assert_eq!(
        *starts.lock(),
        vec![
            ("x".to_owned(), Duration::ZERO),
            ("y".to_owned(), Duration::ZERO)
        ]
    );
    assert_eq!(dedup.skipped(), 2);
    assert_eq!(limited.deferred(), 1, "only z waited");

    clock.advance(Duration::from_millis(500));
    broker.run_until_idle();
    assert_eq!(started(&starts), 3);
    assert_eq!(
        starts.lock()[2],
        ("z".to_owned(), Duration::from_millis(500))
    );
    let s = sub.stats();
    assert_eq!((s.delivered, s.attempts, s.failures), (5, 5, 0));
}

// R-PAT-2, R-DEL-3: a retry is a handler start and takes a token: the retry due after
// 100 ms waits for the next token at 1 s, and the message behind it for the one after.
#[test]
fn a_retry_takes_a_token() {
    let (clock, broker) = manual();
    let starts = Starts::default();
    let record = recording(&clock, &starts);
    let failed = AtomicBool::new(false);
    let limited = RateLimited::new(
        move |m: &Message| -> Result<(), HandlerError> {
            record(m);
            if m.payload().as_ref() == b"a" && !failed.swap(true, Ordering::Relaxed) {
                return Err(HandlerError::retry("down"));
            }
            Ok(())
        },
        1,
        Duration::from_secs(1),
        broker.clock().clone(),
    )
    .unwrap();
    let sub = broker
        .subscribe(
            "jobs",
            SubscribeOptions {
                retry: Retry::fixed(Duration::from_millis(100), 3),
                ..Default::default()
            },
            limited,
        )
        .unwrap();
    broker.publish(Message::to("jobs").payload("a")).unwrap();
    broker.publish(Message::to("jobs").payload("b")).unwrap();
    broker.run_until_idle();
    while let Some(next) = broker.next_wake() {
        clock.advance_to(next);
        broker.run_until_idle();
    }
    let secs = Duration::from_secs;
    assert_eq!(
        *starts.lock(),
        vec![
            ("a".to_owned(), secs(0)),
            ("a".to_owned(), secs(1)),
            ("b".to_owned(), secs(2)),
        ]
    );
    let s = sub.stats();
    assert_eq!((s.delivered, s.attempts, s.failures), (2, 3, 1));
}

/// Waits (bounded) until `sub` has delivered `n`.
fn wait_delivered(sub: &Subscription, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while sub.stats().delivered < n {
        assert!(Instant::now() < deadline, "stuck: {:?}", sub.stats());
        std::thread::sleep(Duration::from_millis(1));
    }
}

// R-PAT-2, R-EXE-1, R-CORE-6: a live pool driver with ONE worker, 200 messages at 50 per
// 100 ms: all delivered, in order, none before its token time (measured from before the
// first publish, so the bound holds whatever the scheduling). A neighbour subscription on
// the same single worker handles its messages while the limited one still has a backlog.
// And a third subscription, limited to 1 per hour, holds a message waiting an hour for its
// token all along: were that wait a sleep, the only worker would be gone and nothing else
// would finish; as a deferral it holds nobody, and close abandons it as `Shutdown`.
#[test]
fn a_live_pool_worker_is_not_held_by_waiting_messages() {
    let broker = Broker::builder()
        .driver(Driver::Pool { workers: 1 })
        .build()
        .unwrap();
    let clock = broker.clock().clone();
    let starts: Arc<Mutex<Vec<(u32, Instant)>>> = Arc::default();
    let record = {
        let (starts, clock) = (starts.clone(), clock.clone());
        move |m: &Message| {
            let n: u32 = std::str::from_utf8(m.payload()).unwrap().parse().unwrap();
            starts.lock().push((n, clock.now()));
        }
    };
    let per = Duration::from_millis(100);
    let limited = RateLimited::new(record, 50, per, clock.clone()).unwrap();
    let sub = broker
        .subscribe(
            "limited",
            SubscribeOptions {
                capacity: 256,
                ..Default::default()
            },
            limited,
        )
        .unwrap();
    let neighbour = broker
        .subscribe("free", SubscribeOptions::default(), |_m: &Message| {})
        .unwrap();
    let hourly = RateLimited::new(
        |_m: &Message| {},
        1,
        Duration::from_secs(3600),
        clock.clone(),
    )
    .unwrap();
    let slow = broker
        .subscribe("slow", SubscribeOptions::default(), hourly)
        .unwrap();
    broker.publish(Message::to("slow").payload("now")).unwrap();
    broker
        .publish(Message::to("slow").payload("in an hour"))
        .unwrap();
    wait_delivered(&slow, 1);

    let before = clock.now();
    for i in 0..200u32 {
        broker
            .publish(Message::to("limited").payload(i.to_string()))
            .unwrap();
    }
    // Into the paced part of the schedule: at least 140 starts (280 ms) are still to come.
    wait_delivered(&sub, 60);
    for _ in 0..50 {
        broker.publish(Message::to("free")).unwrap();
    }
    wait_delivered(&neighbour, 50);
    let limited_when_neighbour_done = sub.stats().delivered;
    wait_delivered(&sub, 200);

    assert!(
        limited_when_neighbour_done < 200,
        "the neighbour finished only after the limited backlog: it was held up"
    );
    let starts = starts.lock();
    let order: Vec<u32> = starts.iter().map(|(n, _)| *n).collect();
    assert_eq!(order, (0..200).collect::<Vec<_>>(), "publish order");
    let interval = per / 50;
    for (k, (n, at)) in starts.iter().enumerate() {
        let token = interval * (k as u32).saturating_sub(49);
        assert!(
            *at >= before + token,
            "message {n} started {:?} after the first publish, before its token at {token:?}",
            *at - before
        );
    }
    let s = sub.stats();
    assert_eq!((s.delivered, s.attempts, s.failures), (200, 200, 0));

    // The drain keeps the deferral until its deadline; close abandons it.
    let report = broker.close(Duration::from_millis(100));
    let left: Vec<_> = report
        .undelivered
        .iter()
        .map(|u| (u.subscription, u.message.payload().clone()))
        .collect();
    assert_eq!(left, [(Some(slow.id()), "in an hour".into())]);
    let dead = slow.dead_letters();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (&dead[0].reason, dead[0].attempts),
        (&tidings::DeadLetterReason::Shutdown, 0)
    );
    assert_eq!(slow.stats().attempts, 1);
}

// R-PAT-2, R-LOG-3, R-CORE-6: on a durable subscription (the embedded log), a message still
// waiting for its token at close is abandoned, not finished: its offset is not committed,
// so the next process reads it again. Nothing published is lost; the messages handled
// before close are not handled again.
#[test]
fn a_durable_message_waiting_for_its_token_at_close_is_read_again_after_restart() {
    use tidings::embedded::{EmbeddedBackend, EmbeddedStreamOptions};
    use tidings::{DurableSpec, Fsync, StreamConfig};

    let dir = tempfile::tempdir().unwrap();
    let open = |clock: &ManualClock| {
        let backend = EmbeddedBackend::new(dir.path())
            .stream_defaults(EmbeddedStreamOptions::new().fsync(Fsync::Never));
        let broker = Broker::builder()
            .driver(Driver::Manual)
            .clock(clock.clone())
            .durable_backend(Arc::new(backend))
            .build()
            .unwrap();
        broker
            .create_stream(StreamConfig::new("jobs", ["jobs.#"]))
            .unwrap();
        broker
    };

    let clock = ManualClock::new();
    let broker = open(&clock);
    for i in 0..5 {
        broker
            .publish(Message::to("jobs.x").payload(i.to_string()))
            .unwrap();
    }
    let first = Starts::default();
    let limited = RateLimited::new(
        recording(&clock, &first),
        2,
        Duration::from_secs(1),
        broker.clock().clone(),
    )
    .unwrap();
    let sub = broker
        .subscribe_durable(
            DurableSpec::new("jobs").name("worker"),
            SubscribeOptions::default(),
            limited,
        )
        .unwrap();
    broker.run_until_idle();
    assert_eq!(started(&first), 2, "the burst");
    let stats = sub.subscription().stats();
    assert_eq!((stats.delivered, stats.failures), (2, 0));
    drop(sub);
    broker.close(Duration::ZERO);
    drop(broker);

    let clock = ManualClock::new();
    let broker = open(&clock);
    let second = Starts::default();
    let _sub = broker
        .subscribe_durable(
            DurableSpec::new("jobs").name("worker"),
            SubscribeOptions::default(),
            recording(&clock, &second),
        )
        .unwrap();
    broker.run_until_idle();
    let handled =
        |starts: &Starts| -> Vec<String> { starts.lock().iter().map(|(p, _)| p.clone()).collect() };
    assert_eq!(handled(&first), ["0", "1"]);
    assert_eq!(handled(&second), ["2", "3", "4"]);
}

#[cfg(feature = "tokio")]
mod tokio_driver {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, SystemTime};

    use parking_lot::Mutex;
    use tidings::{
        Broker, Clock, Deduplicating, Driver, HandlerError, Message, MessageId, RateLimited, Retry,
        SubscribeOptions, Timeout,
    };
    use tokio::time::Instant;

    /// The broker's clock read from tokio's, so the token schedule (broker clock), the
    /// deferral waits and the timeout (tokio timers) share paused time (as in
    /// `tests/timeout.rs`).
    struct TokioClock {
        std_base: std::time::Instant,
        tokio_base: Instant,
        wall_base: SystemTime,
    }

    impl Clock for TokioClock {
        fn now(&self) -> std::time::Instant {
            self.std_base + (Instant::now() - self.tokio_base)
        }
        fn wall(&self) -> SystemTime {
            self.wall_base + (Instant::now() - self.tokio_base)
        }
    }

    // R-PAT-2: `Deduplicating(RateLimited(Timeout(async)))` under the tokio driver, 1 start
    // per second: the duplicate takes no token, the attempt that hangs is cancelled at the
    // limit and its retry waits for the next token, and every start is on the schedule.
    #[tokio::test(start_paused = true)]
    async fn deduplicating_rate_limited_timeout_compose() {
        let tokio_base = Instant::now();
        let broker = Broker::builder()
            .driver(Driver::Tokio(tokio::runtime::Handle::current()))
            .clock(TokioClock {
                std_base: std::time::Instant::now(),
                tokio_base,
                wall_base: SystemTime::now(),
            })
            .build()
            .unwrap();
        let starts: Arc<Mutex<Vec<(String, Duration)>>> = Arc::default();
        let record = starts.clone();
        let hung = AtomicBool::new(false);
        let handler = Arc::new(Deduplicating::new(
            RateLimited::new(
                Timeout::new(
                    move |m: Arc<Message>| {
                        let payload = String::from_utf8(m.payload().to_vec()).unwrap();
                        record.lock().push((payload.clone(), tokio_base.elapsed()));
                        let hang = payload == "hangs once" && !hung.swap(true, Ordering::Relaxed);
                        async move {
                            let work = if hang { 3600 } else { 0 };
                            tokio::time::sleep(Duration::from_secs(work)).await;
                            Ok::<(), HandlerError>(())
                        }
                    },
                    Duration::from_millis(500),
                ),
                1,
                Duration::from_secs(1),
                broker.clock().clone(),
            )
            .unwrap(),
        ));
        let sub = broker
            .subscribe_async(
                "jobs",
                SubscribeOptions {
                    retry: Retry::fixed(Duration::from_millis(100), 3),
                    ..Default::default()
                },
                handler.clone(),
            )
            .unwrap();
        let first = MessageId::new();
        broker
            .publish(Message::to("jobs").payload("first").id(first))
            .unwrap();
        broker
            .publish(Message::to("jobs").payload("hangs once"))
            .unwrap();
        broker
            .publish(Message::to("jobs").payload("duplicate").id(first))
            .unwrap();
        broker.publish(Message::to("jobs").payload("last")).unwrap();
        while sub.stats().delivered < 4 {
            assert!(
                tokio_base.elapsed() < Duration::from_secs(60),
                "{:?}",
                sub.stats()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        let starts = starts.lock().clone();
        let names: Vec<&str> = starts.iter().map(|(p, _)| p.as_str()).collect();
        // The duplicate never reached the limiter or the handler.
        assert_eq!(names, ["first", "hangs once", "hangs once", "last"]);
        // Tokens at 0, 1 s, 2 s, 3 s at the earliest; the retry was due at 1.6 s (timed out
        // at 1.5 s + 100 ms) and waited for the token at 2 s.
        let secs = |s: u64| Duration::from_secs(s);
        for (k, (name, at)) in starts.iter().enumerate() {
            assert!(*at >= secs(k as u64), "{name} started at {at:?}");
            // Paused time: nothing else to wait for than the token (timer granularity).
            assert!(
                *at < secs(k as u64) + Duration::from_millis(50),
                "{name} at {at:?}"
            );
        }
        let s = sub.stats();
        // The duplicate was a handler call too (skipped by `Deduplicating`, acknowledged).
        assert_eq!((s.delivered, s.attempts, s.failures), (4, 5, 1));
        assert_eq!(handler.skipped(), 1);
        assert!(broker.close_async(Duration::from_secs(5)).await.is_clean());
    }
}
