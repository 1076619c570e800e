//! Re-entrant calls from handlers under the manual driver (R-EXE-5): publish (every
//! overflow policy), request, subscribe and close neither deadlock nor silently do nothing.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use parking_lot::Mutex;
use tidings::*;
use tidings_testkit::helpers::{manual, self_publishing_subscription, text};

const PATIENCE: Duration = Duration::from_secs(30);

/// Run `f` on its own thread; fail (instead of hanging) if it takes longer than `PATIENCE`.
fn bounded<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(PATIENCE) {
        Ok(r) => r,
        Err(_) => panic!("{what}: deadlocked (no result within {PATIENCE:?})"),
    }
}

fn block_opts() -> SubscribeOptions {
    SubscribeOptions::new()
        .capacity(1)
        .overflow(Overflow::Block {
            timeout: Duration::from_secs(5),
        })
}

// R-EXE-5: a handler publishing into a full `Block` queue (an a→b→a cycle, capacity 1)
// does not wait: under the manual driver nothing else could make room, so the offer is
// refused at once as Overflow (and dead-lettered), and `run_until_idle` returns.
#[test]
fn block_cycle_under_the_manual_driver_does_not_hang() {
    let (broker, _clock) = manual();
    let hops = Arc::new(Mutex::new(0u32));
    let mut subs = Vec::new();
    for (me, next) in [("a", "b"), ("b", "a")] {
        let weak = broker.downgrade();
        let hops = hops.clone();
        let sub = broker
            .subscribe(me, block_opts(), move |_m: &Message| {
                let mut h = hops.lock();
                *h += 1;
                if *h < 20
                    && let Some(b) = weak.upgrade()
                {
                    drop(h);
                    let _ = b.publish(Message::to(next));
                }
                Ok::<(), HandlerError>(())
            })
            .unwrap();
        subs.push(sub);
    }
    broker.publish(Message::to("a")).unwrap();
    broker.publish(Message::to("b")).unwrap();
    let b = broker.clone();
    bounded("run_until_idle with a Block cycle", move || {
        b.run_until_idle();
    });
    let refused: u64 = subs.iter().map(|s| s.stats().refused.overflow).sum();
    assert!(
        refused >= 1,
        "a full Block queue refused the re-entrant offer"
    ); // R-EXE-5
    for s in &subs {
        let st = s.stats();
        assert!(st.is_conserved(), "{st:?}"); // R-DEL-6
        assert_eq!(st.queued, 0);
        assert_eq!(st.dlq_len, st.refused.overflow); // refusals are dead-lettered
    }
}

