//! Offline tools for a stream directory: [`inspect`], [`verify`], [`dump`].
//!
//! They only read (files are opened read-only; nothing is repaired, truncated or rebuilt), so they
//! are safe on a log another process has open, though they may then see a partly written tail.
//! Each has a `*_with_storage` twin for tests on [`SimStorage`](crate::testing::SimStorage).
//! Reports implement `Display` for a command-line tool.

mod verify;

use std::fmt;
use std::path::{Path, PathBuf};

use bytes::Bytes;

pub use verify::{
    Problem, ProblemKind, VerifyReport, verify, verify_with_progress, verify_with_storage,
};

use crate::dir::{self, BadEntry, Listing};
use crate::error::ToolError;
use crate::index;
use crate::record::{self, StoredRecord};
use crate::scan::scan;
use crate::segment::{FileKind, HEADER_LEN, check_header, file_path};
use crate::storage::{FsStorage, OpenMode, Storage, StorageFile, read_all, read_exact_at};

/// State of a segment's index files.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IndexStatus {
    /// Present and consistent with the segment.
    Valid,
    /// The last (active) segment: its indexes are always rebuilt on open.
    Active,
    /// One or both files are missing (rebuilt on open).
    Missing,
    /// Present but failing a check (rebuilt on open).
    Invalid(String),
}

impl fmt::Display for IndexStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IndexStatus::Valid => f.write_str("ok"),
            IndexStatus::Active => f.write_str("active"),
            IndexStatus::Missing => f.write_str("missing"),
            IndexStatus::Invalid(r) => write!(f, "invalid ({r})"),
        }
    }
}

/// One segment as seen by [`inspect`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SegmentInfo {
    /// The segment file.
    pub path: PathBuf,
    /// Offset of its first record (from the file name).
    pub base_offset: u64,
    /// Offset after its last valid record.
    pub end_offset: u64,
    /// File size in bytes.
    pub bytes: u64,
    /// Number of valid records before the first problem.
    pub records: u64,
    /// Smallest record timestamp.
    pub min_timestamp_ms: Option<u64>,
    /// Largest record timestamp.
    pub max_timestamp_ms: Option<u64>,
    /// State of its index files.
    pub index: IndexStatus,
    /// The first problem found, if any (`verify` lists all of them).
    pub problem: Option<String>,
}

/// What [`inspect`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Inspection {
    /// The stream directory.
    pub dir: PathBuf,
    /// Segments, oldest first.
    pub segments: Vec<SegmentInfo>,
    /// Files that are not segments or index files.
    pub other_files: Vec<PathBuf>,
}

impl Inspection {
    /// Earliest offset (base of the first segment), 0 for an empty directory.
    pub fn start_offset(&self) -> u64 {
        self.segments.first().map_or(0, |s| s.base_offset)
    }

    /// Offset after the last valid record.
    pub fn end_offset(&self) -> u64 {
        self.segments.last().map_or(0, |s| s.end_offset)
    }

    /// Total size of the segment files.
    pub fn total_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.bytes).sum()
    }

    /// Total number of valid records.
    pub fn records(&self) -> u64 {
        self.segments.iter().map(|s| s.records).sum()
    }
}

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: {} segment(s), offsets {}..{}, {} record(s), {} bytes",
            self.dir.display(),
            self.segments.len(),
            self.start_offset(),
            self.end_offset(),
            self.records(),
            self.total_bytes()
        )?;
        writeln!(
            f,
            "{:<26} {:>20} {:>20} {:>12} {:>10}  {:<29}  index",
            "segment", "base", "end", "bytes", "records", "timestamps (ms)"
        )?;
        for s in &self.segments {
            let name = s
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let ts = match (s.min_timestamp_ms, s.max_timestamp_ms) {
                (Some(a), Some(b)) => format!("{a}..={b}"),
                _ => "-".to_owned(),
            };
            writeln!(
                f,
                "{:<26} {:>20} {:>20} {:>12} {:>10}  {:<29}  {}",
                name, s.base_offset, s.end_offset, s.bytes, s.records, ts, s.index
            )?;
            if let Some(p) = &s.problem {
                writeln!(f, "  ! {p}")?;
            }
        }
        for p in &self.other_files {
            writeln!(f, "other file: {}", p.display())?;
        }
        Ok(())
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ToolError + '_ {
    move |source| ToolError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub(crate) fn listing(storage: &dyn Storage, dir: &Path) -> Result<Listing, ToolError> {
    dir::list(storage, dir).map_err(io(dir))
}

