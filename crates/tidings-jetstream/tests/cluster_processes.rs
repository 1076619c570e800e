//! Processes on different nodes of a real cluster (R-DIST-3, R-DIST-7): two child OS
//! processes, each connected to a node of its own, share one durable subscription on a
//! stream with three replicas, while the parent publishes through the third node. Child A
//! is SIGKILLed holding a backlog; while it is down, the node of child B is SIGKILLed.
//!
//! Each child is this test binary started again with [`ROLE_ENV`] set, so it runs only
//! [`child_cluster_consumer`]. A child appends the index of every message its handler saw
//! to its own file, one unbuffered write per line (a line written before a SIGKILL
//! survives it). The parent checks which node each child is connected to through the
//! nodes' monitoring endpoints ([`NatsCluster::client_names`]).
//!
//! A missing `nats-server` is installed by the launcher (the test skips, with a notice, only
//! under `TIDINGS_SKIP_NATS=1`); every node and child is stopped when the test ends.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidings::durable::DurableBackend;
use tidings::{Broker, DurableSpec, HandlerError, Message, StreamConfig, SubscribeOptions};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};
use tidings_testkit::child::{self, ScratchDir, TestChild, count_files, wait_until};
use tidings_testkit::nats::NatsCluster;

mod support;
use support::{Published, lock, preferring};

const ROLE_ENV: &str = "TIDINGS_CLUSTER_PROCESSES_ROLE";
const URLS_ENV: &str = "TIDINGS_CLUSTER_PROCESSES_URLS";
const NAME_ENV: &str = "TIDINGS_CLUSTER_PROCESSES_NAME";
const DIR_ENV: &str = "TIDINGS_CLUSTER_PROCESSES_DIR";

const STREAM: &str = "work";
const DURABLE: &str = "d";
/// The bound on each request to the cluster.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// What the killed child held comes back after this long.
const ACK_WAIT: Duration = Duration::from_secs(5);
/// Each handler call takes this long, so the children fall behind the publisher and
/// hold a backlog fetched ahead.
const HANDLER_DELAY: Duration = Duration::from_millis(5);
/// Generous bound on every wait (never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(120);

/// A broker on the cluster, trying the nodes in the order of `urls`, named `name` on the
/// server, with the replicated stream opened.
fn broker(urls: Vec<String>, name: &str) -> Broker {
    let backend = JetStreamBackend::builder()
        .ack_wait(ACK_WAIT)
        .connect(
            ConnectOptions::servers(urls)
                .keep_server_order(true)
                .connect_timeout(Duration::from_secs(5))
                .request_timeout(REQUEST_TIMEOUT)
                .name(name),
        )
        .expect("connects to the cluster");
    let broker = Broker::builder()
        .durable_backend(Arc::new(backend) as Arc<dyn DurableBackend>)
        .build()
        .expect("valid configuration");
    broker
        .create_stream(StreamConfig::new(STREAM, ["work.#"]).replicas(3))
        .expect("a stream with three replicas");
    broker
}

/// The child role: subscribe durably as [`DURABLE`] and note every handled index in
/// `<name>.handled`, until the parent writes `stop` (or kills it).
#[test]
#[ignore = "entry point of the child processes the test in this file starts"]
fn child_cluster_consumer() {
    if std::env::var_os(ROLE_ENV).is_none() {
        return;
    }
    let var = |name| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let dir = PathBuf::from(var(DIR_ENV));
    let name = var(NAME_ENV);
    let urls: Vec<String> = var(URLS_ENV).split(',').map(str::to_owned).collect();
    let out = Mutex::new(
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{name}.handled")))
            .expect("open the output file"),
    );
    let broker = broker(urls, &name);
    let _sub = broker
        .subscribe(
            DurableSpec::new(STREAM).name(DURABLE).filter("work.#"),
            SubscribeOptions::default(),
            move |m: &Message| {
                std::thread::sleep(HANDLER_DELAY);
                let line = format!("{}\n", String::from_utf8_lossy(m.payload()));
                lock(&out)
                    .write_all(line.as_bytes())
                    .expect("write the handled index");
                Ok::<(), HandlerError>(())
            },
        )
        .expect("subscribes");
    fs::write(dir.join(format!("ready-{name}")), b"").expect("ready file");
    let deadline = Instant::now() + PATIENCE * 2;
    while !dir.join("stop").exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    broker.close(Duration::from_secs(10));
}

/// How often each index was handled, over every child's file.
fn handled(dir: &Path) -> BTreeMap<u64, u32> {
    let mut counts = BTreeMap::new();
    for name in ["a", "b"] {
        for line in child::complete_lines(&dir.join(format!("{name}.handled"))) {
            let index: u64 = line.parse().expect("a whole index per line");
            *counts.entry(index).or_insert(0) += 1;
        }
    }
    counts
}

fn handled_by(dir: &Path, name: &str) -> usize {
    child::complete_lines(&dir.join(format!("{name}.handled"))).len()
}

