//! Durable streams and durable subscriptions (SPEC §8, R-BP-2).
//!
//! A **stream** is a `tidings-log` in `<data_dir>/streams/<name>/` that captures every
//! published message whose topic matches one of its patterns: `publish` appends the message
//! once to each matching stream *before* offering it to buffered subscriptions, and its
//! [`PublishReport::streams`](crate::PublishReport::streams) lists them. Under
//! `Fsync::Always` publish returns only once the record is synced; an append failure makes
//! publish fail (`PublishError::Stream`) and nothing is offered.
//!
//! A **durable subscription** is an ordinary subscription (same core, dispatcher, driver,
//! retry, DLQ, TTL, lanes, counters) that is *not* in the topic router; a pump thread reads
//! the stream from its cursor and offers the messages whose topic matches its filter,
//! keeping at most `capacity` messages outstanding (queued or in flight): when the window is
//! full — or the queue is, because an in-memory redrive shares it — the pump waits, it never
//! refuses (R-BP-2: the consumer only lags). The room check and the offer happen under one
//! subscription lock.
//!
//! # Durable DLQ (R-DEL-4)
//! Each durable subscription has a dead-letter log, `consumers/<stream>/<name>.dlq/`, whose
//! records carry tidings' metadata (reason, attempts, stream offset) in a leading header no
//! user header can override (see `dlq_record`). It can be listed, drained and redriven;
//! a redrive appends copies reserved for the subscription to the stream before the entries
//! leave the DLQ (loss-safe). Dropping the handle closes it before `drop` returns.
//!
//! # Storage and faults
//! Stream logs, offset files, DLQ logs and [`DurableDedupStore`]s all go through the
//! broker's [`Storage`](tidings_log::Storage) (`BrokerBuilder::storage`). A failed commit
//! poisons the cursor ([`CommitFailed`]) instead of being retried.
//!
//! # Retention
//! Applied after every segment roll by the log, and on a timer by the broker's retention
//! service (see `retention`), so idle streams shed old segments too.
//!
//! # Commit rules (R-LOG-3)
//! The committed position is the *low watermark*: the lowest offset offered and not yet
//! finished (or the cursor, when nothing is outstanding). A message finishes when its
//! handler succeeded or it was dead-lettered (for dead letters: after it was appended to the
//! subscription's durable DLQ log). Messages abandoned at close (`Shutdown`) never finish,
//! so they are redelivered after a restart. The position is written (temp file, fsync,
//! rename, fsync dir) every `commit_every` completions, when the pump is idle, on seek and
//! on close. After a crash, the messages redelivered are exactly those finished but not yet
//! covered by the last written position: at-least-once across restarts. A committed
//! position beyond the stream's end (foreign file, or a stream that lost its tail in a
//! power cut) is clamped to the end at open, committed and logged, never trusted.
//!
//! See `docs/design.md` for the on-disk layout and encoding.

pub(crate) mod api;
pub(crate) mod codec;
pub(crate) mod commit;
pub(crate) mod config;
pub(crate) mod dedup_log;
pub(crate) mod dlq_record;
pub(crate) mod durable;
pub(crate) mod error;
pub mod offline;
pub(crate) mod pump;
pub(crate) mod retention;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::SystemTime;

use parking_lot::{Mutex, RwLock};
use tidings_log::{Log, RecoveryReport, RetentionReport};

use crate::error::PublishError;
use crate::message::{Message, millis_since_epoch};
use crate::topic::Pattern;

pub use config::{DEFAULT_COMMIT_EVERY, DEFAULT_RETENTION_INTERVAL, StartAt, StreamConfig};
pub use dedup_log::DurableDedupStore;
pub use durable::{DurableDeadLetter, DurableSubscription};
pub use error::{CommitFailed, StreamError};

