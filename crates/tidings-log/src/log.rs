//! [`Log`]: the handle over one stream directory.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::commit::{Commit, Flusher};
use crate::config::{Fsync, LogConfig};
use crate::error::{AppendError, CloseError, OpenError, ReadError, RetentionError};
use crate::log_reader::LogReader;
use crate::reader;
use crate::record::{MAX_HEADER_NAME, Record, StoredRecord};
use crate::recovery::{RecoveryReport, recover};
use crate::retention::{self, RetentionReport};
use crate::segment::Segment;
use crate::storage::{DirLock, FsStorage, LOCK_FILE, Storage};
use crate::tail::{AppendListener, Tail};
use crate::writeback::Writeback;
use crate::writer::Writer;

/// State shared by the handle, the flusher thread and the internals.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) storage: Arc<dyn Storage>,
    pub(crate) dir: PathBuf,
    pub(crate) config: LogConfig,
    pub(crate) writer: Mutex<Writer>,
    /// All retained segments, oldest first; the last one is the active segment.
    pub(crate) segments: RwLock<Vec<Arc<Segment>>>,
    pub(crate) start: AtomicU64,
    /// One past the last record readers may see.
    pub(crate) visible: AtomicU64,
    /// Next offset to assign (mirror of the writer's).
    pub(crate) written: AtomicU64,
    pub(crate) commit: Commit,
    pub(crate) tail: Tail,
    pub(crate) closed: AtomicBool,
    pub(crate) retention_lock: Mutex<()>,
    /// Why the last retention pass run after a roll failed, if it did.
    pub(crate) retention_error: Mutex<Option<String>>,
    /// Appenders between entering `append` and finishing their write (group commit window).
    pub(crate) appending: AtomicUsize,
    /// Read chunks handed out recently, reused once no record refers to them any more.
    pub(crate) chunks: crate::reader::ChunkPool,
    /// Requests to the background writeback thread (unused under `Fsync::Always`).
    pub(crate) writeback: crate::writeback::Requests,
}

impl Shared {
    fn publish(&self) {
        self.tail.publish(self.visible.load(Ordering::SeqCst));
    }
}

/// An append-only log of records in one directory: segment files with offset and time indexes.
///
/// `Log` is `Send + Sync`; share it with `Arc<Log>` and append from many threads.
///
/// # Ordering
///
/// Offsets are assigned consecutively from 0, in the order appends take the internal writer
/// lock; a batch gets a contiguous range. Readers see records in offset order, and a record
/// becomes visible only after every record before it.
///
/// # Durability
///
/// Given by [`Fsync`]: under `Always` an `Ok` from `append` means the record survives a power
/// cut; under `Interval` at most about one interval of acknowledged records can be lost; under
/// `Never` nothing is promised beyond what [`Log::sync`] reported. [`Log::durable_offset`] tells
/// what is synced. After a crash, [`Log::open`] recovers exactly the records that reached the
/// disk intact, as a prefix: see the [recovery rules](crate#recovery-rules).
///
/// # Failure
///
/// A failed write or fsync *poisons* the writer: that append returns the I/O error and every
/// later append or sync returns [`AppendError::Poisoned`]; reads keep working. Reopen to recover.
///
/// # Closing
///
/// [`Log::close`] (or dropping the log) stops the flusher thread, hands the write buffer to the
/// OS and, under `Always` and `Interval`, syncs it. Later appends fail with
/// [`AppendError::Closed`]; waiters in [`Log::wait_for_append`] return.
///
/// One `Log` per directory: two handles (in one process or two) on the same directory corrupt
/// it; the embedding broker owns that rule.
#[derive(Debug)]
pub struct Log {
    shared: Arc<Shared>,
    flusher: Mutex<Option<Flusher>>,
    writeback: Mutex<Option<Writeback>>,
    /// Held until close: one writing `Log` per directory at a time.
    lock: Mutex<DirLock>,
}

impl Log {
    /// Opens (creating if needed) the log in `dir` on the real file system, recovering from any
    /// crash. See [`Log::open_with_storage`].
    pub fn open(
        dir: impl AsRef<Path>,
        config: LogConfig,
    ) -> Result<(Log, RecoveryReport), OpenError> {
        Self::open_with_storage(Arc::new(FsStorage), dir.as_ref(), config)
    }

