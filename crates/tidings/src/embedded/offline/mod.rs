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
//!
//! The dead-letter log is append-only, so an entry *leaves* it through a removal record
//! appended to the same log (see `embedded::dlq_record`); listing replays the log.
//! [`DurableSubscription::durable_dead_letters`](crate::DurableSubscription::durable_dead_letters)
//! reads the same records, so both views agree.
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
//! [`ConsumerSummary::active`] say whether a broker holds the stream / the subscription;
//! finding out takes the lock for an instant (`try_lock`, released at once), so a broker
//! opening that very log in the same microsecond may see `Locked` and must retry.
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
//! loss). The copies get new offsets at the end of the stream and are reserved for the
//! subscription whose dead letters they were: other durable subscriptions of the stream
//! skip them. A redriven message
//! keeps its absolute expiry and delivery time: an `expired` dead letter expires again.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::Serialize;
use tidings_log::{StoredRecord, tools};

use super::offset_store::OffsetStore;
use crate::durable::{StreamError, check_name};

mod dlq_store;
mod error;
mod write;

pub use error::{InspectError, PurgeError, RedriveError, SeekError};

/// Longest payload preview, in bytes of the payload.
const PREVIEW_BYTES: usize = 96;

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

/// Which dead-letter entries [`DataDir::redrive`] or [`DataDir::purge`] act on
/// (`#[non_exhaustive]`: a new way to select is not a breaking change).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Selection {
    /// Every entry present.
    All,
    /// These entry ids ([`DeadLetterEntry::entry`]); an id that is not present (never
    /// existed, or already removed) fails the whole operation before anything changes.
    Entries(Vec<u64>),
}

// ---------------------------------------------------------------------------------------
// The data directory.

/// A broker's data directory, opened for offline inspection and maintenance (R-OPS-5).
///
/// ```no_run
/// use tidings::embedded::offline::DataDir;
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
    let d = dlq_store::decode(&r).map_err(bad)?;
    let m = &d.message;
    Ok(DeadLetterEntry {
        entry,
        stream_offset: d.stream_offset,
        message_id: m.id().to_string(),
        topic: m.topic().as_str().to_owned(),
        key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
        priority: format!("{:?}", m.priority()).to_lowercase(),
        timestamp_ms: m
            .timestamp()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        reason_kind: d.reason.name().to_owned(),
        reason: d.reason.to_string(),
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
        let store = OffsetStore::new(
            std::sync::Arc::new(tidings_log::FsStorage),
            &self.consumer_dir(stream),
            name,
        );
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
        dlq_store::read_present(&dlq)
            .map_err(|e| unreadable(&dlq, e))?
            .into_iter()
            .map(|r| entry_from(r, &dlq))
            .collect()
    }
}
