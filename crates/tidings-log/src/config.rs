//! Log configuration: segment size, fsync policy, retention, index density.

use std::time::Duration;

use crate::error::ConfigError;

/// Largest record (encoded frame, see the [format](crate#record-layout)) the format allows: 1 GiB.
pub const MAX_RECORD_BYTES: u32 = 1 << 30;

/// Smallest accepted [`LogConfig::segment_bytes`].
pub const MIN_SEGMENT_BYTES: u64 = 128;

/// When appended data is forced to stable storage.
///
/// # Durability
///
/// * [`Fsync::Always`]: [`Log::append`](crate::Log::append) returns only after the record is
///   synced (`fdatasync`). Concurrent appenders share one sync (group commit): the thread that
///   finds no sync in flight becomes the leader, flushes the write buffer and syncs for every
///   record written before it started; the others wait for it. Records become *visible* to
///   readers only once synced, so no reader ever sees a record that a power cut could take back.
/// * [`Fsync::Interval`]: a background thread (`tidings-log-flush`, joined on close/drop) flushes
///   and syncs every interval; a power cut loses at most about one interval of acknowledged
///   records. Records are visible as soon as `append` returns.
/// * [`Fsync::Never`]: the log promises nothing beyond what [`Log::sync`](crate::Log::sync) and
///   [`Log::durable_offset`](crate::Log::durable_offset) report. It syncs when a segment is sealed
///   (rolled), on `sync`, and from a background writeback thread (`tidings-log-writeback`, also
///   under `Interval`) every eighth of a segment written, so that a roll finds little left to
///   sync. Records are visible as soon as `append` returns.
///
/// Under `Interval` and `Never`, records still in the in-process write buffer are lost if the
/// process is killed; set [`LogConfig::write_buffer_bytes`] to 0 to hand every append to the OS.
/// Records appended after a segment roll whose background seal is still running are in the new
/// segment's temporary file: a process kill keeps them (the next open adopts the file, because
/// the segment before it is complete in the page cache), a power cut may not (like any unsynced
/// data). [`Log::sync`](crate::Log::sync) and
/// [`Log::durable_offset`](crate::Log::durable_offset) count them only once the seal has
/// published the file: nothing they report is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fsync {
    /// Sync before acknowledging every append (with group commit).
    Always,
    /// Sync from a background thread at this interval.
    Interval(Duration),
    /// No sync per append: syncs on segment roll, background writeback and explicit
    /// [`Log::sync`](crate::Log::sync).
    Never,
}

/// Which old segments [`Log::apply_retention`](crate::Log::apply_retention) removes. Only whole
/// sealed segments are removed, oldest first, never the active segment.
///
/// Built with [`Retention::new`] (keep everything) and its setters; `#[non_exhaustive]`, so a
/// new limit is not a breaking change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Retention {
    /// Remove the oldest sealed segments while the total size of all segments exceeds this.
    pub max_bytes: Option<u64>,
    /// Remove the oldest sealed segments whose newest record (largest timestamp) is older than
    /// this, measured against the `now_ms` given to `apply_retention`.
    pub max_age: Option<Duration>,
}

/// Configuration of one log (one stream directory).
///
/// Built with [`LogConfig::new`] (the defaults) and its setters; the fields stay readable.
/// `#[non_exhaustive]`, so a new setting is not a breaking change: code outside this crate
/// cannot write a struct literal.
///
/// ```
/// use tidings_log::{Fsync, LogConfig};
/// let config = LogConfig::new().fsync(Fsync::Never).segment_bytes(1 << 20);
/// assert_eq!(config.segment_bytes, 1 << 20);
/// ```
///
/// ```compile_fail
/// use tidings_log::LogConfig;
/// let config = LogConfig { segment_bytes: 1 << 20, ..LogConfig::default() };
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogConfig {
    /// A new segment is started when the next record would make the active segment larger than
    /// this (a record larger than this gets a segment of its own). Default 64 MiB.
    pub segment_bytes: u64,
    /// Fsync policy. Default [`Fsync::Always`].
    pub fsync: Fsync,
    /// Retention, applied after every segment roll (age judged against the newest record
    /// appended) and by [`Log::apply_retention`](crate::Log::apply_retention). Default: keep
    /// everything.
    pub retention: Retention,
    /// One offset-index entry (and at most one time-index entry) per this many bytes of records.
    /// Default 4096.
    pub index_interval_bytes: u32,
    /// Largest encoded record accepted by `append`. Default 16 MiB, at most
    /// [`MAX_RECORD_BYTES`].
    pub max_record_bytes: u32,
    /// Size of the in-process write buffer; it is handed to the OS when it grows past this, before
    /// every sync and before a read that needs its contents. 0 writes every append through.
    /// Default 256 KiB.
    pub write_buffer_bytes: usize,
    /// Check every record of every segment when opening (default `false`: only the last segment,
    /// the only one a crash can damage, is scanned; sealed segments are checked lazily by reads
    /// and fully by [`tools::verify`](crate::tools::verify)).
    pub verify_on_open: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_bytes: 64 << 20,
            fsync: Fsync::Always,
            retention: Retention::default(),
            index_interval_bytes: 4096,
            max_record_bytes: 16 << 20,
            write_buffer_bytes: 256 << 10,
            verify_on_open: false,
        }
    }
}

