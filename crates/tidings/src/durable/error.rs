//! Errors of streams and durable subscriptions (R-LIM-1, R-LIM-2, R-LOG-4).

use std::path::PathBuf;

use tidings_log::{AppendError, OpenError, ReadError, RetentionError};

use crate::error::SubscribeError;
use crate::topic::TopicError;

/// Why a stream operation failed. Messages name the file or directory involved.
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
    /// corrupt or foreign file (the inner error names its path and offset), or I/O.
    #[error("cannot open log {}: {source}", dir.display())]
    Open {
        /// The log directory.
        dir: PathBuf,
        /// What tidings-log reported.
        #[source]
        source: OpenError,
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
    /// Reading the log failed.
    #[error("read from {} failed: {source}", dir.display())]
    Read {
        /// The log directory.
        dir: PathBuf,
        /// The underlying error.
        #[source]
        source: ReadError,
    },
    /// Appending to the log failed.
    #[error("append to {} failed: {source}", dir.display())]
    Append {
        /// The log directory.
        dir: PathBuf,
        /// The underlying error.
        #[source]
        source: AppendError,
    },
    /// Applying retention failed.
    #[error("retention on {} failed: {source}", dir.display())]
    Retention {
        /// The log directory.
        dir: PathBuf,
        /// The underlying error.
        #[source]
        source: RetentionError,
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
    /// The durable backend cannot do what was asked (an option, or an operation).
    #[error("{feature} is not supported by the {backend} backend")]
    Unsupported {
        /// The option or operation.
        feature: &'static str,
        /// The backend's name.
        backend: &'static str,
    },
    /// A remote backend failed (connection, timeout, a refusal by the server).
    #[error("{backend}: {reason}")]
    Backend {
        /// The backend's name.
        backend: &'static str,
        /// What failed, as text.
        reason: String,
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
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StreamError::Io {
            path: path.into(),
            source,
        }
    }
}
