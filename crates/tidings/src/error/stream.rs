//! Errors of streams and durable subscriptions (R-LIM-1, R-LIM-2, R-LOG-4, R-DIST-4).
//!
//! # Kinds
//! Every [`StreamError`] has a [`StreamErrorKind`] ([`StreamError::kind`]), the same on every
//! backend: a caller matches on "unsupported", "unavailable", "timed out", "refused",
//! "auth", "TLS", "corrupt"… without knowing where the stream lives, and never on the
//! message text. The underlying failure stays reachable through
//! [`std::error::Error::source`] (a remote backend's own error, boxed, with its cause
//! after it).

use std::path::PathBuf;

use tidings_log::{AppendError, OpenError, ReadError, RetentionError};

/// A failure's cause, boxed: tidings' errors carry the source of a failure without naming
/// its type, so no other crate's version is part of tidings' API.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

use super::{SubscribeError, TransportError};
use crate::topic::TopicError;

/// What kind of failure a [`StreamError`] is, whatever the backend (DESIGN.md: "errors keep
/// a kind and a source chain across the seam").
///
/// ```
/// # use tidings::{StreamConfig, StreamErrorKind};
/// let broker = tidings::Broker::builder().build()?;
/// let err = broker.create_stream(StreamConfig::new("orders", ["orders.#"])).unwrap_err();
/// assert_eq!(err.kind(), StreamErrorKind::Unsupported); // no durable backend
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StreamErrorKind {
    /// The backend cannot do what was asked: an option or an operation it does not have
    /// (R-DIST-4), or a broker without a durable backend.
    Unsupported,
    /// A name, pattern or setting given by the caller is not valid.
    InvalidInput,
    /// The stream, durable subscription or record asked for does not exist.
    NotFound,
    /// Something of that name already exists (a stream opened twice in one broker).
    AlreadyExists,
    /// The name is held by someone else right now: a durable subscription already active,
    /// a log directory locked by another broker.
    InUse,
    /// The stream exists with other settings than the ones asked for (patterns,
    /// retention); nothing was changed (R-LOG-5).
    ConfigMismatch,
    /// An offset outside the retained part of the stream (R-LOG-4).
    OutOfRange,
    /// The remote engine cannot be reached: not connected, connection lost, no server
    /// answering (R-DIST-5).
    Unavailable,
    /// The remote engine did not answer within its timeout; the outcome may be unknown.
    TimedOut,
    /// The engine refused the request (a server API error, a limit reached).
    Refused,
    /// The credentials were refused (R-SEC-1).
    Auth,
    /// TLS failed: handshake, certificate, or a TLS requirement not met (R-SEC-1).
    Tls,
    /// Stored data is unreadable or not tidings' own: a corrupt or foreign file, a record
    /// that does not decode (R-LIM-2).
    Corrupt,
    /// A local file-system operation failed, or an earlier failed sync poisoned the
    /// writer (R-LOG-3).
    Io,
    /// The broker, stream or cursor is closed.
    Closed,
    /// Anything else.
    Other,
}

impl std::fmt::Display for StreamErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Unsupported => "unsupported",
            Self::InvalidInput => "invalid input",
            Self::NotFound => "not found",
            Self::AlreadyExists => "already exists",
            Self::InUse => "in use",
            Self::ConfigMismatch => "configuration mismatch",
            Self::OutOfRange => "out of range",
            Self::Unavailable => "unavailable",
            Self::TimedOut => "timed out",
            Self::Refused => "refused",
            Self::Auth => "authentication failed",
            Self::Tls => "TLS failed",
            Self::Corrupt => "corrupt",
            Self::Io => "I/O error",
            Self::Closed => "closed",
            Self::Other => "other",
        })
    }
}

