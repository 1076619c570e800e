//! `jetstream/keyed-group/processes={1,2,3}`: one durable subscription with
//! `Concurrency::PerKey` shared by 1, 2 or 3 OS processes (a keyed consumer group on the
//! JetStream backend, R-DIST-6), draining keyed records stored before it starts.
//!
//! Each round stores the records (64 keys) in a fresh stream on one local `nats-server`
//! (the testkit launcher), starts the worker processes — this benchmark binary again, with
//! [`WORKER_ENV`] set — lets the key partitions spread over them for [`SETTLE`] (handlers
//! wait for a `go` file meanwhile), and times from `go` until the handlers saw every
//! record. A handler waits 1 ms (the work) and appends one byte to a
//! file all workers share, whose length the parent watches; 16 handlers run at once per
//! process. The figure is records over that time; the median is over rounds. A record seen
//! twice (after a hand-over) counts once more in the file, so the time is until the file
//! holds at least every record.
//!
//! `jetstream/keyed-group/no-op`: the machinery alone (issue 33's bar: ≥ 0.5× the plain
//! durable subscription). One process, a no-op handler: a keyed group (`PerKey`, 16 in
//! flight) drains keyed records against the baseline `plain-durable`, a durable
//! subscription without per-key order draining as many unkeyed records, on the same
//! server, interleaved rounds. The rate is the records after the first over the time from
//! the first handler to the last: consuming, not opening.
//!
//! `jetstream/keyed-group/subscribe`: the same rounds' opening, from the subscribe call to
//! the first handler (a keyed group creates a consumer per partition, a lease bucket, and
//! takes its leases first), in milliseconds, lower is better.
//!
//! Without a `nats-server` binary the cases are emitted with no values and the reason in
//! their notes.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tidings::{
    Broker, Concurrency, DurableSpec, Message, MessageBuilder, StreamConfig, SubscribeOptions,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

use crate::{Case, Filter, Plan};

/// Set in a worker process: `<url> <stream> <dir> <name>`, separated by spaces.
pub(crate) const WORKER_ENV: &str = "TIDINGS_BENCH_KEYED_WORKER";

const PROCESSES: [usize; 3] = [1, 2, 3];
const KEYS: u64 = 64;
const IN_FLIGHT: usize = 16;
const HANDLER_WAIT: Duration = Duration::from_millis(1);
/// The ack wait, which is the group's lease: partitions settle within a few quarters of it.
const LEASE: Duration = Duration::from_secs(3);
/// How long the workers get, once all subscribed, for the partitions to spread over them
/// before the timer starts (eight lease rounds).
const SETTLE: Duration = Duration::from_secs(6);
/// Bound on one round (never reached unless something broke).
const PATIENCE: Duration = Duration::from_secs(120);

fn case_name(processes: usize) -> String {
    format!("jetstream/keyed-group/processes={processes}")
}

const NO_OP: &str = "jetstream/keyed-group/no-op";
const SUBSCRIBE: &str = "jetstream/keyed-group/subscribe";

pub(crate) fn case_names() -> Vec<String> {
    let mut names: Vec<String> = PROCESSES.iter().map(|p| case_name(*p)).collect();
    names.push(NO_OP.to_owned());
    names.push(SUBSCRIBE.to_owned());
    names
}

/// What one in-process drain measured.
struct Drain {
    /// From the subscribe call until the first handler ran: opening the subscription.
    opening: Duration,
    /// Records after the first over the time from the first handler to the last.
    rate: f64,
}

/// One in-process drain of `records` stored records by a fresh durable subscription, keyed
/// (a keyed group with per-key order) or plain, with a no-op handler.
fn no_op_round(
    server: &NatsServer,
    keyed: bool,
    records: u64,
    round: usize,
) -> Result<Drain, String> {
    let stream = format!("noop{}r{round}", if keyed { "k" } else { "p" });
    let broker = broker(&server.url(), &stream)?;
    for i in 0..records {
        let m = MessageBuilder::new(format!("{stream}.order")).payload(i.to_string());
        let m = if keyed {
            m.key(format!("k{}", i % KEYS))
        } else {
            m
        };
        broker.publish(m).map_err(|e| e.to_string())?;
    }
    let options = if keyed {
        SubscribeOptions::new().concurrency(Concurrency::PerKey {
            max_in_flight: IN_FLIGHT,
        })
    } else {
        SubscribeOptions::default()
    };
    let seen = Arc::new(AtomicU64::new(0));
    let (first, last) = (Arc::new(OnceLock::new()), Arc::new(OnceLock::new()));
    let handler = {
        let (seen, first, last) = (Arc::clone(&seen), Arc::clone(&first), Arc::clone(&last));
        move |_m: &Message| {
            first.get_or_init(Instant::now);
            if seen.fetch_add(1, Ordering::Relaxed) + 1 == records {
                last.get_or_init(Instant::now);
            }
            Ok(())
        }
    };
    let started = Instant::now();
    let sub = broker
        .subscribe(DurableSpec::new(&stream).name("group"), options, handler)
        .map_err(|e| e.to_string())?;
    wait("every record handled", || {
        seen.load(Ordering::Relaxed) >= records
    })?;
    drop(sub);
    broker.close(Duration::from_secs(5));
    let (Some(first), Some(last)) = (first.get(), last.get()) else {
        return Err("no handler ran".to_owned());
    };
    Ok(Drain {
        opening: first.duration_since(started),
        rate: (records - 1) as f64 / last.duration_since(*first).as_secs_f64().max(1e-9),
    })
}

