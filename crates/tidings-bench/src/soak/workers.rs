//! The soak's child processes: this benchmark binary started again with [`WORKER_ENV`] set
//! to `<role>\t<arg>\t…`. The soak SIGKILLs them and starts new ones; each role runs until
//! the file `stop` appears in its directory (then it finishes cleanly) or until the soak
//! itself is gone (its parent pid changed), so a killed soak leaves nothing behind.
//!
//! * `embedded <dir> <generation>`: a broker on the embedded log in `<dir>/log` with a
//!   durable subscription `ledger`; it publishes ids (`generation × 10⁷ + n`), appending each
//!   id whose publish returned `Ok` (synced: acknowledged) to `<dir>/published`, and the
//!   handler appends each id it handles to `<dir>/handled`. On `stop` it publishes no more
//!   and drains (lag 0) before it exits.
//! * `keyed <url> <dir> <name>`: one member of a keyed consumer group: the durable
//!   subscription `group` of the JetStream stream `soakkeyed` with `Concurrency::PerKey`
//!   (R-DIST-6); the handler appends each id to `<dir>/handled`.
//! * `sql <url> <dir> <generation>`: the SQL recipe: the durable subscription `ledger` of the
//!   stream `soaksql` through `Transactional::sqlite(<dir>/ledger.db)`; the handler adds the
//!   payment to its account and records one `effects` row, in the transaction that records
//!   the message id.
//!
//! Every line is one `write(2)` on an `O_APPEND` file, so lines from processes killed at any
//! point are whole or absent (a reader leaves a last line without its newline for later).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tidings::embedded::{EmbeddedBackend, EmbeddedStreamOptions};
use tidings::{
    Broker, Concurrency, DurableSpec, HandlerError, Message, MessageBuilder, Retention,
    StreamConfig, SubscribeOptions,
};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};
use tidings_sql::{SqliteTx, Transactional};
use tidings_testkit::child::TestChild;

/// Set in a worker process: `<role>\t<arg>\t…`.
pub(crate) const WORKER_ENV: &str = "TIDINGS_BENCH_SOAK_WORKER";
/// The soak's pid, so a worker notices when it is orphaned.
const PARENT_ENV: &str = "TIDINGS_BENCH_SOAK_PARENT";

/// The JetStream streams (and their subject prefixes).
pub(crate) const KEYED_STREAM: &str = "soakkeyed";
pub(crate) const SQL_STREAM: &str = "soaksql";
/// The embedded stream.
const EMBEDDED_STREAM: &str = "soak";
/// The JetStream ack wait, which is also the keyed group's lease: a killed member's keys
/// move to the others within a few of these.
const LEASE: Duration = Duration::from_secs(3);
/// Embedded publishes per second in a child (each synced before `publish` returns).
const EMBEDDED_RATE: u64 = 40;
/// How long the streams keep records (`--max-age-secs`), passed to the workers in
/// [`MAX_AGE_ENV`]: streams stop growing once the run is past it (the handlers are seconds
/// behind, never minutes), so the warm-up should cover it.
static MAX_AGE: OnceLock<Duration> = OnceLock::new();
const MAX_AGE_ENV: &str = "TIDINGS_BENCH_SOAK_MAX_AGE_SECS";
/// Bound on a worker's drain at `stop`.
const DRAIN: Duration = Duration::from_secs(120);

/// Sets the streams' record age for this process (the soak, from its arguments); the
/// first call wins.
pub(crate) fn set_max_age(age: Duration) {
    let _ = MAX_AGE.set(age);
}

fn max_age() -> Duration {
    *MAX_AGE.get_or_init(|| {
        std::env::var(MAX_AGE_ENV)
            .ok()
            .and_then(|s| s.parse().ok())
            .map_or(DEFAULT_MAX_AGE, Duration::from_secs)
    })
}

/// `--max-age-secs`' default.
pub(crate) const DEFAULT_MAX_AGE: Duration = Duration::from_secs(300);

fn retention() -> Retention {
    Retention::new().max_age(max_age())
}