/// An open segment file, its length and its first (up to 32) bytes.
pub(crate) type OpenedSegment = (Box<dyn StorageFile>, u64, Vec<u8>);

pub(crate) fn open_segment(storage: &dyn Storage, path: &Path) -> Result<OpenedSegment, ToolError> {
    let file = storage.open(path, OpenMode::Read).map_err(io(path))?;
    let len = file.len().map_err(io(path))?;
    let mut head = vec![0; len.min(HEADER_LEN) as usize];
    read_exact_at(&*file, &mut head, 0).map_err(io(path))?;
    Ok((file, len, head))
}

/// Checks the index files of a sealed segment; with `truth` (`(position, timestamp)` of every
/// record, from the base offset on) also that every entry matches the records. Returns the status
/// and the file it is about: the one missing or failing a check (the offset index when both are
/// fine, or both missing).
pub(crate) fn index_status(
    storage: &dyn Storage,
    dir: &Path,
    base: u64,
    len: u64,
    truth: Option<&[(u64, u64)]>,
) -> (IndexStatus, FileKind) {
    let read = |kind| -> Result<Vec<u8>, IndexStatus> {
        let f = storage
            .open(&file_path(dir, base, kind), OpenMode::Read)
            .map_err(|_| IndexStatus::Missing)?;
        if f.len().map_err(|_| IndexStatus::Missing)? > index::max_file_len(len) {
            return Err(IndexStatus::Invalid(
                "index file longer than its segment allows".to_owned(),
            ));
        }
        read_all(&*f).map_err(|_| IndexStatus::Missing)
    };
    let (idx, tix) = match (read(FileKind::OffsetIndex), read(FileKind::TimeIndex)) {
        (Ok(idx), Ok(tix)) => (idx, tix),
        (Err(s), _) => return (s, FileKind::OffsetIndex),
        (_, Err(s)) => return (s, FileKind::TimeIndex),
    };
    match index::decode_files(base, len, &idx, &tix) {
        Err(fault) => (IndexStatus::Invalid(fault.reason.to_owned()), fault.file),
        Ok((info, loaded)) => match truth {
            Some(recs) if !entries_match(base, info.end, &loaded, recs) => (
                IndexStatus::Invalid("entries do not match the records".to_owned()),
                FileKind::OffsetIndex,
            ),
            _ => (IndexStatus::Valid, FileKind::OffsetIndex),
        },
    }
}

fn entries_match(base: u64, end: u64, idx: &index::SegmentIndex, recs: &[(u64, u64)]) -> bool {
    let mut running = Vec::with_capacity(recs.len());
    for &(_, ts) in recs {
        running.push(running.last().map_or(ts, |&m: &u64| m.max(ts)));
    }
    let at = |o: u64| usize::try_from(o - base).ok();
    end == base + recs.len() as u64
        && idx
            .offsets
            .iter()
            .all(|&(o, p)| at(o).and_then(|i| recs.get(i)).is_some_and(|r| r.0 == p))
        && idx
            .times
            .iter()
            .all(|&(m, o)| at(o).and_then(|i| running.get(i)) == Some(&m))
}

/// Describes every segment of the log in `dir` (record counts need a full scan).
pub fn inspect(dir: impl AsRef<Path>) -> Result<Inspection, ToolError> {
    inspect_with_storage(&FsStorage, dir.as_ref())
}