/// Why a stream operation failed. Messages name the file or directory involved; match on
/// [`kind`](Self::kind) (or on a variant) rather than on the text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The broker was built without [`BrokerBuilder::data_dir`](crate::BrokerBuilder::data_dir).
    #[error("streams need a data directory: build the broker with BrokerBuilder::data_dir")]
    NoDataDir,
    /// A stream or durable subscription name is not usable as a file name.
    #[error("invalid {what} name {name:?}: {reason}")]
    InvalidName {
        /// `"stream"`, `"durable subscription"` or `"dedup store"`.
        what: &'static str,
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A stream pattern or a durable filter pattern is invalid (R-RT-2).
    #[error("invalid pattern {pattern:?}: {error}")]
    InvalidPattern {
        /// The pattern given.
        pattern: String,
        /// Why it was refused.
        error: TopicError,
    },
    /// A stream needs at least one pattern.
    #[error("stream {0:?} has no pattern")]
    NoPattern(String),
    /// `create_stream` was called twice for one name on one broker.
    #[error("stream {0:?} is already open in this broker")]
    AlreadyExists(String),
    /// No stream of that name was created on this broker.
    #[error("no stream named {0:?} (call create_stream first)")]
    UnknownStream(String),
    /// A durable subscription with this name on this stream is already live.
    #[error("durable subscription {name:?} on stream {stream:?} is already active")]
    DurableInUse {
        /// The stream.
        stream: String,
        /// The subscription name.
        name: String,
    },
    /// The stream's log (or a durable DLQ log) could not be opened: bad configuration, a
    /// corrupt or foreign file (the source names its path and offset), a directory locked
    /// by another broker, or I/O — `kind` says which.
    #[error("cannot open log {}: {source}", dir.display())]
    Open {
        /// The log directory.
        dir: PathBuf,
        /// What kind of failure it is.
        kind: StreamErrorKind,
        /// The log's own error, reachable with [`std::error::Error::source`].
        #[source]
        source: BoxError,
    },
    /// The requested position was removed by retention (R-LOG-4).
    #[error("offset {requested} is no longer retained; the earliest retained offset is {earliest}")]
    OutOfRetention {
        /// The offset asked for.
        requested: u64,
        /// The earliest offset still retained.
        earliest: u64,
    },
    /// The requested offset lies past the end of the stream.
    #[error("offset {requested} is beyond the end of the stream ({end})")]
    BeyondEnd {
        /// The offset asked for.
        requested: u64,
        /// The current end offset.
        end: u64,
    },
    /// Reading the log failed. `kind` says how (I/O, corrupt data, a closed log, out of range…).
    #[error("read from {} failed: {source}", dir.display())]
    Read {
        /// The log directory.
        dir: PathBuf,
        /// What kind of failure it is.
        kind: StreamErrorKind,
        /// The log's own error, reachable with [`std::error::Error::source`].
        #[source]
        source: BoxError,
    },
    /// Appending to the log failed. `kind` says how (I/O, corrupt data, a closed log, out of range…).
    #[error("append to {} failed: {source}", dir.display())]
    Append {
        /// The log directory.
        dir: PathBuf,
        /// What kind of failure it is.
        kind: StreamErrorKind,
        /// The log's own error, reachable with [`std::error::Error::source`].
        #[source]
        source: BoxError,
    },
    /// Applying retention failed. `kind` says how (I/O, corrupt data, a closed log, out of range…).
    #[error("retention on {} failed: {source}", dir.display())]
    Retention {
        /// The log directory.
        dir: PathBuf,
        /// What kind of failure it is.
        kind: StreamErrorKind,
        /// The log's own error, reachable with [`std::error::Error::source`].
        #[source]
        source: BoxError,
    },
    /// A file-system operation failed.
    #[error("I/O error on {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A committed-offset file exists but is not one tidings wrote (R-LIM-2).
    #[error("{} is not a tidings offset file: {reason}", path.display())]
    BadOffsetFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A record of a stream is not an encoded tidings message (R-LIM-2).
    #[error("record {offset} in {} is not a tidings message: {reason}", dir.display())]
    Decode {
        /// The log directory.
        dir: PathBuf,
        /// The record's offset.
        offset: u64,
        /// What check failed.
        reason: &'static str,
    },
    /// The durable subscription's cursor is poisoned by a failed commit (R-LOG-3).
    #[error(transparent)]
    Poisoned(#[from] CommitFailed),
    /// Creating the underlying subscription failed.
    #[error(transparent)]
    Subscribe(#[from] SubscribeError),
    /// The broker is closed.
    #[error("the broker is closed")]
    Closed,
    /// The durable backend cannot do what was asked (an option, or an operation); kind
    /// [`StreamErrorKind::Unsupported`] (R-DIST-4).
    #[error("{feature} is not supported by the {backend} backend")]
    Unsupported {
        /// The option or operation (e.g. `"message priority"`, `"StreamConfig::retention"`).
        feature: &'static str,
        /// The backend's name.
        backend: &'static str,
    },
    /// The stream exists with another value of `setting` than the one asked for; it was
    /// opened with neither, and nothing was changed (R-LOG-5). Kind
    /// [`StreamErrorKind::ConfigMismatch`].
    #[error(
        "stream {stream:?} exists with {setting} {existing}, not the requested {requested}; \
         nothing was changed (delete the stream, or open it with its stored {setting})"
    )]
    ConfigMismatch {
        /// The stream.
        stream: String,
        /// The setting that differs: `"patterns"`, `"retention"`.
        setting: &'static str,
        /// What the stream has (e.g. the stored patterns, `["sh.#"]`).
        existing: String,
        /// What was asked for.
        requested: String,
    },
    /// A backend failed: a remote engine (connection, timeout, a refusal by the server),
    /// or a local operation without a variant of its own. `kind` says which; `source` is
    /// the backend's own error (for `tidings-jetstream`, a `JetStreamError` carrying the
    /// server's API error code when there is one), reachable with
    /// [`std::error::Error::source`] and `downcast_ref`.
    #[error("{backend}: {source}")]
    Backend {
        /// The backend's name.
        backend: &'static str,
        /// What kind of failure it is.
        kind: StreamErrorKind,
        /// The backend's error.
        #[source]
        source: BoxError,
    },
}

