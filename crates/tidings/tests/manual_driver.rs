//! Deterministic tests of the core on the manual driver and manual clock (R-EXE-2).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tidings::*;
use tidings_testkit::helpers::{Recorder, drive, manual, text};

fn payloads(n: std::ops::Range<u32>) -> Vec<String> {
    n.map(|i| i.to_string()).collect()
}

// Test 1: fan-out, priority, predicate filters, retry counts and DLQ contents, exactly.
#[test]
fn fan_out_priority_filters_retries_and_dlq_exactly() {
    let (broker, clock) = manual();
    let all = Recorder::default();
    let evens = Recorder::default();
    let a = broker
        .subscribe("orders", SubscribeOptions::default(), all.handler())
        .unwrap();
    let b = broker
        .subscribe(
            "orders",
            SubscribeOptions::new().predicate(Predicate::new(|m: &Message| {
                text(m).parse::<u32>().is_ok_and(|n| n % 2 == 0)
            })),
            evens.handler(),
        )
        .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let c_calls = calls.clone();
    let c = broker
        .subscribe(
            "orders",
            SubscribeOptions::new().retry(Retry::fixed(Duration::from_millis(10), 3)),
            move |m: &Message| {
                c_calls.fetch_add(1, Ordering::SeqCst);
                if text(m) == "3" {
                    Err(HandlerError::retry("three is unlucky"))
                } else {
                    Ok(())
                }
            },
        )
        .unwrap();
    // R-CORE-5: the report says who accepted and who refused, and why.
    for i in 0..6u32 {
        let r = broker
            .publish(Message::to("orders").payload(i.to_string()))
            .unwrap();
        let expect_filtered = usize::from(i % 2 == 1);
        assert_eq!(r.accepted, 3 - expect_filtered);
        assert_eq!(r.refused_for(Refusal::Filtered), expect_filtered);
        if expect_filtered == 1 {
            assert_eq!(r.refused, vec![(b.id(), Refusal::Filtered)]);
        }
    }
    // R-CORE-5: no subscriber is not an error.
    let none = broker.publish(Message::to("nobody.home")).unwrap();
    assert_eq!((none.accepted, none.matched()), (0, 0));

    let waits = drive(&broker, &clock);
    // R-CORE-1: fan-out, each subscription independently.
    assert_eq!(all.take(), payloads(0..6));
    assert_eq!(evens.take(), vec!["0", "2", "4"]); // R-RT-3 predicate filter
    // R-DEL-1: "3" tried 3 times then dead-lettered; the others once each.
    assert_eq!(calls.load(Ordering::SeqCst), 5 + 3);
    assert_eq!(waits, vec![Duration::from_millis(10); 2]); // R-DEL-3
    let dlq = c.dead_letters();
    assert_eq!(dlq.len(), 1);
    assert_eq!(text(&dlq[0].message), "3");
    assert_eq!(dlq[0].attempts, 3);
    assert_eq!(
        dlq[0].reason,
        DeadLetterReason::RetriesExhausted {
            attempts: 3,
            last_error: "three is unlucky".into()
        }
    );
    // R-DEL-6: conservation, with exact counters.
    let s = c.stats();
    assert!(s.is_conserved(), "{s:?}");
    assert_eq!((s.offered, s.accepted, s.delivered), (6, 6, 5));
    assert_eq!(s.dead_lettered.retries_exhausted, 1);
    assert_eq!((s.attempts, s.failures), (8, 3));
    let s = b.stats();
    assert!(s.is_conserved());
    assert_eq!((s.offered, s.refused.filtered, s.delivered), (6, 3, 3));
    assert!(a.stats().is_conserved());
}

// R-ORD-1: priority first, FIFO within a priority.
#[test]
fn priority_then_fifo() {
    let (broker, _clock) = manual();
    let rec = Recorder::default();
    let _s = broker
        .subscribe("t", SubscribeOptions::default(), rec.handler())
        .unwrap();
    let plan = [
        ("l1", Priority::Low),
        ("n1", Priority::Normal),
        ("u1", Priority::Urgent),
        ("h1", Priority::High),
        ("n2", Priority::Normal),
        ("u2", Priority::Urgent),
        ("l2", Priority::Low),
        ("h2", Priority::High),
    ];
    for (p, prio) in plan {
        broker
            .publish(Message::to("t").payload(p).priority(prio))
            .unwrap();
    }
    broker.run_until_idle();
    assert_eq!(
        rec.take(),
        vec!["u1", "u2", "h1", "h2", "n1", "n2", "l1", "l2"]
    );
}

