//! Broker lifecycle: close reports, concurrent close, requests at close, saturating
//! deadlines, the scheduler's isolation, internal subscriptions, settle and wait_idle.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use parking_lot::Mutex;
use tidings::*;
use tidings_testkit::helpers::{manual, text, wait_until};

const PATIENCE: Duration = Duration::from_secs(30);
const MS: Duration = Duration::from_millis(1);

/// Run `f` on its own thread; fail (instead of hanging) if it takes longer than `PATIENCE`.
fn bounded<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(PATIENCE) {
        Ok(r) => r,
        Err(_) => panic!("{what}: did not finish within {PATIENCE:?}"),
    }
}

fn responder(broker: &Broker, topic: &str) -> Subscription {
    let weak = broker.downgrade();
    broker
        .subscribe(topic, SubscribeOptions::default(), move |m: &Message| {
            if let (Some(b), Some(reply)) = (weak.upgrade(), m.reply()) {
                let _ = b.publish(reply.payload(format!("re:{}", text(m))));
            }
            Ok::<(), HandlerError>(())
        })
        .unwrap()
}

// ---------------------------------------------------------------- Duration::MAX

// R-LIM-1: a request timeout whose deadline overflows `Instant` means "no deadline".
#[test]
fn request_with_duration_max_waits_for_the_reply() {
    let broker = Broker::new();
    let _svc = responder(&broker, "svc");
    let b = broker.clone();
    let reply = bounded("request(.., MAX)", move || {
        b.request(Message::to("svc").payload("x"), Duration::MAX)
    });
    assert_eq!(text(&reply.unwrap()), "re:x"); // R-LIM-1
    let (broker, _clock) = manual();
    let _svc = responder(&broker, "svc");
    let reply = broker.request(Message::to("svc").payload("y"), Duration::MAX);
    assert_eq!(text(&reply.unwrap()), "re:y"); // R-LIM-1
}

// R-LIM-1: close(Duration::MAX) drains everything and returns; it does not panic.
#[test]
fn close_with_duration_max_drains_and_returns() {
    for driver in [Driver::Thread, Driver::Pool { workers: 2 }, Driver::Manual] {
        let broker = Broker::builder().driver(driver).build().unwrap();
        let n = Arc::new(AtomicUsize::new(0));
        let n2 = n.clone();
        let _sub = broker
            .subscribe("t", SubscribeOptions::default(), move |_m: &Message| {
                n2.fetch_add(1, Ordering::SeqCst);
                Ok::<(), HandlerError>(())
            })
            .unwrap();
        for _ in 0..50 {
            broker.publish(Message::to("t")).unwrap();
        }
        let b = broker.clone();
        let report = bounded("close(MAX)", move || b.close(Duration::MAX));
        assert!(report.is_clean(), "{report:?}"); // R-LIM-1, R-CORE-6
        assert_eq!(n.load(Ordering::SeqCst), 50);
    }
}

// R-LIM-1: `Block { timeout: Duration::MAX }` on a full queue waits without a deadline
// (until room is made), instead of panicking.
#[test]
fn block_with_duration_max_waits_for_room() {
    let (broker, _clock) = manual();
    let sub = broker
        .subscribe(
            "t",
            SubscribeOptions::new()
                .capacity(1)
                .overflow(Overflow::Block {
                    timeout: Duration::MAX,
                }),
            |_m: &Message| Ok::<(), HandlerError>(()),
        )
        .unwrap();
    broker.publish(Message::to("t")).unwrap();
    let b = broker.clone();
    let publisher = std::thread::spawn(move || b.publish(Message::to("t").payload("second")));
    wait_until("publisher blocked", PATIENCE, || {
        sub.stats().blocked_publishers == 1 || publisher.is_finished()
    });
    // Make room: the blocked publisher gets in.
    wait_until("room taken", PATIENCE, || {
        broker.run_until_idle();
        publisher.is_finished()
    });
    let report = publisher.join().expect("publisher must not panic"); // R-LIM-1
    assert_eq!(report.unwrap().accepted, 1);
    broker.run_until_idle();
    assert_eq!(sub.stats().delivered, 2);
}

// ---------------------------------------------------------------- close report

