//! `tidings-bench soak`: a mixed workload for a given time, with kills and restarts,
//! sampled every few seconds; the verdict is R-LIM-3 (memory, threads, descriptors and
//! server-side objects stay flat after a warm-up; nothing acknowledged is lost; every
//! effect once).
//!
//! ```text
//! tidings-bench soak [--secs 120] [--sample-secs 5] [--cycle-secs 4] [--warmup 0.2]
//!                    [--max-age-secs 300] [--json PATH] [--plot DIR]
//! ```
//!
//! The workload, all at once for `--secs`, on a `nats-server` the testkit starts on
//! 127.0.0.1 (and stops at the end):
//! * **in-process fan-out**: one broker, 8 subscriptions for the whole run and 4 that are
//!   dropped and made anew every few cycles, 1,000 messages/s;
//! * **embedded durable**: a child process publishing to the embedded log (synced) and
//!   handling through a durable subscription, SIGKILLed and restarted;
//! * **JetStream keyed group**: three member processes of one `Concurrency::PerKey` durable
//!   subscription; the oldest is SIGKILLed and a new one joins;
//! * **the SQL recipe**: a child consuming payments through `Transactional::sqlite`, SIGKILLed
//!   and restarted.
//!
//! Every `--cycle-secs` one of them is hit, in turn. Every `--sample-secs` the soak samples
//! its own RSS, threads and open descriptors, the server's, the workers' (summed), and the
//! server's streams, consumers and buckets. At the end it stops publishing, lets every
//! worker drain, and checks the ledgers: every acknowledged publish handled (redeliveries
//! allowed, losses not), every payment's effect applied once. It exits non-zero with the
//! reasons when a check fails.

mod chart;
mod probe;
mod verdict;
mod workers;

use std::collections::{BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clap::Parser;
use serde::Serialize;
use tidings::{Broker, Message, MessageBuilder, Overflow, SubscribeOptions, Subscription};
use tidings_testkit::child::{ScratchDir, TestChild};
use tidings_testkit::nats::{NatsServer, NatsServerOptions};

use crate::BenchError;
use probe::{Footprint, ServerProbe};
use verdict::{Bound, Flatness};
pub(crate) use workers::worker_from_env;

/// `tidings-bench soak` arguments.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "tidings-bench soak",
    about = "Mixed workload with kills and restarts; checks that resources stay flat and \
             nothing acknowledged is lost (R-LIM-3)"
)]
pub(crate) struct SoakArgs {
    /// How long the workload runs, seconds (the drain and checks come after).
    #[arg(long, default_value_t = 120)]
    pub secs: u64,
    /// Seconds between samples.
    #[arg(long, default_value_t = 5)]
    pub sample_secs: u64,
    /// Seconds between kills (one workload in turn).
    #[arg(long, default_value_t = 4)]
    pub cycle_secs: u64,
    /// Fraction of the run left out of the flatness fit (warm-up); it should cover
    /// `--max-age-secs` and the server's 30 s clean-up of idle ephemeral consumers.
    #[arg(long, default_value_t = 0.2)]
    pub warmup: f64,
    /// How long every stream keeps records: the streams (and the server's memory for them)
    /// stop growing after this.
    #[arg(long, default_value_t = workers::DEFAULT_MAX_AGE.as_secs())]
    pub max_age_secs: u64,
    /// Write the samples, slopes and ledger checks as JSON to PATH.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Write SVG charts of the samples into DIR (created if missing).
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Run nothing: judge (and plot) the samples in PATH, the standard error of an earlier
    /// run that was cut short. Its ledgers are not checked.
    #[arg(long, value_name = "PATH")]
    pub from_log: Option<PathBuf>,
}

/// One sampled series and the bound it is held to (`None`: reported, not judged).
pub(crate) struct SeriesSpec {
    pub name: &'static str,
    pub unit: &'static str,
    pub bound: Option<Bound>,
}

const fn bound(per_hour: f64, rise: f64) -> Option<Bound> {
    Some(Bound::trend(per_hour, rise))
}

