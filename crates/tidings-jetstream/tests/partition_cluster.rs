//! One node of a three-node cluster partitioned from the other two while clients stay
//! connected to it (R-DIST-9, with R-DIST-7): every route between node `n0` and the others
//! goes through a [`FaultProxy`](tidings_testkit::fault_proxy::FaultProxy)
//! ([`NatsCluster::for_test_with_proxied_node`]); the test blackholes them, then cuts them,
//! each time healing after a while. One broker is connected to `n0` (it stays connected:
//! its own connection is fine), another to `n1`; both publish to a stream with three
//! replicas and share one durable subscription.
//!
//! What the test checks:
//! - every publish call returns within the request timeout plus the backend's 0.5 s (and a
//!   margin for a loaded machine), with `Ok` or a typed error of kind `TimedOut` or
//!   `Unavailable`;
//! - the majority side goes on: the broker on `n1` publishes and handles during the
//!   partition;
//! - nothing acknowledged is lost: every publish that returned `Ok` is handled, and the
//!   stream holds each acknowledged message once (a failed publish is retried with the
//!   same message id);
//! - the broker on `n0` publishes and handles again after each heal, without a restart.
//!
//! Recovery times, the longest calls and the counts are printed, never asserted. A missing
//! `nats-server` is installed by the launcher (the test skips, with a notice, only under
//! `TIDINGS_SKIP_NATS=1`); every node and proxy is stopped when the test ends.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tidings::{
    Broker, DurableSpec, DurableSubscription, Message, StreamConfig, StreamErrorKind,
    SubscribeOptions,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};
use tidings_testkit::fault_proxy::{Direction, FaultProxy};
use tidings_testkit::nats::NatsCluster;

mod support;
use support::{Published, lock, preferring};

const STREAM: &str = "work";
const DURABLE: &str = "d";
/// The bound on each request to the cluster.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// What a seam call may add to the request timeout (the backend's own bound).
const BACKEND_SLACK: Duration = Duration::from_millis(500);
/// Room for a loaded machine's scheduling on top of the promised bound.
const MARGIN: Duration = Duration::from_secs(1);
const ACK_WAIT: Duration = Duration::from_secs(5);
/// Generous bound on every wait (never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(60);
/// The node partitioned from the others.
const ISOLATED: usize = 0;

/// A fault to apply (to every proxy concerned): its name, how long it lasts, how.
type Fault<'a> = (&'a str, Duration, &'a dyn Fn(&FaultProxy));

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "not within {PATIENCE:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A broker trying node `first` first, with the replicated stream opened.
fn broker(urls: &[String], first: usize, name: &str) -> Broker {
    let backend = JetStreamBackend::builder()
        .ack_wait(ACK_WAIT)
        .connect(
            ConnectOptions::servers(preferring(urls, first))
                .keep_server_order(true)
                .connect_timeout(Duration::from_secs(5))
                .request_timeout(REQUEST_TIMEOUT)
                .name(name),
        )
        .expect("connects to the cluster");
    let broker = Broker::builder()
        .durable_backend(Arc::new(backend))
        .build()
        .expect("valid configuration");
    broker
        .create_stream(StreamConfig::new(STREAM, ["work.#"]).replicas(3))
        .expect("a stream with three replicas");
    broker
}

/// What the handlers saw, per broker.
#[derive(Default)]
struct Handled {
    counts: Mutex<BTreeMap<u64, u32>>,
    by_broker: [AtomicU64; 2],
}

impl Handled {
    fn subscribe(self: &Arc<Self>, broker: &Broker, which: usize) -> DurableSubscription {
        let me = Arc::clone(self);
        broker
            .subscribe(
                DurableSpec::new(STREAM).name(DURABLE).filter("work.#"),
                SubscribeOptions::default(),
                move |m: &Message| {
                    let index: u64 = std::str::from_utf8(m.payload())
                        .expect("utf-8")
                        .parse()
                        .expect("an index");
                    *lock(&me.counts).entry(index).or_insert(0) += 1;
                    me.by_broker[which].fetch_add(1, Ordering::Relaxed);
                    Ok(())
                },
            )
            .expect("subscribe")
    }

    fn by(&self, which: usize) -> u64 {
        self.by_broker[which].load(Ordering::Relaxed)
    }
}

