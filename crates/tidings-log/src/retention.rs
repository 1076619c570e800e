//! Retention: remove whole old segments by total size and by age.
//!
//! # When
//!
//! After every segment roll (outside the writer lock, judging age against the newest record
//! just appended; a failure is kept for `Log::retention_error`, the append already
//! succeeded), and whenever `Log::apply_retention` is called with an explicit time.
//!
//! # Rules
//!
//! Only sealed segments are removed, always a prefix (oldest first, so offsets stay contiguous),
//! never the active segment, nor the segment whose [seal](crate::writeback#asynchronous-seal)
//! is still pending (the next one is not on disk under its name yet). A segment is removed while
//! either
//! * the total size of all segments (active included) exceeds `max_bytes`, or
//! * its newest record is older than `max_age`: `max_timestamp + max_age < now_ms` (a sealed
//!   segment without records counts as expired).
//!
//! The new start offset is published before any file is touched, so a concurrent reader asking
//! for a removed offset gets [`ReadError::OutOfRetention`](crate::ReadError::OutOfRetention)
//! (a reader already inside a removed segment finishes from its open file handle). Files are
//! removed oldest first (index files, then the segment), then the directory is synced; a crash in
//! between leaves a contiguous prefix of old segments that the next run removes again.

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use crate::error::RetentionError;
use crate::log::Shared;
use crate::segment::{FileKind, file_path};

/// What [`Log::apply_retention`](crate::Log::apply_retention) removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetentionReport {
    /// Removed segments, oldest first.
    pub removed: Vec<RemovedSegment>,
    /// Earliest retained offset afterwards.
    pub start_offset: u64,
    /// Total size of the remaining segments in bytes.
    pub retained_bytes: u64,
}

/// One segment removed by retention.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedSegment {
    /// The segment file.
    pub path: PathBuf,
    /// First offset it held.
    pub base_offset: u64,
    /// Offset after the last record it held.
    pub end_offset: u64,
    /// Its size in bytes.
    pub bytes: u64,
}

impl fmt::Display for RetentionReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "removed {} segment(s); start offset {}, {} bytes retained",
            self.removed.len(),
            self.start_offset,
            self.retained_bytes
        )?;
        for r in &self.removed {
            write!(
                f,
                "\n  {} (offsets {}..{}, {} bytes)",
                r.path.display(),
                r.base_offset,
                r.end_offset,
                r.bytes
            )?;
        }
        Ok(())
    }
}

pub(crate) fn apply(sh: &Shared, now_ms: u64) -> Result<RetentionReport, RetentionError> {
    let _serial = sh.retention_lock.lock();
    let policy = sh.config.retention;
    let max_age_ms = policy
        .max_age
        .map(|a| u64::try_from(a.as_millis()).unwrap_or(u64::MAX));
    let (victims, start, retained) = {
        let mut segs = sh.segments.write();
        let mut total: u64 = segs.iter().map(|s| s.size()).sum();
        let mut k = 0;
        // Never a segment whose successor is not published yet (its seal is pending): it is
        // the last segment on disk, and removing it would leave a directory without the
        // offsets after it.
        while k + 1 < segs.len() && segs[k + 1].is_published() {
            let s = &segs[k];
            let by_size = policy.max_bytes.is_some_and(|m| total > m);
            let by_age = max_age_ms
                .is_some_and(|age| s.max_ts().is_none_or(|ts| ts.saturating_add(age) < now_ms));
            if !(by_size || by_age) {
                break;
            }
            total -= s.size();
            k += 1;
        }
        let start = segs[k].base;
        sh.start.fetch_max(start, Ordering::AcqRel);
        let victims: Vec<_> = segs.drain(..k).collect();
        (victims, start, total)
    };
    let mut report = RetentionReport {
        removed: Vec::new(),
        start_offset: start,
        retained_bytes: retained,
    };
    if victims.is_empty() {
        return Ok(report);
    }
    let io = |path: PathBuf| move |source| RetentionError::Io { path, source };
    for seg in &victims {
        for kind in [FileKind::OffsetIndex, FileKind::TimeIndex] {
            let p = file_path(&sh.dir, seg.base, kind);
            match sh.storage.remove(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(p)(e)),
            }
        }
        sh.storage.remove(&seg.path).map_err(io(seg.path.clone()))?;
        report.removed.push(RemovedSegment {
            path: seg.path.clone(),
            base_offset: seg.base,
            end_offset: seg.end(),
            bytes: seg.size(),
        });
    }
    sh.storage.sync_dir(&sh.dir).map_err(io(sh.dir.clone()))?;
    Ok(report)
}