#[test]
fn processes_on_different_nodes_finish_everything_across_a_process_and_a_node_kill() {
    let Some(mut cluster) = NatsCluster::for_test(3) else {
        return;
    };
    let urls = cluster.urls();
    let dir = ScratchDir::new("cluster-processes");
    let publisher = broker(preferring(&urls, 2), "tidings-parent");
    let spawn = |name: &str, node: usize| {
        TestChild::spawn(
            "child_cluster_consumer",
            [
                (ROLE_ENV, "consumer".to_owned()),
                (URLS_ENV, preferring(&urls, node).join(",")),
                (NAME_ENV, name.to_owned()),
                (DIR_ENV, dir.path().display().to_string()),
            ],
        )
    };
    let mut a = spawn("a", 0);
    let b = spawn("b", 1);
    wait_until("both children subscribed", PATIENCE, || {
        count_files(dir.path(), "ready-") == 2
    });
    // Each child is on a node of its own, the parent on the third.
    wait_until("each client on its own node", PATIENCE, || {
        cluster.client_names(0).contains(&"a".to_owned())
            && cluster.client_names(1).contains(&"b".to_owned())
            && cluster
                .client_names(2)
                .contains(&"tidings-parent".to_owned())
    });

    let published = Arc::new(Published::default());
    let thread = {
        let (published, publisher) = (Arc::clone(&published), publisher.clone());
        std::thread::spawn(move || {
            for index in 0.. {
                if published.stop.load(Ordering::Acquire) {
                    return;
                }
                published.publish_until_acknowledged(&publisher, "work.items", index);
            }
        })
    };
    wait_until("both children handle some of the work", PATIENCE, || {
        handled_by(dir.path(), "a") >= 20 && handled_by(dir.path(), "b") >= 20
    });
    // A holds a backlog: the publisher outpaces the handlers, which fetch ahead.
    a.kill();
    let a_handled = handled_by(dir.path(), "a");
    let acknowledged_at_kill = published.acknowledged();
    eprintln!(
        "SIGKILLed child a after it handled {a_handled} ({acknowledged_at_kill} acknowledged)"
    );
    let b_before = handled_by(dir.path(), "b");
    wait_until("b goes on alone", PATIENCE, || {
        handled_by(dir.path(), "b") >= b_before + 50
    });
    // While A is down, B's node.
    cluster.kill(1).expect("SIGKILL b's node");
    let (b_before, acked_before) = (handled_by(dir.path(), "b"), published.acknowledged());
    wait_until("b handles again through another node", PATIENCE, || {
        handled_by(dir.path(), "b") >= b_before + 50
            && published.acknowledged() >= acked_before + 50
    });
    cluster.restart(1).expect("restart b's node");
    published.stop.store(true, Ordering::Release);
    thread.join().expect("publisher thread");

    let acknowledged = lock(&published.acknowledged).clone();
    wait_until("every acknowledged message handled", PATIENCE, || {
        let counts = handled(dir.path());
        acknowledged.iter().all(|i| counts.contains_key(i))
    });
    // Sequences from 1, nothing deleted: the last one is how many the stream holds.
    let stream = publisher.stream(STREAM).expect("the stream is open");
    wait_until("the stream's bounds read", PATIENCE, || {
        stream.read(stream.end_offset(), 1).is_ok()
    });
    let stored = stream.end_offset() - 1;
    fs::write(dir.path().join("stop"), b"").expect("stop file");
    let mut b = b;
    b.wait_success(PATIENCE);
    drop(a);

    // What was dead-lettered, read through the durable name once no child runs.
    let sub = publisher
        .subscribe(
            DurableSpec::new(STREAM).name(DURABLE).filter("work.#"),
            SubscribeOptions::default(),
            |_: &Message| Ok::<(), HandlerError>(()),
        )
        .expect("subscribes");
    let dead = sub.durable_dead_letters().expect("reads the DLQ").len();
    drop(sub);

    let counts = handled(dir.path());
    let duplicates: u32 = counts.values().map(|n| n - 1).sum();
    eprintln!(
        "{} acknowledged, {stored} stored, {} handled ({} distinct), {duplicates} duplicates, \
         {dead} dead letters, {} failed publishes retried {:?}, longest publish {:?} \
         (request timeout {REQUEST_TIMEOUT:?})",
        acknowledged.len(),
        counts.values().sum::<u32>(),
        counts.len(),
        published.failures(),
        lock(&published.failures),
        published.longest(),
    );
    // R-DIST-7: nothing acknowledged lost, nothing stored twice, nothing handled that was
    // not acknowledged: acknowledged == stored == handled (distinct).
    assert_eq!(stored, acknowledged.len() as u64, "stored once each");
    assert!(
        counts.keys().copied().eq(acknowledged.iter().copied()),
        "handled exactly the acknowledged messages"
    );
    assert_eq!(dead, 0, "nothing dead-lettered");
    publisher.close(Duration::from_secs(10));
}
