//! `log/append/{never,interval,always}`, `log/append/always/publishers=64`, `log/read`
//! (the lending reader), `log/read/batches` (owned records): 256-byte records through
//! `tidings-log`, against plain file I/O.
//!
//! `log/durable/publishers=64`: end to end through the broker: 64 publisher threads publish
//! to a stream with `Fsync::Always`, a durable subscription's handler receives every record
//! and its position is committed; records/s against `log-append-alone` (the same 64
//! publishers appending to a bare `tidings-log` log with `Fsync::Always`).
//!
//! Baselines:
//! * `raw-write` — buffered appends (64 KiB `BufWriter`) to a plain file, no fsync.
//! * `raw-fdatasync` — append + `fdatasync` per record.
//! * `raw-fdatasync-batch` — append a batch, then one `fdatasync`; the batch size is the
//!   group-commit batch tidings-log achieved in the first round (estimated as its records/s
//!   over raw-fdatasync's syncs/s), or the publisher count when the log was not run.
//! * `raw-sequential-read` — the same bytes read back sequentially from a plain file.
//!
//! The tidings side needs the `log` cargo feature (the `tidings-log` crate); without it the
//! cases are still emitted, with `tidings: null`, and the baselines still run.

use std::cell::Cell;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::harness::{Contender, interleave};
use crate::{Case, Filter, Plan};

/// Payload bytes per record.
pub(crate) const RECORD_BYTES: usize = 256;
/// Concurrent publishers in the group-commit case.
const PUBLISHERS: u64 = 64;
/// Sync period of the `interval` policy.
const INTERVAL: Duration = Duration::from_millis(100);

const POLICIES: [&str; 3] = ["never", "interval", "always"];

pub(crate) fn case_names() -> Vec<String> {
    let mut v: Vec<String> = POLICIES.iter().map(|p| format!("log/append/{p}")).collect();
    v.push(BATCH_CASE.into());
    v.push(format!("log/append/always/publishers={PUBLISHERS}"));
    v.push("log/read".into());
    v.push(READ_BATCHES_CASE.into());
    v.push(DURABLE_CASE.into());
    v
}

/// Records per `Log::append_batch` in the batch case.
const BATCH: u64 = 64;
/// The append case through `Log::append_batch`.
const BATCH_CASE: &str = "log/append/never/batch=64";

/// The read case through owned batches (`Log::read`) instead of the lending reader.
const READ_BATCHES_CASE: &str = "log/read/batches";

/// The end-to-end durable case.
const DURABLE_CASE: &str = "log/durable/publishers=64";

/// Where the files go: a fresh directory under the system temp dir (same disk as the
/// workspace on this machine; a tmpfs would make every fsync free — see the notes).
fn scratch() -> Result<tempfile::TempDir, String> {
    tempfile::Builder::new()
        .prefix("tidings-bench-log-")
        .tempdir()
        .map_err(|e| e.to_string())
}

fn filesystem_note(dir: &Path) -> String {
    // /proc/mounts: find the longest mount point that prefixes the directory.
    let Ok(mounts) = std::fs::read_to_string("/proc/mounts") else {
        return String::new();
    };
    let dir = dir.to_string_lossy();
    let best = mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (dev, mnt, fs) = (f.next()?, f.next()?, f.next()?);
            dir.starts_with(mnt)
                .then(|| (mnt.len(), format!("{fs} on {dev}")))
        })
        .max_by_key(|(n, _)| *n);
    match best {
        Some((_, fs)) if fs.starts_with("tmpfs") => {
            format!(
                "files on {fs}: fsync is free here, the always/interval numbers are NOT durable-disk numbers"
            )
        }
        Some((_, fs)) => format!("files on {fs}"),
        None => String::new(),
    }
}

fn payload() -> bytes::Bytes {
    bytes::Bytes::from(vec![0x5Au8; RECORD_BYTES])
}

/// A raw record: 8-byte length-and-seq header + payload, so the raw file carries what a
/// minimal log would.
fn raw_record(seq: u64, payload: &[u8]) -> [u8; 8 + RECORD_BYTES] {
    let mut r = [0u8; 8 + RECORD_BYTES];
    r[..8].copy_from_slice(&seq.to_le_bytes());
    r[8..].copy_from_slice(&payload[..RECORD_BYTES]);
    r
}

