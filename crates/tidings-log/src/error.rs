//! One small error enum per operation.
//!
//! Every variant that concerns a file names its path; every variant that concerns a place inside
//! a file names the byte offset. Nothing in this crate panics on bad input or bad files: they
//! surface as one of these errors.

use std::io;
use std::path::PathBuf;

/// A [`LogConfig`](crate::LogConfig) that cannot be used, with the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `segment_bytes` is zero.
    #[error("segment_bytes must be greater than zero")]
    ZeroSegmentBytes,
    /// `segment_bytes` is below the minimum.
    #[error("segment_bytes is {value}, the minimum is {min}")]
    SegmentBytesTooSmall {
        /// The configured value.
        value: u64,
        /// The smallest accepted value.
        min: u64,
    },
    /// `index_interval_bytes` is zero.
    #[error("index_interval_bytes must be greater than zero")]
    ZeroIndexInterval,
    /// `Fsync::Interval` with a zero duration.
    #[error("Fsync::Interval needs a non-zero interval")]
    ZeroFsyncInterval,
    /// `Retention::max_bytes` is `Some(0)`.
    #[error("retention max_bytes must be greater than zero (use None for no size limit)")]
    ZeroRetentionBytes,
    /// `Retention::max_age` is `Some(Duration::ZERO)`.
    #[error("retention max_age must be greater than zero (use None for no age limit)")]
    ZeroRetentionAge,
    /// `max_record_bytes` is zero or above the format limit.
    #[error("max_record_bytes is {value}, it must be between 1 and {max}")]
    MaxRecordBytes {
        /// The configured value.
        value: u32,
        /// The format limit ([`MAX_RECORD_BYTES`](crate::MAX_RECORD_BYTES)).
        max: u32,
    },
}

/// Why [`Log::open`](crate::Log::open) failed. Nothing was modified on disk when this is
/// returned, except where the variant says so (I/O errors during the repair phase).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The configuration was rejected.
    #[error("invalid log configuration: {0}")]
    Config(#[from] ConfigError),
    /// An I/O operation on `path` failed.
    #[error("I/O error on {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A record that is followed by valid data (or lies in a sealed segment) fails its checks:
    /// this is corruption, not a torn tail, and the log refuses to open rather than drop the
    /// records after it.
    #[error("corrupt record in {} at byte {byte_offset}: {reason}", path.display())]
    Corrupt {
        /// The segment file.
        path: PathBuf,
        /// Byte offset of the first bad record inside the file.
        byte_offset: u64,
        /// What check failed.
        reason: &'static str,
    },
    /// A segment file whose header is not a valid tidings segment header (bad magic, bad header
    /// checksum, truncated header in a sealed segment, base offset not matching the file name).
    #[error("{} is not a valid tidings segment: {reason}", path.display())]
    BadHeader {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Another handle (in this or another process) has the log open: two writers would
    /// corrupt it.
    #[error("{} is locked: the log is open elsewhere", path.display())]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// A segment written by a format version this build does not read.
    #[error("{} has unsupported format version {version} (this build reads {supported})", path.display())]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// Version found in the header.
        version: u16,
        /// Version this build reads and writes.
        supported: u16,
    },
    /// A file whose extension belongs to the log (`.seg`, `.idx`, `.tix`) but whose name is not a
    /// 20-digit base offset.
    #[error("{} has a log file extension but its name is not a 20-digit offset", path.display())]
    UnparseableName {
        /// The file.
        path: PathBuf,
    },
    /// Segments do not follow each other: a segment ends at `expected` but the next starts at
    /// `found`.
    #[error("offset gap before {}: previous segment ends at {expected}, this one starts at {found}", path.display())]
    Gap {
        /// The segment that does not start where the previous one ended.
        path: PathBuf,
        /// End offset of the previous segment.
        expected: u64,
        /// Base offset of this segment.
        found: u64,
    },
}

/// Why an append (or [`Log::sync`](crate::Log::sync)) failed. When an append fails, none of its
/// records is acknowledged; they may or may not be present after a restart.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AppendError {
    /// An earlier write or fsync failed; the writer refuses all further appends because it can
    /// no longer tell what is on disk. Reopen the log to recover.
    #[error("the log writer is poisoned by an earlier I/O failure; reopen the log")]
    Poisoned,
    /// The log was closed.
    #[error("the log is closed")]
    Closed,
    /// The encoded record exceeds `max_record_bytes`.
    #[error("record of {size} bytes exceeds the limit of {max} bytes")]
    RecordTooLarge {
        /// Encoded size of the record.
        size: u64,
        /// Configured limit.
        max: u32,
    },
    /// A header name is longer than 65,535 bytes.
    #[error("header name of {len} bytes exceeds the limit of {max} bytes")]
    HeaderNameTooLong {
        /// Length of the name.
        len: usize,
        /// The format limit.
        max: usize,
    },
    /// The write or fsync that failed (this poisons the writer).
    #[error("I/O error on {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

/// Why a read or a time lookup failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The requested offset was removed by retention.
    #[error("offset {requested} is no longer retained; the earliest retained offset is {earliest}")]
    OutOfRetention {
        /// The offset asked for.
        requested: u64,
        /// The earliest offset still retained.
        earliest: u64,
    },
    /// The requested offset is beyond the end of the log.
    #[error("offset {requested} is beyond the end of the log ({end})")]
    BeyondEnd {
        /// The offset asked for.
        requested: u64,
        /// The current end offset.
        end: u64,
    },
    /// A record failed its checks while being read. [`Log::next_readable`](crate::Log::next_readable)
    /// finds where reading can go on past it, when the format lets it.
    #[error("corrupt record (offset {offset}) in {} at byte {byte_offset}: {reason}", path.display())]
    Corrupt {
        /// The segment file.
        path: PathBuf,
        /// Byte offset of the bad record.
        byte_offset: u64,
        /// The offset the bad record holds the place of: the one expected at that position.
        offset: u64,
        /// What check failed.
        reason: &'static str,
    },
    /// The records asked for were still in the write buffer when the writer got poisoned.
    #[error("the records are in the write buffer of a poisoned writer")]
    Poisoned,
    /// An I/O operation failed.
    #[error("I/O error on {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

/// Why [`Log::apply_retention`](crate::Log::apply_retention) failed. The segments it had decided
/// to drop are already out of the log (reads before the new start offset get
/// [`ReadError::OutOfRetention`]); a file that could not be removed is removed again by the next
/// run or reappears harmlessly, as a contiguous prefix, after a restart.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RetentionError {
    /// Removing a file or syncing the directory failed.
    #[error("I/O error on {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

/// Why [`Log::close`](crate::Log::close) could not make everything durable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CloseError {
    /// The final flush or fsync failed (or the writer was already poisoned).
    #[error("final flush failed: {0}")]
    Flush(#[from] AppendError),
}

/// Why a [`tools`](crate::tools) function could not run at all. Problems *inside* the log are
/// reported in the returned report instead.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// An I/O operation failed.
    #[error("I/O error on {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A record could not be decoded while dumping.
    #[error("corrupt record in {} at byte {byte_offset}: {reason}", path.display())]
    Corrupt {
        /// The segment file.
        path: PathBuf,
        /// Byte offset of the bad record.
        byte_offset: u64,
        /// What check failed.
        reason: &'static str,
    },
    /// A segment header is unreadable.
    #[error("{} is not a valid tidings segment: {reason}", path.display())]
    BadHeader {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}
