//! The thread driver under real concurrency: isolation, ordering, re-entrancy, close, churn.
//! Bounded waits with generous timeouts; assertions on invariants, never on timings.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tidings::*;
use tidings_testkit::helpers::{Recorder, text, wait_until};
use tidings_testkit::{ThreadedDriver, suite};

const PATIENCE: Duration = Duration::from_secs(30);

// Test 3: a subscriber blocked on a barrier does not delay another one (R-CORE-1).
#[test]
fn blocked_subscriber_does_not_delay_others() {
    let broker = Broker::new();
    let gate = Arc::new(Barrier::new(2));
    let a_seen = Recorder::default();
    let a_inner = a_seen.handler();
    let g = gate.clone();
    let first = Arc::new(AtomicBool::new(true));
    let a = broker
        .subscribe("t", SubscribeOptions::default(), move |m: &Message| {
            if first.swap(false, Ordering::SeqCst) {
                g.wait(); // blocked until the test releases it
            }
            a_inner(m)
        })
        .unwrap();
    let b_seen = Recorder::default();
    let b = broker
        .subscribe("t", SubscribeOptions::default(), b_seen.handler())
        .unwrap();
    for i in 0..20 {
        broker
            .publish(Message::to("t").payload(i.to_string()))
            .unwrap();
    }
    // B gets all 20 while A is still stuck on its first message.
    wait_until("B receives its 20 messages", PATIENCE, || {
        b_seen.len() == 20
    });
    // A's dispatcher thread may start after B has finished: wait for it to be stuck.
    wait_until("A is stuck in its first message", PATIENCE, || {
        a.stats().in_flight == 1
    });
    assert_eq!(a_seen.len(), 0);
    gate.wait();
    wait_until("A receives its 20 messages", PATIENCE, || {
        a_seen.len() == 20
    });
    let expected: Vec<String> = (0..20).map(|i| i.to_string()).collect();
    assert_eq!(a_seen.take(), expected);
    assert_eq!(b_seen.take(), expected);
    assert!(a.stats().is_conserved() && b.stats().is_conserved());
    assert!(broker.close(Duration::from_secs(5)).is_clean());
}

// Test 4: 4 publishers × 200 messages: per-publisher order (R-ORD-2) and max active == 1
// (R-CORE-3), with conservation (R-DEL-6) — the shared suite case at the size.
#[test]
fn per_publisher_order_and_one_active_handler() {
    suite::fan_out_with(&ThreadedDriver::new("thread", Driver::Thread), 4, 200);
}

// Test 5: handlers that unsubscribe themselves, publish (to their own topic too) and
// subscribe new subscribers do not deadlock (R-CORE-2).
#[test]
fn reentrant_handlers_do_not_deadlock() {
    let broker = Broker::new();
    let weak = broker.downgrade();
    // Unsubscribes itself on its first message.
    let my_id: Arc<OnceLock<SubscriptionId>> = Arc::default();
    let (id_cell, w) = (my_id.clone(), weak.clone());
    let quitter_calls = Arc::new(AtomicUsize::new(0));
    let qc = quitter_calls.clone();
    let quitter = broker
        .subscribe("quit", SubscribeOptions::default(), move |_m: &Message| {
            qc.fetch_add(1, Ordering::SeqCst);
            let b = w.upgrade().unwrap();
            b.unsubscribe(*id_cell.get().unwrap());
            Ok(())
        })
        .unwrap();
    my_id.set(quitter.id()).unwrap();
    // Publishes to its own topic (a countdown) and to another, and subscribes a newcomer.
    let newcomer_got = Recorder::default();
    let (w, ng) = (weak.clone(), newcomer_got.clone());
    let newcomers = Arc::new(Mutex::new(Vec::new()));
    let nc = newcomers.clone();
    let _chain = broker
        .subscribe("chain", SubscribeOptions::default(), move |m: &Message| {
            let b = w.upgrade().unwrap();
            let n: u32 = text(m).parse().unwrap();
            if n == 3 {
                nc.lock().push(
                    b.subscribe("side", SubscribeOptions::default(), ng.handler())
                        .unwrap(),
                );
            }
            if n > 0 {
                b.publish(Message::to("chain").payload((n - 1).to_string()))
                    .unwrap();
                b.publish(Message::to("side").payload(format!("from {n}")))
                    .unwrap();
            }
            Ok(())
        })
        .unwrap();
    broker.publish(Message::to("quit")).unwrap();
    broker.publish(Message::to("chain").payload("5")).unwrap();
    wait_until("quitter ran", PATIENCE, || {
        quitter_calls.load(Ordering::SeqCst) == 1
    });
    wait_until("newcomer got the later side messages", PATIENCE, || {
        newcomer_got.len() == 3
    });
    assert_eq!(newcomer_got.take(), vec!["from 3", "from 2", "from 1"]);
    // The quitter is gone: later messages are not offered to it.
    assert_eq!(broker.publish(Message::to("quit")).unwrap().matched(), 0);
    assert_eq!(quitter.stats().delivered, 1);
    newcomers.lock().clear();
    let report = broker.close(Duration::from_secs(5));
    assert!(report.unjoined.is_empty());
}