/// Publishes `base + k` through `broker` until `published.stop`.
fn publisher(broker: &Broker, published: &Arc<Published>, base: u64) -> JoinHandle<()> {
    let (broker, published) = (broker.clone(), Arc::clone(published));
    std::thread::spawn(move || {
        for k in 0.. {
            if published.stop.load(Ordering::Acquire) {
                return;
            }
            published.publish_until_acknowledged(&broker, "work.items", base + k);
        }
    })
}

/// What the cluster says of the durable consumer (from every node) and what the
/// subscription on n0 says of itself: printed when n0's broker does not recover.
fn diagnose(cluster: &NatsCluster, on_isolated: &DurableSubscription) -> String {
    let mut out = format!("subscription on n0: {:?}\n", on_isolated.state());
    for i in 0..cluster.len() {
        let jsz = cluster
            .monitor_text(i, "/jsz?accounts=true&streams=true&consumers=true")
            .unwrap_or_default();
        // The consumer's part only: its delivered, ack floor, pending and waiting pulls.
        let at = jsz.find("\"consumer_detail\"").unwrap_or(0);
        out.push_str(&format!(
            "{}: {}\n",
            cluster.name(i),
            &jsz[at..jsz.len().min(at + 1500)]
        ));
    }
    out
}

/// The index of the broker connected to the isolated node, and of the other.
const ON_ISOLATED: usize = 0;
const ON_MAJORITY: usize = 1;