/// R-LIM-3's bounds. The soak process and the server live through the whole run, so their
/// growth is what a leak looks like. The workers are killed and started all the time: their
/// summed footprint is a sawtooth, plotted and reported but not judged. Streams and buckets
/// may not grow at all: one more at the very end fits a rise of about half an object, and
/// neither may consumers: the durable ones are made once, and a keyed group's lease round
/// reads its bucket without one (before, each round's key listing left an ephemeral
/// consumer for 30 s: about 120 stood, and the bound was 10).
pub(crate) const SERIES: [SeriesSpec; 12] = [
    SeriesSpec {
        name: "soak RSS",
        unit: "MiB",
        bound: bound(8.0, 4.0),
    },
    SeriesSpec {
        name: "soak threads",
        unit: "threads",
        bound: bound(2.0, 2.0),
    },
    SeriesSpec {
        name: "soak fds",
        unit: "fds",
        bound: bound(4.0, 4.0),
    },
    SeriesSpec {
        name: "nats-server RSS",
        unit: "MiB",
        // Its garbage collector swings it by ~40 MiB (55-98 MiB in a 27-minute run): a
        // two-minute window can rise 12 MiB with nothing leaking.
        bound: bound(16.0, 48.0),
    },
    SeriesSpec {
        name: "nats-server threads",
        unit: "threads",
        // A high-water mark (Go keeps every OS thread it starts): 11 → 19 in one step of
        // a two-minute run, 22-23 for the last 48 minutes of an hour. A leak of one per
        // kill would pass 64 within minutes of an hour's 225 kills.
        bound: Some(Bound::ceiling(64.0)),
    },
    SeriesSpec {
        name: "nats-server fds",
        unit: "fds",
        bound: bound(4.0, 4.0),
    },
    SeriesSpec {
        name: "workers RSS",
        unit: "MiB",
        bound: None,
    },
    SeriesSpec {
        name: "workers threads",
        unit: "threads",
        bound: None,
    },
    SeriesSpec {
        name: "workers fds",
        unit: "fds",
        bound: None,
    },
    SeriesSpec {
        name: "streams",
        unit: "streams",
        bound: bound(1.0, 1.0),
    },
    SeriesSpec {
        name: "consumers",
        unit: "consumers",
        bound: bound(1.0, 1.0),
    },
    SeriesSpec {
        name: "KV buckets",
        unit: "buckets",
        bound: bound(1.0, 1.0),
    },
];

/// One sample: seconds since the start, one value per [`SERIES`] entry.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Sample {
    pub t: f64,
    pub values: Vec<Option<f64>>,
}

/// A series' outcome.
#[derive(Debug, Clone, Serialize)]
struct SeriesOutcome {
    name: &'static str,
    unit: &'static str,
    judged: bool,
    flatness: Option<Flatness>,
}

/// Published against handled, for one workload.
#[derive(Debug, Clone, Serialize)]
struct LedgerCheck {
    workload: &'static str,
    /// Publishes acknowledged (returned `Ok`, stored).
    acknowledged: usize,
    /// Distinct acknowledged ids handled.
    handled: usize,
    /// Handler calls beyond the first per id (redeliveries after kills).
    redelivered: usize,
    /// Acknowledged ids never handled.
    lost: usize,
    /// Up to ten of them.
    lost_ids: Vec<u64>,
    /// Ids handled that no acknowledged publish had (a publish stored just before its
    /// publisher was killed, before it could write the ledger line).
    unacknowledged_handled: usize,
    /// Effects applied more than once (SQL only: rows beyond one per id).
    effects_twice: usize,
}

#[derive(Debug, Clone, Default, Serialize)]
struct Kills {
    embedded: u64,
    keyed_members: u64,
    keyed_joins: u64,
    sql: u64,
    fanout_resubscribes: u64,
}

/// Everything a soak produced (the `--json` file).
#[derive(Debug, Clone, Serialize)]
struct SoakReport {
    command: String,
    machine: String,
    load_average: String,
    secs: u64,
    sample_secs: u64,
    cycle_secs: u64,
    warmup_secs: f64,
    max_age_secs: u64,
    kills: Kills,
    series: Vec<SeriesOutcome>,
    ledgers: Vec<LedgerCheck>,
    fanout: FanoutOutcome,
    publish_failures: u64,
    sample_errors: Vec<String>,
    failures: Vec<String>,
    pass: bool,
    samples: Vec<Sample>,
}

/// Parse the soak's arguments (`args[0]` is `soak`), run it, print the verdict.
pub(crate) fn main_with_args(args: &[String]) -> Result<(), BenchError> {
    let args = match SoakArgs::try_parse_from(args) {
        Ok(a) => a,
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) =>
        {
            return crate::say(format_args!("{e}"));
        }
        Err(e) => return Err(BenchError::Args(e.to_string())),
    };
    if args.secs == 0 || args.sample_secs == 0 || args.cycle_secs == 0 || args.max_age_secs == 0 {
        return Err(BenchError::Args(
            "--secs, --sample-secs, --cycle-secs and --max-age-secs must be at least 1\n".into(),
        ));
    }
    if !(0.0..0.9).contains(&args.warmup) {
        return Err(BenchError::Args("--warmup must be in [0, 0.9)\n".into()));
    }
    let report = match &args.from_log {
        Some(path) => from_log(&args, path)?,
        None => run(&args)?,
    };
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| BenchError::Setup(format!("serialising JSON: {e}")))?;
        crate::write_file(path, &text)?;
    }
    if let Some(dir) = &args.plot {
        std::fs::create_dir_all(dir).map_err(|error| BenchError::Io {
            path: dir.clone(),
            error,
        })?;
        for (file, svg) in chart::charts(&report.samples, report.warmup_secs) {
            crate::write_file(&dir.join(file), &svg)?;
        }
    }
    crate::say(format_args!("{}", summary(&report)))?;
    if report.pass {
        Ok(())
    } else {
        Err(BenchError::Soak(report.failures.join("\n")))
    }
}

fn command_line(args: &SoakArgs) -> String {
    let mut cmd = format!(
        "cargo run --release -p tidings-bench -- soak --secs {} --sample-secs {} --cycle-secs {} --warmup {} --max-age-secs {}",
        args.secs, args.sample_secs, args.cycle_secs, args.warmup, args.max_age_secs
    );
    if let Some(p) = &args.plot {
        cmd.push_str(&format!(" --plot {}", p.display()));
    }
    if let Some(p) = &args.json {
        cmd.push_str(&format!(" --json {}", p.display()));
    }
    cmd
}