impl Retention {
    /// Keep everything (the default).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
    /// Remove the oldest sealed segments while all segments total more than `bytes`.
    #[must_use]
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = Some(bytes);
        self
    }
    /// Remove the oldest sealed segments whose newest record is older than `age`.
    #[must_use]
    pub fn max_age(mut self, age: Duration) -> Self {
        self.max_age = Some(age);
        self
    }
}

impl LogConfig {
    /// The defaults (see each field).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
    /// See [`LogConfig::segment_bytes`](#structfield.segment_bytes).
    #[must_use]
    pub fn segment_bytes(mut self, bytes: u64) -> Self {
        self.segment_bytes = bytes;
        self
    }
    /// See [`LogConfig::fsync`](#structfield.fsync).
    #[must_use]
    pub fn fsync(mut self, fsync: Fsync) -> Self {
        self.fsync = fsync;
        self
    }
    /// See [`LogConfig::retention`](#structfield.retention).
    #[must_use]
    pub fn retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }
    /// See [`LogConfig::index_interval_bytes`](#structfield.index_interval_bytes).
    #[must_use]
    pub fn index_interval_bytes(mut self, bytes: u32) -> Self {
        self.index_interval_bytes = bytes;
        self
    }
    /// See [`LogConfig::max_record_bytes`](#structfield.max_record_bytes).
    #[must_use]
    pub fn max_record_bytes(mut self, bytes: u32) -> Self {
        self.max_record_bytes = bytes;
        self
    }
    /// See [`LogConfig::write_buffer_bytes`](#structfield.write_buffer_bytes).
    #[must_use]
    pub fn write_buffer_bytes(mut self, bytes: usize) -> Self {
        self.write_buffer_bytes = bytes;
        self
    }
    /// See [`LogConfig::verify_on_open`](#structfield.verify_on_open).
    #[must_use]
    pub fn verify_on_open(mut self, verify: bool) -> Self {
        self.verify_on_open = verify;
        self
    }
    /// Checks the configuration; [`Log::open`](crate::Log::open) calls this first.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.segment_bytes == 0 {
            return Err(ConfigError::ZeroSegmentBytes);
        }
        if self.segment_bytes < MIN_SEGMENT_BYTES {
            return Err(ConfigError::SegmentBytesTooSmall {
                value: self.segment_bytes,
                min: MIN_SEGMENT_BYTES,
            });
        }
        if self.index_interval_bytes == 0 {
            return Err(ConfigError::ZeroIndexInterval);
        }
        if self.fsync == Fsync::Interval(Duration::ZERO) {
            return Err(ConfigError::ZeroFsyncInterval);
        }
        if self.retention.max_bytes == Some(0) {
            return Err(ConfigError::ZeroRetentionBytes);
        }
        if self.retention.max_age == Some(Duration::ZERO) {
            return Err(ConfigError::ZeroRetentionAge);
        }
        if self.max_record_bytes == 0 || self.max_record_bytes > MAX_RECORD_BYTES {
            return Err(ConfigError::MaxRecordBytes {
                value: self.max_record_bytes,
                max: MAX_RECORD_BYTES,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_bad_values_are_named() {
        assert_eq!(LogConfig::default().validate(), Ok(()));
        let bad = |f: fn(&mut LogConfig)| {
            let mut c = LogConfig::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        // R-LIM-1: bad configuration is refused with a typed error naming the value.
        assert_eq!(bad(|c| c.segment_bytes = 0), ConfigError::ZeroSegmentBytes);
        assert_eq!(
            bad(|c| c.segment_bytes = 5),
            ConfigError::SegmentBytesTooSmall {
                value: 5,
                min: MIN_SEGMENT_BYTES
            }
        );
        assert_eq!(
            bad(|c| c.index_interval_bytes = 0),
            ConfigError::ZeroIndexInterval
        );
        assert_eq!(
            bad(|c| c.fsync = Fsync::Interval(Duration::ZERO)),
            ConfigError::ZeroFsyncInterval
        );
        assert_eq!(
            bad(|c| c.retention.max_bytes = Some(0)),
            ConfigError::ZeroRetentionBytes
        );
        assert_eq!(
            bad(|c| c.retention.max_age = Some(Duration::ZERO)),
            ConfigError::ZeroRetentionAge
        );
        assert!(matches!(
            bad(|c| c.max_record_bytes = 0),
            ConfigError::MaxRecordBytes { value: 0, .. }
        ));
    }
}
