//! The subscription's rate limit (R-PAT-2, amended): at most N handler starts in **any**
//! window of one period, on the broker's own clock. Every start instant is recorded and
//! every window is checked — windows starting at a start and between starts — for sync
//! handlers on the manual driver and async handlers on the tokio driver, under serial,
//! laned and per-key concurrency, with retries. A message without room waits as a
//! deferral does, so it holds no thread: a neighbour subscription is not held up, and the
//! wait is neither an attempt nor a failure. `HandlerError::defer_for` is here too: the
//! relative deferral on the same clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tidings::{
    Broker, Concurrency, DeadLetterReason, Deduplicating, Driver, HandlerError, ManualClock,
    Message, MessageId, RateLimit, RateLimited, Retry, SubscribeOptions, Subscription,
};

#[path = "support/embedded.rs"]
mod embedded;
use embedded::jobs_broker;

const SEC: Duration = Duration::from_secs(1);
const NS: Duration = Duration::from_nanos(1);

fn manual() -> (ManualClock, Broker) {
    let clock = ManualClock::new();
    let broker = Broker::builder()
        .driver(Driver::Manual)
        .clock(clock.clone())
        .build()
        .unwrap();
    (clock, broker)
}

fn limit(n: u32, per: Duration) -> SubscribeOptions {
    SubscribeOptions::new().rate_limit(RateLimit::new(n, per).unwrap())
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

fn instants(starts: &Starts) -> Vec<Duration> {
    starts.lock().iter().map(|(_, at)| *at).collect()
}

/// The most starts in any window `[t, t + per)`. Checked at every start, 1 ns before and
/// after it, half-way to the next start, and at the window that ends 1 ns after each start
/// (so windows that begin between two starts are covered, not only those aligned to one).
fn most_in_any_window(starts: &[Duration], per: Duration) -> usize {
    let mut sorted = starts.to_vec();
    sorted.sort();
    let mut windows = Vec::new();
    for (i, &s) in sorted.iter().enumerate() {
        windows.extend([
            Some(s),
            s.checked_sub(NS),
            Some(s + NS),
            (s + NS).checked_sub(per),
        ]);
        if let Some(&next) = sorted.get(i + 1) {
            windows.push(Some(s + (next - s) / 2));
        }
    }
    windows
        .into_iter()
        .flatten()
        .map(|t| sorted.iter().filter(|&&s| s >= t && s < t + per).count())
        .max()
        .unwrap_or(0)
}

/// A deterministic sequence of clock steps between 1 ns and 1.3 periods (an LCG: the same
/// steps every run).
struct Steps(u64);

impl Steps {
    fn next(&mut self, per: Duration) -> Duration {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let span = per.as_nanos() as u64 * 13 / 10;
        Duration::from_nanos((self.0 >> 33) % span + 1)
    }
}

// R-PAT-2, R-TIME-3: 10 messages at 3 per second on a manual clock: 3 start at t = 0, the
// next 3 at exactly 1 s, 3 more at 2 s and the last at 3 s — none a nanosecond early, in
// publish order. The first second holds 3 starts, not the token bucket's 5 (its burst plus
// two refills). The waits are neither attempts nor failures; a second subscription on the
// same (manual, single-threaded) driver handles all of its messages at t = 0.
#[test]
fn ten_messages_at_three_per_second_start_exactly_on_the_schedule() {
    let (clock, broker) = manual();
    let t0 = broker.clock().now();
    let starts = Starts::default();
    let sub = broker
        .subscribe("limited.*", limit(3, SEC), recording(&clock, &starts))
        .unwrap();
    let neighbour_starts = Starts::default();
    let neighbour = broker
        .subscribe(
            "free.*",
            SubscribeOptions::new(),
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
    assert!(instants(&neighbour_starts).iter().all(|at| at.is_zero()));

    for second in 1..=3u32 {
        let due = SEC * second;
        assert_eq!(broker.next_wake(), Some(t0 + due), "second {second}");
        clock.advance(due - NS - clock.elapsed());
        broker.run_until_idle();
        assert_eq!(started(&starts), 3 * second as usize, "1 ns early");
        clock.advance(NS);
        broker.run_until_idle();
        assert_eq!(
            started(&starts),
            (3 * second as usize + 3).min(10),
            "on time"
        );
    }
    assert_eq!(broker.next_wake(), None);

    let expected: Vec<(String, Duration)> =
        (0..10u32).map(|i| (i.to_string(), SEC * (i / 3))).collect();
    assert_eq!(*starts.lock(), expected);
    assert_eq!(most_in_any_window(&instants(&starts), SEC), 3);
    let s = sub.stats();
    assert_eq!((s.delivered, s.attempts, s.failures), (10, 10, 0));
    assert_eq!(s.dead_lettered.total(), 0);
    assert!(s.is_conserved());
}

/// The start instants of 10 messages on `broker`'s manual clock, one per second stepped
/// until all started, through the subscription `subscribe` makes with `handler`.
fn starts_of(
    subscribe: impl FnOnce(&Broker, Box<dyn Fn(&Message) + Send + Sync>) -> Subscription,
) -> Vec<(String, Duration)> {
    let (clock, broker) = manual();
    let starts = Starts::default();
    let sub = subscribe(&broker, Box::new(recording(&clock, &starts)));
    for i in 0..10 {
        broker
            .publish(Message::to("limited.x").payload(i.to_string()))
            .unwrap();
    }
    broker.run_until_idle();
    while sub.stats().delivered < 10 {
        let next = broker.next_wake().expect("a start is due");
        clock.advance(next - broker.clock().now());
        broker.run_until_idle();
    }
    starts.lock().clone()
}

// R-PAT-2: the decorator form keeps the same schedule as the option — it hands its limit
// to the subscription, which keeps it on the broker's clock.
#[test]
fn the_rate_limited_decorator_keeps_the_options_schedule() {
    let by_option = starts_of(|broker, handler| {
        broker
            .subscribe("limited.*", limit(3, SEC), handler)
            .unwrap()
    });
    let by_decorator = starts_of(|broker, handler| {
        let three = RateLimit::new(3, SEC).unwrap();
        broker
            .subscribe(
                "limited.*",
                SubscribeOptions::new(),
                RateLimited::new(handler, three),
            )
            .unwrap()
    });
    let expected: Vec<(String, Duration)> =
        (0..10u32).map(|i| (i.to_string(), SEC * (i / 3))).collect();
    assert_eq!(by_option, expected);
    assert_eq!(by_decorator, expected);
}

// R-PAT-2, R-LIM-1: one rate limit per subscription. A decorator's limit beside the
// options' one, or two decorators, is refused with the setting named — never one of
// them silently dropped; on a durable target too. A decorator alone on a durable target
// limits it.
#[test]
fn two_rate_limits_on_one_subscription_are_refused() {
    use tidings::{ConfigError, DurableSpec, SubscribeError};

    let (clock, broker) = manual();
    let two = RateLimit::new(2, SEC).unwrap();
    let noop = |_: &Message| {};
    let refused = |e: SubscribeError| match e {
        SubscribeError::InvalidOptions(ConfigError::Invalid { setting, value, .. }) => {
            assert_eq!(setting, "rate_limit");
            value
        }
        other => panic!("{other:?}"),
    };
    let both = broker
        .subscribe("a", limit(3, SEC), RateLimited::new(noop, two))
        .unwrap_err();
    assert_eq!(refused(both), "3 per 1s and 2 per 1s");
    let nested = broker
        .subscribe(
            "a",
            SubscribeOptions::new(),
            RateLimited::new(RateLimited::new(noop, two), RateLimit::new(5, SEC).unwrap()),
        )
        .unwrap_err();
    assert_eq!(refused(nested), "2 per 1s and 5 per 1s");
    assert!(broker.subscriptions().is_empty());

    let dir = tempfile::tempdir().unwrap();
    let durable = jobs_broker(dir.path(), &clock);
    let e = durable
        .subscribe(
            DurableSpec::new("jobs").name("w"),
            limit(1, SEC),
            RateLimited::new(noop, two),
        )
        .unwrap_err();
    let tidings::StreamError::Subscribe(e) = e else {
        panic!("{e:?}");
    };
    assert_eq!(refused(e), "1 per 1s and 2 per 1s");
    for i in 0..5 {
        durable
            .publish(Message::to("jobs.x").payload(i.to_string()))
            .unwrap();
    }
    let starts = Starts::default();
    let sub = durable
        .subscribe(
            DurableSpec::new("jobs").name("w"),
            SubscribeOptions::new(),
            RateLimited::new(recording(&clock, &starts), two),
        )
        .unwrap();
    durable.run_until_idle();
    assert_eq!(
        started(&starts),
        2,
        "the burst of 2, the name free after the refusal"
    );
    clock.advance(SEC);
    durable.run_until_idle();
    assert_eq!(started(&starts), 4);
    drop(sub);
}

/// One run of `messages` keyed messages (keys `k0`..`k4`) through a subscription of
/// `options` under the manual driver, advancing the clock in irregular steps; every third
/// message fails its first attempt (retried after 10 ms), so retries take starts too.
/// Returns the start instants, and checks that everything was delivered.
fn run_sync(options: SubscribeOptions, messages: u32, seed: u64) -> Vec<Duration> {
    let per = options.rate_limit.unwrap().per();
    let (clock, broker) = manual();
    let starts = Starts::default();
    let record = recording(&clock, &starts);
    let failed = Mutex::new(std::collections::HashSet::new());
    let sub = broker
        .subscribe(
            "jobs",
            options.retry(Retry::fixed(Duration::from_millis(10), 3)),
            move |m: &Message| -> Result<(), HandlerError> {
                record(m);
                let n: u32 = std::str::from_utf8(m.payload()).unwrap().parse().unwrap();
                if n.is_multiple_of(3) && failed.lock().insert(n) {
                    return Err(HandlerError::retry("first attempt fails"));
                }
                Ok(())
            },
        )
        .unwrap();
    for i in 0..messages {
        let key = format!("k{}", i % 5);
        broker
            .publish(Message::to("jobs").key(key).payload(i.to_string()))
            .unwrap();
    }
    let mut steps = Steps(seed);
    for _ in 0..100_000 {
        broker.run_until_idle();
        if sub.stats().delivered == u64::from(messages) {
            break;
        }
        clock.advance(steps.next(per));
    }
    let s = sub.stats();
    let retries = u64::from(messages.div_ceil(3));
    assert_eq!(
        (s.delivered, s.attempts, s.failures),
        (u64::from(messages), u64::from(messages) + retries, retries),
        "{s:?}"
    );
    assert!(s.is_conserved());
    let at = instants(&starts);
    assert_eq!(
        at.len() as u64,
        s.attempts,
        "every attempt is a recorded start"
    );
    at
}

// R-PAT-2 (amended): sync handlers under serial, laned and per-key concurrency, with
// retries, the clock moved in irregular steps (1 ns to 1.3 periods): every window of one
// period, wherever it starts, holds at most N starts — and the limit is reached, so the
// check is not passed by a subscription that merely ran slowly.
#[test]
fn no_window_of_one_period_holds_more_than_n_starts_sync() {
    let cases = [
        (3, SEC, Concurrency::Serial),
        (3, SEC, Concurrency::Lanes(3)),
        (
            4,
            Duration::from_millis(250),
            Concurrency::PerKey { max_in_flight: 4 },
        ),
        (
            1,
            Duration::from_millis(7),
            Concurrency::PerKey { max_in_flight: 2 },
        ),
        (7, Duration::from_nanos(1_000_003), Concurrency::Lanes(2)),
    ];
    for (seed, (n, per, concurrency)) in cases.into_iter().enumerate() {
        let at = run_sync(limit(n, per).concurrency(concurrency), 40, seed as u64 + 1);
        assert_eq!(
            most_in_any_window(&at, per),
            n as usize,
            "{n} per {per:?} under {concurrency:?}: {at:?}"
        );
    }
}

// R-PAT-2, R-DEL-3: a retry is a handler start and takes room in the window: the retry due
// after 100 ms waits until 1 s, and the message behind it until 2 s.
#[test]
fn a_retry_takes_a_start() {
    let (clock, broker) = manual();
    let starts = Starts::default();
    let record = recording(&clock, &starts);
    let failed = AtomicBool::new(false);
    let sub = broker
        .subscribe(
            "jobs",
            limit(1, SEC).retry(Retry::fixed(Duration::from_millis(100), 3)),
            move |m: &Message| -> Result<(), HandlerError> {
                record(m);
                if m.payload().as_ref() == b"a" && !failed.swap(true, Ordering::Relaxed) {
                    return Err(HandlerError::retry("down"));
                }
                Ok(())
            },
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

// R-PAT-2, R-DEL-5: the limit counts handler starts, whatever the handler does with them:
// a duplicate that `Deduplicating` skips was a start too (its docs say so). At 2 per
// second, x and its duplicate start at 0, y and the next duplicate at 1 s, z at 2 s.
#[test]
fn a_skipped_duplicate_is_still_a_start() {
    let (clock, broker) = manual();
    let starts = Starts::default();
    let dedup = Arc::new(Deduplicating::new(recording(&clock, &starts)));
    let sub = broker
        .subscribe("jobs", limit(2, SEC), dedup.clone())
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
    while let Some(next) = broker.next_wake() {
        clock.advance_to(next);
        broker.run_until_idle();
    }
    assert_eq!(
        *starts.lock(),
        vec![
            ("x".to_owned(), Duration::ZERO),
            ("y".to_owned(), SEC),
            ("z".to_owned(), SEC * 2)
        ]
    );
    assert_eq!(dedup.skipped(), 2);
    let s = sub.stats();
    assert_eq!((s.delivered, s.attempts, s.failures), (5, 5, 0));
}

// R-PAT-2, R-TIME-3: `HandlerError::defer_for` waits on the broker's clock: delivered again
// exactly 250 ms after the call (not 1 ns earlier), as the same attempt.
#[test]
fn defer_for_waits_on_the_brokers_clock() {
    let (clock, broker) = manual();
    let starts = Starts::default();
    let record = recording(&clock, &starts);
    let deferred = AtomicBool::new(false);
    let sub = broker
        .subscribe(
            "jobs",
            SubscribeOptions::new(),
            move |m: &Message| -> Result<(), HandlerError> {
                record(m);
                if !deferred.swap(true, Ordering::Relaxed) {
                    return Err(HandlerError::defer_for(Duration::from_millis(250)));
                }
                Ok(())
            },
        )
        .unwrap();
    clock.advance(Duration::from_millis(40));
    broker.publish(Message::to("jobs").payload("a")).unwrap();
    broker.run_until_idle();
    assert_eq!(started(&starts), 1);
    assert_eq!(
        broker.next_wake(),
        Some(broker.clock().now() + Duration::from_millis(250))
    );
    clock.advance(Duration::from_millis(250) - NS);
    broker.run_until_idle();
    assert_eq!(started(&starts), 1, "1 ns early");
    clock.advance(NS);
    broker.run_until_idle();
    assert_eq!(
        instants(&starts),
        [Duration::from_millis(40), Duration::from_millis(290)]
    );
    let s = sub.stats();
    assert_eq!((s.delivered, s.attempts, s.failures), (1, 1, 0));
}

// R-LIM-1, R-DEL-1: a `defer_for` past the clock's range (`Duration::MAX`) does not panic
// and does not park the message for good: it is refused, dead-lettered as `Rejected` with
// the reason, and the message behind it goes on.
#[test]
fn defer_for_beyond_the_clocks_range_is_rejected_not_parked_forever() {
    let (clock, broker) = manual();
    let starts = Starts::default();
    let record = recording(&clock, &starts);
    let sub = broker
        .subscribe(
            "jobs",
            SubscribeOptions::new(),
            move |m: &Message| -> Result<(), HandlerError> {
                record(m);
                if m.payload().as_ref() == b"forever" {
                    return Err(HandlerError::defer_for(Duration::MAX));
                }
                Ok(())
            },
        )
        .unwrap();
    broker
        .publish(Message::to("jobs").payload("forever"))
        .unwrap();
    broker.publish(Message::to("jobs").payload("next")).unwrap();
    broker.run_until_idle();
    assert_eq!(broker.next_wake(), None);
    let dead = sub.dead_letters();
    assert_eq!(dead.len(), 1);
    match &dead[0].reason {
        DeadLetterReason::Rejected { error } => {
            assert!(error.contains("past the clock's range"), "{error}");
        }
        other => panic!("{other:?}"),
    }
    let s = sub.stats();
    assert_eq!((s.delivered, s.dead_lettered.rejected), (1, 1));
    assert!(s.is_conserved());
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
// 100 ms: all delivered, in order, none before its window had room (measured from before the
// first publish, so the bound holds whatever the scheduling). A neighbour subscription on
// the same single worker handles its messages while the limited one still has a backlog.
// And a third subscription, limited to 1 per hour, holds a message waiting an hour for its
// room all along: were that wait a sleep, the only worker would be gone and nothing else
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
    let sub = broker
        .subscribe(
            "limited",
            SubscribeOptions::new()
                .capacity(256)
                .rate_limit(RateLimit::new(50, per).unwrap()),
            record,
        )
        .unwrap();
    let neighbour = broker
        .subscribe("free", SubscribeOptions::default(), |_m: &Message| {})
        .unwrap();
    let slow = broker
        .subscribe(
            "slow",
            SubscribeOptions::new()
                .rate_limit(RateLimit::new(1, Duration::from_secs(3600)).unwrap()),
            |_m: &Message| {},
        )
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
    // The k-th start may come no earlier than one period after the (k - 50)-th: so no
    // earlier than `per * (k / 50)` after the first publish.
    for (k, (n, at)) in starts.iter().enumerate() {
        let room = per * (k as u32 / 50);
        assert!(
            *at >= before + room,
            "message {n} started {:?} after the first publish, before its window had room at {room:?}",
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
// waiting for room at close is abandoned, not finished: its offset is not committed,
// so the next process reads it again. Nothing published is lost; the messages handled
// before close are not handled again.
#[test]
fn a_durable_message_waiting_for_room_at_close_is_read_again_after_restart() {
    use tidings::DurableSpec;

    let dir = tempfile::tempdir().unwrap();
    let open = |clock: &ManualClock| jobs_broker(dir.path(), clock);

    let clock = ManualClock::new();
    let broker = open(&clock);
    for i in 0..5 {
        broker
            .publish(Message::to("jobs.x").payload(i.to_string()))
            .unwrap();
    }
    let first = Starts::default();
    let sub = broker
        .subscribe(
            DurableSpec::new("jobs").name("worker"),
            SubscribeOptions::new().rate_limit(RateLimit::new(2, Duration::from_secs(1)).unwrap()),
            recording(&clock, &first),
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
        .subscribe(
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
        Broker, Clock, Concurrency, Deduplicating, Driver, HandlerError, ManualClock, Message,
        MessageId, RateLimit, Retry, SubscribeOptions, Timeout,
    };
    use tokio::time::Instant;

    use super::{SEC, Steps, most_in_any_window};
    use tidings::RateLimited;

    /// The broker's clock read from tokio's, so the rate limit's schedule (broker clock),
    /// the waits and the timeout (tokio timers) share paused time (as in `tests/timeout.rs`).
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

    // R-PAT-2: `RateLimited(Deduplicating(Timeout(async)))` under the tokio driver, 1 start
    // per second:
    // the attempt that hangs is cancelled at the limit and its retry waits for room (2 s),
    // the duplicate is a start of its own (3 s, skipped by `Deduplicating`), and every
    // start is on the schedule.
    #[tokio::test(start_paused = true)]
    async fn deduplicating_timeout_under_a_rate_limit_compose() {
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
        let handler = Arc::new(Deduplicating::new(Timeout::new(
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
        )));
        // The limit as a decorator around the others: RateLimited(Deduplicating(Timeout)).
        let sub = broker
            .subscribe(
                "jobs",
                SubscribeOptions::new().retry(Retry::fixed(Duration::from_millis(100), 3)),
                RateLimited::new(handler.clone(), RateLimit::new(1, SEC).unwrap()),
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
        assert_eq!(names, ["first", "hangs once", "hangs once", "last"]);
        // Starts at 0, 1 s, 2 s (the retry: due at 1.6 s, room at 2 s), [3 s: the
        // duplicate, skipped], 4 s.
        let secs = |s: u64| Duration::from_secs(s);
        for ((name, at), due) in starts.iter().zip([0, 1, 2, 4]) {
            assert!(*at >= secs(due), "{name} started at {at:?}");
            // Paused time: nothing else to wait for than room (timer granularity).
            assert!(
                *at < secs(due) + Duration::from_millis(50),
                "{name} at {at:?}"
            );
        }
        let s = sub.stats();
        assert_eq!((s.delivered, s.attempts, s.failures), (4, 5, 1));
        assert_eq!(handler.skipped(), 1);
        assert!(broker.close_async(Duration::from_secs(5)).await.is_clean());
    }

    /// How many of a backlog of `messages` may have started by each of `steps` (clock
    /// times), at `n` per `per`, starting as many as the window allows at each: the promise
    /// itself, written out as the reference the runs are compared with.
    fn allowed_by(steps: &[Duration], n: usize, per: Duration, messages: usize) -> Vec<usize> {
        let mut starts: Vec<Duration> = Vec::new();
        steps
            .iter()
            .map(|&t| {
                while starts.len() < messages && starts.iter().filter(|&&s| s + per > t).count() < n
                {
                    starts.push(t);
                }
                starts.len()
            })
            .collect()
    }

    // R-PAT-2 (amended), R-EXE-3: async handlers on the tokio driver, the broker on a
    // manual clock moved in irregular steps. After each step the run is awaited until it
    // has made as many starts as the promise allows by then (and never more: every window
    // is checked at the end): so it admits at most N per window, and no fewer than it may.
    #[test]
    fn no_window_of_one_period_holds_more_than_n_starts_async() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let cases = [
            (3u32, SEC, Concurrency::Serial),
            (
                4,
                Duration::from_millis(250),
                Concurrency::PerKey { max_in_flight: 3 },
            ),
            (2, Duration::from_nanos(999_983), Concurrency::Lanes(2)),
        ];
        for (seed, (n, per, concurrency)) in cases.into_iter().enumerate() {
            let messages = 30usize;
            let clock = ManualClock::new();
            let broker = Broker::builder()
                .driver(Driver::Tokio(rt.handle().clone()))
                .clock(clock.clone())
                .build()
                .unwrap();
            let starts: Arc<Mutex<Vec<Duration>>> = Arc::default();
            let (record, at) = (starts.clone(), clock.clone());
            let sub = broker
                .subscribe(
                    "jobs",
                    SubscribeOptions::new()
                        .concurrency(concurrency)
                        .rate_limit(RateLimit::new(n, per).unwrap()),
                    move |_m: Arc<Message>| {
                        record.lock().push(at.elapsed());
                        async { Ok::<(), HandlerError>(()) }
                    },
                )
                .unwrap();
            for i in 0..messages {
                broker
                    .publish(Message::to("jobs").key(format!("k{}", i % 4)))
                    .unwrap();
            }
            let mut steps = Steps(seed as u64 + 7);
            let mut times = vec![Duration::ZERO];
            while *allowed_by(&times, n as usize, per, messages)
                .last()
                .unwrap()
                < messages
            {
                let next = *times.last().unwrap() + steps.next(per);
                times.push(next);
            }
            let allowed = allowed_by(&times, n as usize, per, messages);
            for (t, want) in times.iter().zip(&allowed) {
                clock.advance(*t - clock.elapsed());
                let deadline = std::time::Instant::now() + Duration::from_secs(30);
                while starts.lock().len() < *want {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "at {t:?}: {} of {want} started; {:?}",
                        starts.lock().len(),
                        sub.stats()
                    );
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while sub.stats().delivered < messages as u64 {
                assert!(std::time::Instant::now() < deadline, "{:?}", sub.stats());
                std::thread::sleep(Duration::from_millis(1));
            }
            let at = starts.lock().clone();
            assert_eq!(at.len(), messages, "one start per message");
            assert_eq!(
                most_in_any_window(&at, per),
                n as usize,
                "{n} per {per:?} under {concurrency:?}: {at:?}"
            );
            let s = sub.stats();
            assert_eq!((s.delivered, s.attempts, s.failures), (30, 30, 0));
            broker.close(Duration::from_secs(5));
        }
    }
}