// Test 6: close during a one-hour backoff returns promptly and reports the message (R-CORE-6).
#[test]
fn close_interrupts_a_one_hour_backoff() {
    let broker = Broker::new();
    let attempts = Arc::new(AtomicUsize::new(0));
    let a = attempts.clone();
    let sub = broker
        .subscribe(
            "t",
            SubscribeOptions::new().retry(Retry::fixed(Duration::from_secs(3600), 3)),
            move |_m: &Message| {
                a.fetch_add(1, Ordering::SeqCst);
                Err(HandlerError::retry("down for an hour"))
            },
        )
        .unwrap();
    broker.publish(Message::to("t").payload("stuck")).unwrap();
    wait_until("first attempt failed", PATIENCE, || {
        attempts.load(Ordering::SeqCst) == 1 && sub.stats().failures == 1
    });
    let started = Instant::now();
    let report = broker.close(Duration::from_secs(10));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "close took {took:?}");
    assert_eq!(report.undelivered.len(), 1);
    assert_eq!(text(&report.undelivered[0].message), "stuck");
    assert_eq!(report.undelivered[0].subscription, Some(sub.id()));
    assert!(report.unjoined.is_empty());
    let s = sub.stats();
    assert_eq!(s.dead_lettered.shutdown, 1);
    assert!(s.is_conserved()); // R-DEL-6
}

// Test 7: churn — subscribe/unsubscribe in a loop while two threads publish.
#[test]
fn churn_keeps_conservation() {
    let broker = Broker::new();
    let stop = AtomicBool::new(false);
    let retired = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for p in 0..2 {
            let (broker, stop) = (broker.clone(), &stop);
            s.spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    broker
                        .publish(Message::to("churn").payload(format!("{p}:{i}")))
                        .unwrap();
                    i += 1;
                }
            });
        }
        let (broker, stop, retired) = (broker.clone(), &stop, &retired);
        s.spawn(move || {
            for round in 0..150 {
                let sub = broker
                    .subscribe(
                        "churn",
                        SubscribeOptions::new().capacity(64),
                        |_m: &Message| Ok(()),
                    )
                    .unwrap();
                if round % 3 == 0 {
                    std::thread::yield_now();
                }
                let _left = broker.unsubscribe(sub.id());
                retired.lock().push(sub);
            }
            stop.store(true, Ordering::Relaxed);
        });
    });
    let retired = retired.into_inner();
    assert_eq!(retired.len(), 150);
    let report = broker.close(Duration::from_secs(5));
    assert!(report.unjoined.is_empty());
    for sub in &retired {
        let s = sub.stats();
        assert!(s.is_conserved(), "{s:?}"); // R-DEL-6
        assert_eq!(s.in_flight, 0);
        assert_eq!(s.queued, 0);
    }
}

// R-CORE-6: dropping the last broker handle closes it and joins its threads.
#[test]
fn dropping_the_broker_closes_it() {
    let broker = Broker::new();
    let sub = broker
        .subscribe("t", SubscribeOptions::default(), |_m: &Message| Ok(()))
        .unwrap();
    broker.publish(Message::to("t")).unwrap();
    let weak = broker.downgrade();
    drop(broker);
    assert!(weak.upgrade().is_none());
    let s = sub.stats();
    assert!(s.is_conserved());
    assert_eq!(s.queued + s.in_flight, 0);
}
