//! The tokio driver and async handlers (R-EXE-1, R-EXE-3), run with `--features tokio`
//! (CI: `cargo test --workspace --all-features`).
#![cfg(feature = "tokio")]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tidings::{
    Broker, DeadLetterReason, Driver, HandlerError, Message, RequestError, Retry, SubscribeError,
    SubscribeOptions, Subscription,
};
use tidings_testkit::helpers::{Activity, text};

/// Generous bound for every wait: these tests assert outcomes, never timings.
const PATIENCE: Duration = Duration::from_secs(20);

fn tokio_broker() -> Broker {
    Broker::builder()
        .driver(Driver::Tokio(tokio::runtime::Handle::current()))
        .build()
        .unwrap()
}

/// Await `cond` (checked every 2 ms of tokio time) for up to `PATIENCE` of real time.
/// A two-worker runtime of the test's own (the test thread stays outside it) and a broker on
/// the tokio driver over it.
fn runtime_and_broker() -> (tokio::runtime::Runtime, Broker) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let broker = Broker::builder()
        .driver(Driver::Tokio(rt.handle().clone()))
        .build()
        .unwrap();
    (rt, broker)
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

type Seen = Arc<Mutex<Vec<(u32, u32)>>>;

fn record(log: &Seen, m: &Message) {
    let t = text(m);
    let (p, i) = t.split_once(':').unwrap();
    log.lock().push((p.parse().unwrap(), i.parse().unwrap()));
}

// Fan-out to async and sync handlers on the tokio driver; 4 publisher tasks × 200: each
// subscription sees every message, each publisher's in order, one handler call at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_order_and_one_active_handler() {
    let broker = tokio_broker();
    let options = || SubscribeOptions::new().capacity(1000);
    let mut subs = Vec::new();
    for n in 0..4 {
        let activity = Arc::new(Activity::default());
        let seen: Seen = Arc::default();
        let (act, log) = (activity.clone(), seen.clone());
        let sub = if n % 2 == 0 {
            broker
                .subscribe("load", options(), move |m: Arc<Message>| {
                    let (act, log) = (act.clone(), log.clone());
                    async move {
                        act.enter();
                        record(&log, &m);
                        tokio::task::yield_now().await; // suspend mid-handler
                        act.exit();
                        Ok(())
                    }
                })
                .unwrap()
        } else {
            broker
                .subscribe("load", options(), move |m: &Message| {
                    act.enter();
                    record(&log, m);
                    act.exit();
                    Ok::<(), HandlerError>(())
                })
                .unwrap()
        };
        subs.push((sub, activity, seen));
    }
    let mut publishers = Vec::new();
    for p in 0..4u32 {
        let broker = broker.clone();
        publishers.push(tokio::spawn(async move {
            for i in 0..200u32 {
                let r = broker
                    .publish_async(Message::to("load").payload(format!("{p}:{i}")))
                    .await
                    .unwrap();
                assert_eq!(r.accepted, 4); // R-CORE-1: fan-out to every matching subscription
            }
        }));
    }
    for p in publishers {
        p.await.unwrap();
    }
    for (sub, activity, seen) in &subs {
        eventually("all 800 delivered", || sub.stats().delivered == 800).await;
        let mut next: HashMap<u32, u32> = HashMap::new();
        for &(p, i) in seen.lock().iter() {
            let expect = next.entry(p).or_insert(0);
            assert_eq!(i, *expect, "publisher {p} out of order"); // R-ORD-2
            *expect += 1;
        }
        assert_eq!(activity.max(), 1); // R-CORE-3 on R-EXE-1's tokio driver
        assert_eq!(seen.lock().len(), 800); // R-CORE-1: each message exactly once
        assert!(sub.stats().is_conserved()); // R-DEL-6
    }
    let report = broker.close_async(Duration::from_secs(5)).await;
    assert!(report.is_clean(), "{report:?}"); // R-CORE-6
}

