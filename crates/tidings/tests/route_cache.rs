//! The publish side's route cache never changes who a publish reaches: a subscription
//! registered before a publish starts is offered it, one removed before is not, however
//! the cache was filled (R-RT-1, R-CORE-1, R-CORE-6).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use tidings::{
    Broker, Driver, HandlerError, ManualClock, Message, Overflow, Pattern, SubscribeOptions,
    Subscription, Topic, TopicTrie,
};

fn manual() -> Broker {
    Broker::builder()
        .driver(Driver::Manual)
        .clock(ManualClock::new())
        .build()
        .unwrap()
}

fn noop() -> impl Fn(&Message) -> Result<(), HandlerError> + Send + Sync + 'static {
    |_m: &Message| Ok(())
}

fn opts() -> SubscribeOptions {
    SubscribeOptions::new()
        .capacity(4096)
        .overflow(Overflow::Reject)
}

#[test]
fn a_cached_topic_reaches_new_subscriptions_and_not_removed_ones() {
    let broker = manual();
    let a = broker.subscribe("orders.created", opts(), noop()).unwrap();
    // Publish twice so the second one is served from the cache.
    for _ in 0..2 {
        assert_eq!(
            broker
                .publish(Message::to("orders.created"))
                .unwrap()
                .accepted,
            1
        );
    }
    let b = broker.subscribe("orders.*", opts(), noop()).unwrap();
    let report = broker.publish(Message::to("orders.created")).unwrap();
    assert_eq!(report.accepted, 2); // R-RT-1, R-CORE-1: the new subscription is not missed
    assert_eq!(b.stats().offered, 1);
    let a_offered = a.stats().offered;
    let a_id = a.id();
    assert!(broker.unsubscribe(a_id).is_some());
    for _ in 0..2 {
        let report = broker.publish(Message::to("orders.created")).unwrap();
        assert_eq!(report.accepted, 1);
        assert!(
            report.refused.is_empty(),
            "offered to a removed subscription"
        );
    }
    assert_eq!(a.stats().offered, a_offered); // R-CORE-6: nothing offered after unsubscribe
    assert_eq!(b.stats().offered, 3);
    // A subscription dropped (which unsubscribes) is gone from the cached route too.
    drop(b);
    let report = broker.publish(Message::to("orders.created")).unwrap();
    assert_eq!(report.accepted, 0); // R-CORE-6
    assert!(report.refused.is_empty());
    broker.run_until_idle();
}

/// A hot topic's publish takes its checked topic from the cache: the message carries
/// exactly that topic, and a spelling that is not a valid topic is still refused however
/// close it is to a cached one (R-RT-1, R-CORE-4).
#[test]
fn a_cached_topic_is_shared_and_invalid_spellings_are_still_refused() {
    let broker = manual();
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let log = seen.clone();
    let _s = broker
        .subscribe("orders.#", opts(), move |m: &Message| {
            log.lock().push(m.topic().as_str().to_owned());
            Ok(())
        })
        .unwrap();
    for _ in 0..3 {
        broker.publish(Message::to("orders.created")).unwrap();
    }
    for bad in [
        "orders.created.",
        "orders..created",
        "orders.created ",
        "orders.*",
        "",
    ] {
        assert!(
            matches!(
                broker.publish(Message::to(bad)),
                Err(tidings::PublishError::InvalidTopic(_))
            ),
            "{bad:?} was accepted after a cached look-alike"
        );
    }
    broker.publish(Message::to("orders.created.eu")).unwrap();
    broker.run_until_idle();
    assert_eq!(
        *seen.lock(),
        [
            "orders.created",
            "orders.created",
            "orders.created",
            "orders.created.eu"
        ]
    );
}

/// A delayed message to a hot topic is routed when it is due, to the subscriptions there
/// are then, not to the cached route it was published with (R-TIME-2, R-RT-1, R-CORE-6).
#[test]
fn a_delayed_publish_to_a_cached_topic_routes_when_due() {
    let clock = ManualClock::new();
    let broker = Broker::builder()
        .driver(Driver::Manual)
        .clock(clock.clone())
        .build()
        .unwrap();
    let early = broker.subscribe("jobs.run", opts(), noop()).unwrap();
    for _ in 0..2 {
        assert_eq!(broker.publish(Message::to("jobs.run")).unwrap().accepted, 1);
    }
    let report = broker
        .publish(Message::to("jobs.run").delay(Duration::from_secs(5)))
        .unwrap();
    assert!(report.scheduled);
    // Before it is due: one subscription leaves, another arrives.
    drop(early);
    let late = broker.subscribe("jobs.*", opts(), noop()).unwrap();
    clock.advance(Duration::from_secs(5));
    broker.run_until_idle();
    assert_eq!(
        late.stats().delivered,
        1,
        "the due message reached the new subscription"
    );
}

