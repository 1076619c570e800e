//! The behavioural suite: each function is one test, run under every driver.
//! SPEC ids are named beside the assertions that prove them.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use tidings::*;

use crate::driver::DriverUnderTest;
use crate::helpers::{Activity, text};

/// Fan-out to 3 subscriptions; per-publisher order; max active == 1; conservation.
pub fn fan_out_order_and_exclusivity(b: &dyn DriverUnderTest) {
    fan_out_with(b, 3, 150);
}

/// Fan-out to 3 subscriptions from `publishers` threads × `per_publisher` messages: every
/// publish is accepted by all 3, each subscription sees each publisher's messages in order,
/// never two handler calls of one subscription at once, counters conserved, close clean.
pub fn fan_out_with(b: &dyn DriverUnderTest, publishers: u32, per_publisher: u32) {
    let broker = b.broker();
    let mut subs = Vec::new();
    for _ in 0..3 {
        let act = Arc::new(Activity::default());
        let seen: Arc<Mutex<Vec<(u32, u32)>>> = Arc::default();
        let (a, s) = (act.clone(), seen.clone());
        let sub = broker
            .subscribe(
                "suite.fan",
                SubscribeOptions::new().capacity((publishers * per_publisher) as usize),
                move |m: &Message| {
                    a.enter();
                    let t = text(m);
                    let (p, i) = t.split_once(':').unwrap_or(("0", "0"));
                    s.lock()
                        .push((p.parse().unwrap_or(0), i.parse().unwrap_or(0)));
                    std::thread::yield_now();
                    a.exit();
                    Ok(())
                },
            )
            .unwrap();
        subs.push((sub, act, seen));
    }
    std::thread::scope(|s| {
        for p in 0..publishers {
            let broker = broker.clone();
            s.spawn(move || {
                for i in 0..per_publisher {
                    let r = broker
                        .publish(Message::to("suite.fan").payload(format!("{p}:{i}")))
                        .unwrap();
                    assert_eq!(r.accepted, 3);
                }
            });
        }
    });
    let total = (publishers * per_publisher) as usize;
    for (sub, act, seen) in &subs {
        b.settle(&broker, "all delivered", &mut || seen.lock().len() == total);
        let mut next: HashMap<u32, u32> = HashMap::new();
        for &(p, i) in seen.lock().iter() {
            let e = next.entry(p).or_insert(0);
            assert_eq!(i, *e, "[{}] publisher {p} out of order", b.name()); // R-ORD-2
            *e += 1;
        }
        assert_eq!(act.max(), 1, "[{}]", b.name()); // R-CORE-3
        assert!(sub.stats().is_conserved(), "[{}]", b.name()); // R-DEL-6
    }
    let report = broker.close(Duration::from_secs(5));
    assert!(report.is_clean(), "[{}] {report:?}", b.name()); // R-CORE-6
}

/// Retries then success; retries exhausted to the DLQ with attempts and last error.
pub fn retry_and_dead_letter(b: &dyn DriverUnderTest) {
    let broker = b.broker();
    let tries: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let t = tries.clone();
    let sub = broker
        .subscribe(
            "suite.retry",
            SubscribeOptions::new().retry(Retry::fixed(Duration::from_millis(1), 3)),
            move |m: &Message| {
                let mut t = t.lock();
                let n = t.entry(text(m)).or_insert(0);
                *n += 1;
                match (text(m).as_str(), *n) {
                    ("flaky", k) if k < 3 => Err(HandlerError::retry(format!("try {k}"))),
                    ("dead", k) => Err(HandlerError::retry(format!("dead {k}"))),
                    _ => Ok(()),
                }
            },
        )
        .unwrap();
    broker
        .publish(Message::to("suite.retry").payload("flaky"))
        .unwrap();
    broker
        .publish(Message::to("suite.retry").payload("dead"))
        .unwrap();
    b.settle(&broker, "flaky delivered, dead dead-lettered", &mut || {
        let s = sub.stats();
        s.delivered == 1 && s.dead_lettered.retries_exhausted == 1
    });
    let dlq = sub.dead_letters();
    assert_eq!(dlq.len(), 1);
    assert_eq!(
        dlq[0].reason,
        DeadLetterReason::RetriesExhausted {
            attempts: 3,
            last_error: "dead 3".into()
        }
    ); // R-DEL-1
    assert_eq!(tries.lock()["flaky"], 3); // R-DEL-3
    assert!(sub.stats().is_conserved()); // R-DEL-6
    broker.close(Duration::from_secs(5));
}

