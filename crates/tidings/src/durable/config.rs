//! Stream configuration and where a durable subscription starts (R-LOG-1, R-LOG-4,
//! R-LOG-5, R-DIST-4).
//!
//! # Backend-neutral
//! [`StreamConfig`] holds only what every durable backend honours or refuses: the
//! stream's name, its patterns, its retention and its replica count. A backend's own
//! settings live with that backend — the embedded log's fsync policy, segment size, commit
//! cadence and retention timer in
//! [`EmbeddedStreamOptions`](crate::embedded::EmbeddedStreamOptions), JetStream's servers
//! in `tidings-jetstream`. A setting a backend cannot honour is refused
//! with [`StreamError::Unsupported`](crate::StreamError::Unsupported) naming it and the
//! backend, never dropped.
//!
//! # Duplicate window (R-DEL-7)
//! Every stream remembers the ids of the messages appended within its duplicate window
//! ([`StreamConfig::duplicate_window`], default [`DEFAULT_DUPLICATE_WINDOW`], two minutes
//! like JetStream's): appending an id again within it stores nothing, and the publish
//! reports the stream in [`PublishReport::duplicate_in`](crate::PublishReport::duplicate_in).
//! This makes a publish retried with its id ([`MessageBuilder::id`](crate::MessageBuilder::id))
//! and the outputs of a redelivered input
//! ([`MessageBuilder::caused_by`](crate::MessageBuilder::caused_by)) land once — as long
//! as the retry comes within the window.
//!
//! # Reopening
//! Opening a stream that exists (after a restart, or from another process) with other
//! patterns, another retention or another duplicate window than it was created with is
//! refused with
//! [`StreamError::ConfigMismatch`](crate::StreamError::ConfigMismatch) naming both values;
//! a stream is never changed implicitly.

use std::time::{Duration, SystemTime};

/// Default duplicate window of a stream (R-DEL-7): two minutes, JetStream's default.
pub const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// How much of a stream is kept (R-LOG-1, R-LOG-4): every backend honours it. The default
/// keeps everything. Build with [`new`](Self::new) and the setters; the fields are
/// readable, and new ones may be added without a break (`#[non_exhaustive]`).
///
/// ```
/// # use std::time::Duration;
/// # use tidings::Retention;
/// let week = Retention::new().max_age(Duration::from_secs(7 * 24 * 3600));
/// assert_eq!(week.max_bytes, None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub struct Retention {
    /// Remove the oldest messages while the stream is larger than this many bytes (the
    /// embedded log removes whole sealed segments, oldest first). `None`: no size limit.
    pub max_bytes: Option<u64>,
    /// Remove messages older than this (the embedded log: whole sealed segments whose
    /// newest message is older, judged against the broker clock's wall time). `None`: no
    /// age limit.
    pub max_age: Option<Duration>,
}

impl Retention {
    /// Keep everything (the default).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
    /// Keep at most about `bytes` (above zero; a zero is refused when the stream opens).
    #[must_use]
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = Some(bytes);
        self
    }
    /// Keep messages for about `age` (above zero; a zero is refused when the stream opens).
    #[must_use]
    pub fn max_age(mut self, age: Duration) -> Self {
        self.max_age = Some(age);
        self
    }
    /// The embedded log's form of it.
    pub(crate) fn to_log(self) -> tidings_log::Retention {
        // Field by field: the log's type is `#[non_exhaustive]`, and its setters take the
        // values, not the `Option`s.
        let mut retention = tidings_log::Retention::new();
        retention.max_bytes = self.max_bytes;
        retention.max_age = self.max_age;
        retention
    }
}

/// A stream: a durable log capturing every published message whose topic matches one of
/// its patterns, kept by the broker's durable backend (in the embedded log,
/// `<data_dir>/streams/<name>/`).
///
/// ```
/// # use std::time::Duration;
/// # use tidings::{Retention, StreamConfig};
/// let config = StreamConfig::new("orders", ["orders.#"])
///     .retention(Retention::new().max_age(Duration::from_secs(7 * 24 * 3600)));
/// assert_eq!(config.name(), "orders");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct StreamConfig {
    pub(crate) name: String,
    pub(crate) patterns: Vec<String>,
    pub(crate) retention: Retention,
    pub(crate) replicas: usize,
    /// `None`: the default (see [`StreamConfig::duplicate_window_duration`]).
    pub(crate) duplicate_window: Option<Duration>,
}