// R-ORD-1: a retry happens in place and blocks the messages behind it.
#[test]
fn retry_is_head_of_line() {
    let (broker, clock) = manual();
    let rec = Recorder::default();
    let inner = rec.handler();
    let failed_once = Arc::new(AtomicU32::new(0));
    let f = failed_once.clone();
    let _s = broker
        .subscribe(
            "t",
            SubscribeOptions::new().retry(Retry::fixed(Duration::from_secs(1), 2)),
            move |m: &Message| {
                if text(m) == "a" && f.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err(HandlerError::retry("first try fails"));
                }
                inner(m)
            },
        )
        .unwrap();
    for p in ["a", "b", "c"] {
        broker.publish(Message::to("t").payload(p)).unwrap();
    }
    assert_eq!(broker.run_until_idle(), 1);
    assert!(rec.take().is_empty(), "b and c wait behind a's retry");
    clock.advance(Duration::from_secs(1));
    broker.run_until_idle();
    assert_eq!(rec.take(), vec!["a", "b", "c"]);
}

// Test 2: the injected clock records the backoff schedule (R-DEL-3, R-TIME-3).
#[test]
fn exponential_backoff_schedule_is_recorded() {
    let (broker, clock) = manual();
    let sub = broker
        .subscribe(
            "t",
            SubscribeOptions::new()
                .retry(Retry::exponential(Duration::from_millis(100), 2.0).max_attempts(3)),
            |_m: &Message| Err(HandlerError::retry("still down")),
        )
        .unwrap();
    broker.publish(Message::to("t").payload("x")).unwrap();
    let waits = drive(&broker, &clock);
    assert_eq!(
        waits,
        vec![Duration::from_millis(100), Duration::from_millis(200)]
    );
    let dlq = sub.dead_letters();
    assert_eq!(dlq.len(), 1);
    assert_eq!(dlq[0].attempts, 3); // R-DEL-1
    assert_eq!(dlq[0].last_error(), Some("still down"));
    assert!(sub.stats().is_conserved()); // R-DEL-6
}

// Test 8: a panicking handler is retried, then dead-lettered with the panic message.
#[test]
fn handler_panic_is_retried_then_dead_lettered() {
    let (broker, clock) = manual();
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let sub = broker
        .subscribe(
            "t",
            SubscribeOptions::new().retry(Retry::fixed(Duration::from_millis(5), 2)),
            move |_m: &Message| -> Result<(), HandlerError> {
                c.fetch_add(1, Ordering::SeqCst);
                panic!("boom {}", 7)
            },
        )
        .unwrap();
    broker.publish(Message::to("t")).unwrap();
    drive(&broker, &clock);
    assert_eq!(calls.load(Ordering::SeqCst), 2); // R-DEL-1: panic treated as an error
    let dlq = sub.dead_letters();
    assert_eq!(
        dlq[0].reason,
        DeadLetterReason::RetriesExhausted {
            attempts: 2,
            last_error: "handler panicked: boom 7".into()
        }
    );
}

// Test 9: dedup skips duplicates; an id whose handler failed is not recorded (R-DEL-5).
#[test]
fn dedup_records_only_after_success() {
    let (broker, clock) = manual();
    let seen = Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let s2 = seen.clone();
    let fail_first = Arc::new(AtomicU32::new(0));
    let f = fail_first.clone();
    let store = Arc::new(InMemoryDedupStore::new(16));
    let handler = Arc::new(Deduplicating::with_store(
        move |m: &Message| {
            if text(m) == "flaky" && f.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err(HandlerError::retry("transient"));
            }
            s2.lock().push(text(m));
            Ok(())
        },
        store.clone(),
    ));
    let sub = broker
        .subscribe(
            "t",
            SubscribeOptions::new().retry(Retry::fixed(Duration::from_millis(1), 3)),
            handler.clone(),
        )
        .unwrap();
    broker.publish(Message::to("t").payload("once")).unwrap();
    broker.publish(Message::to("t").payload("flaky")).unwrap();
    drive(&broker, &clock);
    assert_eq!(*seen.lock(), vec!["once", "flaky"]); // the failed id was retried for real
    assert_eq!(store.len(), 2);
    assert!(sub.stats().is_conserved());
    // Capture a delivered message, then hand the same id to the decorator again.
    let msgs: Vec<Arc<Message>> = {
        let captured = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let c = captured.clone();
        let tap = broker
            .subscribe("t", SubscribeOptions::default(), move |m: &Message| {
                c.lock().push(Arc::new(m.clone()));
                Ok(())
            })
            .unwrap();
        broker.publish(Message::to("t").payload("dup")).unwrap();
        broker.run_until_idle();
        drop(tap);
        captured.lock().clone()
    };
    assert_eq!(seen.lock().last().map(String::as_str), Some("dup"));
    // Deliver the same id straight to the decorator again: skipped.
    for m in &msgs {
        handler.handle(m).unwrap();
        handler.handle(m).unwrap();
    }
    assert_eq!(seen.lock().iter().filter(|s| *s == "dup").count(), 1);
    assert_eq!(handler.skipped(), 2);
}