/// Both no-op cases from one series of rounds: the drain rate ([`NO_OP`]) and the opening
/// ([`SUBSCRIBE`]), keyed against plain.
fn run_no_op(plan: &Plan, server: &NatsServer, cases: &mut [Case]) {
    let (records, rounds) = if plan.quick { (2_000, 1) } else { (20_000, 5) };
    let (mut keyed, mut plain) = (Vec::new(), Vec::new());
    let mut failures = Vec::new();
    for r in 0..rounds {
        // Interleaved, alternating which goes first.
        for first in [r % 2 == 0, r % 2 != 0] {
            let drains = if first { &mut keyed } else { &mut plain };
            match no_op_round(server, first, records, r) {
                Ok(drain) => drains.push(drain),
                Err(e) => failures.push(format!(
                    "round {r} ({}) failed: {e}",
                    if first { "keyed" } else { "plain" }
                )),
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let rates = |d: &[Drain]| d.iter().map(|d| d.rate).collect::<Vec<_>>();
    let openings = |d: &[Drain]| {
        d.iter()
            .map(|d| d.opening.as_secs_f64() * 1e3)
            .collect::<Vec<_>>()
    };
    let setup = format!(
        "{records} stored records, one process, a no-op handler: a keyed group (PerKey, \
         {IN_FLIGHT} in flight, {KEYS} keys, {} partitions, lease {LEASE:?}) against a plain \
         durable subscription on unkeyed records, same server; median of {rounds} \
         interleaved round(s)",
        tidings_jetstream::DEFAULT_KEY_PARTITIONS
    );
    for case in cases.iter_mut() {
        let (ours, theirs, what) = if case.name == NO_OP {
            (
                median(&mut rates(&keyed)),
                median(&mut rates(&plain)),
                "records after the first over the time from the first handler to the last",
            )
        } else {
            (
                median(&mut openings(&keyed)),
                median(&mut openings(&plain)),
                "from the subscribe call until the first handler ran (creating the consumers, \
                 the lease bucket and the first lease round for the group)",
            )
        };
        case.tidings = ours;
        if let Some(p) = theirs {
            case.baselines.insert("plain-durable".to_owned(), p);
        }
        case.note(format!("{setup}; {what}"));
        for f in &failures {
            case.note(f.clone());
        }
    }
}

fn broker(url: &str, stream: &str) -> Result<Broker, String> {
    let backend = JetStreamBackend::builder()
        .ack_wait(LEASE)
        .connect(ConnectOptions::new(url).name("tidings-bench-keyed"))
        .map_err(|e| e.to_string())?;
    let broker = Broker::builder()
        .durable_backend(Arc::new(backend))
        .build()
        .map_err(|e| e.to_string())?;
    broker
        .create_stream(StreamConfig::new(stream, [format!("{stream}.#")]))
        .map_err(|e| e.to_string())?;
    Ok(broker)
}

/// In a worker process (started by [`run`]): handle until `<dir>/stop` exists, then exit.
/// Returns `None` in any other process.
pub(crate) fn worker_from_env() -> Option<i32> {
    let spec = std::env::var(WORKER_ENV).ok()?;
    let parts: Vec<&str> = spec.split(' ').collect();
    let [url, stream, dir, name] = parts[..] else {
        eprintln!("{WORKER_ENV}: expected `<url> <stream> <dir> <name>`");
        return Some(2);
    };
    match worker(url, stream, Path::new(dir), name) {
        Ok(()) => Some(0),
        Err(e) => {
            eprintln!("keyed-group worker {name}: {e}");
            Some(1)
        }
    }
}

fn worker(url: &str, stream: &str, dir: &Path, name: &str) -> Result<(), String> {
    let seen = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("seen"))
        .map_err(|e| e.to_string())?;
    let go = dir.join("go");
    let broker = broker(url, stream)?;
    let _sub = broker
        .subscribe(
            DurableSpec::new(stream)
                .name("group")
                .filter(format!("{stream}.#")),
            SubscribeOptions::new().concurrency(Concurrency::PerKey {
                max_in_flight: IN_FLIGHT,
            }),
            move |_m: &Message| {
                // Held until the timer starts: the partitions spread first.
                while !go.exists() {
                    std::thread::sleep(Duration::from_millis(2));
                }
                std::thread::sleep(HANDLER_WAIT);
                (&seen)
                    .write_all(b".")
                    .map_err(|e| tidings::HandlerError::retry(e.to_string()))
            },
        )
        .map_err(|e| e.to_string())?;
    fs::write(dir.join(format!("ready-{name}")), b"").map_err(|e| e.to_string())?;
    let deadline = Instant::now() + PATIENCE;
    while !dir.join("stop").exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    broker.close(Duration::from_secs(10));
    Ok(())
}

fn wait(what: &str, mut cond: impl FnMut() -> bool) -> Result<(), String> {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        if Instant::now() >= deadline {
            return Err(format!("not within {PATIENCE:?}: {what}"));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// One round: `records` keyed records drained by `processes` workers; records per second.
fn round(server: &NatsServer, processes: usize, records: u64, round: usize) -> Result<f64, String> {
    let url = server.url();
    let stream = format!("keyed{processes}r{round}");
    let dir: PathBuf = std::env::temp_dir().join(format!(
        "tidings-bench-keyed-{}-{stream}",
        std::process::id()
    ));
    fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let publisher = broker(&url, &stream)?;
    for i in 0..records {
        publisher
            .publish(
                MessageBuilder::new(format!("{stream}.order"))
                    .key(format!("k{}", i % KEYS))
                    .payload(i.to_string()),
            )
            .map_err(|e| e.to_string())?;
    }
    publisher.close(Duration::from_secs(5));
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut workers: Vec<Child> = Vec::new();
    for w in 0..processes {
        let spec = format!("{url} {stream} {} w{w}", dir.display());
        workers.push(
            Command::new(&exe)
                .env(WORKER_ENV, spec)
                .spawn()
                .map_err(|e| e.to_string())?,
        );
    }
    let timed = (|| -> Result<Duration, String> {
        wait("the workers subscribed", || {
            (0..processes).all(|w| dir.join(format!("ready-w{w}")).exists())
        })?;
        std::thread::sleep(SETTLE);
        fs::write(dir.join("go"), b"").map_err(|e| e.to_string())?;
        let started = Instant::now();
        let seen = dir.join("seen");
        wait("every record handled", || {
            fs::metadata(&seen).is_ok_and(|m| m.len() >= records)
        })?;
        Ok(started.elapsed())
    })();
    let _ = fs::write(dir.join("stop"), b"");
    for mut w in workers {
        let _ = w.wait();
    }
    let _ = fs::remove_dir_all(&dir);
    let took: Duration = timed?;
    Ok(records as f64 / took.as_secs_f64())
}

pub(crate) fn run(plan: &Plan, filter: &Filter) -> Vec<Case> {
    let mut cases: Vec<Case> = case_names()
        .into_iter()
        .filter(|n| filter.wants(n))
        .map(|n| {
            if n == SUBSCRIBE {
                Case::new(n, "ms", false)
            } else {
                Case::new(n, "msgs/s", true)
            }
        })
        .collect();
    if cases.is_empty() {
        return cases;
    }
    let server = match NatsServer::start(NatsServerOptions::new()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("keyed-group cases skipped: {e}");
            for c in &mut cases {
                c.note(format!("skipped: {e}"));
            }
            return cases;
        }
    };
    let (records, rounds) = if plan.quick { (3_200, 1) } else { (19_200, 3) };
    let (mut no_op, mut cases): (Vec<Case>, Vec<Case>) = cases
        .into_iter()
        .partition(|c| c.name == NO_OP || c.name == SUBSCRIBE);
    if !no_op.is_empty() {
        run_no_op(plan, &server, &mut no_op);
    }
    for case in &mut cases {
        let processes = PROCESSES
            .iter()
            .copied()
            .find(|p| case.name == case_name(*p))
            .unwrap_or(1);
        let mut rates = Vec::new();
        for r in 0..rounds {
            match round(&server, processes, records, r) {
                Ok(rate) => rates.push(rate),
                Err(e) => case.note(format!("round {r} failed: {e}")),
            }
        }
        rates.sort_by(f64::total_cmp);
        case.tidings = rates.get(rates.len() / 2).copied();
        case.note(format!(
            "{records} keyed records ({KEYS} keys) stored first, drained by {processes} \
             process(es) sharing one PerKey durable subscription ({IN_FLIGHT} in flight each, \
             handler waits {HANDLER_WAIT:?}, lease {LEASE:?}); median of {} round(s), timed \
             after the partitions spread ({SETTLE:?}) until the last record handled",
            rates.len()
        ));
    }
    cases.extend(no_op);
    cases
}
