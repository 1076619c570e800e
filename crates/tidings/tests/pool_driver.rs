//! The pool driver: actor-mailbox exclusivity, fairness by counting, and scale (R-EXE-1).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tidings::*;
use tidings_testkit::helpers::wait_until;

const PATIENCE: Duration = Duration::from_secs(120);

// R-EXE-1, R-CORE-3: never two workers inside one subscription, across 100,000 deliveries
// over 1,000 subscriptions.
#[test]
fn never_two_workers_in_one_subscription() {
    let broker = Broker::builder()
        .driver(Driver::Pool { workers: 4 })
        .build()
        .unwrap();
    let delivered = Arc::new(AtomicUsize::new(0));
    let violations = Arc::new(AtomicUsize::new(0));
    let mut subs = Vec::new();
    for _ in 0..1000 {
        let active = Arc::new(AtomicUsize::new(0));
        let (d, v) = (delivered.clone(), violations.clone());
        subs.push(
            broker
                .subscribe(
                    "p",
                    SubscribeOptions::new().capacity(200),
                    move |_m: &Message| {
                        if active.fetch_add(1, Ordering::SeqCst) != 0 {
                            v.fetch_add(1, Ordering::SeqCst);
                        }
                        d.fetch_add(1, Ordering::Relaxed);
                        active.fetch_sub(1, Ordering::SeqCst);
                        Ok(())
                    },
                )
                .unwrap(),
        );
    }
    for _ in 0..100 {
        assert_eq!(broker.publish(Message::to("p")).unwrap().accepted, 1000);
    }
    wait_until("100,000 deliveries", PATIENCE, || {
        delivered.load(Ordering::Relaxed) == 100_000
    });
    assert_eq!(violations.load(Ordering::SeqCst), 0); // R-CORE-3
    assert!(subs.iter().all(|s| s.stats().is_conserved())); // R-DEL-6
    assert!(broker.close(Duration::from_secs(10)).unjoined.is_empty()); // R-CORE-6
}

// R-EXE-1: one subscription with 100,000 queued messages delays another subscription's
// single message by a bounded number of batches (counted, not timed).
#[test]
fn hot_subscription_cannot_starve_another() {
    let broker = Broker::builder()
        .driver(Driver::Pool { workers: 1 })
        .build()
        .unwrap();
    let gate = Arc::new(AtomicBool::new(false));
    let hot_count = Arc::new(AtomicUsize::new(0));
    let (g, h) = (gate.clone(), hot_count.clone());
    let _hot = broker
        .subscribe(
            "hot",
            SubscribeOptions::new().capacity(100_000),
            move |_m: &Message| {
                while !g.load(Ordering::SeqCst) {
                    std::thread::yield_now();
                }
                h.fetch_add(1, Ordering::SeqCst);
                Ok(())
            },
        )
        .unwrap();
    let seen_at = Arc::new(AtomicUsize::new(usize::MAX));
    let (hc, s) = (hot_count.clone(), seen_at.clone());
    let _cold = broker
        .subscribe("cold", SubscribeOptions::default(), move |_m: &Message| {
            s.store(hc.load(Ordering::SeqCst), Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
    for _ in 0..100_000 {
        broker.publish(Message::to("hot")).unwrap();
    }
    broker.publish(Message::to("cold")).unwrap();
    gate.store(true, Ordering::SeqCst);
    wait_until("cold delivered", PATIENCE, || {
        seen_at.load(Ordering::SeqCst) != usize::MAX
    });
    let before_cold = seen_at.load(Ordering::SeqCst);
    assert!(
        before_cold <= 2 * 64,
        "cold waited behind {before_cold} hot deliveries"
    ); // R-EXE-1
    broker.close(Duration::ZERO);
}

// R-EXE-1: 10,000 subscriptions without one OS thread each; publishing to all and to a few.
#[test]
fn ten_thousand_subscriptions() {
    let broker = Broker::builder()
        .driver(Driver::Pool { workers: 2 })
        .build()
        .unwrap();
    let delivered = Arc::new(AtomicUsize::new(0));
    let mut subs = Vec::with_capacity(10_010);
    for i in 0..10_010 {
        let d = delivered.clone();
        let pattern = if i < 10_000 {
            "all.*".to_owned()
        } else {
            format!("few.{}", i % 3)
        };
        subs.push(
            broker
                .subscribe(
                    &pattern,
                    SubscribeOptions::new().capacity(4),
                    move |_m: &Message| {
                        d.fetch_add(1, Ordering::Relaxed);
                        Ok(())
                    },
                )
                .unwrap(),
        );
    }
    assert_eq!(
        broker.publish(Message::to("all.x")).unwrap().accepted,
        10_000
    );
    assert_eq!(broker.publish(Message::to("few.1")).unwrap().accepted, 4); // ids 10_000.. with i%3==1
    wait_until("all delivered", PATIENCE, || {
        delivered.load(Ordering::Relaxed) == 10_004
    });
    assert!(broker.close(Duration::from_secs(10)).is_clean());
}
