//! The publishers' fast path into a single-dispatcher subscription (src/subscription/
//! ingress.rs): messages offered without the subscription's lock must obey exactly the
//! rules of the locked path — capacity and overflow, priority order, close, counters.
//! Every test here pits concurrent publishers against a dispatcher held inside a handler,
//! under each threaded driver, and checks invariants (never timings).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use parking_lot::Mutex;
use tidings::*;
use tidings_testkit::helpers::{self_publishing_subscription, wait_until};

#[path = "support/drivers.rs"]
mod drivers;

const PATIENCE: Duration = Duration::from_secs(30);
const PUBLISHERS: usize = 4;
const PER_PUBLISHER: usize = 500;

/// A handler that blocks on its first message until the gate opens, recording the
/// payloads it sees.
struct Gated {
    gate: Arc<Barrier>,
    first: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Gated {
    fn new() -> Self {
        Self {
            gate: Arc::new(Barrier::new(2)),
            first: Arc::new(AtomicBool::new(true)),
            seen: Arc::default(),
        }
    }

    fn handler(&self) -> impl Fn(&Message) -> Result<(), HandlerError> + Send + Sync + 'static {
        let (gate, first, seen) = (self.gate.clone(), self.first.clone(), self.seen.clone());
        move |m: &Message| {
            if first.swap(false, Ordering::SeqCst) {
                gate.wait();
            }
            seen.lock()
                .push(String::from_utf8_lossy(m.payload()).into_owned());
            Ok(())
        }
    }
}

/// A broker on `driver` with one subscription to "t" whose handler holds its first message
/// ("first", published here) until the gate opens.
fn held_subscription(driver: Driver, options: SubscribeOptions) -> (Broker, Gated, Subscription) {
    let broker = Broker::builder().driver(driver).build().unwrap();
    let gated = Gated::new();
    let sub = broker.subscribe("t", options, gated.handler()).unwrap();
    broker.publish(Message::to("t").payload("first")).unwrap();
    wait_until("the handler holds the first message", PATIENCE, || {
        sub.stats().in_flight == 1
    });
    (broker, gated, sub)
}

