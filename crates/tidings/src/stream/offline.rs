//! Offline tools on a broker's data directory (R-OPS-5): list and inspect streams, durable
//! subscriptions (consumers) and their durable dead-letter queues; seek a consumer; redrive
//! and purge dead letters. The `tidings` command line is a thin layer over this module.
//!
//! # The data directory
//!
//! The directory given to [`BrokerBuilder::data_dir`](crate::BrokerBuilder::data_dir):
//!
//! | path | content |
//! |---|---|
//! | `streams/<stream>/` | the stream's `tidings-log` |
//! | `consumers/<stream>/<name>.offset` | the committed position of durable subscription `name` |
//! | `consumers/<stream>/<name>.dlq/` | its durable dead-letter log (a `tidings-log`) |
//! | `consumers/<stream>/<name>.dlq.removed` | entries of that log that were redriven or purged |
//!
//! The dead-letter log is append-only, so an entry *leaves* it by being listed in
//! `<name>.dlq.removed`: the line `tidings-dlq-removed 1`, then one line `<start> <end>` per
//! half-open range of removed entry ids (the entries' offsets in the dead-letter log). The
//! file is replaced atomically (temp file, fsync, rename, fsync of the directory), like the
//! offset file. [`DurableSubscription::durable_dead_letters`](crate::DurableSubscription::durable_dead_letters)
//! skips removed entries too.
//!
//! # Reading while a broker runs
//!
//! Read operations ([`DataDir::streams`], [`DataDir::stream`], [`DataDir::consumers`],
//! [`DataDir::consumer`], [`DataDir::dead_letters`]) open files read-only, never repair
//! anything and take no lock, so they run beside a live broker. They show what is on disk
//! then: the records written so far (a partly written last record is not shown), the
//! position as of the subscription's last commit (a live subscription commits every
//! `commit_every` completions, when idle and on close, so it may be ahead in memory), and
//! the dead letters appended so far. [`StreamSummary::locked`] and
//! [`ConsumerSummary::active`] say whether a broker holds the stream / the subscription.
//!
//! # Writing
//!
//! Write operations ([`DataDir::seek`], [`DataDir::redrive`], [`DataDir::purge`]) first
//! open the stream's log, which takes its advisory `LOCK`; while a broker has the stream
//! open they fail with a `Locked` error naming the lock file and change nothing. Holding the
//! stream's lock for the whole operation keeps a broker from opening the stream (and so
//! from starting any of its durable subscriptions) meanwhile. Opening the log recovers it
//! exactly as a broker would (a torn tail is truncated); retention is not applied.
//!
//! # Redrive is loss-safe
//!
//! [`DataDir::redrive`] appends the original messages (same id, topic, key, headers,
//! payload, timestamp; without the dead-letter metadata) to the stream, in batches, syncs the
//! stream, and only then marks the batch removed from the dead-letter log. A crash in
//! between leaves the entries in both places (redriven again next time: a duplicate, never a
//! loss). The messages get new offsets at the end of the stream, so **every** durable
//! subscription of that stream whose filter matches sees them again, not only the one whose
//! dead letters they were; wrap handlers in [`Deduplicating`](crate::Deduplicating) (with a
//! durable store) to have the others skip ids they already processed.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::Serialize;
use tidings_log::{Fsync, Log, LogConfig, OpenError, StoredRecord, tools};

use super::commit::{OffsetStore, sync_dir};
use super::config::StartAt;
use super::durable::{decode_dead_letter, redrive_record};
use super::error::StreamError;
use super::{StreamInner, check_name, codec};

const REMOVED_MAGIC: &str = "tidings-dlq-removed 1\n";
/// Records per appended-and-synced redrive batch.
const REDRIVE_BATCH: usize = 256;
/// Longest payload preview, in bytes of the payload.
const PREVIEW_BYTES: usize = 96;

// ---------------------------------------------------------------------------------------
// The removed-entries file of a durable dead-letter log.

/// The set of removed entry ids of one dead-letter log (`<name>.dlq.removed`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Removed {
    /// start → end (exclusive), disjoint and non-adjacent.
    ranges: BTreeMap<u64, u64>,
}

/// `<dir>/<name>.dlq` → `<dir>/<name>.dlq.removed`.
pub(crate) fn removed_path(dlq_dir: &Path) -> PathBuf {
    let mut p = dlq_dir.as_os_str().to_owned();
    p.push(".removed");
    PathBuf::from(p)
}