/// A JetStream broker holding both soak streams (creating them when absent).
pub(crate) fn jetstream_broker(url: &str, name: &str) -> Result<Broker, String> {
    let backend = JetStreamBackend::builder()
        .ack_wait(LEASE)
        .connect(ConnectOptions::new(url).name(name))
        .map_err(|e| format!("connecting to {url}: {e}"))?;
    let broker = Broker::builder()
        .durable_backend(Arc::new(backend))
        .build()
        .map_err(|e| e.to_string())?;
    for stream in [KEYED_STREAM, SQL_STREAM] {
        broker
            .create_stream(
                StreamConfig::new(stream, [format!("{stream}.#")]).retention(retention()),
            )
            .map_err(|e| format!("creating stream {stream}: {e}"))?;
    }
    Ok(broker)
}

/// Starts a worker; its standard error goes to `<dir>/<label>.err`.
pub(crate) fn spawn(dir: &Path, label: &str, args: &[String]) -> Result<TestChild, String> {
    // This very program, even when its file was replaced meanwhile (a rebuild during an
    // hour-long run made a restart fail with "No such file or directory" at 395 s): on
    // Linux `/proc/self/exe` opens the running image, whatever its path now holds.
    let exe = match Path::new("/proc/self/exe") {
        p if p.exists() => p.to_path_buf(),
        _ => std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?,
    };
    let err =
        File::create(dir.join(format!("{label}.err"))).map_err(|e| format!("{label}.err: {e}"))?;
    let child = Command::new(exe)
        .env(WORKER_ENV, args.join("\t"))
        .env(PARENT_ENV, std::process::id().to_string())
        .env(MAX_AGE_ENV, max_age().as_secs().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .map_err(|e| format!("starting worker {label}: {e}"))?;
    Ok(TestChild::adopt(child))
}

/// In a worker process: run its role, then exit with its code. `None` in any other process.
pub(crate) fn worker_from_env() -> Option<i32> {
    let spec = std::env::var(WORKER_ENV).ok()?;
    let args: Vec<&str> = spec.split('\t').collect();
    let result = match args[..] {
        ["embedded", dir, generation] => generation
            .parse()
            .map_err(|e| format!("generation {generation:?}: {e}"))
            .and_then(|g| embedded(Path::new(dir), g)),
        ["keyed", url, dir, name] => keyed(url, Path::new(dir), name),
        ["sql", url, dir, _generation] => sql(url, Path::new(dir)),
        _ => Err(format!("{WORKER_ENV}: unknown worker {spec:?}")),
    };
    Some(match result {
        Ok(()) => 0,
        Err(e) => {
            super::progress(format_args!("soak worker {spec:?}: {e}"));
            1
        }
    })
}

/// Whether to finish: `<dir>/stop` exists, or the soak that started us is gone.
fn told_to_stop(dir: &Path) -> bool {
    let orphaned = std::env::var(PARENT_ENV)
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|p| p != std::os::unix::process::parent_id());
    orphaned || dir.join("stop").exists()
}

fn append(path: PathBuf) -> Result<File, String> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// A handler failure that the broker retries (a full disk is not the message's fault).
fn retry(e: std::io::Error) -> HandlerError {
    HandlerError::retry(e.to_string())
}

/// The handler's side of a ledger: one line per handled id.
fn record_handled(file: &File, m: &Message) -> Result<(), HandlerError> {
    let mut line = m.payload().to_vec();
    line.push(b'\n');
    let mut f = file;
    f.write_all(&line).map_err(retry)
}