/// A durable subscription could not write or sync its committed position: its cursor is
/// **poisoned** (R-LOG-3).
///
/// A failed fsync leaves the file's state unknown, so the commit is not retried: the
/// subscription stops reading its stream and commits nothing more, the position on disk
/// stays the last one written successfully, and every message finished after it is
/// delivered again once the name is subscribed again (after dropping the handle, or a
/// restart). Read it with [`DurableSubscription::poisoned`](crate::DurableSubscription::poisoned).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("committing position {position} to {} failed: {reason}; the cursor is poisoned (subscribe again to resume from the last commit)", path.display())]
#[non_exhaustive]
pub struct CommitFailed {
    /// The offset file.
    pub path: PathBuf,
    /// The position that could not be committed.
    pub position: u64,
    /// The I/O error, as text.
    pub reason: String,
}

impl StreamError {
    /// What kind of failure this is, the same on every backend (see [`StreamErrorKind`]).
    #[must_use]
    pub fn kind(&self) -> StreamErrorKind {
        use StreamErrorKind as K;
        match self {
            StreamError::NoDataDir | StreamError::Unsupported { .. } => K::Unsupported,
            StreamError::InvalidName { .. }
            | StreamError::InvalidPattern { .. }
            | StreamError::NoPattern(_) => K::InvalidInput,
            StreamError::AlreadyExists(_) => K::AlreadyExists,
            StreamError::UnknownStream(_) => K::NotFound,
            StreamError::DurableInUse { .. } => K::InUse,
            StreamError::Open { kind, .. }
            | StreamError::Read { kind, .. }
            | StreamError::Append { kind, .. }
            | StreamError::Retention { kind, .. } => *kind,
            StreamError::OutOfRetention { .. } | StreamError::BeyondEnd { .. } => K::OutOfRange,
            StreamError::Io { .. } | StreamError::Poisoned(_) => K::Io,
            StreamError::BadOffsetFile { .. } | StreamError::Decode { .. } => K::Corrupt,
            StreamError::Subscribe(e) => match e {
                SubscribeError::InvalidPattern(_) | SubscribeError::InvalidOptions(_) => {
                    K::InvalidInput
                }
                SubscribeError::TooManySubscriptions { .. } => K::Refused,
                SubscribeError::Closed => K::Closed,
                SubscribeError::AsyncHandlerNeedsTokio => K::Unsupported,
                SubscribeError::Transport(t) => match t {
                    TransportError::Unavailable { .. } => K::Unavailable,
                    TransportError::Refused { .. } => K::Refused,
                    TransportError::Closed { .. } => K::Closed,
                },
                SubscribeError::Spawn(_) => K::Io,
            },
            StreamError::Closed => K::Closed,
            StreamError::ConfigMismatch { .. } => K::ConfigMismatch,
            StreamError::Backend { kind, .. } => *kind,
        }
    }

    /// A [`StreamError::Backend`] of `backend` with this `kind`, caused by `source`.
    pub fn backend(
        backend: &'static str,
        kind: StreamErrorKind,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        StreamError::Backend {
            backend,
            kind,
            source: source.into(),
        }
    }

    /// The log at `dir` could not be opened.
    pub(crate) fn open(dir: impl Into<PathBuf>, source: OpenError) -> Self {
        use StreamErrorKind as K;
        let kind = match &source {
            OpenError::Config(_) => K::InvalidInput,
            OpenError::Io { .. } => K::Io,
            OpenError::Locked { .. } => K::InUse,
            _ => K::Corrupt,
        };
        StreamError::Open {
            dir: dir.into(),
            kind,
            source: Box::new(source),
        }
    }

    /// Reading the log at `dir` failed.
    pub(crate) fn read(dir: impl Into<PathBuf>, source: ReadError) -> Self {
        use StreamErrorKind as K;
        let kind = match &source {
            ReadError::OutOfRetention { .. } | ReadError::BeyondEnd { .. } => K::OutOfRange,
            ReadError::Corrupt { .. } => K::Corrupt,
            _ => K::Io,
        };
        StreamError::Read {
            dir: dir.into(),
            kind,
            source: Box::new(source),
        }
    }

    /// Appending to (or syncing) the log at `dir` failed.
    pub(crate) fn append(dir: impl Into<PathBuf>, source: AppendError) -> Self {
        use StreamErrorKind as K;
        let kind = match &source {
            AppendError::Closed => K::Closed,
            AppendError::RecordTooLarge { .. } | AppendError::HeaderNameTooLong { .. } => {
                K::InvalidInput
            }
            _ => K::Io,
        };
        StreamError::Append {
            dir: dir.into(),
            kind,
            source: Box::new(source),
        }
    }

    /// Applying retention to the log at `dir` failed.
    pub(crate) fn retention(dir: impl Into<PathBuf>, source: RetentionError) -> Self {
        StreamError::Retention {
            dir: dir.into(),
            kind: StreamErrorKind::Io,
            source: Box::new(source),
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StreamError::Io {
            path: path.into(),
            source,
        }
    }
}