/// Close under load with handlers failing retryably while close(ZERO) runs: the report and
/// the `Shutdown` dead letters must agree exactly, per subscription and by message id.
fn close_report_matches_shutdown_dead_letters(driver: Driver) {
    for round in 0..5 {
        let broker = Broker::builder().driver(driver.clone()).build().unwrap();
        let mut subs = Vec::new();
        for i in 0..6 {
            let retry = match i % 3 {
                0 => Retry::None,
                1 => Retry::fixed(MS, 3),
                _ => Retry::exponential(MS, 2.0).max_attempts(4),
            };
            let sub = broker
                .subscribe(
                    &format!("t.{i}"),
                    SubscribeOptions::new()
                        .capacity(10_000)
                        .retry(retry)
                        .concurrency(if i % 2 == 0 {
                            Concurrency::Serial
                        } else {
                            Concurrency::Lanes(2)
                        })
                        .dead_letter(DeadLetterOptions::new().capacity(100_000)),
                    move |m: &Message| {
                        std::thread::sleep(Duration::from_micros(200));
                        if m.payload().len().is_multiple_of(2) {
                            Err(HandlerError::retry("flaky"))
                        } else {
                            Ok(())
                        }
                    },
                )
                .unwrap();
            subs.push(sub);
        }
        for k in 0..300usize {
            for i in 0..6 {
                broker
                    .publish(
                        Message::to(format!("t.{i}"))
                            .key(format!("{}", k % 5))
                            .payload(vec![0u8; k % 3]),
                    )
                    .unwrap();
            }
        }
        std::thread::sleep(5 * MS);
        let report = broker.close(Duration::ZERO);
        assert!(report.unjoined.is_empty(), "{report:?}");
        for sub in &subs {
            let reported: BTreeSet<MessageId> = report
                .undelivered
                .iter()
                .filter(|u| u.subscription == Some(sub.id()))
                .map(|u| u.message.id())
                .collect();
            let shutdown: BTreeSet<MessageId> = sub
                .dead_letters()
                .iter()
                .filter(|d| d.reason == DeadLetterReason::Shutdown)
                .map(|d| d.message.id())
                .collect();
            let s = sub.stats();
            assert_eq!(
                reported,
                shutdown,
                "round {round}: close report ({}) != Shutdown DLQ entries ({})",
                reported.len(),
                shutdown.len()
            ); // R-CORE-6
            assert_eq!(s.dead_lettered.shutdown as usize, shutdown.len()); // R-CORE-6
            assert!(s.is_conserved(), "{s:?}"); // R-DEL-6
        }
    }
}

// R-CORE-6: close report == Shutdown dead letters, thread driver.
#[test]
fn close_report_matches_shutdown_dead_letters_thread() {
    close_report_matches_shutdown_dead_letters(Driver::Thread);
}

// R-CORE-6: close report == Shutdown dead letters, pool driver.
#[test]
fn close_report_matches_shutdown_dead_letters_pool() {
    close_report_matches_shutdown_dead_letters(Driver::Pool { workers: 3 });
}

// R-CORE-6: the precise case: a handler running when close(ZERO) is called returns a
// retryable error afterwards; its message is in the report and in the DLQ as Shutdown.
#[test]
fn handler_failing_after_close_began_is_in_the_report() {
    let broker = Broker::new();
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let sub = broker
        .subscribe(
            "t",
            SubscribeOptions::new().retry(Retry::fixed(MS, 5)),
            move |_m: &Message| {
                let _ = started_tx.send(());
                let _ = release_rx.lock().recv_timeout(PATIENCE);
                Err::<(), _>(HandlerError::retry("late failure"))
            },
        )
        .unwrap();
    broker
        .publish(Message::to("t").payload("in-flight"))
        .unwrap();
    started_rx.recv_timeout(PATIENCE).unwrap();
    let b = broker.clone();
    let closer = std::thread::spawn(move || b.close(Duration::ZERO));
    wait_until("close began", PATIENCE, || broker.is_closed());
    release_tx.send(()).unwrap();
    let report = closer.join().unwrap();
    let shutdown: Vec<_> = sub
        .dead_letters()
        .into_iter()
        .filter(|d| d.reason == DeadLetterReason::Shutdown)
        .collect();
    assert_eq!(shutdown.len(), 1);
    assert_eq!(report.undelivered.len(), 1, "{report:?}"); // R-CORE-6
    assert_eq!(report.undelivered[0].message.id(), shutdown[0].message.id()); // R-CORE-6
}

// ---------------------------------------------------------------- request at close

// R-CORE-6, R-PAT-1: a request pending when close runs is woken at once with a closed
// error, not left to its 60 s timeout.
#[test]
fn close_wakes_a_pending_request_with_closed() {
    let broker = Broker::new();
    // A responder that never replies.
    let _svc = broker
        .subscribe("svc", SubscribeOptions::default(), |_m: &Message| {
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    let b = broker.clone();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(b.request(Message::to("svc"), Duration::from_secs(60)));
    });
    wait_until("request pending", PATIENCE, || {
        broker.pending_requests() == 1
    });
    broker.close(Duration::ZERO);
    let outcome = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("close must wake the pending request"); // R-CORE-6
    assert_eq!(outcome.unwrap_err(), RequestError::Closed); // R-PAT-1
    assert_eq!(broker.pending_requests(), 0);
    // After close, a request fails with the same error.
    assert_eq!(
        broker
            .request(Message::to("svc"), Duration::from_secs(1))
            .unwrap_err(),
        RequestError::Closed
    ); // R-CORE-6
}