// R-DEL-4: the DLQ is bounded, listable, drainable and re-drivable.
#[test]
fn dlq_bounded_drain_and_redrive() {
    let (broker, _clock) = manual();
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let f = fail.clone();
    let rec = Recorder::default();
    let inner = rec.handler();
    let sub = broker
        .subscribe(
            "t",
            SubscribeOptions::new()
                .retry(Retry::None)
                .dead_letter(DeadLetterOptions::new().capacity(3)),
            move |m: &Message| {
                if f.load(Ordering::SeqCst) {
                    Err(HandlerError::retry("down"))
                } else {
                    inner(m)
                }
            },
        )
        .unwrap();
    for i in 0..5 {
        broker
            .publish(Message::to("t").payload(i.to_string()))
            .unwrap();
    }
    broker.run_until_idle();
    let s = sub.stats();
    assert_eq!((s.dlq_len, s.dlq_evicted), (3, 2));
    let listed: Vec<_> = sub
        .dead_letters()
        .iter()
        .map(|d| text(&d.message))
        .collect();
    assert_eq!(listed, vec!["2", "3", "4"]);
    fail.store(false, Ordering::SeqCst);
    let r = sub.redrive(|d| text(&d.message) != "3");
    assert_eq!(
        r,
        RedriveReport {
            accepted: 2,
            refused: 0
        }
    );
    broker.run_until_idle();
    assert_eq!(rec.take(), vec!["2", "4"]);
    let drained = sub.drain_dead_letters();
    assert_eq!(drained.len(), 1);
    assert!(sub.dead_letters().is_empty());
    assert!(sub.stats().is_conserved());
}

// R-DEL-4: a dead-letter topic receives forwarded dead letters with their reason.
#[test]
fn dead_letter_topic_forwarding() {
    let (broker, _clock) = manual();
    let dead = Recorder::default();
    let reasons = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let r2 = reasons.clone();
    let _watch = broker
        .subscribe(
            "dlq.orders",
            SubscribeOptions::default(),
            move |m: &Message| {
                r2.lock()
                    .push(m.header(DLQ_REASON_HEADER).unwrap_or("").to_owned());
                Ok(())
            },
        )
        .unwrap();
    let _s = broker
        .subscribe(
            "orders",
            SubscribeOptions::new()
                .retry(Retry::None)
                .dead_letter(DeadLetterOptions::new().topic("dlq.orders")),
            |_m: &Message| Err(HandlerError::reject("bad order")),
        )
        .unwrap();
    let _ = dead;
    broker.publish(Message::to("orders").payload("x")).unwrap();
    broker.run_until_idle();
    assert_eq!(*reasons.lock(), vec!["rejected: bad order"]);
}

// R-BP-1: the default Reject policy refuses and dead-letters overflow; publisher never waits.
#[test]
fn reject_overflow_goes_to_dlq() {
    let (broker, _clock) = manual();
    let sub = broker
        .subscribe("t", SubscribeOptions::new().capacity(2), |_m: &Message| {
            Ok(())
        })
        .unwrap();
    let refused: usize = (0..5)
        .map(|_| {
            broker
                .publish(Message::to("t"))
                .unwrap()
                .refused_for(Refusal::Overflow)
        })
        .sum();
    assert_eq!(refused, 3);
    let s = sub.stats();
    assert_eq!(
        (s.accepted, s.refused.overflow, s.dlq_len, s.queued),
        (2, 3, 3, 2)
    );
    assert!(
        sub.dead_letters()
            .iter()
            .all(|d| d.reason == DeadLetterReason::Overflow)
    );
    broker.run_until_idle();
    assert!(sub.stats().is_conserved()); // R-DEL-6
}

