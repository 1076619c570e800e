//! A real cluster (R-DIST-7): a three-node JetStream cluster on 127.0.0.1, a replicated
//! stream (`StreamConfig::replicas(3)`), publishers and a durable subscription running
//! throughout, and nodes SIGKILLed under them — the stream's leader, the consumer's leader,
//! a follower. The client is given every node's URL and fails over by itself.
//!
//! What each test checks:
//! - no acknowledged publish is lost: every publish that returned `Ok` is handled;
//! - a publish that failed during an election is retried with the same message id and is
//!   stored once (`Nats-Msg-Id` deduplication): the stream holds exactly the acknowledged
//!   messages;
//! - no publish call blocks longer than the request timeout (plus the backend's 0.5 s and a
//!   margin for a reconnect) — the only timing asserted, because it is the promise;
//! - the subscription resumes without help (handling goes on after each kill).
//!
//! Messages handled more than once (an acknowledgement lost with a dying node) are counted
//! and printed, never failed on. Every wait is bounded and asserts an invariant.
//!
//! The tests run one at a time (one cluster at a time on the machine); `TIDINGS_LONG=1`
//! makes the runs longer (more kills, more messages). A missing `nats-server` is installed
//! by the launcher (the tests skip, with a notice, only under `TIDINGS_SKIP_NATS=1`); every
//! node a test starts is stopped when it ends.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tidings::{
    Broker, DurableSpec, DurableSubscription, Message, StreamConfig, StreamError, StreamErrorKind,
    SubscribeOptions,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend, JetStreamError};
use tidings_testkit::nats::NatsCluster;

mod support;
use support::{Published, lock};

/// The tidings stream; its JetStream name is the same (no `.` or `_` to escape).
const STREAM: &str = "work";
/// The durable subscription; its consumer name on the server is the same.
const DURABLE: &str = "d";
/// The bound on each request to the cluster.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// What a seam call may add to the request timeout (the backend's own bound).
const BACKEND_SLACK: Duration = Duration::from_millis(500);
/// Room for a reconnect and a loaded machine's scheduling on top of the promised bound.
const MARGIN: Duration = Duration::from_secs(1);
/// A message whose acknowledgement was lost with a node is redelivered after this long.
const ACK_WAIT: Duration = Duration::from_secs(5);
/// Generous bound on every wait (never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(90);
/// Publisher threads per test.
const PUBLISHERS: u64 = 2;

/// One cluster at a time: the machine's cores are few and the nodes fsync every write.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