/// [`inspect`] on any [`Storage`].
pub fn inspect_with_storage(storage: &dyn Storage, dir: &Path) -> Result<Inspection, ToolError> {
    let listing = listing(storage, dir)?;
    let bases = listing.segment_bases();
    let mut out = Inspection {
        dir: dir.to_path_buf(),
        segments: Vec::new(),
        other_files: listing.foreign.clone(),
    };
    out.other_files.extend(listing.temps.iter().cloned());
    out.other_files.extend(listing.pending.values().cloned());
    out.other_files.extend(listing.bad.iter().map(|b| match b {
        BadEntry::Unparseable(p) | BadEntry::NotAFile(p) => p.clone(),
    }));
    for (i, &base) in bases.iter().enumerate() {
        let path = file_path(dir, base, FileKind::Segment);
        let (file, len, head) = open_segment(storage, &path)?;
        let mut info = SegmentInfo {
            path: path.clone(),
            base_offset: base,
            end_offset: base,
            bytes: len,
            records: 0,
            min_timestamp_ms: None,
            max_timestamp_ms: None,
            index: IndexStatus::Active,
            problem: None,
        };
        if let Err(p) = check_header(&head, base) {
            info.problem = Some(format!("bad header: {}", p.reason()));
            out.segments.push(info);
            continue;
        }
        let sc = scan(
            &*file,
            len,
            HEADER_LEN,
            base,
            crate::LogConfig::default().index_interval_bytes,
            &mut |_| true,
        )
        .map_err(io(&path))?;
        info.end_offset = sc.end;
        info.records = sc.records;
        info.min_timestamp_ms = sc.min_ts;
        info.max_timestamp_ms = sc.max_ts;
        if i + 1 < bases.len() {
            info.index = index_status(storage, dir, base, len, None).0;
        }
        if let Some(d) = sc.damage {
            info.problem = Some(format!("bad record at byte {}: {}", d.pos, d.reason));
        }
        out.segments.push(info);
    }
    Ok(out)
}

/// Reads up to `max` records from offset `from` (or the earliest retained, if later) without
/// opening the log for writing. Stops quietly at a torn tail (what open would truncate); fails
/// with [`ToolError::Corrupt`] on any other bad record.
pub fn dump(dir: impl AsRef<Path>, from: u64, max: usize) -> Result<Vec<StoredRecord>, ToolError> {
    dump_with_storage(&FsStorage, dir.as_ref(), from, max)
}

/// [`dump`] on any [`Storage`].
pub fn dump_with_storage(
    storage: &dyn Storage,
    dir: &Path,
    from: u64,
    max: usize,
) -> Result<Vec<StoredRecord>, ToolError> {
    let listing = listing(storage, dir)?;
    let bases = listing.segment_bases();
    let first = bases.partition_point(|&b| b <= from).saturating_sub(1);
    let mut out = Vec::new();
    for (i, &base) in bases.iter().enumerate().skip(first) {
        if out.len() >= max {
            break;
        }
        let path = file_path(dir, base, FileKind::Segment);
        let (file, len, head) = open_segment(storage, &path)?;
        check_header(&head, base).map_err(|p| ToolError::BadHeader {
            path: path.clone(),
            reason: p.reason().to_owned(),
        })?;
        let mut err = None;
        let mut io_err = None;
        let sc = scan(&*file, len, HEADER_LEN, base, u32::MAX, &mut |fr| {
            if fr.offset >= from {
                let bytes = match fr.bytes {
                    Some(b) => Bytes::copy_from_slice(b),
                    None => {
                        let mut b = vec![0; fr.len];
                        if let Err(e) = read_exact_at(&*file, &mut b, fr.pos) {
                            io_err = Some(e);
                            return false;
                        }
                        Bytes::from(b)
                    }
                };
                match record::decode(&bytes) {
                    Ok(r) => out.push(r),
                    Err(reason) => {
                        err = Some((fr.pos, reason));
                        return false;
                    }
                }
            }
            out.len() < max
        })
        .map_err(io(&path))?;
        if let Some(e) = io_err {
            return Err(io(&path)(e));
        }
        let last = i + 1 == bases.len();
        let bad = err.or(sc
            .damage
            .filter(|d| !last || d.resync.is_some())
            .map(|d| (d.pos, d.reason)));
        if let Some((byte_offset, reason)) = bad {
            return Err(ToolError::Corrupt {
                path,
                byte_offset,
                reason,
            });
        }
    }
    Ok(out)
}