    /// Opens (creating if needed) the log in `dir` on `storage`.
    ///
    /// Validates the configuration, then the directory: every segment header, the index files of
    /// sealed segments, every record of the last segment (all segments with
    /// [`LogConfig::verify_on_open`]), and that segments follow each other without gaps. A torn
    /// tail is cut off and reported; corruption anywhere else is an error that leaves the files
    /// untouched. See the [recovery rules](crate#recovery-rules).
    pub fn open_with_storage(
        storage: Arc<dyn Storage>,
        dir: &Path,
        config: LogConfig,
    ) -> Result<(Log, RecoveryReport), OpenError> {
        let io = |path: PathBuf| move |source| OpenError::Io { path, source };
        storage.create_dir_all(dir).map_err(io(dir.to_path_buf()))?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = storage.lock_dir(dir).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock => OpenError::Locked {
                path: lock_path.clone(),
            },
            _ => io(lock_path.clone())(e),
        })?;
        let rec = recover(&*storage, dir, &config)?;
        let active = rec.segments.last().cloned().ok_or_else(|| OpenError::Io {
            path: dir.to_path_buf(),
            source: std::io::Error::other("no segment after recovery"),
        })?;
        let start = rec.segments.first().map_or(0, |s| s.base);
        let end = active.end();
        let fsync = config.fsync;
        let tail = Tail::default();
        tail.publish(end);
        let shared = Arc::new(Shared {
            storage,
            dir: dir.to_path_buf(),
            writer: Mutex::new(Writer::new(
                active,
                rec.builder,
                (fsync != Fsync::Always).then(|| crate::writeback::threshold(&config)),
            )),
            segments: RwLock::new(rec.segments),
            start: AtomicU64::new(start),
            visible: AtomicU64::new(end),
            written: AtomicU64::new(end),
            commit: Commit::new(end),
            tail,
            closed: AtomicBool::new(false),
            retention_lock: Mutex::new(()),
            retention_error: Mutex::new(None),
            appending: AtomicUsize::new(0),
            chunks: Default::default(),
            writeback: Default::default(),
            config,
        });
        let spawn_err = |source| OpenError::Io {
            path: dir.to_path_buf(),
            source,
        };
        let mut writeback = match fsync {
            Fsync::Always => None,
            _ => Some(Writeback::spawn(shared.clone()).map_err(spawn_err)?),
        };
        let flusher = match fsync {
            Fsync::Interval(every) => match Flusher::spawn(shared.clone(), every) {
                Ok(f) => Some(f),
                Err(e) => {
                    // The writeback thread holds the shared state: stop it, or it would live on.
                    if let Some(w) = writeback.as_mut() {
                        w.stop();
                    }
                    return Err(spawn_err(e));
                }
            },
            _ => None,
        };
        Ok((
            Log {
                shared,
                flusher: Mutex::new(flusher),
                writeback: Mutex::new(writeback),
                lock: Mutex::new(lock),
            },
            rec.report,
        ))
    }

    fn check(&self, record: &Record) -> Result<u64, AppendError> {
        if let Some((name, _)) = record
            .headers
            .iter()
            .find(|(n, _)| n.len() > MAX_HEADER_NAME)
        {
            return Err(AppendError::HeaderNameTooLong {
                len: name.len(),
                max: MAX_HEADER_NAME,
            });
        }
        let size = record.encoded_len();
        let max = self.shared.config.max_record_bytes;
        if size > u64::from(max) {
            return Err(AppendError::RecordTooLarge { size, max });
        }
        Ok(size)
    }

    /// Appends one record and returns its offset.
    ///
    /// Under [`Fsync::Always`] returns only once the record is synced (sharing the sync with
    /// concurrent appenders). Fails without writing anything if the record is too large, and with
    /// [`AppendError::Poisoned`] / [`AppendError::Closed`] if the writer is poisoned or closed.
    pub fn append(&self, record: &Record) -> Result<u64, AppendError> {
        let len = self.check(record)?;
        self.write(std::slice::from_ref(record), &[len])
            .map(|r| r.start)
    }

    /// Appends records as one contiguous range of offsets (one lock round trip, one sync under
    /// `Always`). All records are checked first; if one is refused, none is written. An empty
    /// batch returns an empty range at the current end.
    pub fn append_batch(&self, records: &[Record]) -> Result<Range<u64>, AppendError> {
        let lens = records
            .iter()
            .map(|r| self.check(r))
            .collect::<Result<Vec<_>, _>>()?;
        self.write(records, &lens)
    }

    fn write(&self, records: &[Record], lens: &[u64]) -> Result<Range<u64>, AppendError> {
        let sh = &*self.shared;
        let always = sh.config.fsync == Fsync::Always;
        if always {
            sh.appending.fetch_add(1, Ordering::SeqCst);
        }
        let written = self.write_locked(records, lens);
        if always {
            sh.appending.fetch_sub(1, Ordering::SeqCst);
        }
        let (range, rolled) = written?;
        if always && !range.is_empty() {
            let synced = sh.commit.sync_to(sh, range.end);
            sh.publish();
            synced?;
        } else {
            sh.publish();
        }
        if rolled {
            self.retain_after_roll(records);
        }
        Ok(range)
    }

    /// Retention after a roll, outside the writer lock, judging age against the newest record
    /// just appended. The append already succeeded, so a failure is kept for
    /// [`Log::retention_error`] rather than returned.
    fn retain_after_roll(&self, records: &[Record]) {
        let policy = self.shared.config.retention;
        if policy.max_bytes.is_none() && policy.max_age.is_none() {
            return;
        }
        let now_ms = records.iter().map(|r| r.timestamp_ms).max().unwrap_or(0);
        let outcome = retention::apply(&self.shared, now_ms)
            .err()
            .map(|e| e.to_string());
        *self.shared.retention_error.lock() = outcome;
    }

    /// Why the retention pass run after the last segment roll failed (`None` when it
    /// succeeded or has not run). Retention is applied after every roll and by
    /// [`Log::apply_retention`].
    #[must_use]
    pub fn retention_error(&self) -> Option<String> {
        self.shared.retention_error.lock().clone()
    }

    fn write_locked(
        &self,
        records: &[Record],
        lens: &[u64],
    ) -> Result<(Range<u64>, bool), AppendError> {
        let sh = &*self.shared;
        let range = {
            let mut w = sh.writer.lock();
            if w.closed {
                return Err(AppendError::Closed);
            }
            if sh.commit.is_poisoned() {
                return Err(AppendError::Poisoned);
            }
            let first = w.next;
            let mut result = Ok(());
            for (r, &len) in records.iter().zip(lens) {
                if let Err(e) = w.append(sh, r, len) {
                    result = Err(e);
                    break;
                }
            }
            sh.written.store(w.next, Ordering::Release);
            result?;
            if sh.config.fsync != Fsync::Always {
                // Only the writer raises `visible` under these policies. A release store, not
                // `SeqCst`: a waiter registers under this lock (see `wait_for_append`), so the
                // lock orders the two, and an append pays one locked instruction less (each
                // one waits for the record's bytes, just copied, to leave the store buffer).
                sh.visible.store(w.next, Ordering::Release);
            }
            (first..w.next, std::mem::take(&mut w.rolled))
        };
        Ok(range)
    }

    /// Reads up to `max_records` records starting at offset `from`, in offset order.
    ///
    /// Returns fewer (possibly none) when the end of the log is reached; `from == end_offset()`
    /// gives an empty vector. A record that fails its checks ends the batch: the records
    /// before it are returned, and the read that starts at it fails with
    /// [`ReadError::Corrupt`] (file, byte offset and record offset). Fails with
    /// [`ReadError::OutOfRetention`] if `from` was removed by retention and
    /// [`ReadError::BeyondEnd`] if `from > end_offset()`.
    pub fn read(&self, from: u64, max_records: usize) -> Result<Vec<StoredRecord>, ReadError> {
        reader::read(&self.shared, from, max_records)
    }

    /// A reader from offset `from` that lends each record ([`crate::RecordRef`], borrowed until
    /// its next call) instead of returning owned ones: the same checks as [`Log::read`],
    /// without a reference count, allocation or copy per record. See [`LogReader`] for its
    /// ordering and failures (a position out of range is reported by its first `next`).
    #[must_use]
    pub fn reader(&self, from: u64) -> LogReader<'_> {
        LogReader::new(&self.shared, from)
    }

    /// The first offset at or after `from` from which [`Log::read`] can go on: `from` itself
    /// when its record (and every record a read walks over to reach it) passes its checks;
    /// otherwise the first trustworthy record after the damage. Every offset in
    /// `from..returned` is a record that cannot be read; nothing is changed on disk.
    ///
    /// The record after a damaged one is found by the resync search of the [recovery
    /// rules](crate#recovery-rules) (rule 5) over the segment: through the damaged record's
    /// length when it is intact, byte by byte otherwise, where a candidate inside the extent
    /// the damaged record claims needs checksum evidence. In a sealed segment with no such
    /// record after the damage, the answer is the segment's end (the next segment's first
    /// record). What is found is remembered, so later reads start past the damage.
    ///
    /// # Errors
    /// [`ReadError::Corrupt`] for the damaged record when nothing readable follows it in
    /// the active segment (the format cannot resync there); [`ReadError::OutOfRetention`],
    /// [`ReadError::BeyondEnd`] and [`ReadError::Io`] as for [`Log::read`].
    pub fn next_readable(&self, from: u64) -> Result<u64, ReadError> {
        reader::next_readable(&self.shared, from)
    }

    /// The offset of the first record, in offset order, whose timestamp is `>= timestamp_ms`
    /// ("at or after"), among retained visible records; [`Log::end_offset`] if there is none.
    ///
    /// Timestamps may go backwards; the answer is still the *first* such record, never a later
    /// one (the time index stores the running maximum timestamp, see the
    /// [format](crate#index-files)). Records after the answer may have smaller timestamps.
    pub fn offset_for_time(&self, timestamp_ms: u64) -> Result<u64, ReadError> {
        reader::offset_for_time(&self.shared, timestamp_ms)
    }

    /// The earliest retained offset.
    pub fn start_offset(&self) -> u64 {
        self.shared.start.load(Ordering::Acquire)
    }

    /// One past the last record readers can see: the offset the next record will get once
    /// in-flight appends complete. Under [`Fsync::Always`] only synced records are visible, so this
    /// equals [`Log::durable_offset`].
    pub fn end_offset(&self) -> u64 {
        self.shared.visible.load(Ordering::SeqCst)
    }

    /// The next offset the writer will assign (includes appends not yet visible or synced).
    pub fn next_offset(&self) -> u64 {
        self.shared.written.load(Ordering::Acquire)
    }

    /// Every record below this offset is synced to stable storage.
    pub fn durable_offset(&self) -> u64 {
        self.shared.commit.durable()
    }

    /// Whether an earlier I/O failure poisoned the writer.
    pub fn is_poisoned(&self) -> bool {
        self.shared.commit.is_poisoned()
    }

    /// The stream directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The configuration the log was opened with.
    pub fn config(&self) -> &LogConfig {
        &self.shared.config
    }

    /// Blocks until `end_offset() > offset` (returns `true`), or the log is closed or `timeout`
    /// passes (returns whether the condition holds then). Woken by appends, never polls.
    pub fn wait_for_append(&self, offset: u64, timeout: Duration) -> bool {
        let sh = &*self.shared;
        sh.tail.wait(
            timeout,
            || sh.visible.load(Ordering::SeqCst) > offset,
            || sh.closed.load(Ordering::SeqCst),
            // Under the writer lock: the writer raises `visible` under it (with a release
            // store), so either that append comes first and `ready` sees it, or it comes after
            // and its `publish` sees this waiter.
            || {
                let _writer = sh.writer.lock();
                sh.tail.register_waiter();
            },
        )
    }

    /// Registers `f`, called after records become visible with a lower bound of the new end
    /// offset. It runs on the appending (or syncing) thread, outside every internal lock, so it
    /// may call back into the log; keep it short (wake a task, signal a condvar). Calls from
    /// different threads may run concurrently and out of order: treat the argument as a hint and
    /// read [`Log::end_offset`] for the truth.
    pub fn add_append_listener(&self, f: AppendListener) {
        self.shared.tail.add_listener(f);
    }

    /// Makes every record appended so far durable (flush and fsync), whatever the policy. Fails
    /// with [`AppendError::Poisoned`] once the writer is poisoned.
    pub fn sync(&self) -> Result<(), AppendError> {
        let sh = &*self.shared;
        if sh.commit.is_poisoned() {
            return Err(AppendError::Poisoned);
        }
        let target = sh.written.load(Ordering::Acquire);
        let r = sh.commit.sync_to(sh, target);
        sh.publish();
        r
    }

    /// Removes old sealed segments per [`LogConfig::retention`], judging age against `now_ms`
    /// (milliseconds since the UNIX epoch). See [`crate::retention`](crate#retention) rules.
    pub fn apply_retention(&self, now_ms: u64) -> Result<RetentionReport, RetentionError> {
        retention::apply(&self.shared, now_ms)
    }

    /// Closes the log: stops the flusher, flushes the write buffer, syncs under `Always` and
    /// `Interval`, and releases the directory lock (another handle may then open it).
    /// Idempotent; later appends fail with [`AppendError::Closed`], reads keep working, waiters
    /// return.
    pub fn close(&self) -> Result<(), CloseError> {
        let closed = self.close_writer();
        *self.lock.lock() = DirLock::none();
        closed
    }

    fn close_writer(&self) -> Result<(), CloseError> {
        let sh = &*self.shared;
        let first = {
            let mut w = sh.writer.lock();
            !std::mem::replace(&mut w.closed, true)
        };
        sh.closed.store(true, Ordering::SeqCst);
        if let Some(mut f) = self.flusher.lock().take() {
            f.stop();
        }
        if let Some(mut w) = self.writeback.lock().take() {
            w.stop();
        }
        sh.tail.wake_all();
        if !first {
            return Ok(());
        }
        if sh.commit.is_poisoned() {
            return Err(AppendError::Poisoned.into());
        }
        match sh.config.fsync {
            Fsync::Never => sh.writer.lock().flush(sh)?,
            _ => sh.commit.sync_to(sh, sh.written.load(Ordering::Acquire))?,
        }
        sh.publish();
        Ok(())
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        let _ = self.close();
    }
}