// An async handler that awaits a one-hour tokio sleep completes under paused time: the
// dispatcher task really awaits it (R-EXE-3) instead of blocking a thread.
#[tokio::test(start_paused = true)]
async fn async_handler_awaits_tokio_sleep_under_paused_time() {
    let broker = tokio_broker();
    let slept: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let log = slept.clone();
    let sub = broker
        .subscribe(
            "nap",
            SubscribeOptions::default(),
            move |_m: Arc<Message>| {
                let log = log.clone();
                async move {
                    let start = tokio::time::Instant::now();
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    log.lock().push(start.elapsed());
                    Ok(())
                }
            },
        )
        .unwrap();
    broker.publish(Message::to("nap")).unwrap();
    let mut spins = 0;
    while sub.stats().delivered == 0 {
        spins += 1;
        assert!(spins < 100_000, "the async handler never completed");
        tokio::time::sleep(Duration::from_secs(60)).await; // auto-advances paused time
    }
    assert_eq!(slept.lock().len(), 1); // R-EXE-3: awaited exactly once, to completion
    assert!(slept.lock()[0] >= Duration::from_secs(3600)); // slept on tokio's (paused) clock
    let report = broker.close_async(Duration::from_secs(5)).await;
    assert!(report.is_clean(), "{report:?}"); // R-CORE-6
}