/// Publishers keep the cache busy (misses, inserts, hits) on other topics while the test
/// thread subscribes and unsubscribes a probe subscription over and over; only the test
/// thread publishes to the probe's topic, so every offer to it is one the test made.
#[test]
fn subscribe_and_unsubscribe_interleaved_with_concurrent_publishes() {
    let broker = Broker::builder().driver(Driver::Thread).build().unwrap();
    let seen = Arc::new(AtomicU64::new(0));
    let all = {
        let seen = seen.clone();
        let block = opts().overflow(Overflow::Block {
            timeout: Duration::from_secs(60),
        });
        broker
            .subscribe("#", block, move |_m: &Message| {
                seen.fetch_add(1, Ordering::Relaxed);
                Ok::<(), HandlerError>(())
            })
            .unwrap()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let publishers: Vec<_> = (0..3)
        .map(|i| {
            let (broker, stop) = (broker.clone(), stop.clone());
            std::thread::spawn(move || {
                let topics = [format!("bg.{i}.a"), format!("bg.{i}.b"), "probes.x".into()];
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // None of these matches the probe's `probe.*` / `probe.#`.
                    let t = &topics[(n % 3) as usize];
                    broker.publish(Message::to(t.as_str())).unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    for round in 0..300 {
        assert!(Instant::now() < deadline, "took too long");
        let pattern = if round % 2 == 0 { "probe.*" } else { "probe.#" };
        let probe: Subscription = broker.subscribe(pattern, opts(), noop()).unwrap();
        let report = broker.publish(Message::to("probe.x")).unwrap();
        // R-RT-1, R-CORE-1: a publish that starts after subscribe returned reaches it.
        assert_eq!(
            probe.stats().offered,
            1,
            "round {round}: new subscription missed"
        );
        assert_eq!(report.accepted, 2, "round {round}");
        let id = probe.id();
        assert!(broker.unsubscribe(id).is_some());
        let before = probe.stats().offered;
        for _ in 0..3 {
            let report = broker.publish(Message::to("probe.x")).unwrap();
            assert!(
                report.refused.iter().all(|(sub, _)| *sub != id),
                "round {round}: offered to a removed subscription"
            );
        }
        // R-CORE-6: nothing is offered to it after unsubscribe returned.
        assert_eq!(probe.stats().offered, before, "round {round}");
    }
    stop.store(true, Ordering::Relaxed);
    let published: u64 = publishers.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(published > 0);
    assert!(broker.wait_idle(Duration::from_secs(60)));
    assert!(all.stats().is_conserved());
    assert!(seen.load(Ordering::Relaxed) > 0);
    assert!(broker.close(Duration::from_secs(10)).is_clean());
}

#[derive(Debug, Clone)]
enum Op {
    Subscribe(String),
    Unsubscribe(usize),
    Publish(String),
}

fn word() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["a", "b", "c"])
}

fn pattern() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![4 => word(), 1 => Just("*"), 1 => Just("#")],
        1..4,
    )
    .prop_map(|w| w.join("."))
}

fn topic() -> impl Strategy<Value = String> {
    prop::collection::vec(word(), 1..4).prop_map(|w| w.join("."))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => pattern().prop_map(Op::Subscribe),
        1 => (0usize..16).prop_map(Op::Unsubscribe),
        4 => topic().prop_map(Op::Publish),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Every publish reaches exactly the subscriptions a fresh trie of the live set
    /// matches, whatever mix of cache hits, misses and invalidations came before.
    #[test]
    fn publishes_reach_exactly_what_a_fresh_trie_matches(ops in prop::collection::vec(op(), 1..60)) {
        let broker = manual();
        // (pattern, handle, offers seen so far); `None` once unsubscribed.
        let mut subs: Vec<Option<(String, Subscription, u64)>> = Vec::new();
        for op in ops {
            match op {
                Op::Subscribe(p) => {
                    let s = broker.subscribe(&p, opts(), noop()).unwrap();
                    subs.push(Some((p, s, 0)));
                }
                Op::Unsubscribe(i) => {
                    let live: Vec<usize> =
                        (0..subs.len()).filter(|&k| subs[k].is_some()).collect();
                    if let Some(&k) = live.get(i % live.len().max(1)) {
                        let (_, s, _) = subs[k].take().unwrap();
                        s.unsubscribe();
                    }
                }
                Op::Publish(t) => {
                    let mut trie = TopicTrie::new();
                    for (k, entry) in subs.iter().enumerate() {
                        if let Some((p, _, _)) = entry {
                            trie.insert(&Pattern::new(p).unwrap(), k as u64, ());
                        }
                    }
                    let mut want = Vec::new();
                    trie.for_each_match(&Topic::new(&t).unwrap(), |k, _| want.push(k as usize));
                    let report = broker.publish(Message::to(t.as_str())).unwrap();
                    let mut got = Vec::new();
                    for (k, entry) in subs.iter_mut().enumerate() {
                        if let Some((_, s, seen)) = entry {
                            let offered = s.stats().offered;
                            if offered != *seen {
                                got.push(k);
                                *seen = offered;
                            }
                        }
                    }
                    // R-RT-1: routing (cached or not) agrees with the trie over live subs;
                    // R-CORE-6: removed subscriptions are never offered anything.
                    prop_assert_eq!(&got, &want);
                    prop_assert_eq!(report.accepted, want.len());
                    prop_assert!(report.refused.is_empty());
                }
            }
            broker.run_until_idle();
        }
    }
}