impl Removed {
    /// Load the removed set of the dead-letter log in `dlq_dir` (empty when no file).
    pub(crate) fn load(dlq_dir: &Path) -> Result<Self, StreamError> {
        let path = removed_path(dlq_dir);
        let text = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(StreamError::io(&path, e)),
        };
        let bad = |reason: &str| StreamError::BadOffsetFile {
            path: path.clone(),
            reason: reason.to_owned(),
        };
        let text = std::str::from_utf8(&text).map_err(|_| bad("not UTF-8"))?;
        let body = text
            .strip_prefix(REMOVED_MAGIC)
            .ok_or_else(|| bad("missing `tidings-dlq-removed 1` header"))?;
        let mut out = Self::default();
        for line in body.lines() {
            let (a, b) = line
                .split_once(' ')
                .ok_or_else(|| bad("a line is not `<start> <end>`"))?;
            let a: u64 = a.parse().map_err(|_| bad("start is not a number"))?;
            let b: u64 = b.parse().map_err(|_| bad("end is not a number"))?;
            if a >= b {
                return Err(bad("empty or reversed range"));
            }
            out.insert_range(a, b);
        }
        Ok(out)
    }

    /// Durably replace the file with this set.
    pub(crate) fn store(&self, dlq_dir: &Path) -> Result<(), StreamError> {
        let path = removed_path(dlq_dir);
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let mut text = String::from(REMOVED_MAGIC);
        for (a, b) in &self.ranges {
            text.push_str(&format!("{a} {b}\n"));
        }
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| StreamError::io(&tmp, e))?;
        f.write_all(text.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| StreamError::io(&tmp, e))?;
        drop(f);
        fs::rename(&tmp, &path).map_err(|e| StreamError::io(&path, e))?;
        match path.parent() {
            Some(parent) => sync_dir(parent),
            None => Ok(()),
        }
    }

    /// Whether entry `id` was removed.
    pub(crate) fn contains(&self, id: u64) -> bool {
        self.ranges
            .range(..=id)
            .next_back()
            .is_some_and(|(_, &end)| id < end)
    }

    /// Mark entry `id` removed.
    pub(crate) fn insert(&mut self, id: u64) {
        self.insert_range(id, id.saturating_add(1));
    }

    fn insert_range(&mut self, mut a: u64, mut b: u64) {
        // Merge with every overlapping or adjacent range.
        while let Some((&s, &e)) = self.ranges.range(..=b).next_back() {
            if e < a {
                break;
            }
            a = a.min(s);
            b = b.max(e);
            self.ranges.remove(&s);
        }
        self.ranges.insert(a, b);
    }
}

// ---------------------------------------------------------------------------------------
// Public reports.

/// One stream of a data directory, as [`DataDir::streams`] and [`DataDir::stream`] see it
/// on disk. Serialised field names are stable (the `tidings --json` output).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct StreamSummary {
    /// The stream's name.
    pub name: String,
    /// Its log directory, `<data_dir>/streams/<name>`.
    pub dir: PathBuf,
    /// The earliest retained offset.
    pub start_offset: u64,
    /// One past the last complete record.
    pub end_offset: u64,
    /// Complete records on disk.
    pub records: u64,
    /// Bytes of the segment files.
    pub bytes: u64,
    /// Segment files.
    pub segments: usize,
    /// Smallest record timestamp (ms since the UNIX epoch), if any record.
    pub first_timestamp_ms: Option<u64>,
    /// Largest record timestamp (ms since the UNIX epoch), if any record.
    pub last_timestamp_ms: Option<u64>,
    /// Whether a broker (or another tool) holds the log's lock right now.
    pub locked: bool,
    /// Durable subscriptions with state on disk for this stream.
    pub consumers: usize,
    /// Problems seen while reading (a damaged segment); `tidings log verify` tells more.
    pub problems: Vec<String>,
}

/// One durable subscription (consumer) of a stream, as on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ConsumerSummary {
    /// The stream it reads.
    pub stream: String,
    /// Its durable name.
    pub name: String,
    /// The committed position (every offset below it finished), `None` if no offset file.
    pub committed: Option<u64>,
    /// The stream's earliest retained offset.
    pub stream_start: u64,
    /// The stream's end offset.
    pub stream_end: u64,
    /// Records not yet committed: `stream_end - committed` (0 without a position).
    pub lag: u64,
    /// Entries in its durable dead-letter log (removed ones not counted).
    pub dead_letters: u64,
    /// Those entries by reason kind (`retries_exhausted`, `rejected`, `expired`, ...).
    pub dead_letters_by_reason: BTreeMap<String, u64>,
    /// Whether the subscription is live in a broker right now (its dead-letter log is
    /// locked).
    pub active: bool,
    /// The committed-position file.
    pub offset_file: PathBuf,
}