/// Expired messages are dead-lettered, delayed ones arrive in due order.
pub fn ttl_and_delay(b: &dyn DriverUnderTest) {
    let broker = b.broker();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let s2 = seen.clone();
    let sub = broker
        .subscribe(
            "suite.time",
            SubscribeOptions::default(),
            move |m: &Message| {
                s2.lock().push(text(m));
                Ok(())
            },
        )
        .unwrap();
    broker
        .publish(
            Message::to("suite.time")
                .payload("stale")
                .expires_at(SystemTime::UNIX_EPOCH),
        )
        .unwrap();
    broker
        .publish(
            Message::to("suite.time")
                .payload("late")
                .delay(Duration::from_millis(20)),
        )
        .unwrap();
    broker
        .publish(
            Message::to("suite.time")
                .payload("soon")
                .delay(Duration::from_millis(5)),
        )
        .unwrap();
    broker
        .publish(Message::to("suite.time").payload("now"))
        .unwrap();
    b.settle(&broker, "delayed messages arrive", &mut || {
        seen.lock().len() == 3
    });
    assert_eq!(*seen.lock(), vec!["now", "soon", "late"]); // R-TIME-2
    let dlq = sub.dead_letters();
    assert_eq!(dlq[0].reason, DeadLetterReason::Expired); // R-TIME-1
    broker.close(Duration::from_secs(5));
}

/// Handlers that publish, subscribe and unsubscribe themselves do not deadlock.
pub fn reentrant_handlers(b: &dyn DriverUnderTest) {
    let broker = b.broker();
    let weak = broker.downgrade();
    let me: Arc<OnceLock<SubscriptionId>> = Arc::default();
    let (m2, w) = (me.clone(), weak.clone());
    let relay = broker
        .subscribe(
            "suite.in",
            SubscribeOptions::default(),
            move |m: &Message| {
                let b = w.upgrade().expect("broker alive");
                b.publish(Message::to("suite.out").payload(m.payload().clone()))
                    .unwrap();
                if text(m) == "last" {
                    b.unsubscribe(*m2.get().expect("id set"));
                }
                Ok(())
            },
        )
        .unwrap();
    me.set(relay.id()).unwrap();
    let out: Arc<Mutex<Vec<String>>> = Arc::default();
    let o = out.clone();
    let _sink = broker
        .subscribe(
            "suite.out",
            SubscribeOptions::default(),
            move |m: &Message| {
                o.lock().push(text(m));
                Ok(())
            },
        )
        .unwrap();
    for p in ["a", "b", "last"] {
        broker.publish(Message::to("suite.in").payload(p)).unwrap();
    }
    b.settle(&broker, "relayed", &mut || out.lock().len() == 3);
    assert_eq!(*out.lock(), vec!["a", "b", "last"]); // R-CORE-2
    assert_eq!(
        broker.publish(Message::to("suite.in")).unwrap().matched(),
        0
    ); // R-CORE-6
    broker.close(Duration::from_secs(5));
}

/// Close interrupts a long retry wait and reports the message.
pub fn close_interrupts_backoff(b: &dyn DriverUnderTest) {
    let broker = b.broker();
    let sub = broker
        .subscribe(
            "suite.close",
            SubscribeOptions::new().retry(Retry::fixed(Duration::from_secs(3600), 2)),
            |_m: &Message| Err(HandlerError::retry("down")),
        )
        .unwrap();
    broker
        .publish(Message::to("suite.close").payload("stuck"))
        .unwrap();
    b.settle(&broker, "first attempt failed", &mut || {
        sub.stats().failures == 1
    });
    let started = std::time::Instant::now();
    let report = broker.close(Duration::from_secs(10));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "[{}] close was slow",
        b.name()
    );
    assert_eq!(report.undelivered.len(), 1); // R-CORE-6
    assert!(report.unjoined.is_empty());
    assert!(sub.stats().is_conserved()); // R-DEL-6
}

/// Keyed lanes and per-key concurrency keep per-key order through retries.
pub fn per_key_order(b: &dyn DriverUnderTest) {
    for concurrency in [
        Concurrency::Lanes(3),
        Concurrency::PerKey { max_in_flight: 3 },
    ] {
        let broker = b.broker();
        let seen: Arc<Mutex<HashMap<String, Vec<u32>>>> = Arc::default();
        let failed: Arc<Mutex<HashMap<u32, bool>>> = Arc::default();
        let (s2, f2) = (seen.clone(), failed.clone());
        let sub = broker
            .subscribe(
                "suite.keys",
                SubscribeOptions::new()
                    .concurrency(concurrency)
                    .retry(Retry::fixed(Duration::from_millis(1), 5)),
                move |m: &Message| {
                    let t = text(m);
                    let (k, i) = t.split_once(':').unwrap_or(("?", "0"));
                    let i: u32 = i.parse().unwrap_or(0);
                    // Every 7th message fails once: retries must not reorder its key.
                    if i % 7 == 3 && !f2.lock().insert(i, true).unwrap_or(false) {
                        return Err(HandlerError::retry("once"));
                    }
                    s2.lock().entry(k.to_owned()).or_default().push(i);
                    Ok(())
                },
            )
            .unwrap();
        for i in 0..60u32 {
            let k = format!("k{}", i % 4);
            broker
                .publish(
                    Message::to("suite.keys")
                        .key(&k)
                        .payload(format!("{k}:{i}")),
                )
                .unwrap();
        }
        b.settle(&broker, "all keyed delivered", &mut || {
            sub.stats().delivered == 60
        });
        for (k, got) in seen.lock().iter() {
            let mut sorted = got.clone();
            sorted.sort_unstable();
            assert_eq!(
                got,
                &sorted,
                "[{}] {concurrency:?} key {k} out of order",
                b.name()
            ); // R-ORD-3, R-ORD-4
        }
        assert!(sub.stats().is_conserved()); // R-DEL-6
        broker.close(Duration::from_secs(5));
    }
}

