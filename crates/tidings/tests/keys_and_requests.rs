//! Keyed lanes, per-key concurrency and request-reply under real threads.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tidings::*;
use tidings_testkit::helpers::{text, wait_until};

const PATIENCE: Duration = Duration::from_secs(60);

// R-ORD-3: 8 publishers × 4 keys × 250 messages through 4 lanes: per-key order holds and
// lanes run in parallel.
#[test]
fn keyed_lanes_keep_key_order_and_run_in_parallel() {
    let broker = Broker::new();
    type ByKey = HashMap<String, Vec<(u32, u32)>>;
    let seen: Arc<Mutex<ByKey>> = Arc::default();
    let active = Arc::new(AtomicUsize::new(0));
    let overlap = Arc::new(AtomicUsize::new(0));
    let (s, a, o) = (seen.clone(), active.clone(), overlap.clone());
    let sub = broker
        .subscribe(
            "orders",
            SubscribeOptions::new()
                .capacity(10_000)
                .concurrency(Concurrency::Lanes(4)),
            move |m: &Message| {
                let now = a.fetch_add(1, Ordering::SeqCst) + 1;
                o.fetch_max(now, Ordering::SeqCst);
                let t = text(m);
                let mut parts = t.split(':');
                let (k, p, i) = (
                    parts.next().unwrap(),
                    parts.next().unwrap(),
                    parts.next().unwrap(),
                );
                s.lock()
                    .entry(k.to_owned())
                    .or_default()
                    .push((p.parse().unwrap(), i.parse().unwrap()));
                std::thread::sleep(Duration::from_micros(50));
                a.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            },
        )
        .unwrap();
    // Keys chosen to land in distinct lanes (FNV-1a % 4).
    let keys = ["k0", "k1", "k2", "k3"];
    std::thread::scope(|sc| {
        for p in 0..8u32 {
            let broker = broker.clone();
            sc.spawn(move || {
                for i in 0..250u32 {
                    for k in keys {
                        broker
                            .publish(Message::to("orders").key(k).payload(format!("{k}:{p}:{i}")))
                            .unwrap();
                    }
                }
            });
        }
    });
    wait_until("8000 delivered", PATIENCE, || sub.stats().delivered == 8000);
    for (k, got) in seen.lock().iter() {
        assert_eq!(got.len(), 2000);
        let mut next = [0u32; 8];
        for &(p, i) in got {
            assert_eq!(i, next[p as usize], "key {k}, publisher {p}"); // R-ORD-3, R-ORD-2
            next[p as usize] += 1;
        }
    }
    assert!(overlap.load(Ordering::SeqCst) > 1, "lanes never overlapped"); // R-ORD-3
    assert!(overlap.load(Ordering::SeqCst) <= 4);
    assert!(sub.stats().is_conserved()); // R-DEL-6
}

// R-ORD-4: k1 fails 3 times before succeeding while 100 messages of other keys are all
// delivered before k1's retry succeeds; k1's own order holds.
#[test]
fn per_key_concurrency_parks_only_the_failing_key() {
    let clock = ManualClock::new();
    let broker = Broker::builder().clock(clock.clone()).build().unwrap();
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let k1_failures = Arc::new(AtomicUsize::new(0));
    let (l, f) = (log.clone(), k1_failures.clone());
    let sub = broker
        .subscribe(
            "work",
            SubscribeOptions::new()
                .capacity(1000)
                .concurrency(Concurrency::PerKey { max_in_flight: 2 })
                .retry(Retry::fixed(Duration::from_secs(1), 5)),
            move |m: &Message| {
                let t = text(m);
                if t == "k1:0" && f.fetch_add(1, Ordering::SeqCst) < 3 {
                    return Err(HandlerError::retry("k1 not ready"));
                }
                l.lock().push(t);
                Ok(())
            },
        )
        .unwrap();
    broker
        .publish(Message::to("work").key("k1").payload("k1:0"))
        .unwrap();
    broker
        .publish(Message::to("work").key("k1").payload("k1:1"))
        .unwrap();
    for i in 0..100 {
        let k = format!("o{}", i % 10);
        broker
            .publish(Message::to("work").key(&k).payload(format!("{k}:{i}")))
            .unwrap();
    }
    // The other keys all finish while k1 waits on the manual clock (time does not move).
    wait_until("100 other messages delivered", PATIENCE, || {
        log.lock().len() == 100
    });
    assert_eq!(k1_failures.load(Ordering::SeqCst), 1);
    assert!(log.lock().iter().all(|t| !t.starts_with("k1"))); // R-ORD-4
    for _ in 0..3 {
        let before = k1_failures.load(Ordering::SeqCst);
        clock.advance(Duration::from_secs(1));
        wait_until("k1 retried", PATIENCE, || {
            k1_failures.load(Ordering::SeqCst) > before || log.lock().len() > 100
        });
    }
    wait_until("k1 delivered", PATIENCE, || log.lock().len() == 102);
    let k1: Vec<_> = log
        .lock()
        .iter()
        .filter(|t| t.starts_with("k1"))
        .cloned()
        .collect();
    assert_eq!(k1, vec!["k1:0", "k1:1"]); // R-ORD-4: order within the key held
    let s = sub.stats();
    assert_eq!((s.delivered, s.failures), (102, 3));
    assert!(s.is_conserved()); // R-DEL-6
}