/// One entry of a durable dead-letter log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct DeadLetterEntry {
    /// The entry id: its offset in the dead-letter log (what redrive and purge select).
    pub entry: u64,
    /// The message's offset in the stream when it was dead-lettered.
    pub stream_offset: Option<u64>,
    /// The message id (32 hex digits).
    pub message_id: String,
    /// The message topic.
    pub topic: String,
    /// The key, as UTF-8 (lossy), if any.
    pub key: Option<String>,
    /// Priority name (`low`, `normal`, `high`, `urgent`).
    pub priority: String,
    /// The message timestamp, ms since the UNIX epoch.
    pub timestamp_ms: u64,
    /// The reason kind (`retries_exhausted`, `rejected`, `expired`, `overflow`, ...).
    pub reason_kind: String,
    /// The full reason text (with the last handler error).
    pub reason: String,
    /// Handler attempts made.
    pub attempts: u32,
    /// The user headers, in order.
    pub headers: Vec<(String, String)>,
    /// Payload size in bytes.
    pub payload_len: usize,
    /// The payload's first bytes as UTF-8 (lossy), `…` appended when cut.
    pub payload_preview: String,
}

/// What [`DataDir::seek`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SeekOutcome {
    /// The stream.
    pub stream: String,
    /// The durable name.
    pub name: String,
    /// The committed position before.
    pub previous: u64,
    /// The committed position now.
    pub committed: u64,
}

/// What [`DataDir::redrive`] or [`DataDir::purge`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct DlqActionOutcome {
    /// The stream.
    pub stream: String,
    /// The durable name.
    pub name: String,
    /// Entry ids handled (removed from the dead-letter log), ascending.
    pub entries: Vec<u64>,
    /// For a redrive, the stream offsets the messages were appended at, in the same order
    /// (empty for a purge).
    pub stream_offsets: Vec<u64>,
    /// Entries left in the dead-letter log.
    pub remaining: u64,
}

/// Which dead-letter entries [`DataDir::redrive`] or [`DataDir::purge`] act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// Every entry present.
    All,
    /// These entry ids ([`DeadLetterEntry::entry`]); an id that is not present (never
    /// existed, or already removed) fails the whole operation before anything changes.
    Entries(Vec<u64>),
}

// ---------------------------------------------------------------------------------------
// Errors: one per operation.

