//! The errors of the offline tools: one per operation.

use std::path::PathBuf;

use crate::durable::StreamError;

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

/// Why [`DataDir::seek`](super::DataDir::seek) failed; nothing changed.
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

/// Why [`DataDir::redrive`](super::DataDir::redrive) failed. Entries redriven before the failure stay redriven (and
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

/// Why [`DataDir::purge`](super::DataDir::purge) failed; nothing changed.
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