impl StreamConfig {
    /// A stream called `name` capturing topics matching any of `patterns` (AMQP-style
    /// wildcards, like subscriptions), keeping everything. How durably an append is
    /// stored is the backend's setting (the embedded log's default: fsync every append).
    pub fn new<I, S>(name: impl Into<String>, patterns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            name: name.into(),
            patterns: patterns.into_iter().map(Into::into).collect(),
            retention: Retention::default(),
            replicas: 1,
            duplicate_window: None,
        }
    }
    /// The stream's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The patterns it captures, as given.
    #[must_use]
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }
    /// Size/age retention (default: keep everything). Every backend honours it: the
    /// embedded log removes whole segments once they are entirely past a limit (after a
    /// segment roll and on its retention timer, age judged against the broker clock's wall
    /// time); JetStream sets the stream's `max_bytes`/`max_age` and the server removes
    /// messages. Reopening an existing stream with another retention is refused
    /// ([`StreamError::ConfigMismatch`](crate::StreamError::ConfigMismatch)).
    pub fn retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }
    /// The retention asked for.
    #[must_use]
    pub fn retention_policy(&self) -> &Retention {
        &self.retention
    }
    /// How many copies of the stream a replicating backend keeps, each on another node
    /// (default 1; R-DIST-7). JetStream creates the stream with `num_replicas: n` (at most
    /// 5, the server's limit), its durable consumers and DLQ streams with as many; a cluster
    /// that cannot place them refuses the stream when it is created. The embedded log
    /// keeps one copy: it accepts 1 and refuses more with
    /// [`StreamError::Unsupported`](crate::StreamError::Unsupported). Reopening an existing
    /// stream with another count is refused
    /// ([`StreamError::ConfigMismatch`](crate::StreamError::ConfigMismatch)). 0 counts as 1.
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n.max(1);
        self
    }
    /// The replica count asked for (at least 1).
    #[must_use]
    pub fn replica_count(&self) -> usize {
        self.replicas
    }
    /// How long the stream remembers a message id (R-DEL-7): appending a message whose id
    /// was appended within `window` stores nothing and reports the earlier copy
    /// ([`PublishReport::duplicate_in`](crate::PublishReport::duplicate_in)); buffered
    /// subscriptions still receive such a publish (they are not the stream's), durable
    /// subscriptions do not (nothing new is stored).
    ///
    /// Default [`DEFAULT_DUPLICATE_WINDOW`] (2 minutes), shortened to the retention's
    /// `max_age` when that is shorter (as JetStream does); the window survives restarts on
    /// every backend. `Duration::ZERO` turns it off on the embedded log (every append is
    /// stored, no id is kept); JetStream cannot turn it off and refuses it
    /// ([`StreamError::Unsupported`](crate::StreamError::Unsupported)).
    ///
    /// * **Embedded log:** judged by the broker's clock — a message's timestamp, stamped
    ///   at publish, against the earlier copy's — so a
    ///   [`ManualClock`](crate::ManualClock) steps past it. The ids are kept in memory,
    ///   bounded by the window's age *and* by
    ///   [`EmbeddedStreamOptions::duplicate_window_entries`](crate::embedded::EmbeddedStreamOptions::duplicate_window_entries)
    ///   (the most recent appends; an id pushed out by the count is forgotten early), and
    ///   rebuilt from the log's tail when the stream is opened. `Duration::MAX` means "as
    ///   many as the entry cap holds".
    /// * **JetStream:** the stream's `duplicate_window`, judged by the server's clock;
    ///   a window longer than the retention's `max_age` (or than the server can express)
    ///   is refused.
    ///
    /// Reopening an existing stream with another window is refused
    /// ([`StreamError::ConfigMismatch`](crate::StreamError::ConfigMismatch)).
    pub fn duplicate_window(mut self, window: Duration) -> Self {
        self.duplicate_window = Some(window);
        self
    }
    /// The duplicate window in force: the one asked for, else the default
    /// ([`DEFAULT_DUPLICATE_WINDOW`], or the retention's `max_age` when shorter).
    #[must_use]
    pub fn duplicate_window_duration(&self) -> Duration {
        self.duplicate_window
            .unwrap_or_else(|| match self.retention.max_age {
                Some(age) if !age.is_zero() => age.min(DEFAULT_DUPLICATE_WINDOW),
                _ => DEFAULT_DUPLICATE_WINDOW,
            })
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