/// R-DIST-9, R-DIST-7: node n0 partitioned from n1 and n2 (its routes blackholed for
/// 10 s, then cut for 6 s) while a broker stays connected to it: every call bounded and
/// typed, the majority side goes on, nothing acknowledged is lost, and the broker on n0
/// publishes and handles again after each heal.
#[test]
fn a_node_partitioned_from_the_cluster_keeps_its_clients_bounded_and_they_recover() {
    let test = "cluster partition";
    let Some(cluster) = NatsCluster::for_test_with_proxied_node(3, ISOLATED) else {
        return;
    };
    let urls = cluster.urls();
    let brokers = [
        broker(&urls, ISOLATED, "tidings-on-n0"),
        broker(&urls, 1, "tidings-on-n1"),
    ];
    wait_until("each broker is connected to its node", || {
        cluster
            .client_names(ISOLATED)
            .contains(&"tidings-on-n0".to_owned())
            && cluster
                .client_names(1)
                .contains(&"tidings-on-n1".to_owned())
    });
    let handled = Arc::new(Handled::default());
    let subscriptions = [
        handled.subscribe(&brokers[ON_ISOLATED], ON_ISOLATED),
        handled.subscribe(&brokers[ON_MAJORITY], ON_MAJORITY),
    ];
    let published = [
        Arc::new(Published::default()),
        Arc::new(Published::default()),
    ];
    let threads = [
        publisher(&brokers[ON_ISOLATED], &published[ON_ISOLATED], 0),
        publisher(
            &brokers[ON_MAJORITY],
            &published[ON_MAJORITY],
            1_000_000_000,
        ),
    ];
    wait_until("both brokers publish and handle", || {
        published.iter().all(|p| p.acknowledged() >= 50) && (0..2).all(|b| handled.by(b) >= 20)
    });
    let faults: [Fault; 2] = [
        ("routes blackholed", Duration::from_secs(10), &|p| {
            p.blackhole(Direction::Both);
        }),
        ("routes cut", Duration::from_secs(6), &|p| p.cut()),
    ];
    for (name, length, fault) in faults {
        eprintln!(
            "{test}: stream leader {:?}, consumer leader {:?} before \"{name}\"",
            cluster.stream_leader(STREAM).map(|i| cluster.name(i)),
            cluster
                .consumer_leader(STREAM, DURABLE)
                .map(|i| cluster.name(i)),
        );
        let began = Instant::now();
        let acked: Vec<usize> = published.iter().map(|p| p.acknowledged()).collect();
        let majority_handled = handled.by(ON_MAJORITY);
        for proxy in cluster.route_proxies() {
            fault(proxy);
        }
        // The majority side goes on while n0 is away.
        wait_until("the majority side publishes and handles", || {
            published[ON_MAJORITY].acknowledged() >= acked[ON_MAJORITY] + 20
                && handled.by(ON_MAJORITY) >= majority_handled + 20
        });
        let majority_progress = began.elapsed();
        std::thread::sleep(length.saturating_sub(began.elapsed()));
        let during: Vec<usize> = published
            .iter()
            .zip(&acked)
            .map(|(p, a)| p.acknowledged() - a)
            .collect();
        for proxy in cluster.route_proxies() {
            proxy.heal();
        }
        let healed = Instant::now();
        let at_heal = published[ON_ISOLATED].acknowledged();
        let handled_at_heal = handled.by(ON_ISOLATED);
        let mut published_again = None;
        loop {
            if published_again.is_none() && published[ON_ISOLATED].acknowledged() > at_heal {
                published_again = Some(healed.elapsed());
            }
            if published_again.is_some() && handled.by(ON_ISOLATED) > handled_at_heal {
                break;
            }
            if healed.elapsed() > PATIENCE {
                let log = cluster.node(ISOLATED).log();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                panic!(
                    "{name}: the broker on n0 did not recover within {PATIENCE:?}: published \
                     again after {published_again:?}, handled {} -> {}, failures {:?}, \
                     subscription errors {:?}, proxies {:?}; n0's log, newest first:\n{}",
                    handled_at_heal,
                    handled.by(ON_ISOLATED),
                    lock(&published[ON_ISOLATED].failures),
                    subscriptions.iter().map(|s| s.error()).collect::<Vec<_>>(),
                    cluster
                        .route_proxies()
                        .iter()
                        .map(FaultProxy::stats)
                        .collect::<Vec<_>>(),
                    diagnose(&cluster, &subscriptions[ON_ISOLATED]) + &tail.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "{test}: {name} for {length:?}: acknowledged during it {during:?} (on n0, on n1); \
             the majority side progressed within {majority_progress:?}; after the heal the \
             broker on n0 published after {published_again:?} and handled after {:?}; \
             route proxies {:?}",
            healed.elapsed(),
            cluster
                .route_proxies()
                .iter()
                .map(FaultProxy::stats)
                .collect::<Vec<_>>(),
        );
    }
    for p in &published {
        p.stop.store(true, Ordering::Release);
    }
    for t in threads {
        t.join().expect("publisher thread");
    }
    let acknowledged: BTreeSet<u64> = published
        .iter()
        .flat_map(|p| lock(&p.acknowledged).clone())
        .collect();
    wait_until("every acknowledged message handled", || {
        let counts = lock(&handled.counts);
        acknowledged.iter().all(|i| counts.contains_key(i))
    });
    let counts = lock(&handled.counts).clone();
    let again: u32 = counts.values().map(|n| n - 1).sum();
    let stream = brokers[ON_MAJORITY].stream(STREAM).expect("open");
    wait_until("the stream's bounds read", || {
        stream.read(stream.end_offset(), 1).is_ok()
    });
    // Sequences from 1, nothing deleted: the last one is how many the stream holds.
    let stored = stream.end_offset() - 1;
    for (which, p) in published.iter().enumerate() {
        eprintln!(
            "{test}: broker {which}: {} acknowledged, {} failed publishes retried {:?}, \
             longest publish call {:?}; handled {}",
            p.acknowledged(),
            p.failures(),
            lock(&p.failures),
            p.longest(),
            handled.by(which),
        );
    }
    eprintln!(
        "{test}: {} acknowledged, {stored} stored, {} distinct handled, {again} handled again",
        acknowledged.len(),
        counts.len()
    );
    // R-DIST-9, R-DIST-7: nothing acknowledged lost...
    assert!(acknowledged.iter().all(|i| counts.contains_key(i)));
    // ...nothing handled that was not published...
    assert!(
        counts.keys().all(|i| acknowledged.contains(i)),
        "handled, not acknowledged"
    );
    // ...a publish retried with its message id stored once...
    assert_eq!(stored, acknowledged.len() as u64, "stream holds each once");
    // ...every call bounded, every failure typed.
    let bound = REQUEST_TIMEOUT + BACKEND_SLACK + MARGIN;
    for p in &published {
        assert!(p.longest() <= bound, "a publish blocked {:?}", p.longest());
        for kind in lock(&p.failures).keys() {
            assert!(
                kind == &StreamErrorKind::TimedOut.to_string()
                    || kind == &StreamErrorKind::Unavailable.to_string(),
                "a publish failed with {kind}"
            );
        }
    }
    for s in &subscriptions {
        assert_eq!(s.error(), None, "the subscription goes on");
    }
    drop(subscriptions);
    for b in brokers {
        b.close(Duration::from_secs(10));
    }
}
