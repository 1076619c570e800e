//! Per-key order wins over priority (R-ORD-5) under keyed lanes and per-key concurrency;
//! priority still orders different keys and unkeyed messages (R-ORD-1).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tidings::*;
use tidings_testkit::helpers::{manual, text, wait_until};

const PRIORITIES: [Priority; 4] = [
    Priority::Low,
    Priority::Normal,
    Priority::High,
    Priority::Urgent,
];

/// A delivery: the message's key and payload.
type Delivered = (Option<Vec<u8>>, String);

/// Records deliveries in order.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Delivered>>>);

impl Log {
    fn handler(&self) -> impl Fn(&Message) -> Result<(), HandlerError> + Send + Sync + 'static {
        let log = self.0.clone();
        move |m: &Message| {
            log.lock().push((m.key().map(<[u8]>::to_vec), text(m)));
            Ok(())
        }
    }
    fn payloads(&self) -> Vec<String> {
        self.0.lock().iter().map(|(_, p)| p.clone()).collect()
    }
}

fn opts(concurrency: Concurrency) -> SubscribeOptions {
    SubscribeOptions::new().concurrency(concurrency)
}

/// One key's messages with rising priorities, interleaved with another key and unkeyed
/// ones; queued together, then delivered by one dispatcher.
fn exact_order(concurrency: Concurrency) -> Vec<String> {
    let (broker, _clock) = manual();
    let log = Log::default();
    let _sub = broker
        .subscribe("t", opts(concurrency), log.handler())
        .unwrap();
    let publish = |payload: &str, key: Option<&str>, p: Priority| {
        let mut b = Message::to("t").payload(payload.to_owned()).priority(p);
        if let Some(k) = key {
            b = b.key(k);
        }
        broker.publish(b).unwrap();
    };
    publish("a1", Some("a"), Priority::Low);
    publish("a2", Some("a"), Priority::Urgent);
    publish("b1", Some("b"), Priority::High);
    publish("u1", None, Priority::Urgent);
    publish("u0", None, Priority::Low);
    broker.run_until_idle();
    log.payloads()
}

#[test]
fn one_lane_keeps_key_order_and_orders_keys_by_priority() {
    for c in [Concurrency::Serial, Concurrency::Lanes(1)] {
        // a2 (urgent) never overtakes a1 (low) of the same key; different keys and
        // unkeyed messages still go by priority, then publish order.
        assert_eq!(
            exact_order(c),
            vec!["u1", "b1", "a1", "a2", "u0"], // R-ORD-5, R-ORD-1
            "{c:?}"
        );
    }
}

#[test]
fn per_key_matches_lanes() {
    assert_eq!(
        exact_order(Concurrency::PerKey { max_in_flight: 1 }),
        vec!["u1", "b1", "a1", "a2", "u0"] // R-ORD-5
    );
}

/// Many keys, random priorities, several dispatchers: each key's messages arrive in
/// publish order.
fn per_key_order_holds(broker: &Broker, concurrency: Concurrency, settle: impl Fn(&Log, usize)) {
    let log = Log::default();
    let sub = broker
        .subscribe(
            "t",
            SubscribeOptions::new()
                .capacity(10_000)
                .concurrency(concurrency),
            log.handler(),
        )
        .unwrap();
    let mut n = 0;
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    for i in 0..400 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let key = format!("k{}", rng % 7);
        let p = PRIORITIES[(rng >> 20) as usize % 4];
        broker
            .publish(
                Message::to("t")
                    .key(&key)
                    .priority(p)
                    .payload(format!("{i}")),
            )
            .unwrap();
        n += 1;
    }
    settle(&log, n);
    let mut last: HashMap<Vec<u8>, u32> = HashMap::new();
    for (key, payload) in log.0.lock().iter() {
        let seq: u32 = payload.parse().unwrap();
        let key = key.clone().unwrap();
        if let Some(prev) = last.insert(key.clone(), seq) {
            assert!(prev < seq, "key {key:?}: {seq} after {prev}"); // R-ORD-5
        }
    }
    assert!(sub.stats().is_conserved()); // R-DEL-6
}

#[test]
fn lanes_keep_key_order_under_the_manual_driver() {
    let (broker, _clock) = manual();
    per_key_order_holds(&broker, Concurrency::Lanes(3), |log, n| {
        broker.run_until_idle();
        assert_eq!(log.0.lock().len(), n);
    });
}

#[test]
fn per_key_keeps_key_order_under_the_manual_driver() {
    let (broker, _clock) = manual();
    per_key_order_holds(
        &broker,
        Concurrency::PerKey { max_in_flight: 3 },
        |log, n| {
            broker.run_until_idle();
            assert_eq!(log.0.lock().len(), n);
        },
    );
}

#[test]
fn both_modes_keep_key_order_under_the_thread_driver() {
    for c in [
        Concurrency::Lanes(3),
        Concurrency::PerKey { max_in_flight: 3 },
    ] {
        let broker = Broker::new();
        per_key_order_holds(&broker, c, |log, n| {
            wait_until("all delivered", Duration::from_secs(30), || {
                log.0.lock().len() == n
            });
        });
        assert!(broker.close(Duration::from_secs(10)).is_clean());
    }
}