// R-PAT-1: 1,000 concurrent requests from 4 threads each get their own reply; a silent
// responder times out; nobody subscribed is a clean error; no leftovers in the inbox.
#[test]
fn request_reply_under_concurrency() {
    let broker = Broker::new();
    let w = broker.downgrade();
    let _echo = broker
        .subscribe(
            "rpc.echo",
            SubscribeOptions::new().capacity(4096),
            move |m: &Message| {
                let b = w.upgrade().expect("alive");
                let reply = m.reply().expect("request carries reply-to");
                b.publish(reply.payload(format!("echo {}", text(m))))
                    .unwrap();
                Ok(())
            },
        )
        .unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            let broker = broker.clone();
            s.spawn(move || {
                for i in 0..250 {
                    let ask = format!("{t}-{i}");
                    let reply = broker
                        .request(
                            Message::to("rpc.echo").payload(ask.clone()),
                            Duration::from_secs(30),
                        )
                        .unwrap();
                    assert_eq!(text(&reply), format!("echo {ask}"));
                }
            });
        }
    });
    assert_eq!(broker.pending_requests(), 0);
    let _silent = broker
        .subscribe("rpc.silent", SubscribeOptions::default(), |_m: &Message| {
            Ok(())
        })
        .unwrap();
    let err = broker
        .request(Message::to("rpc.silent"), Duration::from_millis(50))
        .unwrap_err();
    assert_eq!(err, RequestError::Timeout);
    assert_eq!(
        broker
            .request(Message::to("rpc.nobody"), Duration::from_secs(5))
            .unwrap_err(),
        RequestError::NoResponders
    );
    assert_eq!(broker.pending_requests(), 0);
}

// R-BP-1: Block wakes a waiting publisher promptly when room frees (thread driver).
#[test]
fn block_wakes_when_room_frees() {
    let broker = Broker::new();
    let gate = Arc::new(AtomicBool::new(false));
    let g = gate.clone();
    let sub = broker
        .subscribe(
            "t",
            SubscribeOptions::new()
                .capacity(4)
                .overflow(Overflow::Block {
                    timeout: Duration::from_secs(60),
                }),
            move |_m: &Message| {
                while !g.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok(())
            },
        )
        .unwrap();
    for _ in 0..5 {
        broker.publish(Message::to("t")).unwrap(); // 1 in flight + 4 queued
    }
    std::thread::scope(|s| {
        let b = broker.clone();
        let blocked = s.spawn(move || b.publish(Message::to("t")).unwrap());
        wait_until("publisher blocked", PATIENCE, || {
            sub.stats().blocked_publishers == 1
        });
        assert!(!blocked.is_finished());
        gate.store(true, Ordering::SeqCst);
        let report = blocked.join().unwrap();
        assert_eq!(report.accepted, 1); // R-BP-1
    });
    wait_until("all delivered", PATIENCE, || sub.stats().delivered == 6);
    assert!(sub.stats().is_conserved());
}

// R-BP-1: a publisher blocked on one slow subscription does not stall offers to others,
// and close wakes it with a Closed refusal.
#[test]
fn blocked_publisher_stalls_nobody_else_and_wakes_on_close() {
    let broker = Broker::new();
    let release = Arc::new(AtomicBool::new(false));
    let r = release.clone();
    let slow = broker
        .subscribe(
            "slow",
            SubscribeOptions::new()
                .capacity(1)
                .overflow(Overflow::Block {
                    timeout: Duration::from_secs(600),
                }),
            move |_m: &Message| {
                while !r.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok(())
            },
        )
        .unwrap();
    let fast_seen = Arc::new(AtomicUsize::new(0));
    let fs = fast_seen.clone();
    let _fast = broker
        .subscribe("fast", SubscribeOptions::default(), move |_m: &Message| {
            fs.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
    broker.publish(Message::to("slow")).unwrap();
    wait_until("slow busy", PATIENCE, || slow.stats().in_flight == 1);
    broker.publish(Message::to("slow")).unwrap(); // fills its queue
    std::thread::scope(|s| {
        let b = broker.clone();
        let blocked = s.spawn(move || b.publish(Message::to("slow")).unwrap());
        wait_until("publisher blocked", PATIENCE, || {
            slow.stats().blocked_publishers == 1
        });
        for _ in 0..50 {
            broker.publish(Message::to("fast")).unwrap();
        }
        wait_until("fast delivered", PATIENCE, || {
            fast_seen.load(Ordering::SeqCst) == 50
        });
        let b2 = broker.clone();
        let closer = s.spawn(move || b2.close(Duration::ZERO));
        let report = blocked.join().unwrap();
        assert_eq!(report.refused_for(Refusal::Closed), 1); // R-BP-1: woken by close
        release.store(true, Ordering::SeqCst);
        let _ = closer.join().unwrap();
    });
    assert!(slow.stats().is_conserved());
}