/// The in-process fan-out workload.
struct Fanout {
    broker: Broker,
    /// Subscriptions that live through the run, each with its delivery count.
    permanent: Vec<(Subscription, Arc<AtomicU64>)>,
    /// Subscriptions dropped and made anew.
    churn: Vec<Subscription>,
    stop: Arc<AtomicBool>,
    publisher: Option<JoinHandle<FanoutPublished>>,
}

#[derive(Debug, Default)]
struct FanoutPublished {
    published: u64,
    refused_permanent: u64,
    failed: u64,
    first_error: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
struct FanoutOutcome {
    published: u64,
    /// Deliveries each permanent subscription got (each must equal `published`).
    delivered: Vec<u64>,
    refused_permanent: u64,
    publish_failures: u64,
    close_clean: bool,
}

const FAN_PERMANENT: usize = 8;
const FAN_CHURN: usize = 4;
/// Messages per 50 ms tick: 1,000 per second.
const FAN_BATCH: u64 = 50;
const TICK: Duration = Duration::from_millis(50);

fn counting(
    count: &Arc<AtomicU64>,
) -> impl Fn(&Message) -> Result<(), tidings::HandlerError> + Send + Sync + 'static {
    let count = count.clone();
    move |_m: &Message| {
        count.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

impl Fanout {
    fn start() -> Result<Self, String> {
        let broker = Broker::new();
        // The permanent subscriptions make the publisher wait for room rather than refuse,
        // so each must get every message.
        let blocking = SubscribeOptions::new().overflow(Overflow::Block {
            timeout: Duration::from_secs(30),
        });
        let mut permanent = Vec::new();
        for _ in 0..FAN_PERMANENT {
            let count = Arc::new(AtomicU64::new(0));
            let sub = broker
                .subscribe("fan.#", blocking.clone(), counting(&count))
                .map_err(|e| format!("fan-out subscribe: {e}"))?;
            permanent.push((sub, count));
        }
        let mut fan = Self {
            broker,
            permanent,
            churn: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
            publisher: None,
        };
        fan.resubscribe()?;
        let ids: BTreeSet<_> = fan.permanent.iter().map(|(s, _)| s.id()).collect();
        let (broker, stop) = (fan.broker.clone(), fan.stop.clone());
        fan.publisher = Some(std::thread::spawn(move || {
            let mut out = FanoutPublished::default();
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..FAN_BATCH {
                    match broker
                        .publish(MessageBuilder::new("fan.tick").payload(out.published.to_string()))
                    {
                        Ok(report) => {
                            out.published += 1;
                            out.refused_permanent += report
                                .refused
                                .iter()
                                .filter(|(id, _)| ids.contains(id))
                                .count()
                                as u64;
                        }
                        Err(e) => {
                            out.failed += 1;
                            out.first_error.get_or_insert_with(|| e.to_string());
                        }
                    }
                }
                std::thread::sleep(TICK);
            }
            out
        }));
        Ok(fan)
    }

    /// Drops the churning subscriptions and makes new ones.
    fn resubscribe(&mut self) -> Result<(), String> {
        self.churn.clear();
        for _ in 0..FAN_CHURN {
            let count = Arc::new(AtomicU64::new(0));
            self.churn.push(
                self.broker
                    .subscribe("fan.#", SubscribeOptions::default(), counting(&count))
                    .map_err(|e| format!("fan-out resubscribe: {e}"))?,
            );
        }
        Ok(())
    }

    fn stop_publishing(&mut self) -> FanoutPublished {
        self.stop.store(true, Ordering::Relaxed);
        self.publisher
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }

    fn finish(mut self, published: &FanoutPublished) -> FanoutOutcome {
        self.broker.wait_idle(Duration::from_secs(60));
        let delivered = self
            .permanent
            .iter()
            .map(|(_, c)| c.load(Ordering::Relaxed))
            .collect();
        self.churn.clear();
        self.permanent.clear();
        let close = self.broker.close(Duration::from_secs(10));
        FanoutOutcome {
            published: published.published,
            delivered,
            refused_permanent: published.refused_permanent,
            publish_failures: published.failed,
            close_clean: close.is_clean(),
        }
    }
}

/// The JetStream publisher's ledger.
#[derive(Debug, Default)]
struct JsPublished {
    keyed: Vec<u64>,
    payments: Vec<u64>,
    failed: u64,
    first_error: Option<String>,
}

/// Keyed records and payments per 50 ms tick: 80/s and 40/s.
const KEYED_BATCH: u64 = 4;
const PAYMENT_BATCH: u64 = 2;
const KEYS: u64 = 32;

/// Whether a publish was acknowledged (stored in its stream); a failure is counted.
fn acknowledged(
    r: Result<tidings::PublishReport, tidings::PublishError>,
    out: &mut JsPublished,
) -> bool {
    let failure = match r {
        Ok(report) if !report.streams.is_empty() => return true,
        Ok(report) => format!("stored in no stream: {report:?}"),
        Err(e) => e.to_string(),
    };
    out.failed += 1;
    out.first_error.get_or_insert(failure);
    false
}

fn js_publisher(broker: Broker, stop: Arc<AtomicBool>) -> JsPublished {
    let mut out = JsPublished::default();
    let mut id = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..KEYED_BATCH {
            id += 1;
            let r = broker.publish(
                MessageBuilder::new(format!("{}.order", workers::KEYED_STREAM))
                    .key(format!("k{}", id % KEYS))
                    .payload(id.to_string()),
            );
            if acknowledged(r, &mut out) {
                out.keyed.push(id);
            }
        }
        for _ in 0..PAYMENT_BATCH {
            id += 1;
            let (payload, _) = workers::payment(id);
            let r = broker.publish(
                MessageBuilder::new(format!("{}.payment", workers::SQL_STREAM)).payload(payload),
            );
            if acknowledged(r, &mut out) {
                out.payments.push(id);
            }
        }
        std::thread::sleep(TICK);
    }
    out
}

