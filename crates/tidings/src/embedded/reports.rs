//! What opening a stream's log recovered, and what a retention pass removed: the embedded
//! backend's own report types, so that `tidings-log`'s version is not part of tidings' API.
//! Each is built from the log's report and keeps its text (`Display`) word for word.

use std::fmt;
use std::path::PathBuf;

/// What opening a stream's log found and repaired ([`EmbeddedBackend::recovery`]).
///
/// [`EmbeddedBackend::recovery`]: super::EmbeddedBackend::recovery
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecoveryReport {
    /// The stream's log directory.
    pub dir: PathBuf,
    /// Number of segments after recovery.
    pub segments: usize,
    /// Earliest offset after recovery.
    pub start_offset: u64,
    /// Next offset after recovery.
    pub end_offset: u64,
    /// Whether the directory held no segment and a first one was created.
    pub created: bool,
    /// The torn tail that was cut off, if any.
    pub truncated: Option<Truncation>,
    /// A last segment left by an interrupted roll (only a partial header or zeros), removed.
    pub removed_incomplete_segment: Option<PathBuf>,
    /// Index files that were missing, stale or invalid and were rebuilt from their segment.
    pub rebuilt_indexes: Vec<PathBuf>,
    /// Segments an interrupted roll left under a temporary name, published and recovered.
    pub adopted_segments: Vec<PathBuf>,
    /// Leftover temporary files and index files without a segment, removed.
    pub removed_files: Vec<PathBuf>,
    /// Files that do not belong to the log, left alone.
    pub ignored_files: Vec<PathBuf>,
    /// The log's own account, for `Display`.
    text: String,
}

/// A torn tail cut off by recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Truncation {
    /// The last segment.
    pub path: PathBuf,
    /// Where the first incomplete or invalid record started (the new file length).
    pub byte_offset: u64,
    /// Bytes removed.
    pub bytes_dropped: u64,
    /// What was wrong with the first removed record.
    pub reason: &'static str,
}

impl RecoveryReport {
    /// Whether recovery found nothing to repair (ignored foreign files do not count).
    #[must_use]
    pub fn is_clean(&self) -> bool {
        self.truncated.is_none()
            && self.removed_incomplete_segment.is_none()
            && self.adopted_segments.is_empty()
            && self.rebuilt_indexes.is_empty()
            && self.removed_files.is_empty()
    }
}

impl RecoveryReport {
    /// The log's report in tidings' terms (a crate-private conversion: a public `From`
    /// would name the log's type in tidings' API).
    pub(crate) fn of(r: &tidings_log::RecoveryReport) -> Self {
        Self {
            dir: r.dir.clone(),
            segments: r.segments,
            start_offset: r.start_offset,
            end_offset: r.end_offset,
            created: r.created,
            truncated: r.truncated.as_ref().map(|t| Truncation {
                path: t.path.clone(),
                byte_offset: t.byte_offset,
                bytes_dropped: t.bytes_dropped,
                reason: t.reason,
            }),
            removed_incomplete_segment: r.removed_incomplete_segment.clone(),
            rebuilt_indexes: r.rebuilt_indexes.clone(),
            adopted_segments: r.adopted_segments.clone(),
            removed_files: r.removed_files.clone(),
            ignored_files: r.ignored_files.clone(),
            text: r.to_string(),
        }
    }
}

impl fmt::Display for RecoveryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// What a retention pass removed ([`EmbeddedBackend::apply_retention`]).
///
/// [`EmbeddedBackend::apply_retention`]: super::EmbeddedBackend::apply_retention
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetentionReport {
    /// Removed segments, oldest first.
    pub removed: Vec<RemovedSegment>,
    /// Earliest retained offset afterwards.
    pub start_offset: u64,
    /// Total size of the remaining segments in bytes.
    pub retained_bytes: u64,
    /// The log's own account, for `Display`.
    text: String,
}

/// One segment removed by retention.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
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

impl RetentionReport {
    /// The log's report in tidings' terms (crate-private, as `RecoveryReport::of`).
    pub(crate) fn of(r: tidings_log::RetentionReport) -> Self {
        Self {
            text: r.to_string(),
            removed: r
                .removed
                .into_iter()
                .map(|s| RemovedSegment {
                    path: s.path,
                    base_offset: s.base_offset,
                    end_offset: s.end_offset,
                    bytes: s.bytes,
                })
                .collect(),
            start_offset: r.start_offset,
            retained_bytes: r.retained_bytes,
        }
    }
}

impl fmt::Display for RetentionReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}