fn publish_from_threads(broker: &Broker, topic: &str) -> (usize, usize) {
    let start = Arc::new(Barrier::new(PUBLISHERS));
    let counts: Vec<(usize, usize)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..PUBLISHERS)
            .map(|p| {
                let start = start.clone();
                s.spawn(move || {
                    start.wait();
                    let (mut accepted, mut refused) = (0, 0);
                    for i in 0..PER_PUBLISHER {
                        let r = broker
                            .publish(Message::to(topic).payload(format!("{p}-{i}")))
                            .expect("publish");
                        accepted += r.accepted;
                        refused += r.refused.len();
                    }
                    (accepted, refused)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    counts.iter().fold((0, 0), |(a, r), (x, y)| (a + x, r + y))
}

// R-BP-1, R-DEL-6: with the dispatcher held inside its first message, four publishers race
// for a queue of 16 under `Reject`. Exactly 16 more are accepted (capacity), every other
// offer is refused as overflow and dead-lettered, and the publish reports agree with the
// counters: the fast path never admits past the capacity.
#[test]
fn concurrent_publishers_never_overfill_the_queue() {
    for (name, driver) in drivers::threaded() {
        let options = SubscribeOptions::new()
            .capacity(16)
            .overflow(Overflow::Reject);
        let (broker, gated, sub) = held_subscription(driver, options);
        let (accepted, refused) = publish_from_threads(&broker, "t");
        let total = PUBLISHERS * PER_PUBLISHER;
        assert_eq!(accepted, 16, "{name}: accepted exactly the capacity");
        assert_eq!(accepted + refused, total, "{name}");
        let s = sub.stats();
        assert_eq!(s.queued, 16, "{name}");
        assert_eq!(s.refused.overflow, refused as u64, "{name}");
        assert_eq!(
            s.dlq_len + s.dlq_evicted,
            refused as u64,
            "{name}: each in the DLQ"
        );
        gated.gate.wait();
        wait_until("everything accepted is delivered", PATIENCE, || {
            sub.stats().delivered == 17
        });
        let s = sub.stats();
        assert!(s.is_conserved(), "{name}: {s:?}");
        assert_eq!((s.queued, s.in_flight), (0, 0), "{name}");
        assert!(broker.close(Duration::from_secs(5)).is_clean(), "{name}");
    }
}

// R-ORD-1, R-ORD-2: a low-priority message queued first is overtaken by default-priority
// ones offered later, whichever path they took; each publisher's messages arrive in its
// publish order.
#[test]
fn fast_offers_keep_priority_and_publisher_order() {
    for (name, driver) in drivers::threaded() {
        let options = SubscribeOptions::new().capacity(4096);
        let (broker, gated, _sub) = held_subscription(driver, options);
        for (payload, priority) in [("low", Priority::Low), ("urgent", Priority::Urgent)] {
            broker
                .publish(Message::to("t").payload(payload).priority(priority))
                .unwrap();
        }
        let (accepted, _) = publish_from_threads(&broker, "t");
        assert_eq!(accepted, PUBLISHERS * PER_PUBLISHER, "{name}");
        gated.gate.wait();
        // Watched through the handler, not the counters: reading them moves pending fast
        // offers into the queue, which would hide a dispatcher that overlooked them.
        let total = PUBLISHERS * PER_PUBLISHER + 3;
        wait_until("all delivered", PATIENCE, || {
            gated.seen.lock().len() == total
        });
        let seen = gated.seen.lock().clone();
        assert_eq!(seen[0], "first", "{name}");
        assert_eq!(
            seen[1], "urgent",
            "{name}: urgent overtakes everything queued"
        );
        assert_eq!(
            seen[total - 1],
            "low",
            "{name}: low goes after every normal one"
        );
        for p in 0..PUBLISHERS {
            let mine: Vec<&String> = seen
                .iter()
                .filter(|s| s.starts_with(&format!("{p}-")))
                .collect();
            let expected: Vec<String> = (0..PER_PUBLISHER).map(|i| format!("{p}-{i}")).collect();
            assert_eq!(mine.len(), PER_PUBLISHER, "{name}");
            assert!(
                mine.iter().zip(&expected).all(|(a, b)| *a == b),
                "{name}: publisher {p} out of order"
            );
        }
        assert!(broker.close(Duration::from_secs(5)).is_clean(), "{name}");
    }
}

// R-DEL-6, R-CORE-5: unsubscribing while publishers are mid-flight. Nothing accepted is
// lost: every message a publish report counted as accepted was delivered or returned by
// `unsubscribe` as abandoned, and every refusal was for the closed subscription.
#[test]
fn unsubscribe_during_fast_offers_accounts_for_every_message() {
    for (name, driver) in drivers::threaded() {
        let (broker, gated, sub) = held_subscription(driver, SubscribeOptions::default());
        let (accepted, abandoned) = std::thread::scope(|s| {
            let publishing = s.spawn(|| publish_from_threads(&broker, "t"));
            // Let some offers land, then unsubscribe under the publishers.
            wait_until("some offers accepted", PATIENCE, || {
                sub.stats().accepted > 10
            });
            let closer = s.spawn(move || sub.unsubscribe());
            gated.gate.wait();
            let abandoned = closer.join().unwrap();
            let (accepted, _refused) = publishing.join().unwrap();
            (accepted, abandoned)
        });
        // `unsubscribe` returns without waiting for the handler call in flight, and once the
        // gate opens that call may be a later message than "first": wait (bounded) for the
        // ledger to balance rather than reading the count at one instant.
        let expected = accepted + 1;
        wait_until(
            "every accepted message delivered or abandoned",
            PATIENCE,
            || gated.seen.lock().len() + abandoned.len() >= expected,
        );
        assert_eq!(gated.seen.lock().first().map(String::as_str), Some("first"));
        assert!(broker.close(Duration::from_secs(5)).is_clean(), "{name}");
        // Nothing delivered twice or after the ledger balanced, once every dispatcher ended.
        assert_eq!(
            gated.seen.lock().len() + abandoned.len(),
            expected,
            "{name}: every accepted message delivered or abandoned, once"
        );
    }
}

// R-DEL-6, R-BP-1: a handler publishing into its own queue of one (so its offers race the
// dispatcher that runs it, through the ingress or through the core), under every overflow
// policy and every threaded driver, then unsubscribing itself: nothing hangs, and every
// message is delivered, refused with a reason or dead-lettered — and counted.
#[test]
fn self_publishing_handler_into_a_full_queue_loses_nothing() {
    let policies = [
        Overflow::Reject,
        Overflow::DropOldest { keep: true },
        Overflow::Block {
            timeout: Duration::from_millis(20),
        },
    ];
    for (name, driver) in drivers::threaded() {
        for overflow in policies {
            let broker = Broker::builder().driver(driver.clone()).build().unwrap();
            let options = SubscribeOptions::new().capacity(1).overflow(overflow);
            let (sub, refused) = self_publishing_subscription(&broker, "loop", options, 50);
            broker.publish(Message::to("loop")).unwrap();
            // The handler unsubscribes from inside its last call, which is booked when it
            // returns, a moment later.
            wait_until(
                "the handler unsubscribed itself and returned",
                PATIENCE,
                || broker.subscriptions().is_empty() && sub.stats().in_flight == 0,
            );
            let s = sub.stats();
            assert!(s.is_conserved(), "{name} {overflow:?}: {s:?}"); // R-DEL-6
            assert_eq!(s.queued + s.in_flight, 0, "{name} {overflow:?}: {s:?}");
            assert_eq!(
                s.refused.overflow,
                refused.load(Ordering::SeqCst) as u64,
                "{name} {overflow:?}: each refusal reported to its publisher and counted"
            ); // R-BP-1
            assert!(s.delivered >= 50, "{name} {overflow:?}: {s:?}");
            assert!(
                broker.close(Duration::from_secs(5)).is_clean(),
                "{name} {overflow:?}"
            );
        }
    }
}