/// Why a read operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InspectError {
    /// The path is not a readable data directory.
    #[error("{} is not a tidings data directory: {reason}", path.display())]
    NotADataDir {
        /// The path given.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A stream or durable name that cannot name a file (R-LIM-1).
    #[error("invalid {what} name {name:?}: {reason}")]
    InvalidName {
        /// `"stream"` or `"durable subscription"`.
        what: &'static str,
        /// The name given.
        name: String,
        /// Why it was refused.
        reason: String,
    },
    /// No such stream in the data directory.
    #[error("no stream {name:?} in {}", data_dir.display())]
    UnknownStream {
        /// The stream name.
        name: String,
        /// The data directory.
        data_dir: PathBuf,
    },
    /// No such durable subscription on the stream.
    #[error("no durable subscription {name:?} on stream {stream:?}")]
    UnknownConsumer {
        /// The stream.
        stream: String,
        /// The durable name.
        name: String,
    },
    /// A file could not be read or is not what tidings wrote (R-LIM-2): the message names
    /// the path (and offset, for a record).
    #[error("cannot read {}: {reason}", path.display())]
    Unreadable {
        /// The file or directory.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

/// Why [`DataDir::seek`] failed; nothing changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SeekError {
    /// Finding the stream or consumer failed.
    #[error(transparent)]
    Inspect(#[from] InspectError),
    /// A broker holds the stream: stop it first.
    #[error("{} is locked: a broker has this stream open; stop it before writing", path.display())]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// The target is outside the stream, or the log or offset file failed.
    #[error(transparent)]
    Stream(StreamError),
}

/// Why [`DataDir::redrive`] failed. Entries redriven before the failure stay redriven (and
/// removed from the dead-letter log); the rest are still in it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedriveError {
    /// Finding the stream or consumer failed.
    #[error(transparent)]
    Inspect(#[from] InspectError),
    /// A broker holds the stream or the subscription: stop it first.
    #[error("{} is locked: a broker has this stream open; stop it before writing", path.display())]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// A selected entry is not in the dead-letter log (nothing was redriven).
    #[error("dead-letter entry {entry} of {stream}/{name} does not exist or was already removed")]
    UnknownEntry {
        /// The stream.
        stream: String,
        /// The durable name.
        name: String,
        /// The entry id.
        entry: u64,
    },
    /// Reading, appending, syncing or recording the removal failed.
    #[error(transparent)]
    Stream(StreamError),
}

/// Why [`DataDir::purge`] failed; nothing changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PurgeError {
    /// Finding the stream or consumer failed.
    #[error(transparent)]
    Inspect(#[from] InspectError),
    /// A broker holds the stream or the subscription: stop it first.
    #[error("{} is locked: a broker has this stream open; stop it before writing", path.display())]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// A selected entry is not in the dead-letter log.
    #[error("dead-letter entry {entry} of {stream}/{name} does not exist or was already removed")]
    UnknownEntry {
        /// The stream.
        stream: String,
        /// The durable name.
        name: String,
        /// The entry id.
        entry: u64,
    },
    /// Reading the log or recording the removal failed.
    #[error(transparent)]
    Stream(StreamError),
}

// ---------------------------------------------------------------------------------------
// The data directory.

/// A broker's data directory, opened for offline inspection and maintenance (R-OPS-5).
///
/// ```no_run
/// use tidings::offline::DataDir;
/// let dir = DataDir::open("/var/lib/app/tidings")?;
/// for s in dir.streams()? {
///     println!("{}: offsets {}..{}", s.name, s.start_offset, s.end_offset);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct DataDir {
    root: PathBuf,
}

fn unreadable(path: &Path, reason: impl ToString) -> InspectError {
    InspectError::Unreadable {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn checked(what: &'static str, name: &str) -> Result<(), InspectError> {
    check_name(what, name).map_err(|e| match e {
        StreamError::InvalidName { what, name, reason } => InspectError::InvalidName {
            what,
            name,
            reason: reason.to_owned(),
        },
        other => InspectError::InvalidName {
            what,
            name: name.to_owned(),
            reason: other.to_string(),
        },
    })
}

/// Whether another handle holds the advisory lock of the log in `dir`.
fn is_locked(dir: &Path) -> bool {
    let Ok(f) = OpenOptions::new()
        .read(true)
        .open(dir.join(tidings_log::LOCK_FILE))
    else {
        return false;
    };
    // Released again when `f` drops.
    matches!(f.try_lock(), Err(fs::TryLockError::WouldBlock))
}

/// Sorted names of the entries of `dir` accepted by `keep` (which maps a file name to a
/// stream or consumer name).
fn names_in(
    dir: &Path,
    keep: impl Fn(&str, &fs::Metadata) -> Option<String>,
) -> Result<Vec<String>, InspectError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(unreadable(dir, e)),
    };
    let mut out = Vec::new();
    for e in entries {
        let e = e.map_err(|e| unreadable(dir, e))?;
        let Ok(meta) = e.metadata() else { continue };
        if let Some(name) = e.file_name().to_str().and_then(|n| keep(n, &meta))
            && check_name("stream", &name).is_ok()
        {
            out.push(name);
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// The reason kind of a stored reason text (the [`DeadLetterReason`](crate::DeadLetterReason)
/// display text).
fn reason_kind(text: &str) -> String {
    if text.starts_with("retries exhausted") {
        "retries_exhausted".to_owned()
    } else if text.starts_with("rejected") {
        "rejected".to_owned()
    } else if text.is_empty() {
        "unknown".to_owned()
    } else {
        text.split(':').next().unwrap_or(text).to_owned()
    }
}

fn preview(payload: &[u8]) -> String {
    let cut = payload.len() > PREVIEW_BYTES;
    let mut s = String::from_utf8_lossy(&payload[..payload.len().min(PREVIEW_BYTES)]).into_owned();
    if cut {
        s.push('…');
    }
    s
}

fn entry_from(r: StoredRecord, dlq_dir: &Path) -> Result<DeadLetterEntry, InspectError> {
    let entry = r.offset;
    let bad = |reason| {
        unreadable(
            dlq_dir,
            format!("record {entry} is not a tidings dead letter: {reason}"),
        )
    };
    // The original message, as a redrive would append it (no dead-letter metadata).
    let original = redrive_record(&r);
    let m = codec::decode(StoredRecord {
        offset: entry,
        timestamp_ms: original.timestamp_ms,
        key: original.key,
        headers: original.headers,
        payload: original.payload,
    })
    .map_err(bad)?;
    let d = decode_dead_letter(r).map_err(bad)?;
    Ok(DeadLetterEntry {
        entry,
        stream_offset: d.message.offset(),
        message_id: m.id().to_string(),
        topic: m.topic().as_str().to_owned(),
        key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
        priority: format!("{:?}", m.priority()).to_lowercase(),
        timestamp_ms: m
            .timestamp()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        reason_kind: reason_kind(&d.reason),
        reason: d.reason.clone(),
        attempts: d.attempts,
        headers: m
            .headers()
            .iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        payload_len: m.payload().len(),
        payload_preview: preview(m.payload()),
    })
}

/// Every record of the log in `dir` from `from` on (read-only).
fn dump_all(dir: &Path, from: u64) -> Result<Vec<StoredRecord>, InspectError> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    tools::dump(dir, from, usize::MAX).map_err(|e| unreadable(dir, e))
}

/// Map a log open failure of a write operation.
enum Opened {
    Log(Log),
    Locked(PathBuf),
}

fn open_for_write(dir: &Path) -> Result<Opened, StreamError> {
    let config = LogConfig {
        fsync: Fsync::Always,
        ..LogConfig::default()
    };
    match Log::open(dir, config) {
        Ok((log, _)) => Ok(Opened::Log(log)),
        Err(OpenError::Locked { path }) => Ok(Opened::Locked(path)),
        Err(source) => Err(StreamError::Open {
            dir: dir.to_path_buf(),
            source,
        }),
    }
}

fn close_log(log: &Log) -> Result<(), StreamError> {
    log.close().map_err(|e| {
        StreamError::io(
            log.dir(),
            io::Error::other(format!("closing the log failed: {e}")),
        )
    })
}

impl DataDir {
    /// Open the data directory at `path` (it must exist and be a directory; nothing is
    /// written).
    ///
    /// # Errors
    /// [`InspectError::NotADataDir`] when it is missing or not a directory.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, InspectError> {
        let root = path.into();
        match fs::metadata(&root) {
            Ok(m) if m.is_dir() => Ok(Self { root }),
            Ok(_) => Err(InspectError::NotADataDir {
                path: root,
                reason: "not a directory".to_owned(),
            }),
            Err(e) => Err(InspectError::NotADataDir {
                path: root,
                reason: e.to_string(),
            }),
        }
    }

    /// The directory's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.root
    }

    fn stream_dir(&self, stream: &str) -> PathBuf {
        self.root.join("streams").join(stream)
    }

    fn consumer_dir(&self, stream: &str) -> PathBuf {
        self.root.join("consumers").join(stream)
    }

    fn dlq_dir(&self, stream: &str, name: &str) -> PathBuf {
        self.consumer_dir(stream).join(format!("{name}.dlq"))
    }

    fn require_stream(&self, stream: &str) -> Result<PathBuf, InspectError> {
        checked("stream", stream)?;
        let dir = self.stream_dir(stream);
        if dir.is_dir() {
            Ok(dir)
        } else {
            Err(InspectError::UnknownStream {
                name: stream.to_owned(),
                data_dir: self.root.clone(),
            })
        }
    }

    fn require_consumer(&self, stream: &str, name: &str) -> Result<(), InspectError> {
        self.require_stream(stream)?;
        checked("durable subscription", name)?;
        let cdir = self.consumer_dir(stream);
        if cdir.join(format!("{name}.offset")).is_file() || self.dlq_dir(stream, name).is_dir() {
            Ok(())
        } else {
            Err(InspectError::UnknownConsumer {
                stream: stream.to_owned(),
                name: name.to_owned(),
            })
        }
    }

    /// Names of the streams on disk, sorted.
    ///
    /// # Errors
    /// [`InspectError::Unreadable`] when `streams/` cannot be listed.
    pub fn stream_names(&self) -> Result<Vec<String>, InspectError> {
        names_in(&self.root.join("streams"), |n, m| {
            m.is_dir().then(|| n.to_owned())
        })
    }

    /// Every stream, sorted by name.
    ///
    /// # Errors
    /// As [`DataDir::stream`].
    pub fn streams(&self) -> Result<Vec<StreamSummary>, InspectError> {
        self.stream_names()?
            .iter()
            .map(|n| self.stream(n))
            .collect()
    }

    /// One stream: offsets, records, bytes, segments, lock state (read-only; scans the
    /// segments to count records).
    ///
    /// # Errors
    /// Bad or unknown name; an unreadable directory.
    pub fn stream(&self, name: &str) -> Result<StreamSummary, InspectError> {
        let dir = self.require_stream(name)?;
        let ins = tools::inspect(&dir).map_err(|e| unreadable(&dir, e))?;
        let problems = ins
            .segments
            .iter()
            .filter_map(|s| {
                s.problem
                    .as_ref()
                    .map(|p| format!("{}: {p}", s.path.display()))
            })
            .collect();
        Ok(StreamSummary {
            name: name.to_owned(),
            start_offset: ins.start_offset(),
            end_offset: ins.end_offset(),
            records: ins.records(),
            bytes: ins.total_bytes(),
            segments: ins.segments.len(),
            first_timestamp_ms: ins.segments.iter().filter_map(|s| s.min_timestamp_ms).min(),
            last_timestamp_ms: ins.segments.iter().filter_map(|s| s.max_timestamp_ms).max(),
            locked: is_locked(&dir),
            consumers: self.consumer_names(name)?.len(),
            problems,
            dir,
        })
    }

    /// Names of the durable subscriptions of `stream` with state on disk, sorted.
    ///
    /// # Errors
    /// Bad or unknown stream; an unreadable directory.
    pub fn consumer_names(&self, stream: &str) -> Result<Vec<String>, InspectError> {
        self.require_stream(stream)?;
        names_in(&self.consumer_dir(stream), |n, m| {
            if m.is_file() {
                n.strip_suffix(".offset").map(str::to_owned)
            } else if m.is_dir() {
                n.strip_suffix(".dlq").map(str::to_owned)
            } else {
                None
            }
        })
    }

    /// Every durable subscription of `stream`, sorted by name.
    ///
    /// # Errors
    /// As [`DataDir::consumer`].
    pub fn consumers(&self, stream: &str) -> Result<Vec<ConsumerSummary>, InspectError> {
        self.consumer_names(stream)?
            .iter()
            .map(|n| self.consumer(stream, n))
            .collect()
    }

    /// One durable subscription: committed position, lag, dead letters by reason, whether
    /// it is live (read-only).
    ///
    /// # Errors
    /// Bad or unknown names; an unreadable or foreign offset file or dead-letter log.
    pub fn consumer(&self, stream: &str, name: &str) -> Result<ConsumerSummary, InspectError> {
        self.require_consumer(stream, name)?;
        let sdir = self.stream_dir(stream);
        let ins = tools::inspect(&sdir).map_err(|e| unreadable(&sdir, e))?;
        let store = OffsetStore::new(&self.consumer_dir(stream), name);
        let committed = store.load().map_err(|e| unreadable(store.path(), e))?;
        let entries = self.dead_letters(stream, name)?;
        let mut by_reason = BTreeMap::new();
        for e in &entries {
            *by_reason.entry(e.reason_kind.clone()).or_insert(0) += 1;
        }
        let end = ins.end_offset();
        Ok(ConsumerSummary {
            stream: stream.to_owned(),
            name: name.to_owned(),
            committed,
            stream_start: ins.start_offset(),
            stream_end: end,
            lag: committed.map_or(0, |c| end.saturating_sub(c)),
            dead_letters: entries.len() as u64,
            dead_letters_by_reason: by_reason,
            active: is_locked(&self.dlq_dir(stream, name)),
            offset_file: store.path().to_path_buf(),
        })
    }

    /// The entries of a durable subscription's dead-letter log, oldest first, removed ones
    /// left out (read-only).
    ///
    /// # Errors
    /// Bad or unknown names; an unreadable log or removed-entries file; a record that is
    /// not a tidings dead letter (R-LIM-2).
    pub fn dead_letters(
        &self,
        stream: &str,
        name: &str,
    ) -> Result<Vec<DeadLetterEntry>, InspectError> {
        self.require_consumer(stream, name)?;
        let dlq = self.dlq_dir(stream, name);
        let removed = Removed::load(&dlq).map_err(|e| unreadable(&removed_path(&dlq), e))?;
        dump_all(&dlq, 0)?
            .into_iter()
            .filter(|r| !removed.contains(r.offset))
            .map(|r| entry_from(r, &dlq))
            .collect()
    }

    /// Move a durable subscription's committed position (R-LOG-4): it resumes there when
    /// a broker next subscribes it. Refuses while a broker has the stream open.
    ///
    /// # Errors
    /// [`SeekError::Locked`]; unknown names; [`StreamError::OutOfRetention`] /
    /// [`StreamError::BeyondEnd`] (inside [`SeekError::Stream`]) for an offset outside the
    /// stream. Nothing changes on error.
    pub fn seek(&self, stream: &str, name: &str, at: StartAt) -> Result<SeekOutcome, SeekError> {
        self.require_consumer(stream, name)?;
        let sdir = self.stream_dir(stream);
        let log = match open_for_write(&sdir).map_err(SeekError::Stream)? {
            Opened::Log(log) => log,
            Opened::Locked(path) => return Err(SeekError::Locked { path }),
        };
        let inner = StreamInner {
            name: stream.to_owned(),
            patterns: Vec::new(),
            log,
            dir: sdir,
            recovery: Default::default(),
            commit_every: 1,
        };
        let result = (|| {
            let store = OffsetStore::new(&self.consumer_dir(stream), name);
            let previous = store.load()?.unwrap_or(0);
            let target = inner.resolve(at)?;
            store.store(target)?;
            Ok(SeekOutcome {
                stream: stream.to_owned(),
                name: name.to_owned(),
                previous,
                committed: target,
            })
        })();
        let closed = close_log(&inner.log);
        let out = result.map_err(SeekError::Stream)?;
        closed.map_err(SeekError::Stream)?;
        Ok(out)
    }

    /// Redrive dead letters back into the stream, loss-safe (see the module docs): each
    /// batch of up to 256 is appended, synced, and only then marked removed.
    /// `progress(done, total)` is called after each batch. Refuses while a broker has the
    /// stream or the subscription open.
    ///
    /// # Errors
    /// [`RedriveError::Locked`]; unknown names or entries (nothing redriven); a failed
    /// append, sync or removal record (the batches before it stay redriven).
    pub fn redrive(
        &self,
        stream: &str,
        name: &str,
        selection: &Selection,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DlqActionOutcome, RedriveError> {
        self.require_consumer(stream, name)?;
        let sdir = self.stream_dir(stream);
        let log = match open_for_write(&sdir).map_err(RedriveError::Stream)? {
            Opened::Log(log) => log,
            Opened::Locked(path) => return Err(RedriveError::Locked { path }),
        };
        let result = self.redrive_into(&log, stream, name, selection, progress);
        let closed = close_log(&log);
        let out = result?;
        closed.map_err(RedriveError::Stream)?;
        Ok(out)
    }

    fn redrive_into(
        &self,
        log: &Log,
        stream: &str,
        name: &str,
        selection: &Selection,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DlqActionOutcome, RedriveError> {
        let dlq_dir = self.dlq_dir(stream, name);
        let mut outcome = DlqActionOutcome {
            stream: stream.to_owned(),
            name: name.to_owned(),
            entries: Vec::new(),
            stream_offsets: Vec::new(),
            remaining: 0,
        };
        let Some((dlq, mut removed, chosen, remaining)) =
            self.select(&dlq_dir, selection).map_err(|e| match e {
                Selected::Locked(path) => RedriveError::Locked { path },
                Selected::Unknown(entry) => RedriveError::UnknownEntry {
                    stream: stream.to_owned(),
                    name: name.to_owned(),
                    entry,
                },
                Selected::Stream(e) => RedriveError::Stream(e),
            })?
        else {
            return Ok(outcome);
        };
        let total = chosen.len() as u64;
        let result = (|| {
            for batch in chosen.chunks(REDRIVE_BATCH) {
                let records: Vec<_> = batch.iter().map(redrive_record).collect();
                let range = log
                    .append_batch(&records)
                    .map_err(|source| StreamError::Append {
                        dir: log.dir().to_path_buf(),
                        source,
                    })?;
                log.sync().map_err(|source| StreamError::Append {
                    dir: log.dir().to_path_buf(),
                    source,
                })?;
                // Durable in the stream: now, and only now, the entries may leave the DLQ.
                for r in batch {
                    removed.insert(r.offset);
                }
                removed.store(&dlq_dir)?;
                outcome.entries.extend(batch.iter().map(|r| r.offset));
                outcome.stream_offsets.extend(range);
                progress(outcome.entries.len() as u64, total);
            }
            Ok::<_, StreamError>(())
        })();
        let closed = close_log(&dlq);
        result.map_err(RedriveError::Stream)?;
        closed.map_err(RedriveError::Stream)?;
        outcome.remaining = remaining;
        Ok(outcome)
    }

    /// Remove dead letters from a durable subscription's dead-letter log without
    /// redriving them. `progress(done, total)` is called once they are removed. Refuses
    /// while a broker has the stream or the subscription open.
    ///
    /// # Errors
    /// [`PurgeError::Locked`]; unknown names or entries; an unreadable log or a failed
    /// write of the removed-entries file. Nothing changes on error.
    pub fn purge(
        &self,
        stream: &str,
        name: &str,
        selection: &Selection,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DlqActionOutcome, PurgeError> {
        self.require_consumer(stream, name)?;
        let sdir = self.stream_dir(stream);
        let log = match open_for_write(&sdir).map_err(PurgeError::Stream)? {
            Opened::Log(log) => log,
            Opened::Locked(path) => return Err(PurgeError::Locked { path }),
        };
        let dlq_dir = self.dlq_dir(stream, name);
        let mut outcome = DlqActionOutcome {
            stream: stream.to_owned(),
            name: name.to_owned(),
            entries: Vec::new(),
            stream_offsets: Vec::new(),
            remaining: 0,
        };
        let result = match self.select(&dlq_dir, selection) {
            Err(Selected::Locked(path)) => Err(PurgeError::Locked { path }),
            Err(Selected::Unknown(entry)) => Err(PurgeError::UnknownEntry {
                stream: stream.to_owned(),
                name: name.to_owned(),
                entry,
            }),
            Err(Selected::Stream(e)) => Err(PurgeError::Stream(e)),
            Ok(None) => Ok(()),
            Ok(Some((dlq, mut removed, chosen, remaining))) => {
                for r in &chosen {
                    removed.insert(r.offset);
                }
                let stored = removed.store(&dlq_dir);
                let closed = close_log(&dlq);
                stored.and(closed).map_err(PurgeError::Stream).map(|()| {
                    outcome.entries = chosen.iter().map(|r| r.offset).collect();
                    outcome.remaining = remaining;
                    progress(chosen.len() as u64, chosen.len() as u64);
                })
            }
        };
        let closed = close_log(&log);
        result?;
        closed.map_err(PurgeError::Stream)?;
        Ok(outcome)
    }

    /// Open the dead-letter log (taking its lock), load the removed set and pick the
    /// selected present entries. `None` when the subscription has no dead-letter log.
    /// Returns the log, the removed set, the chosen records and how many remain after.
    fn select(
        &self,
        dlq_dir: &Path,
        selection: &Selection,
    ) -> Result<Option<(Log, Removed, Vec<StoredRecord>, u64)>, Selected> {
        if !dlq_dir.is_dir() {
            return match selection {
                Selection::Entries(ids) if !ids.is_empty() => Err(Selected::Unknown(ids[0])),
                _ => Ok(None),
            };
        }
        let dlq = match open_for_write(dlq_dir).map_err(Selected::Stream)? {
            Opened::Log(log) => log,
            Opened::Locked(path) => return Err(Selected::Locked(path)),
        };
        let picked = (|| {
            let removed = Removed::load(dlq_dir).map_err(Selected::Stream)?;
            let mut present = Vec::new();
            let mut from = dlq.start_offset();
            loop {
                let recs = dlq.read(from, 1024).map_err(|source| {
                    Selected::Stream(StreamError::Read {
                        dir: dlq_dir.to_path_buf(),
                        source,
                    })
                })?;
                let Some(last) = recs.last() else { break };
                from = last.offset + 1;
                present.extend(recs.into_iter().filter(|r| !removed.contains(r.offset)));
            }
            let total = present.len() as u64;
            let chosen: Vec<StoredRecord> = match selection {
                Selection::All => present,
                Selection::Entries(ids) => {
                    let mut ids = ids.clone();
                    ids.sort_unstable();
                    ids.dedup();
                    let mut chosen = Vec::with_capacity(ids.len());
                    for id in ids {
                        let i = present
                            .binary_search_by_key(&id, |r| r.offset)
                            .map_err(|_| Selected::Unknown(id))?;
                        chosen.push(present[i].clone());
                    }
                    chosen
                }
            };
            let remaining = total - chosen.len() as u64;
            Ok((removed, chosen, remaining))
        })();
        match picked {
            Ok((removed, chosen, remaining)) => Ok(Some((dlq, removed, chosen, remaining))),
            Err(e) => {
                let _ = close_log(&dlq);
                Err(e)
            }
        }
    }
}

/// Why selecting entries failed (mapped into each operation's error).
enum Selected {
    Locked(PathBuf),
    Unknown(u64),
    Stream(StreamError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removed_ranges_merge_and_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let dlq = dir.path().join("billing.dlq");
        let mut r = Removed::load(&dlq).unwrap();
        for id in [5, 3, 4, 9, 0, 10, 8] {
            r.insert(id);
        }
        assert_eq!(
            r.ranges.iter().map(|(&a, &b)| (a, b)).collect::<Vec<_>>(),
            [(0, 1), (3, 6), (8, 11)]
        );
        assert!(r.contains(4) && r.contains(10) && !r.contains(6) && !r.contains(11));
        r.store(&dlq).unwrap();
        assert_eq!(Removed::load(&dlq).unwrap(), r);
        // R-LIM-2: a foreign file is a typed error naming the path.
        fs::write(removed_path(&dlq), "tidings-dlq-removed 1\n7 3\n").unwrap();
        let e = Removed::load(&dlq).unwrap_err().to_string();
        assert!(e.contains("billing.dlq.removed"), "{e}");
        fs::write(removed_path(&dlq), "hello").unwrap();
        assert!(Removed::load(&dlq).is_err());
    }

    #[test]
    fn reason_kinds() {
        assert_eq!(
            reason_kind("retries exhausted after 3 attempts: boom"),
            "retries_exhausted"
        );
        assert_eq!(reason_kind("rejected: bad: order"), "rejected");
        assert_eq!(reason_kind("expired"), "expired");
        assert_eq!(reason_kind(""), "unknown");
    }
}
