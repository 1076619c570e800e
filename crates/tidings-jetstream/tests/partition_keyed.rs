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
use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use tidings_testkit::child::{self, ScratchDir};
use tidings_testkit::fault_proxy::{Direction, FaultProxy};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

// The marks of a pause and a kill serve tests/keyed_group.rs's cases.
#[allow(dead_code)]
#[path = "support/keyed_log.rs"]
mod keyed_log;
#[path = "support/keyed_worker.rs"]
mod keyed_worker;
use keyed_log::{Mark, check, read_log, report, spread, successes};
use keyed_worker::{ACK_WAIT, Workers, publish_range};

/// This file's workers.
const WORKERS: Workers = Workers {
    prefix: "TIDINGS_PARTITION_KEYED",
    request_timeout: Duration::from_secs(2),
    patience: PATIENCE,
};
/// How long A is cut off: more than twice the ack wait, so its leases surely expire.
const PARTITION: Duration = Duration::from_secs(7);
/// Generous bound on every wait (never asserted as a speed).
const PATIENCE: Duration = Duration::from_secs(90);

/// The child role (see [`Workers::run`]).
#[test]
#[ignore = "entry point of the child processes the test in this file starts"]
fn child_worker() {
    WORKERS.run();
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
    let publisher = WORKERS.broker(&server.url());
    let lines = || child::complete_lines(&log).len();
    let (keys, per_key) = (32, 60);
    let total = (keys * per_key) as usize;
    let third = per_key / 3;
    // A backlog taken by A alone at first.
    publish_range(&publisher, keys, 0..third);
    let a = WORKERS.spawn(&proxy.nats_url(), dir, &log, "A", None);
    WORKERS.wait_ready(dir, &["A"]);
    let b = WORKERS.spawn(&server.url(), dir, &log, "B", None);
    WORKERS.wait_ready(dir, &["B"]);
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