// R-CORE-4: one immutable instance reaches every subscriber; ids are unique and ordered.
#[test]
fn same_message_instance_reaches_every_subscriber() {
    let (broker, _clock) = manual();
    let ptrs = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut subs = Vec::new();
    for _ in 0..3 {
        let p = ptrs.clone();
        subs.push(
            broker
                .subscribe("t", SubscribeOptions::default(), move |m: &Message| {
                    p.lock().push((m as *const Message as usize, m.id()));
                    Ok(())
                })
                .unwrap(),
        );
    }
    let r1 = broker.publish(Message::to("t").payload("a")).unwrap();
    let r2 = broker.publish(Message::to("t").payload("b")).unwrap();
    assert!(r1.id < r2.id);
    broker.run_until_idle();
    let seen = ptrs.lock().clone();
    let first: Vec<_> = seen
        .iter()
        .filter(|(_, id)| *id == r1.id)
        .map(|(p, _)| *p)
        .collect();
    assert_eq!(first.len(), 3);
    assert!(first.iter().all(|p| *p == first[0]));
}

// R-LIM-1: limits and bad configuration are refused with typed errors naming the limit.
#[test]
fn limits_and_bad_configuration_are_typed_errors() {
    let clock = ManualClock::new();
    let broker = Broker::builder()
        .driver(Driver::Manual)
        .clock(clock)
        .limits(
            Limits::new()
                .max_payload_bytes(4)
                .max_headers(1)
                .max_header_bytes(8)
                .max_key_bytes(2)
                .max_subscriptions(1),
        )
        .build()
        .unwrap();
    assert_eq!(
        broker
            .publish(Message::to("t").payload("12345"))
            .unwrap_err(),
        PublishError::PayloadTooLarge { size: 5, limit: 4 }
    );
    assert_eq!(
        broker
            .publish(Message::to("t").header("a", "1").header("b", "2"))
            .unwrap_err(),
        PublishError::TooManyHeaders { count: 2, limit: 1 }
    );
    assert_eq!(
        broker
            .publish(Message::to("t").header("abcd", "12345"))
            .unwrap_err(),
        PublishError::HeadersTooLarge { size: 9, limit: 8 }
    );
    assert_eq!(
        broker.publish(Message::to("t").key("abc")).unwrap_err(),
        PublishError::KeyTooLarge { size: 3, limit: 2 }
    );
    assert!(matches!(
        broker.publish(Message::to("")),
        Err(PublishError::InvalidTopic(_))
    ));
    assert!(matches!(
        broker.publish(Message::to("a.*")),
        Err(PublishError::InvalidTopic(_))
    ));
    let ok = |_m: &Message| Ok(());
    let bad = |o: SubscribeOptions| broker.subscribe("t", o, ok).unwrap_err();
    assert!(matches!(
        bad(SubscribeOptions::new().capacity(0)),
        SubscribeError::InvalidOptions(ConfigError::Invalid {
            setting: "capacity",
            ..
        })
    ));
    assert!(matches!(
        bad(SubscribeOptions::new().concurrency(Concurrency::Lanes(0))),
        SubscribeError::InvalidOptions(ConfigError::Invalid {
            setting: "concurrency.lanes",
            ..
        })
    ));
    assert!(matches!(
        bad(SubscribeOptions::new().retry(Retry::fixed(Duration::ZERO, 0))),
        SubscribeError::InvalidOptions(ConfigError::Invalid {
            setting: "retry.max_attempts",
            ..
        })
    ));
    assert!(matches!(
        broker.subscribe("", SubscribeOptions::default(), ok),
        Err(SubscribeError::InvalidPattern(_))
    ));
    let _first = broker
        .subscribe("t", SubscribeOptions::default(), ok)
        .unwrap();
    assert_eq!(
        broker
            .subscribe("t", SubscribeOptions::default(), ok)
            .unwrap_err(),
        SubscribeError::TooManySubscriptions { limit: 1 }
    );
    assert!(matches!(
        Broker::builder()
            .limits(Limits::new().max_payload_bytes(0))
            .build(),
        Err(ConfigError::Invalid {
            setting: "limits.max_payload_bytes",
            ..
        })
    ));
}

