//! A keyed pipeline across two OS processes on JetStream (R-DIST-6): both run the *same*
//! durable subscription with `Concurrency::PerKey`; the keys are split between them, and
//! each key's orders are handled one at a time, in publish order.
//!
//! ```text
//! cargo run -p tidings-jetstream --example keyed_pipeline
//! ```
//!
//! It starts a throwaway nats-server (installed by `tidings-testkit` when missing), runs
//! itself twice as a worker, publishes 8 keys × 50 orders, waits until every order was
//! handled, and checks that each key's orders were handled in publish order. It prints how
//! the keys were spread and exits non-zero when a check fails.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidings::{
    Broker, Concurrency, DurableSpec, Message, MessageBuilder, StreamConfig, SubscribeOptions,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

const KEYS: u32 = 8;
const ORDERS: u32 = 50;
const PATIENCE: Duration = Duration::from_secs(60);

fn broker(url: &str) -> Result<Broker, Box<dyn std::error::Error>> {
    let backend = JetStreamBackend::builder()
        .ack_wait(Duration::from_secs(5))
        .connect(ConnectOptions::new(url).name("keyed-pipeline"))?;
    let broker = Broker::builder()
        .durable_backend(Arc::new(backend))
        .build()?;
    broker.create_stream(StreamConfig::new("orders", ["orders.#"]))?;
    Ok(broker)
}

/// A worker: handles orders until `<dir>/stop` exists, one line per handled order, each
/// one `write` on the shared `O_APPEND` file (one order across processes, no clocks).
fn worker(url: &str, dir: &Path, name: &str) -> Result<(), Box<dyn std::error::Error>> {
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("handled"))?;
    let broker = broker(url)?;
    let who = name.to_owned();
    let _orders = broker.subscribe(
        DurableSpec::new("orders").name("fulfil").filter("orders.#"),
        SubscribeOptions::new().concurrency(Concurrency::PerKey { max_in_flight: 4 }),
        move |m: &Message| {
            let order = String::from_utf8_lossy(m.payload());
            // The work: a millisecond, then one line saying who handled which order.
            std::thread::sleep(Duration::from_millis(1));
            (&log)
                .write_all(format!("{who} {order}\n").as_bytes())
                .map_err(|e| tidings::HandlerError::retry(e.to_string()))?;
            Ok(())
        },
    )?;
    fs::write(dir.join(format!("ready-{name}")), b"")?;
    let deadline = Instant::now() + PATIENCE;
    while !dir.join("stop").exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    broker.close(Duration::from_secs(10));
    Ok(())
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) -> Result<(), String> {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        if Instant::now() >= deadline {
            return Err(format!("not within {PATIENCE:?}: {what}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// (worker, key, sequence) per handled line, in the order the kernel wrote them.
fn handled(dir: &Path) -> Vec<(String, u32, u32)> {
    fs::read_to_string(dir.join("handled"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (who, order) = l.split_once(' ')?;
            let (key, seq) = order.split_once(':')?;
            Some((
                who.to_owned(),
                key.trim_start_matches('k').parse().ok()?,
                seq.parse().ok()?,
            ))
        })
        .collect()
}

fn run() -> Result<(), String> {
    let server = NatsServer::start(NatsServerOptions::new()).map_err(|e| e.to_string())?;
    let url = server.url();
    let dir: PathBuf = std::env::temp_dir().join(format!("keyed-pipeline-{}", std::process::id()));
    fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut workers: Vec<Child> = Vec::new();
    for name in ["A", "B"] {
        let child = Command::new(&exe)
            .args(["worker", &url, &dir.display().to_string(), name])
            .spawn()
            .map_err(|e| e.to_string())?;
        workers.push(child);
    }
    let result = (|| {
        wait_for("both workers subscribed", || {
            dir.join("ready-A").exists() && dir.join("ready-B").exists()
        })?;
        let publisher = broker(&url).map_err(|e| e.to_string())?;
        for seq in 0..ORDERS {
            for key in 0..KEYS {
                publisher
                    .publish(
                        MessageBuilder::new("orders.placed")
                            .key(format!("k{key}"))
                            .payload(format!("k{key}:{seq}")),
                    )
                    .map_err(|e| e.to_string())?;
            }
        }
        publisher.close(Duration::from_secs(5));
        wait_for("every order handled", || {
            let distinct: BTreeSet<(u32, u32)> =
                handled(&dir).into_iter().map(|(_, k, s)| (k, s)).collect();
            distinct.len() == (KEYS * ORDERS) as usize
        })?;
        check(&handled(&dir))
    })();
    let _ = fs::write(dir.join("stop"), b"");
    for mut w in workers {
        let _ = w.wait();
    }
    let _ = fs::remove_dir_all(&dir);
    result
}

/// Every order handled, and each key's orders first handled in publish order.
fn check(lines: &[(String, u32, u32)]) -> Result<(), String> {
    let mut next: BTreeMap<u32, u32> = BTreeMap::new();
    let mut by: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
    for (who, key, seq) in lines {
        by.entry(who).or_default().insert(*key);
        let expected = next.entry(*key).or_insert(0);
        if *seq == *expected {
            *expected += 1;
        } else if *seq > *expected {
            return Err(format!(
                "key k{key}: order {seq} handled before order {expected}"
            ));
        }
        // A lower one again: a duplicate after a hand-over (at-least-once), not an inversion.
    }
    if next.values().any(|n| *n != ORDERS) || next.len() != KEYS as usize {
        return Err(format!("not every order handled: {next:?}"));
    }
    println!(
        "{} orders handled in per-key order by two processes; keys per worker: {:?}",
        KEYS * ORDERS,
        by.iter().map(|(w, k)| (*w, k.len())).collect::<Vec<_>>()
    );
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("worker") {
        let (Some(url), Some(dir), Some(name)) = (args.get(2), args.get(3), args.get(4)) else {
            eprintln!("usage: keyed_pipeline worker <url> <dir> <name>");
            return ExitCode::FAILURE;
        };
        return match worker(url, Path::new(dir), name) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("worker {name}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("keyed_pipeline failed: {e}");
            ExitCode::FAILURE
        }
    }
}
