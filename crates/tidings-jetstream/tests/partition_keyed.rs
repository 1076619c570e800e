//! A keyed-group member partitioned from the server while it holds keys (R-DIST-9, with
//! R-DIST-6 and R-DIST-8): two processes share a durable subscription with
//! `Concurrency::PerKey`; process A reaches the server through a
//! [`FaultProxy`], process B directly. While both handle, A's traffic is blackholed (lost)
//! or stalled (held) both ways for more than twice the ack wait (A is not paused: it runs
//! on, cut off), then the network heals.
//!
//! Each child is this test binary started again with [`ROLE_ENV`] set, so it runs only
//! [`child_worker`]. Every handler start, success and failure is one line of a shared
//! `O_APPEND` log ([`keyed_log`]); handlers fail one attempt in eight (retried in place).
//! The parent checks, per key: no overlap (never two handlers of one key at once, R-DIST-8:
//! no key in two places), no start before every earlier message succeeded, first starts in
//! publish order, no stale start by A from the moment it was cut off (it lost its keys
//! when its leases expired), and every message handled. How long A took to handle again
//! after the heal (without a restart) is printed.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidings::{
    Broker, Concurrency, DurableSpec, HandlerError, Message, MessageBuilder, Retry, StreamConfig,
    SubscribeOptions,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};
use tidings_testkit::child::{self, ScratchDir, TestChild};
use tidings_testkit::fault_proxy::{Direction, FaultProxy};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

// The marks of a pause and a kill serve tests/keyed_group.rs's cases.
#[allow(dead_code)]
#[path = "support/keyed_log.rs"]
mod keyed_log;
use keyed_log::{Mark, SLOTS, check, read_log, report, spread, successes};

const ROLE_ENV: &str = "TIDINGS_PARTITION_KEYED_ROLE";
const URL_ENV: &str = "TIDINGS_PARTITION_KEYED_URL";
const DIR_ENV: &str = "TIDINGS_PARTITION_KEYED_DIR";
const LOG_ENV: &str = "TIDINGS_PARTITION_KEYED_LOG";

const STREAM: &str = "orders";
const DURABLE: &str = "keyed";
/// The ack wait, which is also the lease.
const ACK_WAIT: Duration = Duration::from_secs(3);
/// How long A is cut off: more than twice the ack wait, so its leases surely expire.
const PARTITION: Duration = Duration::from_secs(7);
/// Generous bound on every wait (never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(90);

fn broker(url: &str) -> Broker {
    let backend = JetStreamBackend::builder()
        .ack_wait(ACK_WAIT)
        .connect(
            ConnectOptions::new(url)
                .connect_timeout(Duration::from_secs(5))
                .request_timeout(Duration::from_secs(2))
                .name("tidings-partition-keyed-test"),
        )
        .expect("connects to the test server");
    let broker = Broker::builder()
        .durable_backend(Arc::new(backend))
        .build()
        .expect("valid configuration");
    broker
        .create_stream(StreamConfig::new(STREAM, ["orders.#"]))
        .expect("stream");
    broker
}

/// One line, one `write(2)` on an `O_APPEND` file.
fn note(log: &File, line: &str) {
    (&*log)
        .write_all(line.as_bytes())
        .expect("one write to the shared log");
}

/// A small per-process random source: fails one attempt in eight.
struct Dice(std::sync::atomic::AtomicU64);