// R-EXE-5: a request from inside a handler is answered: the nested call delivers the
// request (and its reply) in the same thread before returning.
#[test]
fn request_from_inside_a_handler_gets_its_reply() {
    let (broker, _clock) = manual();
    let weak = broker.downgrade();
    let _svc = broker
        .subscribe("svc", SubscribeOptions::default(), move |m: &Message| {
            if let (Some(b), Some(r)) = (weak.upgrade(), m.reply()) {
                b.publish(r.payload(format!("re:{}", text(m)))).unwrap();
            }
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    let results: Arc<Mutex<Vec<Result<String, RequestError>>>> = Arc::default();
    let (weak, res) = (broker.downgrade(), results.clone());
    let _front = broker
        .subscribe("front", SubscribeOptions::default(), move |m: &Message| {
            let b = weak.upgrade().unwrap();
            let r = b.request(Message::to("svc").payload(text(m)), Duration::from_secs(1));
            res.lock().push(r.map(|m| text(&m)));
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    for i in 0..5 {
        broker
            .publish(Message::to("front").payload(format!("{i}")))
            .unwrap();
    }
    let b = broker.clone();
    bounded("request from a handler", move || b.run_until_idle());
    let got = results.lock().clone();
    let want: Vec<Result<String, RequestError>> = (0..5).map(|i| Ok(format!("re:{i}"))).collect();
    assert_eq!(got, want); // R-EXE-5
    assert_eq!(broker.pending_requests(), 0);
}

// R-EXE-5: a request a handler sends to its own subscription cannot be served while that
// handler runs (one dispatcher per subscription): it times out at once, it does not hang.
#[test]
fn request_to_its_own_subscription_times_out_without_hanging() {
    let (broker, _clock) = manual();
    let results: Arc<Mutex<Vec<Result<(), RequestError>>>> = Arc::default();
    let (weak, res) = (broker.downgrade(), results.clone());
    let _me = broker
        .subscribe("me", SubscribeOptions::default(), move |m: &Message| {
            if m.reply_to().is_none() {
                let b = weak.upgrade().unwrap();
                let r = b.request(Message::to("me"), Duration::from_secs(1));
                res.lock().push(r.map(|_| ()));
            }
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    broker.publish(Message::to("me")).unwrap();
    let b = broker.clone();
    bounded("self-request", move || b.run_until_idle());
    assert_eq!(*results.lock(), vec![Err(RequestError::Timeout)]); // R-EXE-5
    assert_eq!(broker.pending_requests(), 0);
}

// R-EXE-5: a subscription created inside a handler is live when subscribe returns and is
// delivered to by the same `run_until_idle`.
#[test]
fn subscribe_from_inside_a_handler() {
    let (broker, _clock) = manual();
    let got: Arc<Mutex<Vec<String>>> = Arc::default();
    let subs: Arc<Mutex<Vec<Subscription>>> = Arc::default();
    let (weak, g, s) = (broker.downgrade(), got.clone(), subs.clone());
    let _boot = broker
        .subscribe("boot", SubscribeOptions::default(), move |_m: &Message| {
            let b = weak.upgrade().unwrap();
            let g = g.clone();
            let sub = b
                .subscribe("late", SubscribeOptions::default(), move |m: &Message| {
                    g.lock().push(text(m));
                    Ok::<(), HandlerError>(())
                })
                .unwrap();
            s.lock().push(sub);
            b.publish(Message::to("late").payload("hello")).unwrap();
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    broker.publish(Message::to("boot")).unwrap();
    assert_eq!(broker.run_until_idle(), 2); // R-EXE-5
    assert_eq!(*got.lock(), vec!["hello".to_owned()]);
}

// R-EXE-5, R-CORE-6: close from inside a handler closes the broker and returns a report
// of what was left; the handler's own message completes normally.
#[test]
fn close_from_inside_a_handler() {
    let (broker, _clock) = manual();
    let reports: Arc<Mutex<Vec<CloseReport>>> = Arc::default();
    let (weak, r) = (broker.downgrade(), reports.clone());
    let sub = broker
        .subscribe("t", SubscribeOptions::default(), move |m: &Message| {
            if text(m) == "stop" {
                let b = weak.upgrade().unwrap();
                r.lock().push(b.close(Duration::ZERO));
            }
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    for p in ["one", "stop", "two", "three"] {
        broker.publish(Message::to("t").payload(p)).unwrap();
    }
    let b = broker.clone();
    bounded("close from a handler", move || b.run_until_idle());
    assert!(broker.is_closed());
    let report = reports.lock()[0].clone();
    let left: Vec<String> = report
        .undelivered
        .iter()
        .map(|u| text(&u.message))
        .collect();
    assert_eq!(left, vec!["two", "three"]); // R-CORE-6
    let s = sub.stats();
    assert_eq!((s.delivered, s.dead_lettered.shutdown), (2, 2)); // R-EXE-5
    assert!(s.is_conserved());
    // The outer caller sees the same report.
    let again = broker.close(Duration::ZERO);
    assert_eq!(again.undelivered.len(), 2); // R-CORE-6
}

// R-EXE-5: run_until_idle called from inside a handler delivers (nested progress) instead of
// returning 0.
#[test]
fn nested_run_until_idle_makes_progress() {
    let (broker, _clock) = manual();
    let rec: Arc<Mutex<Vec<String>>> = Arc::default();
    let r = rec.clone();
    let _b = broker
        .subscribe("b", SubscribeOptions::default(), move |m: &Message| {
            r.lock().push(text(m));
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    let inner: Arc<Mutex<Vec<usize>>> = Arc::default();
    let (weak, i, r) = (broker.downgrade(), inner.clone(), rec.clone());
    let _a = broker
        .subscribe("a", SubscribeOptions::default(), move |_m: &Message| {
            let b = weak.upgrade().unwrap();
            b.publish(Message::to("b").payload("from-a")).unwrap();
            i.lock().push(b.run_until_idle());
            r.lock().push("a-done".into());
            Ok::<(), HandlerError>(())
        })
        .unwrap();
    broker.publish(Message::to("a")).unwrap();
    broker.run_until_idle();
    assert_eq!(*inner.lock(), vec![1]); // R-EXE-5
    assert_eq!(*rec.lock(), vec!["from-a", "a-done"]);
}

// R-EXE-5: a handler that publishes into its own full queue, under every overflow policy,
// and finally unsubscribes itself: nothing waits, every message is accounted.
#[test]
fn self_publish_under_every_overflow_policy_then_self_unsubscribe() {
    let policies = [
        Overflow::Reject,
        Overflow::DropOldest { keep: true },
        Overflow::Block {
            timeout: Duration::from_secs(3600),
        },
    ];
    for overflow in policies {
        let (broker, _clock) = manual();
        let options = SubscribeOptions::new().capacity(1).overflow(overflow);
        // Two publishes into a queue of one per call: the second finds it full.
        let (sub, _refused) = self_publishing_subscription(&broker, "loop", options, 10);
        broker.publish(Message::to("loop")).unwrap();
        let b = broker.clone();
        bounded("self-publish loop", move || b.run_until_idle());
        let s = sub.stats();
        assert!(s.is_conserved(), "{overflow:?}: {s:?}"); // R-EXE-5, R-DEL-6
        assert_eq!(s.delivered, 10, "{overflow:?}");
        assert!(broker.subscriptions().is_empty()); // unsubscribed itself
        assert_eq!(s.queued + s.in_flight, 0);
    }
}