fn long_run() -> bool {
    std::env::var_os("TIDINGS_LONG").is_some_and(|v| v == "1")
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "not within {PATIENCE:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A broker whose durable backend is the cluster, reached through `options`, with no
/// stream opened yet.
fn bare_broker(options: ConnectOptions, name: &str) -> Broker {
    let backend = JetStreamBackend::builder()
        .ack_wait(ACK_WAIT)
        .connect(
            options
                .connect_timeout(Duration::from_secs(5))
                .request_timeout(REQUEST_TIMEOUT)
                .name(name),
        )
        .expect("connects to the cluster");
    Broker::builder()
        .durable_backend(Arc::new(backend))
        .build()
        .expect("valid configuration")
}

/// A broker whose durable backend is the cluster, reached through `options`.
fn broker(options: ConnectOptions, name: &str) -> Broker {
    let broker = bare_broker(options, name);
    broker
        .create_stream(StreamConfig::new(STREAM, ["work.#"]).replicas(3))
        .expect("a stream with three replicas");
    broker
}

/// Connect options trying node `first` of `urls` first, then the others in order.
fn preferring(urls: &[String], first: usize) -> ConnectOptions {
    ConnectOptions::servers(support::preferring(urls, first)).keep_server_order(true)
}

/// What the handlers saw.
#[derive(Default)]
struct Handled {
    /// How often each index was handled.
    counts: Mutex<BTreeMap<u64, u32>>,
    /// Messages handled by each broker (by its position in the test).
    by_broker: [AtomicU64; 2],
}

impl Handled {
    fn distinct(&self) -> usize {
        lock(&self.counts).len()
    }

    fn total(&self) -> u64 {
        self.by_broker
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .sum()
    }

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
}

/// Starts [`PUBLISHERS`] threads publishing indexes to `work.items`, round robin over
/// `brokers`, until `stop`. A failed publish is retried with the same message id.
fn start_publishers(brokers: &[Broker]) -> (Arc<Published>, Vec<JoinHandle<()>>) {
    let published = Arc::new(Published::default());
    let threads = (0..PUBLISHERS)
        .map(|p| {
            let broker = brokers[usize::try_from(p).expect("small") % brokers.len()].clone();
            let published = Arc::clone(&published);
            std::thread::spawn(move || {
                for k in 0.. {
                    if published.stop.load(Ordering::Acquire) {
                        return;
                    }
                    published.publish_until_acknowledged(
                        &broker,
                        "work.items",
                        p * 1_000_000_000 + k,
                    );
                }
            })
        })
        .collect();
    (published, threads)
}

/// Waits until `published` acknowledged `more` publishes and `handled` handled `more`
/// messages past the counts at the call: publishing and the subscription both go on.
fn wait_progress(
    what: &str,
    published: &Published,
    handled: &Handled,
    subscriptions: &[&DurableSubscription],
    more: usize,
) {
    let (acked, seen) = (published.acknowledged(), handled.total());
    let deadline = Instant::now() + PATIENCE;
    while published.acknowledged() < acked + more || handled.total() < seen + more as u64 {
        assert!(
            Instant::now() < deadline,
            "not within {PATIENCE:?}: {what}: acknowledged {acked} -> {}, handled {seen} -> {}, \
             failed publishes {:?}, subscription errors {:?}",
            published.acknowledged(),
            handled.total(),
            lock(&published.failures),
            subscriptions.iter().map(|s| s.error()).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Stops the publishers, waits until every acknowledged index is handled, checks the
/// stream holds exactly the acknowledged messages and the promised bound on blocking,
/// and prints the counts. Returns (acknowledged, duplicates).
fn finish(
    test: &str,
    broker: &Broker,
    published: &Published,
    threads: Vec<JoinHandle<()>>,
    handled: &Handled,
) -> (usize, usize) {
    published.stop.store(true, Ordering::Release);
    for t in threads {
        t.join().expect("publisher thread");
    }
    let acknowledged = lock(&published.acknowledged).clone();
    wait_until("every acknowledged message handled", || {
        let counts = lock(&handled.counts);
        acknowledged.iter().all(|i| counts.contains_key(i))
    });
    let counts = lock(&handled.counts).clone();
    let duplicates = counts.values().map(|n| (n - 1) as usize).sum::<usize>();
    let twice = counts.values().filter(|n| **n > 1).count();
    let stream = broker.stream(STREAM).expect("the stream is open");
    // A read asks the cluster for the stream's bounds (the other broker's appends too).
    // Sequences from 1, nothing deleted: the last one is how many the stream holds.
    wait_until("the stream's bounds read", || {
        stream.read(stream.end_offset(), 1).is_ok()
    });
    let stored = stream.end_offset() - 1;
    let longest = published.longest();
    eprintln!(
        "{test}: {} acknowledged, {stored} stored, {} handled ({} distinct), {duplicates} \
         duplicates ({twice} messages handled more than once), {} failed publishes retried \
         {:?}, longest publish call {longest:?} (request timeout {REQUEST_TIMEOUT:?}), \
         handled per broker {:?}",
        acknowledged.len(),
        handled.total(),
        counts.len(),
        published.failures(),
        lock(&published.failures),
        handled
            .by_broker
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect::<Vec<_>>(),
    );
    // R-DIST-7: no acknowledged message lost...
    assert!(acknowledged.iter().all(|i| counts.contains_key(i)));
    // ...nothing handled that was not published...
    assert!(
        counts.keys().all(|i| acknowledged.contains(i)),
        "{counts:?}"
    );
    // ...a publish retried with its message id is stored once...
    assert_eq!(stored, acknowledged.len() as u64, "stream holds each once");
    // ...and no call blocked longer than the request timeout (plus the backend's own
    // slack and a margin for the reconnect).
    let bound = REQUEST_TIMEOUT + BACKEND_SLACK + MARGIN;
    assert!(
        longest <= bound,
        "a publish blocked {longest:?} > {bound:?}"
    );
    // Every failure was the typed error of a cluster without a leader for a moment.
    for kind in lock(&published.failures).keys() {
        assert!(
            kind == &StreamErrorKind::TimedOut.to_string()
                || kind == &StreamErrorKind::Unavailable.to_string(),
            "a publish failed with {kind}"
        );
    }
    (acknowledged.len(), duplicates)
}

/// A three-node cluster with the stream created on it, a broker knowing every node, a
/// durable subscription and publishers running. `None` when nats tests are skipped.
struct Run {
    cluster: NatsCluster,
    broker: Broker,
    handled: Arc<Handled>,
    subscription: DurableSubscription,
    published: Arc<Published>,
    threads: Vec<JoinHandle<()>>,
}

impl Run {
    fn start(test: &str) -> Option<Self> {
        let cluster = NatsCluster::for_test(3)?;
        let broker = broker(ConnectOptions::servers(cluster.urls()), test);
        let handled = Arc::new(Handled::default());
        let subscription = handled.subscribe(&broker, 0);
        let (published, threads) = start_publishers(std::slice::from_ref(&broker));
        wait_progress(
            "publishing and handling under way",
            &published,
            &handled,
            &[&subscription],
            100,
        );
        Some(Self {
            cluster,
            broker,
            handled,
            subscription,
            published,
            threads,
        })
    }

    fn finish(self, test: &str) {
        finish(
            test,
            &self.broker,
            &self.published,
            self.threads,
            &self.handled,
        );
        self.broker.close(Duration::from_secs(10));
    }

    fn stream_leader(&self) -> usize {
        self.cluster
            .wait_stream_leader(STREAM, PATIENCE)
            .expect("the stream has a leader")
    }
}

#[test]
fn killing_the_stream_leader_loses_no_acknowledged_message() {
    // R-DIST-7: the stream's leader is SIGKILLed three times (more under TIDINGS_LONG=1)
    // while publishers and a durable subscription run.
    let _one = serial();
    let test = "stream leader";
    let Some(mut run) = Run::start(test) else {
        return;
    };
    let kills = if long_run() { 10 } else { 3 };
    for round in 0..kills {
        let leader = run.stream_leader();
        run.cluster.kill(leader).expect("SIGKILL the stream leader");
        wait_until("another node leads the stream", || {
            run.cluster
                .stream_leader(STREAM)
                .is_some_and(|l| l != leader)
        });
        // Publishing and handling resume on two nodes, without help.
        wait_progress(
            "progress with the old leader dead",
            &run.published,
            &run.handled,
            &[&run.subscription],
            100,
        );
        run.cluster.restart(leader).expect("restart the old leader");
        wait_progress(
            "progress after the old leader is back",
            &run.published,
            &run.handled,
            &[&run.subscription],
            100,
        );
        eprintln!(
            "{test}: round {round}: killed and restarted {} ({} acknowledged, {} handled)",
            run.cluster.name(leader),
            run.published.acknowledged(),
            run.handled.distinct()
        );
    }
    run.finish(test);
}

#[test]
fn killing_the_consumer_leader_or_a_follower_interrupts_nothing_for_long() {
    // R-DIST-7: the durable consumer's leader is SIGKILLed, then a follower (neither the
    // stream's nor the consumer's leader): handling goes on across both.
    let _one = serial();
    let test = "consumer leader, follower";
    let Some(mut run) = Run::start(test) else {
        return;
    };
    let rounds = if long_run() { 4 } else { 1 };
    for _ in 0..rounds {
        let mut leader = None;
        wait_until("the consumer has a leader", || {
            leader = run.cluster.consumer_leader(STREAM, DURABLE);
            leader.is_some()
        });
        let leader = leader.expect("a leader");
        run.cluster
            .kill(leader)
            .expect("SIGKILL the consumer leader");
        wait_progress(
            "handling resumes with the consumer leader dead",
            &run.published,
            &run.handled,
            &[&run.subscription],
            100,
        );
        run.cluster.restart(leader).expect("restart it");
        eprintln!(
            "{test}: killed and restarted consumer leader {}",
            run.cluster.name(leader)
        );

        let stream_leader = run.stream_leader();
        let consumer_leader = run.cluster.consumer_leader(STREAM, DURABLE);
        let follower = (0..run.cluster.len())
            .find(|&i| i != stream_leader && Some(i) != consumer_leader)
            .expect("three nodes, at most two leaders");
        eprintln!(
            "{test}: stream leader {stream_leader}, consumer leader {consumer_leader:?}, \
             killing follower {follower}"
        );
        run.cluster.kill(follower).expect("SIGKILL a follower");
        // No leader went away: the handled count keeps growing while it is down.
        wait_progress(
            "handling goes on with a follower dead",
            &run.published,
            &run.handled,
            &[&run.subscription],
            200,
        );
        run.cluster.restart(follower).expect("restart the follower");
        eprintln!(
            "{test}: killed and restarted follower {}",
            run.cluster.name(follower)
        );
    }
    run.finish(test);
}

#[test]
fn two_brokers_on_different_nodes_share_one_durable_across_a_node_kill() {
    // R-DIST-7, R-DIST-3: two brokers, each connected first to a node of its own, compete on
    // one durable subscription; the node of the first is SIGKILLed and it fails over.
    let _one = serial();
    let test = "two brokers";
    let Some(mut cluster) = NatsCluster::for_test(3) else {
        return;
    };
    let urls = cluster.urls();
    let a = broker(preferring(&urls, 0), "tidings-cluster-a");
    let b = broker(preferring(&urls, 1), "tidings-cluster-b");
    let handled = Arc::new(Handled::default());
    let sub_a = handled.subscribe(&a, 0);
    let sub_b = handled.subscribe(&b, 1);
    let brokers = [a.clone(), b.clone()];
    let (published, threads) = start_publishers(&brokers);
    wait_until("both brokers handle some of the work", || {
        handled
            .by_broker
            .iter()
            .all(|n| n.load(Ordering::Relaxed) > 20)
    });
    let kills = if long_run() { 4 } else { 1 };
    for _ in 0..kills {
        cluster.kill(0).expect("SIGKILL the first broker's node");
        wait_progress(
            "progress with node n0 dead",
            &published,
            &handled,
            &[&sub_a, &sub_b],
            100,
        );
        let seen_by_a = handled.by_broker[0].load(Ordering::Relaxed);
        wait_until(
            "the first broker handles again, through another node",
            || handled.by_broker[0].load(Ordering::Relaxed) > seen_by_a,
        );
        cluster.restart(0).expect("restart n0");
        wait_progress(
            "progress with n0 back",
            &published,
            &handled,
            &[&sub_a, &sub_b],
            100,
        );
    }
    let (acknowledged, _) = finish(test, &a, &published, threads, &handled);
    assert!(acknowledged > 0);
    drop((sub_a, sub_b));
    a.close(Duration::from_secs(10));
    b.close(Duration::from_secs(10));
}

#[test]
fn a_replica_count_the_cluster_cannot_place_is_refused_with_a_typed_error() {
    // R-DIST-7: more replicas than nodes (4, 5), more than the server's limit (6, 1000) or a
    // count no server takes (usize::MAX) is refused at creation with kind `Refused` and the
    // server's code; nothing is left behind, so the same name can then be created with 3.
    let _one = serial();
    let Some(cluster) = NatsCluster::for_test(3) else {
        return;
    };
    let urls = cluster.urls();
    for (i, n) in [4, 5, 6, 1000, usize::MAX].into_iter().enumerate() {
        let name = format!("r{i}");
        let broker = bare_broker(ConnectOptions::servers(urls.clone()), "tidings-replicas");
        let started = Instant::now();
        let err = broker
            .create_stream(StreamConfig::new(&name, [format!("{name}.#")]).replicas(n))
            .expect_err("a count the cluster cannot place is refused");
        let took = started.elapsed();
        assert_eq!(err.kind(), StreamErrorKind::Refused, "replicas({n}): {err}");
        let code = match &err {
            StreamError::Backend { source, .. } => source
                .downcast_ref::<JetStreamError>()
                .and_then(JetStreamError::api_code),
            _ => None,
        };
        assert!(code.is_some(), "replicas({n}): no server code in {err:?}");
        eprintln!("replicas({n}): refused in {took:?} with code {code:?}: {err}");
        broker
            .create_stream(StreamConfig::new(&name, [format!("{name}.#")]).replicas(3))
            .expect("the same name with three replicas");
        broker.close(Duration::from_secs(10));
    }
    // StreamConfig documents 0 as 1: accepted, and reopening it with 1 agrees while 3 is a
    // mismatch (one copy was made).
    let broker = bare_broker(ConnectOptions::servers(urls.clone()), "tidings-replicas");
    broker
        .create_stream(StreamConfig::new("zero", ["zero.#"]).replicas(0))
        .expect("replicas(0) counts as 1");
    broker.close(Duration::from_secs(10));
    let broker = bare_broker(ConnectOptions::servers(urls.clone()), "tidings-replicas");
    broker
        .create_stream(StreamConfig::new("zero", ["zero.#"]).replicas(1))
        .expect("it has one replica");
    broker.close(Duration::from_secs(10));
    let broker = bare_broker(ConnectOptions::servers(urls), "tidings-replicas");
    let err = broker
        .create_stream(StreamConfig::new("zero", ["zero.#"]).replicas(3))
        .expect_err("not three");
    assert!(matches!(err, StreamError::ConfigMismatch { .. }), "{err:?}");
    broker.close(Duration::from_secs(10));
}

#[test]
fn processes_opening_one_new_durable_at_the_same_moment_all_succeed() {
    // R-DIST-3, R-DIST-7: three brokers, each on its own connection to its own node (as
    // three processes would be), create one new replicated stream and open one new durable
    // subscription on it at the same moment, 40 times. On a cluster the server leaves a
    // lookup unanswered while another client creates the same stream or consumer; every
    // open must still succeed (it once timed out after the request timeout).
    let _one = serial();
    let Some(cluster) = NatsCluster::for_test(3) else {
        return;
    };
    let urls = cluster.urls();
    let rounds = if long_run() { 200 } else { 40 };
    let brokers: Vec<Broker> = (0..3)
        .map(|i| bare_broker(preferring(&urls, i), &format!("tidings-open-{i}")))
        .collect();
    let mut slowest = Duration::ZERO;
    for round in 0..rounds {
        let stream = format!("race{round}");
        let barrier = Arc::new(std::sync::Barrier::new(brokers.len()));
        let threads: Vec<_> = brokers
            .iter()
            .map(|broker| {
                let (broker, barrier, stream) =
                    (broker.clone(), Arc::clone(&barrier), stream.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    let started = Instant::now();
                    broker
                        .create_stream(
                            StreamConfig::new(&stream, [format!("{stream}.#")]).replicas(3),
                        )
                        .map_err(|e| format!("creating the stream: {e}"))?;
                    let sub = broker
                        .subscribe(
                            DurableSpec::new(&stream)
                                .name("shared")
                                .filter(format!("{stream}.#")),
                            SubscribeOptions::default(),
                            |_: &Message| Ok(()),
                        )
                        .map_err(|e| format!("opening the durable: {e}"))?;
                    Ok::<_, String>((sub, started.elapsed()))
                })
            })
            .collect();
        let opened: Vec<_> = threads
            .into_iter()
            .map(|t| t.join().expect("opening thread"))
            .collect();
        let failed: Vec<&String> = opened.iter().filter_map(|r| r.as_ref().err()).collect();
        assert!(failed.is_empty(), "round {round}: {failed:?}");
        for (sub, took) in opened.into_iter().flatten() {
            slowest = slowest.max(took);
            drop(sub);
        }
    }
    eprintln!("{rounds} rounds of 3 simultaneous opens: all succeeded, slowest {slowest:?}");
    for broker in brokers {
        broker.close(Duration::from_secs(10));
    }
}