/// The worker processes and their directories.
struct Workers {
    url: String,
    embedded_dir: PathBuf,
    keyed_dir: PathBuf,
    sql_dir: PathBuf,
    embedded: (TestChild, String),
    keyed: VecDeque<(TestChild, String)>,
    sql: (TestChild, String),
    next: u64,
    kills: Kills,
    /// Workers that exited by themselves during the run (a crash is a failure).
    crashed: Vec<String>,
}

const KEYED_MEMBERS: usize = 3;

impl Workers {
    fn start(root: &Path, url: &str) -> Result<Self, String> {
        let mk = |name: &str| -> Result<PathBuf, String> {
            let d = root.join(name);
            std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
            Ok(d)
        };
        let (embedded_dir, keyed_dir, sql_dir) = (mk("embedded")?, mk("keyed")?, mk("sql")?);
        workers::create_ledger(&sql_dir.join("ledger.db"))?;
        let mut next = 1;
        let embedded = Self::spawn_embedded(&embedded_dir, &mut next)?;
        let sql = Self::spawn_sql(&sql_dir, url, &mut next)?;
        let mut keyed = VecDeque::new();
        for _ in 0..KEYED_MEMBERS {
            keyed.push_back(Self::spawn_keyed(&keyed_dir, url, &mut next)?);
        }
        Ok(Self {
            url: url.to_owned(),
            embedded_dir,
            keyed_dir,
            sql_dir,
            embedded,
            keyed,
            sql,
            next,
            kills: Kills::default(),
            crashed: Vec::new(),
        })
    }

    fn spawn_embedded(dir: &Path, next: &mut u64) -> Result<(TestChild, String), String> {
        let g = *next;
        *next += 1;
        let label = format!("embedded-{g}");
        let args = [
            "embedded".to_owned(),
            dir.display().to_string(),
            g.to_string(),
        ];
        Ok((workers::spawn(dir, &label, &args)?, label))
    }

    fn spawn_keyed(dir: &Path, url: &str, next: &mut u64) -> Result<(TestChild, String), String> {
        let g = *next;
        *next += 1;
        let label = format!("member-{g}");
        let args = [
            "keyed".to_owned(),
            url.to_owned(),
            dir.display().to_string(),
            label.clone(),
        ];
        Ok((workers::spawn(dir, &label, &args)?, label))
    }

    fn spawn_sql(dir: &Path, url: &str, next: &mut u64) -> Result<(TestChild, String), String> {
        let g = *next;
        *next += 1;
        let label = format!("sql-{g}");
        let args = [
            "sql".to_owned(),
            url.to_owned(),
            dir.display().to_string(),
            g.to_string(),
        ];
        Ok((workers::spawn(dir, &label, &args)?, label))
    }

    fn kill_embedded(&mut self) -> Result<(), String> {
        self.embedded.0.kill();
        self.kills.embedded += 1;
        self.embedded = Self::spawn_embedded(&self.embedded_dir, &mut self.next)?;
        Ok(())
    }

    /// The oldest member is killed and a new one joins.
    fn kill_member(&mut self) -> Result<(), String> {
        if let Some((mut oldest, _)) = self.keyed.pop_front() {
            oldest.kill();
            self.kills.keyed_members += 1;
        }
        self.keyed.push_back(Self::spawn_keyed(
            &self.keyed_dir,
            &self.url,
            &mut self.next,
        )?);
        self.kills.keyed_joins += 1;
        Ok(())
    }

    fn kill_sql(&mut self) -> Result<(), String> {
        self.sql.0.kill();
        self.kills.sql += 1;
        self.sql = Self::spawn_sql(&self.sql_dir, &self.url, &mut self.next)?;
        Ok(())
    }

    fn all(&mut self) -> impl Iterator<Item = &mut (TestChild, String)> {
        std::iter::once(&mut self.embedded)
            .chain(std::iter::once(&mut self.sql))
            .chain(self.keyed.iter_mut())
    }

    fn pids(&mut self) -> Vec<u32> {
        self.all().map(|(c, _)| c.pid()).collect()
    }