// ---------------------------------------------------------------- second close

// R-CORE-6: a second, concurrent close waits for the first and returns the same report.
#[test]
fn concurrent_close_waits_and_returns_the_same_report() {
    let broker = Broker::new();
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let _sub = broker
        .subscribe("t", SubscribeOptions::default(), move |_m: &Message| {
            let _ = started_tx.send(());
            let _ = release_rx.lock().recv_timeout(PATIENCE);
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    for _ in 0..5 {
        broker.publish(Message::to("t")).unwrap();
    }
    started_rx.recv_timeout(PATIENCE).unwrap();
    let b1 = broker.clone();
    let first = std::thread::spawn(move || b1.close(Duration::ZERO));
    wait_until("first close began", PATIENCE, || broker.is_closed());
    let b2 = broker.clone();
    let second = std::thread::spawn(move || b2.close(Duration::ZERO));
    std::thread::sleep(20 * MS); // let the second close reach its wait
    release_tx.send(()).unwrap();
    let (r1, r2) = (first.join().unwrap(), second.join().unwrap());
    let ids = |r: &CloseReport| -> Vec<MessageId> {
        r.undelivered.iter().map(|u| u.message.id()).collect()
    };
    assert_eq!(r1.undelivered.len(), 4, "{r1:?}");
    assert_eq!(ids(&r1), ids(&r2)); // R-CORE-6
    assert_eq!(r1.unjoined, r2.unjoined); // R-CORE-6
    // A later close returns it too.
    assert_eq!(ids(&broker.close(Duration::ZERO)), ids(&r1)); // R-CORE-6
}

// ---------------------------------------------------------------- scheduler

// R-TIME-2, R-CORE-1: a subscription whose `Block` queue is full does not delay another
// subscription's due delayed messages: the scheduler never waits on a queue.
#[test]
fn a_full_block_queue_does_not_stall_the_scheduler() {
    let clock = ManualClock::new();
    let broker = Broker::builder().clock(clock.clone()).build().unwrap();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let slow = broker
        .subscribe(
            "slow",
            SubscribeOptions::new()
                .capacity(1)
                .overflow(Overflow::Block {
                    timeout: Duration::from_secs(15),
                }),
            move |_m: &Message| {
                let _ = started_tx.send(());
                let _ = release_rx.lock().recv_timeout(PATIENCE);
                Ok::<(), HandlerError>(())
            },
        )
        .unwrap();
    let got = Arc::new(AtomicUsize::new(0));
    let g = got.clone();
    let fast = broker
        .subscribe("fast", SubscribeOptions::default(), move |_m: &Message| {
            g.fetch_add(1, Ordering::SeqCst);
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    broker.publish(Message::to("slow")).unwrap(); // in flight
    started_rx.recv_timeout(PATIENCE).unwrap();
    broker.publish(Message::to("slow")).unwrap(); // fills the queue
    broker.publish(Message::to("slow").delay(100 * MS)).unwrap();
    broker.publish(Message::to("fast").delay(150 * MS)).unwrap();
    clock.advance(200 * MS);
    // The manual clock never reaches the 15 s Block timeout: only a scheduler that does
    // not wait on the full queue can deliver `fast`.
    wait_until("fast delivered", PATIENCE, || {
        got.load(Ordering::SeqCst) == 1
    }); // R-TIME-2, R-CORE-1
    let s = slow.stats();
    assert_eq!(s.refused.overflow, 1); // the due message was refused as Overflow
    assert_eq!(slow.dead_letters()[0].reason, DeadLetterReason::Overflow);
    release_tx.send(()).unwrap();
    release_tx.send(()).unwrap();
    assert!(broker.close(Duration::from_secs(10)).is_clean());
    assert_eq!(fast.stats().delivered, 1);
}

// ---------------------------------------------------------------- inbox

// R-PAT-1, R-CORE-1: the internal reply inbox is not a user subscription: not listed, not
// counted against max_subscriptions, not removable.
#[test]
fn the_reply_inbox_is_internal() {
    let broker = Broker::builder()
        .driver(Driver::Manual)
        .clock(ManualClock::new())
        .limits(Limits::new().max_subscriptions(1))
        .build()
        .unwrap();
    let svc = responder(&broker, "svc");
    let reply = broker.request(Message::to("svc").payload("a"), Duration::from_secs(1));
    assert_eq!(text(&reply.unwrap()), "re:a");
    assert_eq!(broker.subscriptions(), vec![svc.id()]); // R-PAT-1
    // Remove everything the user can see: the inbox is not among it, so requests go on.
    for id in broker.subscriptions() {
        assert!(broker.unsubscribe(id).is_some());
    }
    drop(svc);
    assert!(broker.subscriptions().is_empty());
    let _svc2 = responder(&broker, "svc"); // the limit of 1 is the user's alone
    let reply = broker.request(Message::to("svc").payload("b"), Duration::from_secs(1));
    assert_eq!(text(&reply.unwrap()), "re:b"); // R-PAT-1
}

// ---------------------------------------------------------------- settle, wait_idle

// R-EXE-2: settle runs a manual broker to quiescence, jumping the clock to each wake-up.
#[test]
fn settle_runs_retries_and_delays_to_quiescence() {
    let (broker, clock) = manual();
    let failing = broker
        .subscribe(
            "f",
            SubscribeOptions::new().retry(Retry::fixed(100 * MS, 3)),
            |_m: &Message| Err::<(), _>(HandlerError::retry("no")),
        )
        .unwrap();
    let got = Arc::new(AtomicUsize::new(0));
    let g = got.clone();
    let _d = broker
        .subscribe("d", SubscribeOptions::default(), move |_m: &Message| {
            g.fetch_add(1, Ordering::SeqCst);
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    let t0 = clock.elapsed();
    broker.publish(Message::to("f")).unwrap();
    broker
        .publish(Message::to("d").delay(Duration::from_secs(5)))
        .unwrap();
    let calls = broker.settle();
    // 3 attempts, 1 delayed release, 1 delivery.
    assert_eq!(calls, 3 + 1 + 1); // R-EXE-2
    assert_eq!(got.load(Ordering::SeqCst), 1);
    let dl = failing.dead_letters();
    assert_eq!(
        dl[0].reason,
        DeadLetterReason::RetriesExhausted {
            attempts: 3,
            last_error: "no".into()
        }
    );
    assert_eq!(clock.elapsed() - t0, Duration::from_secs(5)); // jumped to the last wake-up
    assert_eq!(broker.next_wake(), None);
    assert!(broker.wait_idle(Duration::ZERO));
}

// R-EXE-1: wait_idle waits (bounded) until every queue is empty and nothing is in flight.
#[test]
fn wait_idle_waits_for_live_drivers() {
    for driver in [Driver::Thread, Driver::Pool { workers: 2 }] {
        let broker = Broker::builder().driver(driver).build().unwrap();
        let sub = broker
            .subscribe("t", SubscribeOptions::default(), |_m: &Message| {
                std::thread::sleep(Duration::from_micros(100));
                Ok::<(), HandlerError>(())
            })
            .unwrap();
        for _ in 0..200 {
            broker.publish(Message::to("t")).unwrap();
        }
        broker.publish(Message::to("t").delay(20 * MS)).unwrap();
        assert!(broker.wait_idle(PATIENCE)); // R-EXE-1
        let s = sub.stats();
        assert_eq!((s.delivered, s.queued, s.in_flight), (201, 0, 0));
        assert_eq!(broker.scheduled(), 0);
    }
    // A handler that never finishes in time: wait_idle gives up and says so.
    let broker = Broker::new();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let _sub = broker
        .subscribe("t", SubscribeOptions::default(), move |_m: &Message| {
            let _ = release_rx.lock().recv_timeout(PATIENCE);
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    broker.publish(Message::to("t")).unwrap();
    assert!(!broker.wait_idle(20 * MS));
    release_tx.send(()).unwrap();
    assert!(broker.wait_idle(PATIENCE));
}

// Subscriptions of one pattern share one copy of its text; an equivalent but
// differently written pattern keeps its own (each subscription reports what it was given),
// and the sharing outlives the subscription it came from.
#[test]
fn subscriptions_of_one_pattern_share_its_text() {
    let broker = Broker::builder().driver(Driver::Manual).build().unwrap();
    let sub = |pattern: &str| {
        broker
            .subscribe(pattern, SubscribeOptions::default(), |_: &Message| {
                Ok::<(), HandlerError>(())
            })
            .unwrap()
    };
    let same = |a: &Subscription, b: &Subscription| {
        std::ptr::eq(a.pattern().as_str(), b.pattern().as_str())
    };
    let first = sub("orders.*.#");
    let second = sub("orders.*.#");
    let equivalent = sub("orders.#.*");
    let literal = sub("orders.eu");
    let literal_too = sub("orders.eu");
    assert!(same(&first, &second));
    assert!(same(&literal, &literal_too));
    assert_eq!(equivalent.pattern().as_str(), "orders.#.*");
    assert!(!same(&first, &equivalent));
    drop(first.unsubscribe());
    let third = sub("orders.*.#");
    assert!(same(&second, &third));
    assert_eq!(third.pattern().as_str(), "orders.*.#");
}
