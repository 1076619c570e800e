//! One embedded stream: a `tidings-log` in `<data_dir>/streams/<name>/` (R-LOG-1, R-LOG-2).
//!
//! # Ordering
//! Offsets grow by append order, from 0. Under `Fsync::Always` an append returns only once
//! the record is synced.
//!
//! # Duplicate window (R-DEL-7)
//! A publish whose message id was appended within the stream's window stores nothing and
//! reports the first offset (`id_window`); the window is rebuilt from the log's tail at
//! open. Redrive copies are appended without it: they repeat an id on purpose.
//!
//! # Waking
//! Every append (a publish, or a redrive copy) wakes the feeders of the cursors open on
//! the stream, through the [`CursorWaker`] each cursor was opened with.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use parking_lot::RwLock;
use tidings_log::{Fsync, Log, LogConfig, Record, RecoveryReport, RetentionReport, Storage};

use crate::durable::{
    Appended, BackendCursor, BackendStream, CursorSpec, CursorWaker, StartAt, StorageInfo,
    StreamError, StreamErrorKind,
};
use crate::message::{Message, millis_since_epoch};

use super::codec;
use super::cursor::{EmbeddedCursor, Opened};
use super::id_window::{Claim, IdWindow};
use super::offset_store::{OffsetStore, ensure_dir};
use super::options::EmbeddedStreamOptions;

/// An open embedded stream.
#[derive(Debug)]
pub(crate) struct EmbeddedStream {
    pub(crate) name: String,
    pub(crate) log: Log,
    pub(crate) dir: PathBuf,
    recovery: RecoveryReport,
    /// Offset files and durable DLQ logs of this stream's cursors: `consumers/<name>/`.
    consumers: PathBuf,
    storage: Arc<dyn Storage>,
    /// Completions between two commits of a cursor's position.
    pub(crate) commit_every: usize,
    /// The options it was opened with.
    options: EmbeddedStreamOptions,
    /// The ids appended within the duplicate window; `None`: the window is off (zero).
    window: Option<IdWindow>,
    /// The wakers of the cursors reading it (dropped with their cursor).
    wakers: RwLock<Vec<Weak<CursorWaker>>>,
    /// This stream itself (its cursors hold an `Arc`).
    me: Weak<EmbeddedStream>,
}

impl EmbeddedStream {
    /// Wrap an opened log.
    pub(crate) fn new(
        name: &str,
        opened: (Log, RecoveryReport),
        dirs: (PathBuf, PathBuf),
        storage: Arc<dyn Storage>,
        options: EmbeddedStreamOptions,
        duplicate_window: Duration,
    ) -> Arc<Self> {
        let ((log, recovery), (dir, consumers)) = (opened, dirs);
        let window = (!duplicate_window.is_zero()).then(|| {
            let window = IdWindow::new(duplicate_window, options.duplicate_window_entries);
            let kept = window.rebuild(&log);
            tracing::debug!("tidings: stream {name}: duplicate window rebuilt with {kept} id(s)");
            window
        });
        Arc::new_cyclic(|me| Self {
            name: name.to_owned(),
            log,
            dir,
            recovery,
            consumers,
            storage,
            commit_every: options.commit_every,
            options,
            window,
            wakers: RwLock::default(),
            me: me.clone(),
        })
    }

    /// Wake `waker` on every append while it lives (dropping the ones that are gone).
    pub(crate) fn add_waker(&self, waker: &Arc<CursorWaker>) {
        let mut wakers = self.wakers.write();
        wakers.retain(|w| w.strong_count() > 0);
        wakers.push(Arc::downgrade(waker));
    }

    /// Something was appended: wake every cursor reading this stream.
    fn appended(&self) {
        for w in self.wakers.read().iter() {
            if let Some(w) = w.upgrade() {
                w.wake();
            }
        }
    }

    /// Append one encoded record and wake the readers.
    pub(crate) fn append_record(&self, record: &Record) -> Result<u64, StreamError> {
        let offset = self
            .log
            .append(record)
            .map_err(|source| StreamError::append(self.dir.clone(), source))?;
        self.appended();
        Ok(offset)
    }

    /// Sync what was appended (a redrive syncs before the DLQ entries leave, R-DEL-4).
    pub(crate) fn sync(&self) -> Result<(), StreamError> {
        self.log
            .sync()
            .map_err(|source| StreamError::append(self.dir.clone(), source))
    }

    pub(crate) fn read_error(&self, e: tidings_log::ReadError) -> StreamError {
        read_error(&self.dir, e)
    }

    /// Resolve a start position against the log (R-LOG-4).
    pub(crate) fn resolve(&self, at: StartAt) -> Result<u64, StreamError> {
        resolve(&self.log, &self.dir, at)
    }

    /// What opening the log found and repaired.
    pub(crate) fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// Apply the retention now, judging age against `now`.
    pub(crate) fn retention_pass(&self, now: SystemTime) -> Result<RetentionReport, StreamError> {
        self.log
            .apply_retention(millis_since_epoch(now))
            .map_err(|source| StreamError::retention(self.dir.clone(), source))
    }
}

/// Count and size the `*.seg` files of a log directory (0, 0 when it cannot be read).
fn segment_files(storage: &dyn Storage, dir: &Path) -> (u64, u64) {
    let Ok(entries) = storage.list_dir(dir) else {
        return (0, 0);
    };
    entries
        .iter()
        .filter(|e| e.is_file && Path::new(&e.name).extension().is_some_and(|x| x == "seg"))
        .fold((0, 0), |(n, bytes), e| {
            let len = storage
                .open(&dir.join(&e.name), tidings_log::storage::OpenMode::Read)
                .and_then(|f| f.len())
                .unwrap_or(0);
            (n + 1, bytes + len)
        })
}