// R-CORE-6: unsubscribe is effective at once for new offers; queued messages are reported.
#[test]
fn unsubscribe_refuses_later_offers_and_reports_queued() {
    let (broker, _clock) = manual();
    let rec = Recorder::default();
    let sub = broker
        .subscribe("t", SubscribeOptions::default(), rec.handler())
        .unwrap();
    broker.publish(Message::to("t").payload("queued")).unwrap();
    let id = sub.id();
    let left = broker.unsubscribe(id).unwrap();
    assert_eq!(
        left.iter().map(|m| text(m)).collect::<Vec<_>>(),
        vec!["queued"]
    );
    assert_eq!(broker.publish(Message::to("t")).unwrap().matched(), 0);
    broker.run_until_idle();
    assert!(rec.take().is_empty());
    let s = sub.stats();
    assert_eq!(s.dead_lettered.shutdown, 1);
    assert!(s.is_conserved()); // R-DEL-6
    assert!(broker.unsubscribe(id).is_none());
}

// R-CORE-6: close on the manual driver drains what is deliverable and reports the rest.
#[test]
fn manual_close_drains_and_reports_retries() {
    let (broker, _clock) = manual();
    let rec = Recorder::default();
    let inner = rec.handler();
    let sub = broker
        .subscribe(
            "t",
            SubscribeOptions::new().retry(Retry::fixed(Duration::from_secs(3600), 5)),
            move |m: &Message| {
                if text(m) == "bad" {
                    Err(HandlerError::retry("down"))
                } else {
                    inner(m)
                }
            },
        )
        .unwrap();
    broker.publish(Message::to("t").payload("bad")).unwrap();
    broker.publish(Message::to("t").payload("good")).unwrap();
    broker.run_until_idle();
    let report = broker.close(Duration::from_secs(1));
    // "bad" was waiting an hour to retry: abandoned at once; the drain then delivered
    // "good", which was queued behind it.
    let left: Vec<_> = report
        .undelivered
        .iter()
        .map(|u| text(&u.message))
        .collect();
    assert_eq!(left, vec!["bad"]);
    assert_eq!(rec.take(), vec!["good"]);
    assert!(report.unjoined.is_empty());
    assert_eq!(
        broker.publish(Message::to("t")).unwrap_err(),
        PublishError::Closed
    );
    let s = sub.stats();
    assert_eq!((s.dead_lettered.shutdown, s.delivered), (1, 1));
    assert!(s.is_conserved());
    // R-CORE-6: a second close returns the first one's report.
    assert_eq!(broker.close(Duration::ZERO).undelivered.len(), 1);
}

// R-PAT-2: the pattern shapes are visible in the API — a Handler trait object (Observer),
// a custom retry Strategy, and a wrapping Decorator — and compose.
#[test]
fn observer_strategy_and_decorator_compose() {
    struct Audit(Arc<parking_lot::Mutex<Vec<String>>>);
    impl Handler for Audit {
        fn handle(&self, m: &Message) -> Result<(), HandlerError> {
            if text(m) == "retry-me" && self.0.lock().is_empty() {
                self.0.lock().push("failed once".into());
                return Err(HandlerError::retry("first call fails"));
            }
            self.0.lock().push(text(m));
            Ok(())
        }
    }
    struct TwiceThenStop;
    impl RetryPolicy for TwiceThenStop {
        fn retry_after(&self, attempts: u32, _e: &HandlerError, _m: &Message) -> Option<Duration> {
            (attempts < 2).then_some(Duration::from_millis(7 * u64::from(attempts)))
        }
    }
    let (broker, clock) = manual();
    let log = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let _s = broker
        .subscribe(
            "t",
            SubscribeOptions::new().retry(Retry::custom(TwiceThenStop)),
            Deduplicating::new(Audit(log.clone())),
        )
        .unwrap();
    broker
        .publish(Message::to("t").payload("retry-me"))
        .unwrap();
    let waits = drive(&broker, &clock);
    assert_eq!(waits, vec![Duration::from_millis(7)]); // the custom strategy decided
    assert_eq!(*log.lock(), vec!["failed once", "retry-me"]);
}