/// Request-reply with a responder; no responder is a clean error.
pub fn request_reply(b: &dyn DriverUnderTest) {
    let broker = b.broker();
    let w = broker.downgrade();
    let _responder = broker
        .subscribe(
            "suite.rpc",
            SubscribeOptions::default(),
            move |m: &Message| {
                let b = w.upgrade().expect("broker alive");
                if let Some(reply) = m.reply() {
                    b.publish(reply.payload(format!("re:{}", text(m)))).unwrap();
                }
                Ok(())
            },
        )
        .unwrap();
    let reply = broker
        .request(
            Message::to("suite.rpc").payload("ping"),
            Duration::from_secs(10),
        )
        .unwrap();
    assert_eq!(text(&reply), "re:ping"); // R-PAT-1
    assert_eq!(
        broker
            .request(Message::to("suite.nobody"), Duration::from_secs(1))
            .unwrap_err(),
        RequestError::NoResponders
    );
    assert_eq!(broker.pending_requests(), 0);
    broker.close(Duration::from_secs(5));
}

/// An expired message — the only one queued — is dead-lettered and forwarded to the
/// dead-letter topic (R-TIME-1, R-DEL-4), under every driver: a dispatcher that finds the
/// queue empty after expiring it still forwards it.
pub fn expired_forwarded_to_dead_letter_topic(b: &dyn DriverUnderTest) {
    let broker = b.broker();
    let sub = broker
        .subscribe(
            "suite.exp",
            SubscribeOptions::new().dead_letter(DeadLetterOptions::new().topic("suite.exp-dlq")),
            |_m: &Message| Ok(()),
        )
        .unwrap();
    // (payload, reason header) of each forwarded dead letter.
    type Forwarded = Vec<(String, Option<String>)>;
    let forwarded: Arc<Mutex<Forwarded>> = Arc::default();
    let f = forwarded.clone();
    let _dlq = broker
        .subscribe(
            "suite.exp-dlq",
            SubscribeOptions::default(),
            move |m: &Message| {
                f.lock()
                    .push((text(m), m.header(DLQ_REASON_HEADER).map(str::to_owned)));
                Ok(())
            },
        )
        .unwrap();
    broker
        .publish(
            Message::to("suite.exp")
                .payload("stale")
                .expires_at(SystemTime::UNIX_EPOCH),
        )
        .unwrap();
    b.settle(&broker, "the expired message forwarded", &mut || {
        forwarded.lock().len() == 1
    });
    let got = forwarded.lock().clone();
    assert_eq!(got[0].0, "stale", "[{}]", b.name()); // R-DEL-4
    assert_eq!(
        got[0].1.as_deref(),
        Some(DeadLetterReason::Expired.name()),
        "[{}]",
        b.name()
    ); // R-TIME-1, R-DEL-4
    assert_eq!(sub.stats().dead_lettered.expired, 1, "[{}]", b.name()); // R-TIME-1
    assert!(sub.stats().is_conserved(), "[{}]", b.name()); // R-DEL-6
    broker.close(Duration::from_secs(5));
}

/// One suite case: its name and body.
pub type Case = (&'static str, fn(&dyn DriverUnderTest));

/// Every suite function, by name.
pub const ALL: &[Case] = &[
    (
        "fan_out_order_and_exclusivity",
        fan_out_order_and_exclusivity,
    ),
    ("retry_and_dead_letter", retry_and_dead_letter),
    ("ttl_and_delay", ttl_and_delay),
    ("reentrant_handlers", reentrant_handlers),
    ("close_interrupts_backoff", close_interrupts_backoff),
    ("per_key_order", per_key_order),
    ("request_reply", request_reply),
    (
        "expired_forwarded_to_dead_letter_topic",
        expired_forwarded_to_dead_letter_topic,
    ),
];