fn embedded(dir: &Path, generation: u64) -> Result<(), String> {
    // Small segments and a short retention interval: segments roll and are removed all
    // through the run, so their files (and descriptors) come and go.
    let options = EmbeddedStreamOptions::new()
        .segment_bytes(256 * 1024)
        .retention_interval(Duration::from_secs(5));
    let backend = EmbeddedBackend::new(dir.join("log")).stream_defaults(options);
    let broker = Broker::builder()
        .durable_backend(Arc::new(backend))
        .build()
        .map_err(|e| e.to_string())?;
    broker
        .create_stream(
            StreamConfig::new(EMBEDDED_STREAM, [format!("{EMBEDDED_STREAM}.#")])
                .retention(retention()),
        )
        .map_err(|e| format!("creating the embedded stream: {e}"))?;
    let handled = append(dir.join("handled"))?;
    let sub = broker
        .subscribe(
            DurableSpec::new(EMBEDDED_STREAM)
                .name("ledger")
                .filter(format!("{EMBEDDED_STREAM}.#")),
            SubscribeOptions::default(),
            move |m: &Message| record_handled(&handled, m),
        )
        .map_err(|e| format!("subscribing the embedded ledger: {e}"))?;
    let mut published = append(dir.join("published"))?;
    let pause = Duration::from_micros(1_000_000 / EMBEDDED_RATE);
    let mut n = 0u64;
    while !told_to_stop(dir) {
        let id = generation * 10_000_000 + n;
        n += 1;
        match broker.publish(
            MessageBuilder::new(format!("{EMBEDDED_STREAM}.order")).payload(id.to_string()),
        ) {
            // Synced (`Fsync::Always`, the default) when publish returns: acknowledged.
            Ok(report) if !report.streams.is_empty() => published
                .write_all(format!("{id}\n").as_bytes())
                .map_err(|e| format!("the published ledger: {e}"))?,
            Ok(report) => return Err(format!("publish {id} reached no stream: {report:?}")),
            Err(e) => return Err(format!("publish {id}: {e}")),
        }
        std::thread::sleep(pause);
    }
    let deadline = Instant::now() + DRAIN;
    while sub.lag() > 0 {
        if Instant::now() > deadline {
            return Err(format!("lag {} after {DRAIN:?} of draining", sub.lag()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(sub);
    let report = broker.close(Duration::from_secs(10));
    if report.is_clean() {
        Ok(())
    } else {
        Err(format!("close left {report:?}"))
    }
}

fn keyed(url: &str, dir: &Path, name: &str) -> Result<(), String> {
    let handled = append(dir.join("handled"))?;
    let broker = jetstream_broker(url, &format!("soak-keyed-{name}"))?;
    let _sub = broker
        .subscribe(
            DurableSpec::new(KEYED_STREAM)
                .name("group")
                .filter(format!("{KEYED_STREAM}.#")),
            SubscribeOptions::new().concurrency(Concurrency::PerKey { max_in_flight: 8 }),
            move |m: &Message| record_handled(&handled, m),
        )
        .map_err(|e| format!("joining the keyed group: {e}"))?;
    while !told_to_stop(dir) {
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(_sub);
    broker.close(Duration::from_secs(10));
    Ok(())
}

/// A payment's payload: `<id>:<account>:<amount>`.
pub(crate) fn payment(id: u64) -> (String, i64) {
    let amount = (id % 97) as i64 + 1;
    (format!("{id}:a{}:{amount}", id % 8), amount)
}

type PaymentFn = fn(&mut SqliteTx<'_>, &Message) -> Result<(), HandlerError>;

/// The effect: the account's balance and one `effects` row, in tidings' transaction.
fn apply_payment(tx: &mut SqliteTx<'_>, m: &Message) -> Result<(), HandlerError> {
    let text = std::str::from_utf8(m.payload())?;
    let mut parts = text.splitn(3, ':');
    let (Some(id), Some(account), Some(amount)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(HandlerError::reject(format!("not a payment: {text:?}")));
    };
    let id: i64 = id.parse()?;
    let amount: i64 = amount.parse()?;
    let changed = tx.execute(
        "UPDATE accounts SET balance = balance + ?1 WHERE id = ?2",
        &[amount.into(), account.into()],
    )?;
    if changed != 1 {
        return Err(HandlerError::reject(format!("no account {account:?}")));
    }
    tx.execute(
        "INSERT INTO effects (id, amount) VALUES (?1, ?2)",
        &[id.into(), amount.into()],
    )?;
    Ok(())
}

/// The ledger database: eight accounts at zero and an `effects` table with no unique
/// constraint, so an effect applied twice would show as two rows.
pub(crate) fn create_ledger(db: &Path) -> Result<(), String> {
    let setup = Transactional::sqlite(
        db,
        "setup",
        "soak-setup",
        |tx: &mut SqliteTx<'_>, _m: &Message| {
            tx.execute_batch(
                "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
             CREATE TABLE effects (id INTEGER NOT NULL, amount INTEGER NOT NULL);",
            )?;
            for a in 0..8 {
                tx.execute(
                    "INSERT INTO accounts VALUES (?1, 0)",
                    &[format!("a{a}").into()],
                )?;
            }
            Ok(())
        },
    )
    .map_err(|e| format!("opening {}: {e}", db.display()))?;
    run_once(&setup)
}

/// What the ledger database holds.
#[derive(Debug, Clone, Default)]
pub(crate) struct LedgerRows {
    /// `effects` rows: (id, amount).
    pub effects: Vec<(u64, i64)>,
    /// The sum of all balances.
    pub balance_total: i64,
}

/// Reads the ledger through a transaction of the same kind (a handler that only reads).
pub(crate) fn read_ledger(db: &Path) -> Result<LedgerRows, String> {
    let out: Arc<Mutex<Option<LedgerRows>>> = Arc::default();
    let o = out.clone();
    let reader = Transactional::sqlite(
        db,
        "reads",
        "soak-reads",
        move |tx: &mut SqliteTx<'_>, _m: &Message| {
            let mut rows = LedgerRows::default();
            for r in tx.query("SELECT id, amount FROM effects", &[])? {
                rows.effects
                    .push((r.integer(0)?.unsigned_abs(), r.integer(1)?));
            }
            let total = tx.query("SELECT COALESCE(SUM(balance), 0) FROM accounts", &[])?;
            rows.balance_total = total.first().map_or(Ok(0), |r| r.integer(0))?;
            *o.lock().unwrap_or_else(PoisonError::into_inner) = Some(rows);
            Ok(())
        },
    )
    .map_err(|e| format!("opening {}: {e}", db.display()))?;
    run_once(&reader)?;
    let rows = out.lock().unwrap_or_else(PoisonError::into_inner).take();
    rows.ok_or_else(|| "the ledger read returned nothing".to_owned())
}

fn run_once(h: &impl tidings::Handler) -> Result<(), String> {
    let m = Message::to("soak.ledger")
        .build_detached()
        .map_err(|e| e.to_string())?;
    h.handle(&m).map_err(|e| e.to_string())
}

fn sql(url: &str, dir: &Path) -> Result<(), String> {
    let handler: PaymentFn = apply_payment;
    let ledger = Transactional::sqlite(dir.join("ledger.db"), "processed", "soak", handler)
        .map_err(|e| format!("opening the ledger: {e}"))?;
    let broker = jetstream_broker(url, "soak-sql")?;
    let _sub = broker
        .subscribe(
            DurableSpec::new(SQL_STREAM)
                .name("ledger")
                .filter(format!("{SQL_STREAM}.#")),
            SubscribeOptions::default(),
            tidings::AnyHandler::from_sync(ledger),
        )
        .map_err(|e| format!("subscribing the SQL ledger: {e}"))?;
    while !told_to_stop(dir) {
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(_sub);
    broker.close(Duration::from_secs(10));
    Ok(())
}

/// Whole lines of a ledger file parsed as ids (see [`tidings_testkit::child::complete_lines`]).
pub(crate) fn ids(path: &Path) -> Vec<u64> {
    tidings_testkit::child::complete_lines(path)
        .iter()
        .filter_map(|l| l.parse().ok())
        .collect()
}

/// Tells the workers of `dir` to finish.
pub(crate) fn request_stop(dir: &Path) -> Result<(), String> {
    fs::write(dir.join("stop"), b"").map_err(|e| format!("{}: {e}", dir.display()))
}
