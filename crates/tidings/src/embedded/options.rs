//! The embedded log's own per-stream settings: what only a local log has (R-LOG-1).
//!
//! The backend-neutral [`StreamConfig`](crate::StreamConfig) says what a stream captures and
//! keeps; [`EmbeddedStreamOptions`] says how the embedded log stores it: the fsync policy,
//! the segment size and the rest of the log's layout, how often durable subscriptions write
//! their position, and how often the broker's timer applies retention. An
//! [`EmbeddedBackend`](super::EmbeddedBackend) has one set of defaults for every stream and
//! may override them per stream name.

use std::time::Duration;

use tidings_log::LogConfig;

/// Default number of completions between two durable commits of a subscription's position.
pub const DEFAULT_COMMIT_EVERY: usize = 64;
/// Default period of the retention timer of a stream with a retention policy.
pub const DEFAULT_RETENTION_INTERVAL: Duration = Duration::from_secs(60);
/// Default cap on the ids a stream's duplicate window keeps in memory (R-DEL-7): about
/// 64 bytes each, so at most about 6.4 MB per stream.
pub const DEFAULT_DUPLICATE_WINDOW_ENTRIES: usize = 100_000;

/// When the embedded log syncs a stream's appends to disk (R-LOG-1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fsync {
    /// Sync before acknowledging every append (with group commit: appends that arrive
    /// while a sync runs share the next one). The default.
    Always,
    /// Sync from a background thread at this interval: a crash loses at most about this
    /// much of the latest appends.
    Interval(Duration),
    /// No sync per append: syncs on segment roll, background writeback and close only.
    Never,
}

impl Fsync {
    pub(crate) fn to_log(self) -> tidings_log::Fsync {
        match self {
            Fsync::Always => tidings_log::Fsync::Always,
            Fsync::Interval(every) => tidings_log::Fsync::Interval(every),
            Fsync::Never => tidings_log::Fsync::Never,
        }
    }
}

/// How the embedded log stores one stream. Defaults: `Fsync::Always` (an append returns
/// once synced), 64 MiB segments, durable positions written every
/// [`DEFAULT_COMMIT_EVERY`] completions (and when idle, on seek and on close), retention
/// applied every [`DEFAULT_RETENTION_INTERVAL`] when the stream has a policy, at most
/// [`DEFAULT_DUPLICATE_WINDOW_ENTRIES`] ids in the duplicate window.
///
/// ```
/// # use std::sync::Arc;
/// use tidings::{Broker, StreamConfig};
/// use tidings::embedded::{EmbeddedBackend, EmbeddedStreamOptions, Fsync};
/// let dir = tempfile::tempdir()?;
/// let backend = EmbeddedBackend::new(dir.path())
///     // every stream: group commit every 10 ms
///     .stream_defaults(EmbeddedStreamOptions::new().fsync(Fsync::Interval(
///         std::time::Duration::from_millis(10),
///     )))
///     // but "audit" syncs every append
///     .stream_options("audit", EmbeddedStreamOptions::new().fsync(Fsync::Always));
/// let broker = Broker::builder().durable_backend(Arc::new(backend)).build()?;
/// broker.create_stream(StreamConfig::new("audit", ["audit.#"]))?;
/// # broker.close(std::time::Duration::from_secs(1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct EmbeddedStreamOptions {
    pub(crate) log: LogConfig,
    pub(crate) commit_every: usize,
    pub(crate) retention_interval: Duration,
    pub(crate) duplicate_window_entries: usize,
}

impl Default for EmbeddedStreamOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl EmbeddedStreamOptions {
    /// The defaults (see the type's docs).
    pub fn new() -> Self {
        Self {
            log: LogConfig::default(),
            commit_every: DEFAULT_COMMIT_EVERY,
            retention_interval: DEFAULT_RETENTION_INTERVAL,
            duplicate_window_entries: DEFAULT_DUPLICATE_WINDOW_ENTRIES,
        }
    }
    /// Fsync policy of the stream's log. Under `Always`, `publish` returns only once the
    /// message is synced.
    pub fn fsync(mut self, fsync: Fsync) -> Self {
        self.log.fsync = fsync.to_log();
        self
    }
    /// Segment size of the stream's log: a new segment starts when the next record would
    /// make the active one larger (default 64 MiB; at least 128 bytes — a smaller one is
    /// refused when the stream is opened). Retention removes whole segments, so this is
    /// also its granularity.
    pub fn segment_bytes(mut self, bytes: u64) -> Self {
        self.log.segment_bytes = bytes;
        self
    }
    /// One offset-index entry (and at most one time-index entry) per this many bytes of
    /// records (default 4096): smaller is a faster seek for a bigger index.
    pub fn index_interval_bytes(mut self, bytes: u32) -> Self {
        self.log.index_interval_bytes = bytes;
        self
    }
    /// The largest encoded record (message) the stream accepts (default 16 MiB); a larger
    /// publish is refused with [`StreamErrorKind::InvalidInput`](crate::StreamErrorKind).
    pub fn max_record_bytes(mut self, bytes: u32) -> Self {
        self.log.max_record_bytes = bytes;
        self
    }
    /// The in-process write buffer, handed to the OS when it grows past this, before every
    /// sync and before a read that needs it (default 256 KiB; 0 writes every append
    /// through).
    pub fn write_buffer_bytes(mut self, bytes: usize) -> Self {
        self.log.write_buffer_bytes = bytes;
        self
    }
    /// Check every record of every segment when the stream is opened (default `false`:
    /// only the last segment, the only one a crash can damage, is scanned).
    pub fn verify_on_open(mut self, verify: bool) -> Self {
        self.log.verify_on_open = verify;
        self
    }
    /// Durable subscriptions of the stream write their position after this many
    /// completions (≥ 1), and at the first completion a second after the last write,
    /// besides when idle, on seek and on close. 1 = after every message.
    ///
    /// What a crash redelivers is what finished since the last write: with the defaults,
    /// at most 64 messages or about one second of completions (plus one handler's run),
    /// well inside the default duplicate window of two minutes that drops the outputs a
    /// redelivered input publishes again (R-DEL-7,
    /// [`StreamConfig::duplicate_window`](crate::StreamConfig::duplicate_window)).
    pub fn commit_every(mut self, completions: usize) -> Self {
        self.commit_every = completions.max(1);
        self
    }
    /// How often the broker applies the stream's retention when it has a policy (default
    /// [`DEFAULT_RETENTION_INTERVAL`], 60 s; on the broker's clock, so a
    /// [`ManualClock`](crate::ManualClock) drives it in tests). A duration too large to
    /// represent means never (only segment rolls and
    /// [`EmbeddedBackend::apply_retention`](super::EmbeddedBackend::apply_retention) apply
    /// it then).
    pub fn retention_interval(mut self, every: Duration) -> Self {
        self.retention_interval = every.max(Duration::from_millis(1));
        self
    }
    /// The most ids the stream's duplicate window
    /// ([`StreamConfig::duplicate_window`](crate::StreamConfig::duplicate_window), R-DEL-7)
    /// keeps in memory (≥ 1; default [`DEFAULT_DUPLICATE_WINDOW_ENTRIES`]), and the most
    /// records read from the log's tail to rebuild it at open. The window holds the ids
    /// appended within its age *and* among the last `entries` appends: past this many
    /// appends within the window, the oldest ids are forgotten early (a retry of one of
    /// them would be stored again). Size it to the appends a window's time brings.
    pub fn duplicate_window_entries(mut self, entries: usize) -> Self {
        self.duplicate_window_entries = entries.max(1);
        self
    }
}