/// Check a stream or subscription name: it becomes a file name.
pub(crate) fn check_name(what: &'static str, name: &str) -> Result<(), StreamError> {
    let bad = |reason| StreamError::InvalidName {
        what,
        name: name.to_owned(),
        reason,
    };
    if name.is_empty() || name.len() > 200 {
        return Err(bad("must be 1 to 200 bytes"));
    }
    if name.starts_with('.') {
        return Err(bad("must not start with '.'"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    {
        return Err(bad(
            "only ASCII letters, digits, '-', '_' and '.' are allowed",
        ));
    }
    Ok(())
}

/// One open stream.
#[derive(Debug)]
pub(crate) struct StreamInner {
    pub(crate) name: String,
    pub(crate) patterns: Vec<Pattern>,
    pub(crate) log: Log,
    pub(crate) dir: PathBuf,
    pub(crate) recovery: RecoveryReport,
    pub(crate) commit_every: usize,
    /// Period of the retention timer; `None` without a retention policy.
    pub(crate) retention_interval: Option<std::time::Duration>,
    /// The durable subscriptions reading it, woken by each append (R-EXE-4).
    pub(crate) feeders: RwLock<Vec<Weak<durable::Durable>>>,
}

/// A handle on an open stream (cheap to clone).
#[derive(Debug, Clone)]
pub struct Stream {
    pub(crate) inner: Arc<StreamInner>,
}

impl Stream {
    /// The stream's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.inner.name
    }
    /// Its directory, `<data_dir>/streams/<name>`.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }
    /// The patterns it captures.
    #[must_use]
    pub fn patterns(&self) -> &[Pattern] {
        &self.inner.patterns
    }
    /// What opening the log found and repaired (torn tail, rebuilt indexes, ignored files).
    #[must_use]
    pub fn recovery(&self) -> &RecoveryReport {
        &self.inner.recovery
    }
    /// The earliest retained offset.
    #[must_use]
    pub fn start_offset(&self) -> u64 {
        self.inner.log.start_offset()
    }
    /// One past the last readable record.
    #[must_use]
    pub fn end_offset(&self) -> u64 {
        self.inner.log.end_offset()
    }
    /// Read up to `max` messages from `from` (each carries its [`Message::offset`]).
    pub fn read(&self, from: u64, max: usize) -> Result<Vec<Message>, StreamError> {
        let records = self
            .inner
            .log
            .read(from, max)
            .map_err(|e| self.inner.read_error(e))?;
        records
            .into_iter()
            .map(|r| {
                let offset = r.offset;
                codec::decode(r).map_err(|reason| StreamError::Decode {
                    dir: self.inner.dir.clone(),
                    offset,
                    reason,
                })
            })
            .collect()
    }

    /// Remove old segments per the stream's retention, judging age against `now`, now. The
    /// log does this after every segment roll and the broker on a timer
    /// ([`StreamConfig::retention_interval`]); call it to force a pass.
    pub fn apply_retention(&self, now: SystemTime) -> Result<RetentionReport, StreamError> {
        self.inner
            .log
            .apply_retention(millis_since_epoch(now))
            .map_err(|source| StreamError::Retention {
                dir: self.inner.dir.clone(),
                source,
            })
    }
}

impl StreamInner {
    /// Register a durable subscription to wake on appends (dropping ones that are gone).
    pub(crate) fn add_feeder(&self, d: &Arc<durable::Durable>) {
        let mut feeders = self.feeders.write();
        feeders.retain(|w| w.strong_count() > 0);
        feeders.push(Arc::downgrade(d));
    }

    /// Something was appended: wake every durable subscription reading this stream (a
    /// no-op for a thread-driven one, which waits on the log itself).
    pub(crate) fn appended(&self) {
        for w in self.feeders.read().iter() {
            if let Some(d) = w.upgrade() {
                d.wake_feeder();
            }
        }
    }

    pub(crate) fn read_error(&self, e: tidings_log::ReadError) -> StreamError {
        match e {
            tidings_log::ReadError::OutOfRetention {
                requested,
                earliest,
            } => StreamError::OutOfRetention {
                requested,
                earliest,
            },
            tidings_log::ReadError::BeyondEnd { requested, end } => {
                StreamError::BeyondEnd { requested, end }
            }
            source => StreamError::Read {
                dir: self.dir.clone(),
                source,
            },
        }
    }

    /// Resolve a start position against the log (R-LOG-4).
    pub(crate) fn resolve(&self, at: StartAt) -> Result<u64, StreamError> {
        let (start, end) = (self.log.start_offset(), self.log.end_offset());
        match at {
            StartAt::Earliest => Ok(start),
            StartAt::Latest => Ok(end),
            StartAt::Offset(o) if o < start => Err(StreamError::OutOfRetention {
                requested: o,
                earliest: start,
            }),
            StartAt::Offset(o) if o > end => Err(StreamError::BeyondEnd { requested: o, end }),
            StartAt::Offset(o) => Ok(o),
            StartAt::Time(t) => self
                .log
                .offset_for_time(millis_since_epoch(t))
                .map_err(|e| self.read_error(e)),
        }
    }
}

/// Where a broker keeps its streams: the data directory and the storage it is accessed
/// through (a field of `BrokerBuilder`).
#[derive(Default)]
pub(crate) struct DataDir {
    pub(crate) path: Option<PathBuf>,
    /// `None` = the real file system.
    pub(crate) storage: Option<Arc<dyn tidings_log::Storage>>,
}

/// The broker's streams (a field of `BrokerInner`).
pub(crate) struct Streams {
    pub(crate) data_dir: Option<PathBuf>,
    /// Every stream log, offset file and durable DLQ log goes through it.
    pub(crate) storage: Arc<dyn tidings_log::Storage>,
    /// Fast path: false until the first stream is created.
    any: AtomicBool,
    pub(crate) map: RwLock<BTreeMap<String, Arc<StreamInner>>>,
    pub(crate) durables: Mutex<BTreeMap<(String, String), Weak<durable::Durable>>>,
    closed: AtomicBool,
    /// Started with the first stream that has a retention policy.
    pub(crate) retention: std::sync::OnceLock<Arc<retention::RetentionService>>,
}

impl Streams {
    /// The durable subscriptions still alive, in (stream, name) order.
    fn live_durables(&self) -> Vec<Arc<durable::Durable>> {
        self.durables
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Manual driver: pump every durable subscription in the caller's thread until it has
    /// nothing more to offer now (window full or log read to the end), writing commit
    /// positions that moved. Returns the passes that offered something.
    pub(crate) fn pump_all(&self, broker: &Weak<crate::broker::BrokerInner>) -> usize {
        let durables = self.live_durables();
        // Retention that fell due on the manual clock (idle streams included).
        let mut progress = self.retention.get().map_or(0, |r| r.run_due());
        for d in durables {
            let Some(sub) = d.sub.upgrade() else {
                continue;
            };
            while let pump::Pumped::Progress = pump::pump_once(&d, &sub, broker) {
                progress += 1;
            }
            d.flush_locked(&mut d.state.lock());
        }
        progress
    }

    pub(crate) fn new(data_dir: DataDir) -> Self {
        Self {
            data_dir: data_dir.path,
            storage: data_dir
                .storage
                .unwrap_or_else(|| Arc::new(tidings_log::FsStorage)),
            any: AtomicBool::new(false),
            map: RwLock::default(),
            durables: Mutex::default(),
            closed: AtomicBool::new(false),
            retention: std::sync::OnceLock::new(),
        }
    }

    /// Append `message` to every matching stream; the names of those that hold it.
    /// Returns at once (no allocation, no lock) when the broker has no stream.
    pub(crate) fn append(&self, message: &Message) -> Result<Vec<String>, PublishError> {
        if !self.any.load(Ordering::Acquire) {
            return Ok(Vec::new());
        }
        let targets: Vec<Arc<StreamInner>> = self
            .map
            .read()
            .values()
            .filter(|s| s.patterns.iter().any(|p| p.matches(message.topic())))
            .cloned()
            .collect();
        if targets.is_empty() {
            return Ok(Vec::new());
        }
        let record = codec::encode(message);
        let mut names = Vec::with_capacity(targets.len());
        for s in targets {
            s.log.append(&record).map_err(|e| PublishError::Stream {
                stream: s.name.clone(),
                error: format!(
                    "{e} (in {}; streams already holding the message: {names:?})",
                    s.dir.display()
                ),
            })?;
            s.appended();
            names.push(s.name.clone());
        }
        Ok(names)
    }

    pub(crate) fn mark_nonempty(&self) {
        self.any.store(true, Ordering::Release);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Broker close: stop every pump, write every durable position (abandoned messages
    /// are not finished, so they stay above it), close every log.
    pub(crate) fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(r) = self.retention.get() {
            r.stop();
        }
        let durables = self.live_durables();
        for d in &durables {
            d.request_stop();
        }
        for d in &durables {
            d.shutdown();
        }
        let streams = std::mem::take(&mut *self.map.write());
        self.any.store(false, Ordering::Release);
        for s in streams.values() {
            if let Err(e) = s.log.close() {
                tracing::error!("tidings: closing stream {}: {e}", s.name);
            }
        }
    }
}
