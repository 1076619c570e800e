//! Stream configuration and where a durable subscription starts (R-LOG-1, R-LOG-4).

use std::time::{Duration, SystemTime};

use tidings_log::{Fsync, LogConfig, Retention};

/// Default number of completions between two durable commits of a subscription's position.
pub const DEFAULT_COMMIT_EVERY: usize = 64;
/// Default period of the retention timer of a stream with a retention policy.
pub const DEFAULT_RETENTION_INTERVAL: Duration = Duration::from_secs(60);

/// A stream: a durable log capturing every published message whose topic matches one of
/// its patterns. Stored in `<data_dir>/streams/<name>/`.
///
/// ```
/// # use tidings::{StreamConfig, Fsync};
/// let config = StreamConfig::new("orders", ["orders.#"]).fsync(Fsync::Always);
/// assert_eq!(config.name(), "orders");
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct StreamConfig {
    pub(crate) name: String,
    pub(crate) patterns: Vec<String>,
    pub(crate) log: LogConfig,
    pub(crate) commit_every: usize,
    pub(crate) retention_interval: Duration,
}

impl StreamConfig {
    /// A stream called `name` capturing topics matching any of `patterns` (AMQP-style
    /// wildcards, like subscriptions). Defaults: `Fsync::Always`, keep everything, 64 MiB
    /// segments, commit durable positions every 64 completions (and when idle / on close).
    pub fn new<I, S>(name: impl Into<String>, patterns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            name: name.into(),
            patterns: patterns.into_iter().map(Into::into).collect(),
            log: LogConfig::default(),
            commit_every: DEFAULT_COMMIT_EVERY,
            retention_interval: DEFAULT_RETENTION_INTERVAL,
        }
    }
    /// The stream's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Fsync policy of the stream's log. Under `Always`, `publish` returns only once the
    /// message is synced.
    pub fn fsync(mut self, fsync: Fsync) -> Self {
        self.log.fsync = fsync;
        self
    }
    /// Size/age retention, applied after every segment roll, by
    /// [`Stream::apply_retention`](crate::Stream::apply_retention), and on a timer every
    /// [`retention_interval`](Self::retention_interval) — so an idle stream sheds old
    /// segments too. Age is judged against the broker clock's wall time.
    pub fn retention(mut self, retention: Retention) -> Self {
        self.log.retention = retention;
        self
    }
    /// How often the broker applies this stream's retention when it has a policy (default
    /// [`DEFAULT_RETENTION_INTERVAL`], 60 s; on the broker's clock, so a
    /// [`ManualClock`](crate::ManualClock) drives it in tests). A duration too large to
    /// represent means never (only rolls and explicit calls apply it then).
    pub fn retention_interval(mut self, every: Duration) -> Self {
        self.retention_interval = every.max(Duration::from_millis(1));
        self
    }
    /// Segment size of the stream's log (at least `tidings_log::MIN_SEGMENT_BYTES`).
    pub fn segment_bytes(mut self, bytes: u64) -> Self {
        self.log.segment_bytes = bytes;
        self
    }
    /// Replace the whole log configuration.
    pub fn log_config(mut self, config: LogConfig) -> Self {
        self.log = config;
        self
    }
    /// Durable subscriptions of this stream write their position after this many
    /// completions (≥ 1), besides when idle, on seek and on close. 1 = after every message.
    pub fn commit_every(mut self, completions: usize) -> Self {
        self.commit_every = completions.max(1);
        self
    }
}

/// Where a durable subscription starts reading when it has no committed position, or where
/// [`DurableSubscription::seek`](crate::DurableSubscription::seek) moves it (R-LOG-4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StartAt {
    /// The earliest retained record.
    Earliest,
    /// The end of the stream: only messages appended from now on.
    Latest,
    /// This offset (must be retained, at most the end offset).
    Offset(u64),
    /// The first record (in offset order) whose timestamp is at or after this time.
    Time(SystemTime),
}