// A failing async handler is retried by the policy, then dead-lettered with its error.
#[tokio::test]
async fn failing_async_handler_is_retried_then_dead_lettered() {
    let broker = tokio_broker();
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let sub = broker
        .subscribe(
            "fail",
            SubscribeOptions::new().retry(Retry::fixed(Duration::from_millis(1), 3)),
            move |_m: Arc<Message>| {
                let c = c.clone();
                async move {
                    c.fetch_add(1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    Err(HandlerError::retry("backend down"))
                }
            },
        )
        .unwrap();
    broker.publish(Message::to("fail").payload("x")).unwrap();
    eventually("dead-lettered", || sub.stats().dlq_len == 1).await;
    assert_eq!(calls.load(Ordering::SeqCst), 3); // R-DEL-1: max_attempts handler calls
    let dead = sub.dead_letters();
    assert_eq!(dead.len(), 1); // R-DEL-4
    assert!(matches!(
        dead[0].reason,
        DeadLetterReason::RetriesExhausted { attempts: 3, .. }
    )); // R-DEL-1
    assert_eq!(dead[0].last_error(), Some("backend down"));
    let stats = sub.stats();
    assert_eq!((stats.attempts, stats.failures, stats.delivered), (3, 3, 0));
    assert!(stats.is_conserved()); // R-DEL-6
    let report = broker.close_async(Duration::from_secs(5)).await;
    assert!(report.is_clean(), "{report:?}"); // R-CORE-6
}

// A panic inside an async handler's future is caught, retried, then dead-lettered with the
// panic text; the dispatcher task survives and delivers the next message.
#[tokio::test]
async fn panicking_async_handler_is_caught_retried_and_dead_lettered() {
    let broker = tokio_broker();
    let ok = Arc::new(AtomicU32::new(0));
    let o = ok.clone();
    let sub = broker
        .subscribe(
            "boom",
            SubscribeOptions::new().retry(Retry::fixed(Duration::from_millis(1), 3)),
            move |m: Arc<Message>| {
                let o = o.clone();
                async move {
                    tokio::task::yield_now().await;
                    if text(&m) == "panic" {
                        panic!("kaboom");
                    }
                    o.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            },
        )
        .unwrap();
    broker
        .publish(Message::to("boom").payload("panic"))
        .unwrap();
    broker.publish(Message::to("boom").payload("fine")).unwrap();
    eventually("panic dead-lettered and next delivered", || {
        let s = sub.stats();
        s.dlq_len == 1 && s.delivered == 1
    })
    .await;
    let dead = sub.dead_letters();
    assert!(matches!(
        dead[0].reason,
        DeadLetterReason::RetriesExhausted { attempts: 3, .. }
    )); // R-DEL-1: a panic is a retryable failure
    assert!(dead[0].last_error().unwrap().contains("kaboom")); // R-DEL-1: panic text kept
    assert_eq!(ok.load(Ordering::SeqCst), 1); // the dispatcher survived the panics
    assert!(sub.stats().is_conserved()); // R-DEL-6
    let report = broker.close_async(Duration::from_secs(5)).await;
    assert!(report.is_clean(), "{report:?}"); // R-CORE-6
}

// Request-reply from async code with an async responder that replies via publish_async.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_request_reply() {
    let broker = tokio_broker();
    let weak = broker.downgrade();
    let _responder = broker
        .subscribe(
            "svc.echo",
            SubscribeOptions::default(),
            move |m: Arc<Message>| {
                let weak = weak.clone();
                async move {
                    let Some(broker) = weak.upgrade() else {
                        return Ok(());
                    };
                    let reply = m.reply().expect("request has reply_to");
                    broker
                        .publish_async(reply.payload(format!("echo {}", text(&m))))
                        .await?;
                    Ok(())
                }
            },
        )
        .unwrap();
    for i in 0..10 {
        let reply = broker
            .request_async(
                Message::to("svc.echo").payload(format!("{i}")),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        assert_eq!(text(&reply), format!("echo {i}")); // R-PAT-1: correlated reply
    }
    assert_eq!(broker.pending_requests(), 0); // R-PAT-1: no leftover entries
    let none = broker
        .request_async(Message::to("svc.nobody"), Duration::from_secs(1))
        .await;
    assert_eq!(none.unwrap_err(), RequestError::NoResponders); // R-PAT-1
    let report = broker.close_async(Duration::from_secs(5)).await;
    assert!(report.is_clean(), "{report:?}"); // R-CORE-6
}

// Sync close from a thread outside the runtime drains and joins the tasks.
#[test]
fn close_from_outside_the_runtime_drains_and_joins() {
    let (_rt, broker) = runtime_and_broker();
    let sub = broker
        .subscribe(
            "slow",
            SubscribeOptions::default(),
            |_m: Arc<Message>| async {
                tokio::time::sleep(Duration::from_millis(2)).await;
                Ok(())
            },
        )
        .unwrap();
    for i in 0..20 {
        broker
            .publish(Message::to("slow").payload(format!("{i}")))
            .unwrap();
    }
    let report = broker.close(Duration::from_secs(10));
    assert!(report.is_clean(), "{report:?}"); // R-CORE-6: drained and joined
    assert_eq!(sub.stats().delivered, 20); // R-CORE-6: queued messages delivered in the drain
}

// close_async inside a current-thread runtime: the waiting happens off the only worker
// thread, so the dispatcher tasks can drain the queue.
#[tokio::test]
async fn close_async_inside_a_current_thread_runtime_drains() {
    let broker = tokio_broker();
    let sub = broker
        .subscribe(
            "slow",
            SubscribeOptions::default(),
            |_m: Arc<Message>| async {
                tokio::time::sleep(Duration::from_millis(1)).await;
                Ok(())
            },
        )
        .unwrap();
    for i in 0..20 {
        broker
            .publish(Message::to("slow").payload(format!("{i}")))
            .unwrap();
    }
    let report = broker.close_async(Duration::from_secs(10)).await;
    assert!(report.is_clean(), "{report:?}"); // R-CORE-6
    assert_eq!(sub.stats().delivered, 20); // R-CORE-6: drained
    assert_eq!(
        broker.publish(Message::to("slow")).unwrap_err(),
        tidings::PublishError::Closed
    ); // R-CORE-6: refuses after close
}

/// A subscription named `stuck`, on topic `stuck`, whose async handler sleeps for an hour;
/// the flag is set once a handler call has started.
fn stuck(broker: &Broker) -> (Subscription, Arc<AtomicBool>) {
    let started = Arc::new(AtomicBool::new(false));
    let s = started.clone();
    let options = SubscribeOptions::new().name("stuck");
    let sub = broker
        .subscribe("stuck", options, move |_m: Arc<Message>| {
            s.store(true, Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(())
            }
        })
        .unwrap();
    (sub, started)
}

// The sync close called from inside a task (the only worker thread of a current-thread
// runtime) returns instead of deadlocking, reporting the busy dispatcher as unjoined.
#[tokio::test]
async fn sync_close_inside_the_runtime_does_not_deadlock() {
    let broker = tokio_broker();
    let (sub, started) = stuck(&broker);
    broker.publish(Message::to("stuck").payload("a")).unwrap();
    broker.publish(Message::to("stuck").payload("b")).unwrap();
    eventually("handler started", || started.load(Ordering::SeqCst)).await;
    let report = broker.close(Duration::from_secs(1)); // must return: R-CORE-6
    assert_eq!(report.unjoined, vec!["tidings-stuck-0".to_string()]); // R-CORE-6: reported
    assert_eq!(report.undelivered.len(), 1); // R-CORE-6: "b" was still queued
    assert_eq!(text(&report.undelivered[0].message), "b");
    assert!(sub.stats().is_conserved()); // R-DEL-6
}

// The sync close called by a handler (on its slot's task) reports the other slot still
// running a handler, and not its own.
#[tokio::test]
async fn close_from_a_handler_reports_the_others_not_itself() {
    let broker = tokio_broker();
    let (_stuck, started) = stuck(&broker);
    let report = Arc::new(Mutex::new(None));
    let (b, r) = (broker.clone(), report.clone());
    let closer = SubscribeOptions::new().name("closer");
    let _closer = broker
        .subscribe("close", closer, move |_m: &Message| {
            *r.lock() = Some(b.close(Duration::ZERO));
            Ok(())
        })
        .unwrap();
    broker.publish(Message::to("stuck")).unwrap();
    eventually("handler started", || started.load(Ordering::SeqCst)).await;
    broker.publish(Message::to("close")).unwrap();
    eventually("closed by the handler", || report.lock().is_some()).await;
    let report = report.lock().take().unwrap();
    assert_eq!(report.unjoined, vec!["tidings-stuck-0".to_string()]); // R-CORE-6
}

// A handler closes its own broker (the sync close, on its slot's task,
// which cannot wait for the other tasks there) while another slot's task is alive but runs
// no handler — it sleeps until a retry is due. That task sees the close at its next poll
// and ends with no user code left to run, so it is not unjoined: the report — which a later
// close from outside the runtime returns again — leaves no dispatcher unjoined, as under
// the thread and pool drivers.
#[test]
fn close_from_a_handler_leaves_no_idle_dispatcher_unjoined() {
    let (_rt, broker) = runtime_and_broker();
    let retrying = broker
        .subscribe(
            "retry",
            SubscribeOptions::new()
                .name("retrying")
                .retry(Retry::fixed(Duration::from_secs(3600), 3)),
            |_m: &Message| Err(HandlerError::retry("later")),
        )
        .unwrap();
    let first = Arc::new(Mutex::new(None));
    let (b, r) = (broker.clone(), first.clone());
    let closer = SubscribeOptions::new().name("closer");
    let _closer = broker
        .subscribe("close", closer, move |_m: &Message| {
            *r.lock() = Some(b.close(Duration::ZERO));
            Ok(())
        })
        .unwrap();
    broker.publish(Message::to("retry")).unwrap();
    let deadline = Instant::now() + PATIENCE;
    // The failed attempt is reported: its task now waits for the retry, in no handler.
    while retrying.stats().failures < 1 {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for the first attempt"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    broker.publish(Message::to("close")).unwrap();
    while first.lock().is_none() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for the handler's close"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let from_handler = first.lock().take().unwrap();
    assert!(from_handler.unjoined.is_empty(), "{from_handler:?}"); // R-CORE-6
    let from_outside = broker.close(Duration::from_secs(5));
    assert!(from_outside.unjoined.is_empty(), "{from_outside:?}"); // R-CORE-6
    // The message waiting for its retry was abandoned, and reported (R-CORE-6).
    assert_eq!(from_outside.undelivered.len(), 1, "{from_outside:?}");
    assert!(retrying.stats().is_conserved()); // R-DEL-6
}

// A handler of one broker closing another broker on the same runtime is not one of the
// other broker's tasks: that broker's own handler still running is reported, and a broker
// with no task left reports nothing (and does not miscount).
#[tokio::test]
async fn a_handler_closing_another_broker_is_not_counted_as_its_task() {
    let (a, b, idle) = (tokio_broker(), tokio_broker(), tokio_broker());
    let (_stuck, started) = stuck(&b);
    let reports = Arc::new(Mutex::new(None));
    let (bb, ib, r) = (b.clone(), idle.clone(), reports.clone());
    let _closer = a
        .subscribe("close", SubscribeOptions::default(), move |_m: &Message| {
            *r.lock() = Some((bb.close(Duration::ZERO), ib.close(Duration::ZERO)));
            Ok(())
        })
        .unwrap();
    b.publish(Message::to("stuck")).unwrap();
    eventually("handler started", || started.load(Ordering::SeqCst)).await;
    a.publish(Message::to("close")).unwrap();
    eventually("closed by the handler", || reports.lock().is_some()).await;
    let (of_b, of_idle) = reports.lock().take().unwrap();
    assert_eq!(of_b.unjoined, vec!["tidings-stuck-0".to_string()]); // R-CORE-6
    assert!(of_idle.unjoined.is_empty(), "{of_idle:?}"); // R-CORE-6
}

// Async handlers need a driver that can await them: any other driver refuses at subscribe.
#[test]
fn async_handler_without_tokio_driver_is_refused() {
    for driver in [Driver::Thread, Driver::Manual] {
        let broker = Broker::builder().driver(driver).build().unwrap();
        let err = broker
            .subscribe("t", SubscribeOptions::default(), |_m: Arc<Message>| async {
                Ok(())
            })
            .unwrap_err();
        assert_eq!(err, SubscribeError::AsyncHandlerNeedsTokio); // R-EXE-3
        assert!(broker.subscriptions().is_empty());
        assert!(broker.close(Duration::from_secs(1)).is_clean());
    }
}

// ---- A slot's task exists only while the slot has work ----

/// A sync handler that counts its calls and checks that one runs at a time.
fn counting(
    broker: &Broker,
    topic: &str,
    options: SubscribeOptions,
) -> (tidings::Subscription, Arc<AtomicU32>, Arc<Activity>) {
    let delivered = Arc::new(AtomicU32::new(0));
    let activity = Arc::new(Activity::default());
    let (d, act) = (delivered.clone(), activity.clone());
    let sub = broker
        .subscribe(topic, options, move |_m: &Message| {
            act.enter();
            d.fetch_add(1, Ordering::SeqCst);
            act.exit();
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    (sub, delivered, activity)
}

// R-EXE-1: bursts separated by idle periods (long enough for the slot's task to end) are
// each delivered in full, by a new task each time, one handler call at a time; between
// bursts the runtime holds no task for the idle subscription.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_after_idle_is_delivered() {
    let broker = tokio_broker();
    let options = SubscribeOptions::new().capacity(1000);
    let metrics = tokio::runtime::Handle::current().metrics();
    let before = metrics.num_alive_tasks();
    let (sub, delivered, activity) = counting(&broker, "burst", options);
    for round in 1..=20u32 {
        for i in 0..100 {
            broker
                .publish(Message::to("burst").payload(format!("{i}")))
                .unwrap();
        }
        eventually("the burst delivered", || {
            delivered.load(Ordering::SeqCst) == round * 100
        })
        .await;
        // Idle: the slot's task ends.
        eventually("the idle slot's task ended", || {
            metrics.num_alive_tasks() == before
        })
        .await;
    }
    assert_eq!(activity.max(), 1); // R-EXE-1: max active == 1
    let stats = sub.stats();
    assert_eq!(stats.delivered, 2000);
    assert!(stats.is_conserved()); // R-DEL-6
    let report = broker.close_async(Duration::from_secs(5)).await;
    assert!(report.is_clean(), "{report:?}"); // R-CORE-6
}

// R-EXE-1: no lost wake-up. A publisher thread outside the runtime offers one message at
// a time, right after the previous one was delivered and after a varying pause, so offers
// land on every step of the task's way out (grace polls, the announcing poll, the flag
// cleared, the task's end); each one is delivered.
#[test]
fn a_message_offered_as_the_task_ends_is_delivered() {
    let (_rt, broker) = runtime_and_broker();
    let (sub, delivered, activity) = counting(&broker, "edge", SubscribeOptions::default());
    for i in 0..3000u32 {
        broker.publish(Message::to("edge")).unwrap();
        let deadline = Instant::now() + PATIENCE;
        while delivered.load(Ordering::SeqCst) <= i {
            assert!(Instant::now() < deadline, "message {i} was never delivered");
            std::hint::spin_loop();
        }
        for _ in 0..(i % 64) * 16 {
            std::hint::spin_loop();
        }
        if i.is_multiple_of(97) {
            std::thread::yield_now();
        }
    }
    assert_eq!(activity.max(), 1); // R-EXE-1: max active == 1
    assert!(sub.stats().is_conserved()); // R-DEL-6
    let report = broker.close(Duration::from_secs(5));
    assert!(report.is_clean(), "{report:?}"); // R-CORE-6
}

// R-CORE-6: close from outside the runtime while subscriptions' tasks come and go (a
// publisher's bursts with pauses, just stopped: some slots still drain, some are idle)
// waits for the tasks: nothing is unjoined, and every message published is either
// delivered or reported undelivered — with a drain, and with none.
#[test]
fn close_while_tasks_come_and_go() {
    for round in 0..10u64 {
        let (_rt, broker) = runtime_and_broker();
        let broker = Arc::new(broker);
        let subs: Vec<_> = (0..8)
            .map(|_| counting(&broker, "churn", SubscribeOptions::new().capacity(10_000)))
            .collect();
        let published = Arc::new(AtomicU32::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let publisher = {
            let (broker, published, stop) = (broker.clone(), published.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0u32;
                while !stop.load(Ordering::SeqCst) {
                    broker.publish(Message::to("churn")).unwrap();
                    published.fetch_add(1, Ordering::SeqCst);
                    i += 1;
                    if i.is_multiple_of(50) {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            })
        };
        std::thread::sleep(Duration::from_millis(5 + round * 3));
        stop.store(true, Ordering::SeqCst);
        publisher.join().unwrap();
        let drain = if round.is_multiple_of(2) {
            Duration::from_secs(5)
        } else {
            Duration::ZERO
        };
        let report = broker.close(drain);
        assert!(report.unjoined.is_empty(), "{report:?}"); // R-CORE-6
        let published = published.load(Ordering::SeqCst) as usize;
        for (sub, delivered, activity) in &subs {
            let undelivered = report
                .undelivered
                .iter()
                .filter(|u| u.subscription == Some(sub.id()))
                .count();
            assert_eq!(
                delivered.load(Ordering::SeqCst) as usize + undelivered,
                published
            ); // R-CORE-6, R-DEL-6: each message delivered or reported
            // R-EXE-1 (0 when close without a drain came before its first delivery)
            assert!(activity.max() <= 1);
            assert!(sub.stats().is_conserved()); // R-DEL-6
        }
    }
}

/// A subscription to `topic` whose handler asks for a retry (after `backoff`) on its first
/// call and succeeds on every later one, with the count of its calls.
fn failing_once(
    broker: &Broker,
    topic: &str,
    backoff: Duration,
) -> (tidings::Subscription, Arc<AtomicU32>) {
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let sub = broker
        .subscribe(
            topic,
            SubscribeOptions::new().retry(Retry::fixed(backoff, 3)),
            move |_m: &Message| {
                if c.fetch_add(1, Ordering::SeqCst) == 0 {
                    Err(HandlerError::retry("not yet"))
                } else {
                    Ok(())
                }
            },
        )
        .unwrap();
    (sub, calls)
}

// R-DEL-1, R-EXE-1: a retry with backoff still fires after the queue went idle: the slot's
// task stays, sleeping until the retry is due, and delivers it then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_backoff_fires_after_the_queue_went_idle() {
    let broker = tokio_broker();
    let (sub, calls) = failing_once(&broker, "later", Duration::from_millis(150));
    broker.publish(Message::to("later")).unwrap();
    eventually("the retry delivered", || sub.stats().delivered == 1).await;
    assert_eq!(calls.load(Ordering::SeqCst), 2); // R-DEL-1: first attempt, then the retry
    let stats = sub.stats();
    assert_eq!((stats.attempts, stats.failures), (2, 1));
    assert!(stats.is_conserved()); // R-DEL-6
    let report = broker.close_async(Duration::from_secs(5)).await;
    assert!(report.is_clean(), "{report:?}"); // R-CORE-6
}

// R-TIME-3, R-EXE-1: under a manual clock a retry's task waits "until woken"; advancing
// the clock wakes it and the retry is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_clock_advance_wakes_a_waiting_retry() {
    let clock = tidings::ManualClock::new();
    let broker = Broker::builder()
        .driver(Driver::Tokio(tokio::runtime::Handle::current()))
        .clock(clock.clone())
        .build()
        .unwrap();
    let (sub, calls) = failing_once(&broker, "manual", Duration::from_secs(60));
    broker.publish(Message::to("manual")).unwrap();
    eventually("the first attempt", || calls.load(Ordering::SeqCst) == 1).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(sub.stats().delivered, 0, "the retry waits for the clock");
    clock.advance(Duration::from_secs(61));
    eventually("the retry delivered", || sub.stats().delivered == 1).await;
    assert!(sub.stats().is_conserved()); // R-DEL-6
    let report = broker.close_async(Duration::from_secs(5)).await;
    assert!(report.is_clean(), "{report:?}"); // R-CORE-6
}

// R-EXE-1, R-ORD-3, R-ORD-4: lanes and per-key subscriptions on the tokio driver, fed in bursts
// with idle gaps (their slots' tasks end and are spawned again): never two calls of one
// key at once, at most `n` calls at once, each key's messages in publish order, all
// delivered. One key's first message fails once with a backoff, so a per-key slot waits
// for a retry while offers of other keys wake it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_and_per_key_slots_come_and_go_keeping_their_limits() {
    use tidings::Concurrency;
    const KEYS: u32 = 7;
    const ROUNDS: u32 = 10;
    const PER_ROUND: u32 = 70;
    for concurrency in [
        Concurrency::Lanes(3),
        Concurrency::PerKey { max_in_flight: 3 },
    ] {
        let broker = tokio_broker();
        let all = Arc::new(Activity::default());
        let by_key: Arc<Vec<Activity>> = Arc::new((0..KEYS).map(|_| Activity::default()).collect());
        let seen: Arc<Mutex<HashMap<u32, Vec<u32>>>> = Arc::default();
        let failed_once = Arc::new(AtomicBool::new(false));
        let (a, k, s, f) = (
            all.clone(),
            by_key.clone(),
            seen.clone(),
            failed_once.clone(),
        );
        let sub = broker
            .subscribe(
                "keyed",
                SubscribeOptions::new()
                    .concurrency(concurrency)
                    .capacity(10_000)
                    .retry(Retry::fixed(Duration::from_millis(30), 3)),
                move |m: Arc<Message>| {
                    let (a, k, s, f) = (a.clone(), k.clone(), s.clone(), f.clone());
                    async move {
                        let (key, i) = text(&m)
                            .split_once(':')
                            .map(|(k, i)| (k.parse::<u32>().unwrap(), i.parse::<u32>().unwrap()))
                            .unwrap();
                        if key == 0 && i == 0 && !f.swap(true, Ordering::SeqCst) {
                            return Err(HandlerError::retry("once"));
                        }
                        a.enter();
                        k[key as usize].enter();
                        s.lock().entry(key).or_default().push(i);
                        tokio::task::yield_now().await; // suspend mid-handler
                        k[key as usize].exit();
                        a.exit();
                        Ok(())
                    }
                },
            )
            .unwrap();
        for round in 0..ROUNDS {
            for j in 0..PER_ROUND {
                let i = round * PER_ROUND + j;
                let key = i % KEYS;
                broker
                    .publish(
                        Message::to("keyed")
                            .key(format!("k{key}"))
                            .payload(format!("{key}:{}", i / KEYS)),
                    )
                    .unwrap();
            }
            eventually("the round delivered", || {
                sub.stats().delivered == u64::from((round + 1) * PER_ROUND)
            })
            .await;
            tokio::time::sleep(Duration::from_millis(5)).await; // idle: the tasks end
        }
        assert!(all.max() <= 3, "{concurrency:?}"); // R-EXE-1: at most n at once
        for key in by_key.iter() {
            assert_eq!(key.max(), 1, "{concurrency:?}"); // never two calls of one key
        }
        {
            let seen = seen.lock();
            for key in 0..KEYS {
                let order = &seen[&key];
                assert!(
                    order.windows(2).all(|w| w[0] < w[1]),
                    "{concurrency:?}: key {key} out of order: {order:?}"
                ); // R-ORD-3, R-ORD-4
            }
        }
        assert!(sub.stats().is_conserved()); // R-DEL-6
        let report = broker.close_async(Duration::from_secs(5)).await;
        assert!(report.is_clean(), "{report:?}"); // R-CORE-6
    }
}