impl Dice {
    fn fails(&self) -> bool {
        let mut x = self.0.load(std::sync::atomic::Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0.store(x, std::sync::atomic::Ordering::Relaxed);
        x.is_multiple_of(8)
    }
}

/// The child role: subscribe as [`DURABLE`] with per-key concurrency and note every
/// handler start and end, until the parent creates `stop` (or kills it).
#[test]
#[ignore = "entry point of the child processes the test in this file starts"]
fn child_worker() {
    let Ok(name) = std::env::var(ROLE_ENV) else {
        return;
    };
    let var = |v| std::env::var(v).unwrap_or_else(|_| panic!("{v} is set"));
    let dir = PathBuf::from(var(DIR_ENV));
    let log = Arc::new(
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(var(LOG_ENV))
            .expect("open the shared log"),
    );
    let broker = broker(&var(URL_ENV));
    let dice = Dice(std::sync::atomic::AtomicU64::new(
        u64::from(std::process::id()).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
    ));
    let who = name.clone();
    let _subscription = broker
        .subscribe_durable(
            DurableSpec::new(STREAM).name(DURABLE).filter("orders.#"),
            SubscribeOptions {
                concurrency: Concurrency::PerKey {
                    max_in_flight: SLOTS,
                },
                retry: Retry::fixed(Duration::from_millis(5), 1000),
                ..SubscribeOptions::default()
            },
            move |m: &Message| {
                let what = std::str::from_utf8(m.payload()).expect("utf-8 payload");
                note(&log, &format!("S {who} {what}\n"));
                std::thread::sleep(Duration::from_millis(1));
                if dice.fails() {
                    note(&log, &format!("F {who} {what}\n"));
                    return Err(HandlerError::retry("one attempt in eight fails"));
                }
                note(&log, &format!("D {who} {what}\n"));
                Ok(())
            },
        )
        .expect("subscribe");
    fs::write(dir.join(format!("ready-{name}")), b"").expect("ready file");
    let deadline = Instant::now() + PATIENCE;
    while !dir.join("stop").exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    broker.close(Duration::from_secs(10));
}

fn spawn(url: &str, dir: &Path, log: &Path, name: &str) -> TestChild {
    TestChild::spawn(
        "child_worker",
        [
            (ROLE_ENV, name.to_owned()),
            (URL_ENV, url.to_owned()),
            (DIR_ENV, dir.display().to_string()),
            (LOG_ENV, log.display().to_string()),
        ],
    )
}

fn wait_ready(dir: &Path, name: &str) {
    child::wait_until("the worker subscribed", PATIENCE, || {
        dir.join(format!("ready-{name}")).exists()
    });
}

/// Publishes `keys` × sequence numbers `seqs`, messages `k<key>:<seq>`.
fn publish_range(broker: &Broker, keys: u32, seqs: std::ops::Range<u32>) {
    for seq in seqs {
        for key in 0..keys {
            broker
                .publish(
                    MessageBuilder::new("orders.placed")
                        .key(format!("k{key}"))
                        .payload(format!("k{key}:{seq}")),
                )
                .expect("publish");
        }
    }
}

/// R-DIST-9, R-DIST-8, R-DIST-6: a member cut off from the server (every byte blackholed,
/// both ways, for more than twice the ack wait) while it holds keys loses them to the
/// other member, starts nothing stale and never runs a key at the same time as the other,
/// and takes keys again after the heal without a restart; per-key order holds.
#[test]
fn a_member_partitioned_while_holding_keys_runs_no_key_in_two_places() {
    partitioned_member("blackholed", |p| p.blackhole(Direction::Both));
}

/// R-DIST-9, R-DIST-8, R-DIST-6: as above, with the member's traffic stalled both ways
/// (held, delivered intact at the heal: TCP over a link that comes back before the sender
/// gives up) instead of lost.
#[test]
fn a_member_stalled_while_holding_keys_runs_no_key_in_two_places() {
    partitioned_member("stalled", |p| p.stall(Direction::Both));
}

/// The scenario of the tests above, with `cut_off` applied to A's proxy.
fn partitioned_member(test: &str, cut_off: impl Fn(&FaultProxy)) {
    let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
        return;
    };
    let proxy = FaultProxy::start(SocketAddr::from((Ipv4Addr::LOCALHOST, server.port())))
        .expect("a proxy in front of the server");
    let scratch = ScratchDir::new(&format!("partition-keyed-{test}"));
    let dir = scratch.path();
    let log = dir.join("log");
    let publisher = broker(&server.url());
    let lines = || child::complete_lines(&log).len();
    let (keys, per_key) = (32, 60);
    let total = (keys * per_key) as usize;
    let third = per_key / 3;
    // A backlog taken by A alone at first.
    publish_range(&publisher, keys, 0..third);
    let a = spawn(&proxy.nats_url(), dir, &log, "A");
    wait_ready(dir, "A");
    let b = spawn(&server.url(), dir, &log, "B");
    wait_ready(dir, "B");
    child::wait_until("a quarter of the first batch handled", PATIENCE, || {
        successes(&log) >= (keys * third / 4) as usize
    });
    let a_keys: BTreeSet<String> = read_log(&log)
        .iter()
        .filter(|l| l.who == "A" && l.kind == 'S')
        .map(|l| l.key.clone())
        .collect();
    assert!(!a_keys.is_empty(), "A took keys");
    cut_off(&proxy);
    let cut_at = lines();
    let cut = Instant::now();
    // While A is cut off: its keys wait until its leases expire, then move to B.
    publish_range(&publisher, keys, third..2 * third);
    child::wait_until("B handled one of A's keys", PATIENCE, || {
        read_log(&log)[cut_at..]
            .iter()
            .any(|l| l.who == "B" && l.kind == 'D' && a_keys.contains(&l.key))
    });
    let moved_after = cut.elapsed();
    std::thread::sleep(PARTITION.saturating_sub(cut.elapsed()));
    let a_during = read_log(&log)[cut_at..]
        .iter()
        .filter(|l| l.who == "A" && l.kind == 'S')
        .count();
    proxy.heal();
    let healed_at = lines();
    let healed = Instant::now();
    // After the heal A takes keys again: the last batch comes slowly enough for that.
    let a_again = std::thread::scope(|scope| {
        scope.spawn(|| {
            for seq in 2 * third..per_key {
                publish_range(&publisher, keys, seq..seq + 1);
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        child::wait_until("A starts a handler again after the heal", PATIENCE, || {
            read_log(&log)[healed_at..]
                .iter()
                .any(|l| l.who == "A" && l.kind == 'S')
        });
        healed.elapsed()
    });
    child::wait_until("every message handled", PATIENCE, || {
        let done: BTreeSet<(String, u32)> = read_log(&log)
            .into_iter()
            .filter(|l| l.kind == 'D')
            .map(|l| (l.key, l.seq))
            .collect();
        done.len() >= total
    });
    fs::write(dir.join("stop"), b"").expect("stop file");
    for mut c in [a, b] {
        c.wait_success(PATIENCE);
    }
    let all = read_log(&log);
    let a_after = all[healed_at..]
        .iter()
        .filter(|l| l.who == "A" && l.kind == 'S')
        .count();
    let v = check(&all, &[(cut_at, Mark::CutOff("A".into()))], keys, per_key);
    eprintln!(
        "{test}: cut off at line {cut_at} for {PARTITION:?} (ack wait {ACK_WAIT:?}); B \
         handled one of A's {} keys {moved_after:?} after the cut; A started {a_during} \
         handlers while cut off; healed at line {healed_at}; A started a handler again \
         {a_again:?} after the heal, {a_after} in all; proxy {:?}",
        a_keys.len(),
        proxy.stats(),
    );
    report(
        test,
        &v,
        &spread(&all[..cut_at]),
        &spread(&all[healed_at..]),
    );
    if !v.clean()
        && let Some(keep) = std::env::var_os("TIDINGS_KEYED_KEEP_LOG")
    {
        let _ = fs::copy(&log, keep);
    }
    assert!(v.clean(), "per-key order or fencing broke: {v:#?}");
    assert!(a_after > 0, "A took keys again after the heal");
}