    /// Workers that exited without being told to: recorded, and replaced.
    fn replace_crashed(&mut self) -> Result<(), String> {
        let mut crashed = Vec::new();
        for (child, label) in self.all() {
            if let Some(status) = child.exited() {
                crashed.push(format!("worker {label} exited by itself ({status})"));
            }
        }
        if crashed.is_empty() {
            return Ok(());
        }
        for c in &crashed {
            progress(format_args!("soak: {c}"));
        }
        self.crashed.extend(crashed);
        if self.embedded.0.exited().is_some() {
            self.embedded = Self::spawn_embedded(&self.embedded_dir, &mut self.next)?;
        }
        if self.sql.0.exited().is_some() {
            self.sql = Self::spawn_sql(&self.sql_dir, &self.url, &mut self.next)?;
        }
        let keyed_dir = self.keyed_dir.clone();
        for member in &mut self.keyed {
            if member.0.exited().is_some() {
                *member = Self::spawn_keyed(&keyed_dir, &self.url, &mut self.next)?;
            }
        }
        Ok(())
    }
}

/// Waits for a worker told to stop to exit; its failure (with its standard error) if it
/// does not exit cleanly in time.
fn wait_exit(
    dir: &Path,
    child: &mut TestChild,
    label: &str,
    patience: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + patience;
    loop {
        if let Some(status) = child.exited() {
            if status.success() {
                return Ok(());
            }
            let err = std::fs::read_to_string(dir.join(format!("{label}.err"))).unwrap_or_default();
            return Err(format!(
                "worker {label} ended with {status}: {}",
                err.trim()
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "worker {label} did not finish within {patience:?} of stop"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn ledger_check(workload: &'static str, acknowledged: &[u64], handled: &[u64]) -> LedgerCheck {
    let handled_set: BTreeSet<u64> = handled.iter().copied().collect();
    let acked: BTreeSet<u64> = acknowledged.iter().copied().collect();
    let lost: Vec<u64> = acked.difference(&handled_set).copied().collect();
    LedgerCheck {
        workload,
        acknowledged: acked.len(),
        handled: acked.intersection(&handled_set).count(),
        redelivered: handled.len() - handled_set.len(),
        lost: lost.len(),
        lost_ids: lost.iter().take(10).copied().collect(),
        unacknowledged_handled: handled_set.difference(&acked).count(),
        effects_twice: 0,
    }
}

/// Polls `cond` every second until it holds or `patience` passes; whether it held.
fn wait_for(patience: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + patience;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A progress line on standard error. A failed write is ignored (`eprintln!` would panic,
/// and a full disk under a redirected standard error must not end an hour's run).
pub(crate) fn progress(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// How long the workers get after the workload to catch up before the ledgers are checked.
const CATCH_UP: Duration = Duration::from_secs(180);

#[allow(clippy::too_many_lines)] // one run, read top to bottom: set up, loop, drain, check
fn run(args: &SoakArgs) -> Result<SoakReport, BenchError> {
    let setup = |e: String| BenchError::Setup(e);
    workers::set_max_age(Duration::from_secs(args.max_age_secs));
    let load_before = crate::output::loadavg();
    let scratch = ScratchDir::new("soak");
    let server = NatsServer::start(NatsServerOptions::new())
        .map_err(|e| setup(format!("starting nats-server: {e}")))?;
    let url = server.url();
    let me = std::process::id();
    let server_pid = probe::child_named(me, "nats-server");
    let probe = ServerProbe::connect(&url).map_err(setup)?;
    let js = workers::jetstream_broker(&url, "soak-publisher").map_err(setup)?;
    let mut fanout = Fanout::start().map_err(setup)?;
    let mut workers = Workers::start(scratch.path(), &url).map_err(setup)?;
    let js_stop = Arc::new(AtomicBool::new(false));
    let js_thread = {
        let (broker, stop) = (js.clone(), js_stop.clone());
        std::thread::spawn(move || js_publisher(broker, stop))
    };

    let started = Instant::now();
    let secs = Duration::from_secs(args.secs);
    let sample_every = Duration::from_secs(args.sample_secs);
    let cycle_every = Duration::from_secs(args.cycle_secs);
    let mut samples: Vec<Sample> = Vec::new();
    let mut sample_errors: Vec<String> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    let (mut next_sample, mut next_cycle) = (Duration::ZERO, cycle_every);
    let mut cycle = 0u64;
    progress(format_args!(
        "soak: {} s of workload on {url}, a sample every {} s, a kill every {} s",
        args.secs, args.sample_secs, args.cycle_secs
    ));
    loop {
        let now = started.elapsed();
        if now >= next_sample {
            next_sample += sample_every;
            let me = Footprint::of(me);
            let srv = server_pid.and_then(Footprint::of);
            let kids = Footprint::sum(workers.pids().into_iter().filter_map(Footprint::of));
            let objects = probe.objects().map_err(|e| {
                if sample_errors.len() < 20 {
                    sample_errors.push(format!("at {:.0} s: {e}", now.as_secs_f64()));
                }
            });
            let objects = objects.ok();
            let values = vec![
                me.map(|f| f.rss_mib),
                me.map(|f| f.threads),
                me.map(|f| f.fds),
                srv.map(|f| f.rss_mib),
                srv.map(|f| f.threads),
                srv.map(|f| f.fds),
                Some(kids.rss_mib),
                Some(kids.threads),
                Some(kids.fds),
                objects.map(|o| o.streams),
                objects.map(|o| o.consumers),
                objects.map(|o| o.buckets),
            ];
            let line: Vec<String> = SERIES
                .iter()
                .zip(&values)
                .map(|(s, v)| format!("{} {}", s.name, v.map_or("-".into(), |v| format!("{v:.1}"))))
                .collect();
            progress(format_args!(
                "[{:>6.0}s] {}",
                now.as_secs_f64(),
                line.join(", ")
            ));
            samples.push(Sample {
                t: now.as_secs_f64(),
                values,
            });
        }
        if now >= secs {
            break;
        }
        if now >= next_cycle {
            next_cycle += cycle_every;
            let hit = match cycle % 4 {
                0 => workers.kill_embedded(),
                1 => workers.kill_member(),
                2 => workers.kill_sql(),
                _ => {
                    workers.kills.fanout_resubscribes += 1;
                    fanout.resubscribe()
                }
            };
            cycle += 1;
            hit.map_err(setup)?;
        }
        workers.replace_crashed().map_err(setup)?;
        std::thread::sleep(Duration::from_millis(100));
    }
    let workload_secs = started.elapsed().as_secs_f64();

    // Drain: no more publishing, no more kills; every worker catches up.
    progress(format_args!(
        "soak: workload done after {workload_secs:.0} s; draining"
    ));
    let fan_published = fanout.stop_publishing();
    js_stop.store(true, Ordering::Relaxed);
    let js_published = js_thread.join().unwrap_or_default();
    workers.replace_crashed().map_err(setup)?;
    failures.extend(workers.crashed.iter().cloned());

    let keyed_handled = || workers::ids(&workers.keyed_dir.join("handled"));
    let keyed_done = wait_for(CATCH_UP, || {
        let h: BTreeSet<u64> = keyed_handled().into_iter().collect();
        js_published.keyed.iter().all(|id| h.contains(id))
    });
    let sql_db = workers.sql_dir.join("ledger.db");
    let sql_done = wait_for(CATCH_UP, || {
        workers::read_ledger(&sql_db).is_ok_and(|rows| {
            let h: BTreeSet<u64> = rows.effects.iter().map(|e| e.0).collect();
            js_published.payments.iter().all(|id| h.contains(id))
        })
    });
    if !keyed_done {
        failures.push(format!(
            "the keyed group did not catch up within {CATCH_UP:?}"
        ));
    }
    if !sql_done {
        failures.push(format!(
            "the SQL ledger did not catch up within {CATCH_UP:?}"
        ));
    }
    for dir in [&workers.embedded_dir, &workers.keyed_dir, &workers.sql_dir] {
        workers::request_stop(dir).map_err(setup)?;
    }
    let patience = Duration::from_secs(150);
    let (embedded_dir, keyed_dir, sql_dir) = (
        workers.embedded_dir.clone(),
        workers.keyed_dir.clone(),
        workers.sql_dir.clone(),
    );
    let mut stopped = Vec::new();
    stopped.push(wait_exit(
        &embedded_dir,
        &mut workers.embedded.0,
        &workers.embedded.1,
        patience,
    ));
    stopped.push(wait_exit(
        &sql_dir,
        &mut workers.sql.0,
        &workers.sql.1,
        patience,
    ));
    for (child, label) in &mut workers.keyed {
        stopped.push(wait_exit(&keyed_dir, child, label, patience));
    }
    failures.extend(stopped.into_iter().filter_map(Result::err));

    // The ledgers.
    let mut ledgers = vec![
        ledger_check(
            "embedded durable",
            &workers::ids(&embedded_dir.join("published")),
            &workers::ids(&embedded_dir.join("handled")),
        ),
        ledger_check(
            "JetStream keyed group",
            &js_published.keyed,
            &keyed_handled(),
        ),
    ];
    match workers::read_ledger(&sql_db) {
        Ok(rows) => {
            let ids: Vec<u64> = rows.effects.iter().map(|e| e.0).collect();
            let mut check = ledger_check("SQL recipe", &js_published.payments, &ids);
            check.effects_twice = check.redelivered;
            check.redelivered = 0;
            let applied: i64 = rows.effects.iter().map(|e| e.1).sum();
            if rows.balance_total != applied {
                failures.push(format!(
                    "SQL recipe: balances sum to {} but the effects to {applied}",
                    rows.balance_total
                ));
            }
            if let Some((id, amount)) = rows
                .effects
                .iter()
                .find(|(id, a)| workers::payment(*id).1 != *a)
            {
                failures.push(format!("SQL recipe: payment {id} applied as {amount}"));
            }
            ledgers.push(check);
        }
        Err(e) => failures.push(format!("SQL recipe: reading the ledger: {e}")),
    }
    for l in &ledgers {
        if l.acknowledged == 0 {
            failures.push(format!("{}: nothing was published", l.workload));
        }
        if l.lost > 0 {
            failures.push(format!(
                "{}: {} acknowledged publishes never handled (first: {:?})",
                l.workload, l.lost, l.lost_ids
            ));
        }
        if l.effects_twice > 0 {
            failures.push(format!(
                "{}: {} effects applied twice",
                l.workload, l.effects_twice
            ));
        }
    }
    let k = &workers.kills;
    if k.embedded == 0 || k.keyed_members == 0 || k.sql == 0 {
        failures.push(format!(
            "too short to kill every workload once ({k:?}): raise --secs or lower --cycle-secs"
        ));
    }
    let fan = fanout.finish(&fan_published);
    if fan.published == 0 {
        failures.push("fan-out: nothing was published".into());
    }
    if fan.refused_permanent > 0 {
        failures.push(format!(
            "fan-out: {} refusals to permanent subscriptions",
            fan.refused_permanent
        ));
    }
    if let Some(d) = fan.delivered.iter().find(|d| **d != fan.published) {
        failures.push(format!(
            "fan-out: a permanent subscription got {d} of {} messages",
            fan.published
        ));
    }
    if !fan.close_clean {
        failures.push("fan-out: close left messages undelivered".into());
    }
    let publish_failures = js_published.failed + fan_published.failed;
    let attempts = js_published.keyed.len() + js_published.payments.len() + fan.published as usize;
    if publish_failures * 100 > attempts as u64 {
        failures.push(format!(
            "{publish_failures} publishes failed (over 1 %); first: {}",
            js_published
                .first_error
                .as_deref()
                .or(fan_published.first_error.as_deref())
                .unwrap_or("?")
        ));
    }
    js.close(Duration::from_secs(10));
    drop(probe);
    drop(server);

    let warmup_secs = workload_secs * args.warmup;
    let series = judge_all(&samples, warmup_secs, &mut failures);
    let pass = failures.is_empty();
    Ok(SoakReport {
        command: command_line(args),
        machine: crate::output::machine(),
        load_average: format!("{load_before} before, {} after", crate::output::loadavg()),
        secs: args.secs,
        sample_secs: args.sample_secs,
        cycle_secs: args.cycle_secs,
        warmup_secs,
        max_age_secs: args.max_age_secs,
        kills: workers.kills.clone(),
        series,
        ledgers,
        fanout: fan,
        publish_failures,
        sample_errors,
        failures,
        pass,
        samples,
    })
}

/// R-LIM-3: every series judged after the warm-up by its bound in [`SERIES`]; a series
/// that grows, or has too few samples to judge, adds a failure.
fn judge_all(
    samples: &[Sample],
    warmup_secs: f64,
    failures: &mut Vec<String>,
) -> Vec<SeriesOutcome> {
    let unbounded = Bound::trend(f64::INFINITY, f64::INFINITY);
    let series: Vec<SeriesOutcome> = SERIES
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let points: Vec<(f64, f64)> = samples
                .iter()
                .filter_map(|s| s.values.get(i).copied().flatten().map(|v| (s.t, v)))
                .collect();
            SeriesOutcome {
                name: spec.name,
                unit: spec.unit,
                judged: spec.bound.is_some(),
                flatness: verdict::judge(&points, warmup_secs, spec.bound.unwrap_or(unbounded)),
            }
        })
        .collect();
    for s in series.iter().filter(|s| s.judged) {
        match &s.flatness {
            None => failures.push(format!("{}: too few samples after the warm-up to judge", s.name)),
            Some(f) if f.max > f.bound.ceiling => failures.push(format!(
                "{} over its ceiling: {} {} after the warm-up (ceiling {})",
                s.name, f.max, s.unit, f.bound.ceiling
            )),
            Some(f) if !f.flat => failures.push(format!(
                "{} grows: {:+.2} {}/hour (bound {}), fitted rise {:+.2} {} over the window (bound {})",
                s.name, f.slope_per_hour, s.unit, f.bound.per_hour, f.rise, s.unit, f.bound.rise
            )),
            Some(_) => {}
        }
    }
    series
}

/// The samples of a progress log (a soak's standard error): its `[   15s] soak RSS 12.8,
/// soak threads 16.0, …` lines; other lines are skipped.
fn samples_from_log(text: &str) -> Vec<Sample> {
    text.lines()
        .filter_map(|line| {
            let (t, rest) = line.strip_prefix('[')?.split_once("s] ")?;
            let t: f64 = t.trim().parse().ok()?;
            let mut values = vec![None; SERIES.len()];
            for field in rest.split(", ") {
                let (name, value) = field.rsplit_once(' ')?;
                let i = SERIES.iter().position(|s| s.name == name)?;
                values[i] = value.parse().ok();
            }
            Some(Sample { t, values })
        })
        .collect()
}

/// `--from-log`: judge and plot the samples of an earlier run that was cut short. There
/// are no ledger checks then (the ledgers died with it).
fn from_log(args: &SoakArgs, path: &Path) -> Result<SoakReport, BenchError> {
    let text = std::fs::read_to_string(path).map_err(|error| BenchError::Io {
        path: path.to_owned(),
        error,
    })?;
    let samples = samples_from_log(&text);
    let last = samples.last().map_or(0.0, |s| s.t);
    let warmup_secs = last * args.warmup;
    let mut failures = Vec::new();
    let series = judge_all(&samples, warmup_secs, &mut failures);
    Ok(SoakReport {
        command: format!(
            "cargo run --release -p tidings-bench -- soak --from-log {} --warmup {}",
            path.display(),
            args.warmup
        ),
        machine: crate::output::machine(),
        load_average: "not measured (judged from a log)".into(),
        secs: last.round() as u64,
        sample_secs: args.sample_secs,
        cycle_secs: args.cycle_secs,
        warmup_secs,
        max_age_secs: args.max_age_secs,
        kills: Kills::default(),
        series,
        ledgers: Vec::new(),
        fanout: FanoutOutcome::default(),
        publish_failures: 0,
        sample_errors: Vec::new(),
        pass: failures.is_empty(),
        failures,
        samples,
    })
}

/// The verdict as text: one line per series and per ledger.
fn summary(r: &SoakReport) -> String {
    let mut s = format!(
        "soak: {} s, warm-up {:.0} s, records kept {} s, {} samples; load average {}\n{}\nkills: {} embedded, {} keyed members (+{} joins), {} SQL, {} fan-out resubscribes\n",
        r.secs,
        r.warmup_secs,
        r.max_age_secs,
        r.samples.len(),
        r.load_average,
        r.machine,
        r.kills.embedded,
        r.kills.keyed_members,
        r.kills.keyed_joins,
        r.kills.sql,
        r.kills.fanout_resubscribes
    );
    s.push_str(&format!(
        "{:<22} {:>12} {:>18} {:>16} {:>20}  verdict\n",
        "series", "min..max", "slope/hour", "fitted rise", "bound (/h, rise)"
    ));
    for o in &r.series {
        let Some(f) = &o.flatness else {
            s.push_str(&format!("{:<22} (no samples)\n", o.name));
            continue;
        };
        let bound = if !o.judged {
            "not judged".into()
        } else if f.bound.ceiling.is_finite() {
            format!("<= {}", f.bound.ceiling)
        } else {
            format!("{}, {}", f.bound.per_hour, f.bound.rise)
        };
        s.push_str(&format!(
            "{:<22} {:>12} {:>18} {:>16} {:>20}  {}\n",
            o.name,
            format!("{:.1}..{:.1}", f.min, f.max),
            format!("{:+.2} {}", f.slope_per_hour, o.unit),
            format!("{:+.2}", f.rise),
            bound,
            if !o.judged {
                "-"
            } else if f.flat {
                "flat"
            } else {
                "GROWS"
            }
        ));
    }
    for l in &r.ledgers {
        s.push_str(&format!(
            "{}: {} acknowledged, {} handled, {} lost, {} redelivered, {} effects twice, {} handled without an acknowledgement\n",
            l.workload, l.acknowledged, l.handled, l.lost, l.redelivered, l.effects_twice, l.unacknowledged_handled
        ));
    }
    if r.ledgers.is_empty() {
        s.push_str("ledgers: not checked (judged from a progress log)\n");
    } else {
        s.push_str(&format!(
            "fan-out: {} published, each of {} permanent subscriptions got {:?}, {} refused\n",
            r.fanout.published,
            r.fanout.delivered.len(),
            r.fanout.delivered.iter().collect::<BTreeSet<_>>(),
            r.fanout.refused_permanent
        ));
    }
    if !r.sample_errors.is_empty() {
        s.push_str(&format!("sample errors: {:?}\n", r.sample_errors));
    }
    if r.pass {
        s.push_str("R-LIM-3: PASS\n");
    } else {
        s.push_str(&format!("R-LIM-3: FAIL\n  {}\n", r.failures.join("\n  ")));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_check_counts_losses_and_redeliveries() {
        let c = ledger_check("t", &[1, 2, 3, 4], &[1, 1, 2, 4, 9]);
        assert_eq!((c.acknowledged, c.handled, c.lost), (4, 3, 1));
        assert_eq!(c.lost_ids, vec![3]);
        assert_eq!((c.redelivered, c.unacknowledged_handled), (1, 1));
    }

    #[test]
    fn progress_lines_parse_back_into_samples() {
        let log = "soak: 2100 s of workload\n\
                   [    15s] soak RSS 12.8, soak threads 16.0, streams -, KV buckets 1.0\n\
                   soak: worker embedded-3 exited by itself (exit status: 101)\n\
                   [    20s] soak RSS 12.9, consumers 98.0\n[  2";
        let samples = samples_from_log(log);
        assert_eq!(samples.len(), 2, "{samples:?}");
        assert_eq!(samples[0].t, 15.0);
        assert_eq!(samples[0].values[0], Some(12.8));
        assert_eq!(samples[0].values[1], Some(16.0));
        assert_eq!(samples[0].values[9], None, "streams -");
        assert_eq!(samples[0].values[11], Some(1.0));
        assert_eq!(samples[1].values[10], Some(98.0));
    }

    #[test]
    fn every_series_has_a_name_and_unit() {
        let names: std::collections::BTreeMap<_, _> =
            SERIES.iter().map(|s| (s.name, s.unit)).collect();
        assert_eq!(names.len(), SERIES.len());
    }
}