fn raw_write(dir: &Path, n: u64) -> Result<f64, String> {
    let path = dir.join("raw-write.dat");
    let p = payload();
    let file = File::create(&path).map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut w = BufWriter::with_capacity(64 * 1024, file);
    for i in 0..n {
        w.write_all(&raw_record(i, &p)).map_err(|e| e.to_string())?;
    }
    w.flush().map_err(|e| e.to_string())?;
    let rate = n as f64 / start.elapsed().as_secs_f64();
    drop(w);
    let _ = std::fs::remove_file(path);
    Ok(rate)
}

/// `n` records, one `fdatasync` per `batch` records.
fn raw_fdatasync(dir: &Path, n: u64, batch: u64) -> Result<f64, String> {
    let path = dir.join(format!("raw-fdatasync-{batch}.dat"));
    let p = payload();
    let mut file = File::create(&path).map_err(|e| e.to_string())?;
    file.sync_all().map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut buf = Vec::with_capacity(batch as usize * (8 + RECORD_BYTES));
    let mut i = 0;
    while i < n {
        buf.clear();
        let end = (i + batch).min(n);
        for s in i..end {
            buf.extend_from_slice(&raw_record(s, &p));
        }
        file.write_all(&buf).map_err(|e| e.to_string())?;
        file.sync_data().map_err(|e| e.to_string())?;
        i = end;
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    drop(file);
    let _ = std::fs::remove_file(path);
    Ok(rate)
}

fn write_raw_file(path: &Path, n: u64) -> Result<(), String> {
    let p = payload();
    let mut w = BufWriter::with_capacity(64 * 1024, File::create(path).map_err(|e| e.to_string())?);
    for i in 0..n {
        w.write_all(&raw_record(i, &p)).map_err(|e| e.to_string())?;
    }
    w.flush().map_err(|e| e.to_string())
}

fn raw_read(path: &Path, n: u64) -> Result<f64, String> {
    let start = Instant::now();
    let mut r = BufReader::with_capacity(64 * 1024, File::open(path).map_err(|e| e.to_string())?);
    let mut rec = [0u8; 8 + RECORD_BYTES];
    let mut count = 0u64;
    let mut sum = 0u64;
    while r.read_exact(&mut rec).is_ok() {
        count += 1;
        sum = sum.wrapping_add(u64::from(rec[8]));
    }
    std::hint::black_box(sum);
    if count != n {
        return Err(format!("read {count} of {n} raw records"));
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// The tidings side, when the `log` feature (and so `tidings-log`) is built.
#[cfg(feature = "log")]
mod tlog {
    use super::*;
    use std::sync::Arc;
    use tidings_log::{Fsync, Log, LogConfig, Record};

    pub(super) const AVAILABLE: Option<&str> = None;

    fn fsync(policy: &str) -> Fsync {
        match policy {
            "always" => Fsync::Always,
            "interval" => Fsync::Interval(INTERVAL),
            _ => Fsync::Never,
        }
    }

    fn open(dir: &Path, policy: &str) -> Result<Log, String> {
        let config = LogConfig::new().fsync(fsync(policy));
        Log::open(dir, config)
            .map(|(log, _report)| log)
            .map_err(|e| format!("Log::open: {e}"))
    }

    fn record(p: &bytes::Bytes) -> Record {
        Record {
            timestamp_ms: 1_700_000_000_000,
            key: None,
            headers: vec![],
            payload: p.clone(),
        }
    }

    /// Append `per_publisher` records from each of `publishers` threads to a fresh log.
    pub(super) fn append(
        dir: &Path,
        policy: &str,
        publishers: u64,
        per_publisher: u64,
    ) -> Result<f64, String> {
        let sub = tempfile::tempdir_in(dir).map_err(|e| e.to_string())?;
        let log = Arc::new(open(sub.path(), policy)?);
        let p = payload();
        let start = Instant::now();
        if publishers == 1 {
            for _ in 0..per_publisher {
                log.append(&record(&p))
                    .map_err(|e| format!("append: {e}"))?;
            }
        } else {
            let barrier = Arc::new(std::sync::Barrier::new(publishers as usize));
            let handles: Vec<_> = (0..publishers)
                .map(|_| {
                    let (log, p, b) = (log.clone(), p.clone(), barrier.clone());
                    std::thread::spawn(move || -> Result<(), String> {
                        b.wait();
                        for _ in 0..per_publisher {
                            log.append(&record(&p))
                                .map_err(|e| format!("append: {e}"))?;
                        }
                        Ok(())
                    })
                })
                .collect();
            for h in handles {
                h.join().map_err(|_| "publisher panicked".to_string())??;
            }
        }
        let rate = (publishers * per_publisher) as f64 / start.elapsed().as_secs_f64();
        drop(log);
        Ok(rate)
    }

    /// Append `n` records to a fresh log from one thread, `batch` at a time through
    /// `Log::append_batch` (one writer-lock round trip per batch).
    pub(super) fn append_batches(
        dir: &Path,
        policy: &str,
        n: u64,
        batch: u64,
    ) -> Result<f64, String> {
        let sub = tempfile::tempdir_in(dir).map_err(|e| e.to_string())?;
        let log = open(sub.path(), policy)?;
        let p = payload();
        let start = Instant::now();
        let mut records = Vec::with_capacity(batch as usize);
        let mut done = 0;
        while done < n {
            let k = batch.min(n - done);
            records.clear();
            records.extend((0..k).map(|_| record(&p)));
            log.append_batch(&records)
                .map_err(|e| format!("append_batch: {e}"))?;
            done += k;
        }
        let rate = n as f64 / start.elapsed().as_secs_f64();
        drop(log);
        Ok(rate)
    }

    /// A log holding `n` records, for the read case.
    pub(super) struct Filled {
        log: Log,
        n: u64,
        _dir: tempfile::TempDir,
    }

    pub(super) fn fill(dir: &Path, n: u64) -> Result<Filled, String> {
        let sub = tempfile::tempdir_in(dir).map_err(|e| e.to_string())?;
        let log = open(sub.path(), "never")?;
        let p = payload();
        for _ in 0..n {
            log.append(&record(&p))
                .map_err(|e| format!("append: {e}"))?;
        }
        Ok(Filled { log, n, _dir: sub })
    }

    /// Front to back through the lending reader (`Log::reader`): each record borrows the
    /// reader's chunk, as the raw reader's record borrows its buffer.
    pub(super) fn read(f: &Filled) -> Result<f64, String> {
        let start = Instant::now();
        let mut reader = f.log.reader(0);
        let mut count = 0u64;
        let mut sum = 0u64;
        while let Some(r) = reader.next().map_err(|e| format!("read: {e}"))? {
            count += 1;
            sum = sum.wrapping_add(u64::from(r.payload[0]));
        }
        std::hint::black_box(sum);
        if count != f.n {
            return Err(format!("read {count} of {} records", f.n));
        }
        Ok(f.n as f64 / start.elapsed().as_secs_f64())
    }

    /// Front to back in owned batches (`Log::read(from, 1024)`: each record holds a
    /// reference to its chunk).
    pub(super) fn read_batches(f: &Filled) -> Result<f64, String> {
        let start = Instant::now();
        let mut from = 0u64;
        let mut count = 0u64;
        let mut sum = 0u64;
        loop {
            let batch = f.log.read(from, 1024).map_err(|e| format!("read: {e}"))?;
            let Some(last) = batch.last() else { break };
            from = last.offset + 1;
            count += batch.len() as u64;
            for r in &batch {
                sum = sum.wrapping_add(u64::from(r.payload[0]));
            }
        }
        std::hint::black_box(sum);
        if count != f.n {
            return Err(format!("read {count} of {} records", f.n));
        }
        Ok(f.n as f64 / start.elapsed().as_secs_f64())
    }
}

/// Placeholder when the `log` feature is off.
#[cfg(not(feature = "log"))]
mod tlog {
    use super::*;

    pub(super) const AVAILABLE: Option<&str> = Some(
        "tidings-log not benchmarked: build with `--features log` (tidings-bench's `log` feature) once crates/tidings-log compiles",
    );

    pub(super) fn append(_: &Path, _: &str, _: u64, _: u64) -> Result<f64, String> {
        Err(AVAILABLE.unwrap_or_default().into())
    }
    pub(super) fn append_batches(_: &Path, _: &str, _: u64, _: u64) -> Result<f64, String> {
        Err(AVAILABLE.unwrap_or_default().into())
    }
    pub(super) struct Filled;
    pub(super) fn fill(_: &Path, _: u64) -> Result<Filled, String> {
        Err(AVAILABLE.unwrap_or_default().into())
    }
    pub(super) fn read(_: &Filled) -> Result<f64, String> {
        Err(AVAILABLE.unwrap_or_default().into())
    }
    pub(super) fn read_batches(_: &Filled) -> Result<f64, String> {
        Err(AVAILABLE.unwrap_or_default().into())
    }
}

fn mbps(records_per_s: f64) -> f64 {
    records_per_s * RECORD_BYTES as f64 / 1e6
}

/// Turn outcomes into a case: `tidings` is the contender named "tidings".
fn case_from(name: &str, outcomes: &[crate::harness::ContenderRun], notes: &[String]) -> Case {
    let mut case = Case::new(name, "records/s", true);
    for o in outcomes {
        match (o.name.as_str(), o.median()) {
            ("tidings", v) => {
                case.tidings = v;
                if let Some(v) = v {
                    case.note(format!("tidings {:.1} MB/s of payload", mbps(v)));
                }
            }
            (n, Some(v)) => {
                case.baselines.insert(n.to_owned(), v);
            }
            (_, None) => {}
        }
    }
    for o in outcomes {
        if let Some(e) = &o.error {
            if o.name == "tidings" && tlog::AVAILABLE.is_some() {
                case.note(format!("tidings skipped: {e}"));
            } else {
                case.note(format!("{} FAILED: {e}", o.name));
            }
        }
    }
    for n in notes {
        case.note(n);
    }
    case
}

pub(crate) fn run(plan: &Plan, filter: &Filter) -> Vec<Case> {
    let names = case_names();
    if !filter.wants_any(names.iter().map(String::as_str)) {
        return Vec::new();
    }
    let dir = match scratch() {
        Ok(d) => d,
        Err(e) => {
            return names
                .iter()
                .filter(|n| filter.wants(n))
                .map(|n| {
                    let mut c = Case::new(n.clone(), "records/s", true);
                    c.note(format!("skipped: no scratch directory: {e}"));
                    c
                })
                .collect();
        }
    };
    let d: PathBuf = dir.path().to_owned();
    let fs = filesystem_note(&d);
    let common = format!(
        "{RECORD_BYTES}-byte payloads, {} rounds interleaved, fresh file/log per round, open/close untimed; {fs}",
        plan.rounds
    );
    let mut cases = Vec::new();

    for policy in POLICIES {
        let name = format!("log/append/{policy}");
        if !filter.wants(&name) {
            continue;
        }
        let n = if policy == "always" {
            plan.log_sync_records
        } else {
            plan.log_records
        };
        let mut cs = vec![
            Contender::new("tidings", || tlog::append(&d, policy, 1, n)),
            Contender::new("raw-write", || raw_write(&d, n)),
        ];
        if policy == "always" {
            cs.push(Contender::new("raw-fdatasync", || raw_fdatasync(&d, n, 1)));
        }
        let out = interleave(plan.rounds, &mut cs);
        drop(cs);
        let mut notes = vec![format!("{n} records per round, 1 publisher")];
        if policy == "interval" {
            notes.push(format!("Fsync::Interval({INTERVAL:?})"));
        }
        notes.push(common.clone());
        cases.push(case_from(&name, &out, &notes));
    }

    if filter.wants(BATCH_CASE) {
        let n = plan.log_records;
        let mut cs = vec![
            Contender::new("tidings", || tlog::append_batches(&d, "never", n, BATCH)),
            Contender::new("raw-write", || raw_write(&d, n)),
        ];
        let out = interleave(plan.rounds, &mut cs);
        drop(cs);
        let notes = vec![
            format!(
                "{n} records per round, 1 publisher, Fsync::Never, Log::append_batch of {BATCH} records \
                 (the records built per batch, as log/append/never builds one per append)"
            ),
            common.clone(),
        ];
        cases.push(case_from(BATCH_CASE, &out, &notes));
    }

    let name = format!("log/append/always/publishers={PUBLISHERS}");
    if filter.wants(&name) {
        let per = plan.log_records_per_publisher;
        let total = per * PUBLISHERS;
        let first_tidings = Cell::new(None::<f64>);
        let first_sync = Cell::new(None::<f64>);
        let batch = Cell::new(None::<u64>);
        let mut cs = vec![
            Contender::new("tidings", || {
                let r = tlog::append(&d, "always", PUBLISHERS, per)?;
                first_tidings.set(first_tidings.get().or(Some(r)));
                Ok(r)
            }),
            Contender::new("raw-fdatasync", || {
                let r = raw_fdatasync(&d, total.min(plan.log_sync_records), 1)?;
                first_sync.set(first_sync.get().or(Some(r)));
                Ok(r)
            }),
            Contender::new("raw-fdatasync-batch", || {
                let b = batch.get().unwrap_or_else(|| {
                    let b = match (first_tidings.get(), first_sync.get()) {
                        (Some(t), Some(s)) if s > 0.0 => {
                            (t / s).round().clamp(1.0, PUBLISHERS as f64) as u64
                        }
                        _ => PUBLISHERS,
                    };
                    batch.set(Some(b));
                    b
                });
                raw_fdatasync(&d, total, b)
            }),
        ];
        let out = interleave(plan.rounds, &mut cs);
        drop(cs);
        let b = batch.get().unwrap_or(PUBLISHERS);
        let how = if first_tidings.get().is_some() {
            "estimated from round 1 as tidings records/s / raw-fdatasync syncs/s"
        } else {
            "tidings did not run, so the publisher count"
        };
        let notes = vec![
            format!(
                "{PUBLISHERS} publisher threads x {per} records per round ({total}), Fsync::Always (group commit); \
                 raw-fdatasync = 1 writer, fdatasync per record; raw-fdatasync-batch = 1 writer, fdatasync per {b} records ({how})"
            ),
            common.clone(),
        ];
        cases.push(case_from(&name, &out, &notes));
    }

    for (name, how) in [
        (
            "log/read",
            "tidings: Log::reader, each record borrowed from the reader's chunk",
        ),
        (
            READ_BATCHES_CASE,
            "tidings: Log::read(from, 1024) batches of owned records",
        ),
    ] {
        if !filter.wants(name) {
            continue;
        }
        let n = plan.log_read_records;
        let raw_path = d.join("read.dat");
        let raw_ok = write_raw_file(&raw_path, n);
        let filled = tlog::fill(&d, n);
        let lending = name == "log/read";
        let mut cs = vec![
            Contender::new("tidings", || match &filled {
                Ok(f) if lending => tlog::read(f),
                Ok(f) => tlog::read_batches(f),
                Err(e) => Err(e.clone()),
            }),
            Contender::new("raw-sequential-read", || match &raw_ok {
                Ok(()) => raw_read(&raw_path, n),
                Err(e) => Err(e.clone()),
            }),
        ];
        let out = interleave(plan.rounds, &mut cs);
        drop(cs);
        let notes = vec![
            format!(
                "{n} records read front to back ({how}; raw: 64 KiB BufReader over the same record \
                 bytes, each record copied into one reused buffer); page cache warm"
            ),
            common.clone(),
        ];
        cases.push(case_from(name, &out, &notes));
    }

    if filter.wants(DURABLE_CASE) {
        let per = plan.log_records_per_publisher;
        let total = per * PUBLISHERS;
        let mut sys = durable::DurableE2e::start(&d);
        let mut cs = vec![
            Contender::new("tidings", || match &mut sys {
                Ok(s) => s.round(PUBLISHERS, per),
                Err(e) => Err(e.clone()),
            }),
            Contender::new("log-append-alone", || {
                tlog::append(&d, "always", PUBLISHERS, per)
            }),
        ];
        let out = interleave(plan.rounds, &mut cs);
        drop(cs);
        let mut notes = vec![format!(
            "{PUBLISHERS} publisher threads x {per} records per round ({total}): Broker::publish to a stream \
             (StreamConfig fsync Always, default 64 MiB segments) -> durable subscription (thread driver, \
             window 1024, commit every 64) whose handler counts -> DurableSubscription::commit once all are \
             handled; timed until the committed position covers every record; log-append-alone = the same \
             publishers appending to a bare tidings-log Log with Fsync::Always; one broker and stream for all \
             rounds (setup untimed)"
        )];
        match sys {
            Ok(s) => notes.push(s.finish()),
            Err(e) => notes.push(format!("tidings skipped: {e}")),
        }
        notes.push(common.clone());
        cases.push(case_from(DURABLE_CASE, &out, &notes));
    }
    cases
}

/// Publish → stream (`Fsync::Always`) → durable subscription → commit.
mod durable {
    use std::path::Path;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use tidings::{
        Broker, DurableSpec, DurableSubscription, HandlerError, Message, StreamConfig,
        SubscribeOptions,
    };

    use crate::harness::Tally;

    const TOPIC: &str = "bench.durable.appended";
    const ROUND_TIMEOUT: Duration = Duration::from_secs(120);

    pub(super) struct DurableE2e {
        broker: Broker,
        sub: DurableSubscription,
        tally: Arc<Tally>,
        published: u64,
        _dir: tempfile::TempDir,
    }

    impl DurableE2e {
        pub(super) fn start(scratch: &Path) -> Result<Self, String> {
            let dir = tempfile::tempdir_in(scratch).map_err(|e| e.to_string())?;
            let broker = Broker::builder()
                .data_dir(dir.path())
                .build()
                .map_err(|e| e.to_string())?;
            broker
                .create_stream(StreamConfig::new("bench", ["bench.durable.#"]))
                .map_err(|e| format!("create_stream: {e}"))?;
            let tally = Arc::new(Tally::new());
            let t = tally.clone();
            let count = AtomicU64::new(0);
            let sub = broker
                .subscribe(
                    DurableSpec::new("bench").name("bench-consumer"),
                    SubscribeOptions::default(),
                    move |m: &Message| {
                        std::hint::black_box(m.payload());
                        let before = count.fetch_add(1, Ordering::Relaxed);
                        t.hit(before, before + 1);
                        Ok::<(), HandlerError>(())
                    },
                )
                .map_err(|e| format!("subscribe: {e}"))?;
            Ok(Self {
                broker,
                sub,
                tally,
                published: 0,
                _dir: dir,
            })
        }

        pub(super) fn round(&mut self, publishers: u64, per: u64) -> Result<f64, String> {
            let target = self.published + publishers * per;
            self.tally.arm(target, 1);
            let payload = super::payload();
            let start = Instant::now();
            std::thread::scope(|s| -> Result<(), String> {
                let handles: Vec<_> = (0..publishers)
                    .map(|_| {
                        let (broker, payload) = (&self.broker, payload.clone());
                        s.spawn(move || -> Result<(), String> {
                            for _ in 0..per {
                                broker
                                    .publish(Message::to(TOPIC).payload(payload.clone()))
                                    .map_err(|e| format!("publish: {e}"))?;
                            }
                            Ok(())
                        })
                    })
                    .collect();
                for h in handles {
                    h.join().map_err(|_| "publisher panicked".to_string())??;
                }
                Ok(())
            })?;
            self.published = target;
            if !self.tally.wait(ROUND_TIMEOUT) {
                return Err(format!(
                    "stuck: handled short of {target}; committed {}, error {:?}",
                    self.sub.committed(),
                    self.sub.error()
                ));
            }
            // The handler's return is recorded just after it counts: commit until the
            // committed position covers every record.
            loop {
                let at = self.sub.commit().map_err(|e| format!("commit: {e}"))?;
                if at >= target {
                    break;
                }
                if start.elapsed() > ROUND_TIMEOUT {
                    return Err(format!("commit stuck at {at} of {target}"));
                }
                std::thread::sleep(Duration::from_micros(50));
            }
            Ok((publishers * per) as f64 / start.elapsed().as_secs_f64())
        }

        pub(super) fn finish(self) -> String {
            let committed = self.sub.committed();
            drop(self.sub);
            let report = self.broker.close(Duration::from_secs(5));
            format!(
                "tidings: committed {committed} of {} published; close {}",
                self.published,
                if report.is_clean() {
                    "clean"
                } else {
                    "NOT clean"
                }
            )
        }
    }
}