/// Map a log read error, naming the directory.
pub(crate) fn read_error(dir: &Path, e: tidings_log::ReadError) -> StreamError {
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
        source => StreamError::read(dir.to_path_buf(), source),
    }
}

/// Resolve a start position against `log` (R-LOG-4).
pub(crate) fn resolve(log: &Log, dir: &Path, at: StartAt) -> Result<u64, StreamError> {
    let (start, end) = (log.start_offset(), log.end_offset());
    match at {
        StartAt::Earliest => Ok(start),
        StartAt::Latest => Ok(end),
        StartAt::Offset(o) if o < start => Err(StreamError::OutOfRetention {
            requested: o,
            earliest: start,
        }),
        StartAt::Offset(o) if o > end => Err(StreamError::BeyondEnd { requested: o, end }),
        StartAt::Offset(o) => Ok(o),
        StartAt::Time(t) => log
            .offset_for_time(millis_since_epoch(t))
            .map_err(|e| read_error(dir, e)),
    }
}

impl BackendStream for EmbeddedStream {
    fn name(&self) -> &str {
        &self.name
    }

    fn append(&self, message: &Message) -> Result<Appended, StreamError> {
        let Some(window) = &self.window else {
            return self
                .append_record(&codec::encode(message))
                .map(Appended::stored);
        };
        let (id, at) = (
            message.id().as_u128(),
            millis_since_epoch(message.timestamp()),
        );
        match window.claim(id, at) {
            Claim::Duplicate(offset) => Ok(Appended::duplicate_of(offset)),
            Claim::Append => {
                let result = self.append_record(&codec::encode(message));
                window.resolve(id, at, result.as_ref().ok().copied());
                result.map(Appended::stored)
            }
        }
    }

    fn start_offset(&self) -> u64 {
        self.log.start_offset()
    }

    fn end_offset(&self) -> u64 {
        self.log.end_offset()
    }

    fn read(&self, from: u64, max: usize) -> Result<Vec<Message>, StreamError> {
        let records = self.log.read(from, max).map_err(|e| self.read_error(e))?;
        records
            .into_iter()
            .map(|r| {
                let offset = r.offset;
                codec::decode(r).map_err(|reason| StreamError::Decode {
                    dir: self.dir.clone(),
                    offset,
                    reason,
                })
            })
            .collect()
    }

    fn open_cursor(&self, spec: CursorSpec<'_>) -> Result<Box<dyn BackendCursor>, StreamError> {
        let me = self.me.upgrade().ok_or(StreamError::Closed)?;
        let name = spec.name;
        ensure_dir(&*self.storage, &self.consumers)?;
        let store = OffsetStore::new(self.storage.clone(), &self.consumers, name);
        // A committed position past the end is never trusted: new messages would reuse
        // the offsets below it.
        let mut clamped_from = None;
        let end = self.log.end_offset();
        let position = match store.load()? {
            Some(committed) if committed > end => {
                tracing::warn!(
                    "tidings: durable {name} on stream {}: committed offset {committed} \
                     is beyond the stream's end {end} (foreign offset file, or the stream lost \
                     its tail in a crash); clamped to {end}",
                    self.name
                );
                store.store(end)?;
                clamped_from = Some(committed);
                end
            }
            Some(committed) => committed,
            None => {
                let p = self.resolve(spec.start)?;
                store.store(p)?;
                p
            }
        };
        let dlq_dir = self.consumers.join(format!("{name}.dlq"));
        ensure_dir(&*self.storage, &dlq_dir)?;
        let dlq_config = LogConfig::new().fsync(Fsync::Always);
        let (dlq, _) = Log::open_with_storage(self.storage.clone(), &dlq_dir, dlq_config)
            .map_err(|source| StreamError::open(dlq_dir.clone(), source))?;
        Ok(Box::new(EmbeddedCursor::new(
            name,
            me,
            spec.filter.clone(),
            Opened {
                store,
                dlq,
                position,
                clamped_from,
            },
            spec.waker,
        )))
    }

    fn retention_interval(&self) -> Option<Duration> {
        // The log's retention is the stream's neutral one (set at open).
        let policy = self.log.config().retention;
        (policy.max_bytes.is_some() || policy.max_age.is_some())
            .then_some(self.options.retention_interval)
    }

    fn apply_retention(&self, now: SystemTime) -> Result<(), StreamError> {
        let report = self.retention_pass(now)?;
        if !report.removed.is_empty() {
            tracing::debug!(
                "tidings: retention removed {} segment(s) of stream {}",
                report.removed.len(),
                self.name
            );
        }
        Ok(())
    }

    fn storage_info(&self) -> StorageInfo {
        let (segments, bytes) = segment_files(&*self.storage, &self.dir);
        StorageInfo {
            bytes,
            segments,
            location: self.dir.display().to_string(),
            durability: match self.options.log.fsync {
                Fsync::Always => "always".to_owned(),
                Fsync::Interval(i) => format!("interval({i:?})"),
                Fsync::Never => "never".to_owned(),
                // A policy added to the log later: its own name until it gets a word here.
                other => format!("{other:?}").to_lowercase(),
            },
        }
    }

    fn close(&self) -> Result<(), StreamError> {
        self.log.close().map_err(|e| match e {
            tidings_log::CloseError::Flush(source) => StreamError::append(self.dir.clone(), source),
            other => StreamError::backend(
                super::NAME,
                StreamErrorKind::Io,
                format!("closing {}: {other}", self.dir.display()),
            ),
        })
    }
}
