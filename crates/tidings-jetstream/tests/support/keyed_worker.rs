//! The worker processes of keyed-group tests (R-DIST-6, R-DIST-8): each is the test binary
//! started again with `<prefix>_ROLE` set, so it runs only its file's `child_worker` entry,
//! which calls [`run`]. A worker subscribes to [`STREAM`] as [`DURABLE`] with per-key
//! concurrency and notes every handler start, success and failure in the shared log
//! ([`super::keyed_log`]); handlers fail one attempt in eight (retried in place).
//! `tests/keyed_group.rs` and `tests/partition_keyed.rs` share it.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tidings::{
    Broker, Concurrency, DurableSpec, HandlerError, Message, MessageBuilder, Retry, StreamConfig,
    SubscribeOptions,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};
use tidings_testkit::child::{self, TestChild};

use super::keyed_log::SLOTS;

pub const STREAM: &str = "orders";
pub const DURABLE: &str = "keyed";
/// The ack wait, which is also the lease: a key moves within about 1.25 of it after its
/// process dies (see docs/design.md). Short, so the tests do not wait long; long enough
/// for the lease rounds (every quarter of it) on a loaded machine.
pub const ACK_WAIT: Duration = Duration::from_secs(3);

/// How one file's workers are started and connected.
#[derive(Debug, Clone, Copy)]
pub struct Workers {
    /// The prefix of the environment variables (`<prefix>_ROLE`, `_URL`, `_DIR`, `_LOG`,
    /// `_SLOW_MS`).
    pub prefix: &'static str,
    /// The connection's request timeout.
    pub request_timeout: Duration,
    /// Generous bound on every wait (never asserted as a speed).
    pub patience: Duration,
}

impl Workers {
    fn var(&self, what: &str) -> String {
        format!("{}_{what}", self.prefix)
    }

    /// A broker on `url` with [`STREAM`] created.
    pub fn broker(&self, url: &str) -> Broker {
        let backend = JetStreamBackend::builder()
            .ack_wait(ACK_WAIT)
            .connect(
                ConnectOptions::new(url)
                    .connect_timeout(Duration::from_secs(5))
                    .request_timeout(self.request_timeout)
                    .name("tidings-keyed-group-test"),
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

    /// The child role (a no-op outside a worker process): subscribe and note every handler
    /// start and end, until the parent creates `stop` (or kills it). `<prefix>_SLOW_MS`
    /// (`lo-hi`): every handler call takes between `lo` and `hi` ms (default 1 ms).
    pub fn run(&self) {
        let Ok(name) = std::env::var(self.var("ROLE")) else {
            return;
        };
        let var = |v: &str| {
            let v = self.var(v);
            std::env::var(&v).unwrap_or_else(|_| panic!("{v} is set"))
        };
        let dir = PathBuf::from(var("DIR"));
        let log = Arc::new(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(var("LOG"))
                .expect("open the shared log"),
        );
        let broker = self.broker(&var("URL"));
        let dice = Dice(AtomicU64::new(
            u64::from(std::process::id()).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
        ));
        let slow: Option<(u64, u64)> = std::env::var(self.var("SLOW_MS")).ok().map(|v| {
            let (lo, hi) = v.split_once('-').expect("lo-hi");
            (lo.parse().expect("lo"), hi.parse().expect("hi"))
        });
        let who = name.clone();
        let _subscription = broker
            .subscribe(
                DurableSpec::new(STREAM).name(DURABLE).filter("orders.#"),
                SubscribeOptions::new()
                    .concurrency(Concurrency::PerKey {
                        max_in_flight: SLOTS,
                    })
                    .retry(Retry::fixed(Duration::from_millis(5), 1000)),
                move |m: &Message| {
                    let what = std::str::from_utf8(m.payload()).expect("utf-8 payload");
                    note(&log, &format!("S {who} {what}\n"));
                    let ms = slow.map_or(1, |(lo, hi)| lo + dice.next() % (hi - lo + 1));
                    std::thread::sleep(Duration::from_millis(ms));
                    if dice.next().is_multiple_of(8) {
                        note(&log, &format!("F {who} {what}\n"));
                        return Err(HandlerError::retry("one attempt in eight fails"));
                    }
                    note(&log, &format!("D {who} {what}\n"));
                    Ok(())
                },
            )
            .expect("subscribe");
        fs::write(dir.join(format!("ready-{name}")), b"").expect("ready file");
        let deadline = Instant::now() + self.patience;
        while !dir.join("stop").exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        broker.close(Duration::from_secs(10));
    }

    /// Starts worker `name` on `url`, logging to `log`, with handlers of `slow` ms.
    pub fn spawn(
        &self,
        url: &str,
        dir: &Path,
        log: &Path,
        name: &str,
        slow: Option<&str>,
    ) -> TestChild {
        let mut env = vec![
            (self.var("ROLE"), name.to_owned()),
            (self.var("URL"), url.to_owned()),
            (self.var("DIR"), dir.display().to_string()),
            (self.var("LOG"), log.display().to_string()),
        ];
        if let Some(slow) = slow {
            env.push((self.var("SLOW_MS"), slow.to_owned()));
        }
        TestChild::spawn("child_worker", env)
    }

    /// Waits until every worker of `names` subscribed.
    pub fn wait_ready(&self, dir: &Path, names: &[&str]) {
        child::wait_until("the workers subscribed", self.patience, || {
            names
                .iter()
                .all(|n| dir.join(format!("ready-{n}")).exists())
        });
    }
}

/// One line, one `write(2)` on an `O_APPEND` file: the kernel places it whole, in one total
/// order with every other process's lines.
fn note(log: &File, line: &str) {
    (&*log)
        .write_all(line.as_bytes())
        .expect("one write to the shared log");
}

/// A small per-process random source (xorshift).
struct Dice(AtomicU64);

impl Dice {
    fn next(&self) -> u64 {
        let mut x = self.0.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0.store(x, Ordering::Relaxed);
        x
    }
}

/// Publishes `keys` × sequence numbers `seqs`, messages `k<key>:<seq>` keyed `k<key>`.
pub fn publish_range(broker: &Broker, keys: u32, seqs: std::ops::Range<u32>) {
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
