//! Opening a stream directory: validate everything first (read-only), then repair.
//!
//! See the [recovery rules](crate#recovery-rules). Phase 1 reads only; if it finds corruption or a
//! foreign file it returns the error and nothing on disk has changed. Phase 2 applies the repairs
//! phase 1 decided on (remove leftovers, remove an interrupted roll, truncate a torn tail, rewrite
//! index files, create the first segment), syncs the last segment and the directory (so that
//! everything recovered is durable).

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::LogConfig;
use crate::dir::{self, BadEntry};
use crate::error::OpenError;
use crate::index::{self, IndexBuilder, SealedInfo, SegmentIndex};
use crate::record::{FRAME_PREFIX, u64_at};
use crate::scan::{Damage, ScanOutcome, is_interrupted_roll_file, scan};
use crate::segment::{
    FileKind, HEADER_LEN, HeaderProblem, Segment, check_header, file_path, header_bytes,
};
use crate::storage::{OpenMode, Storage, StorageFile, read_all, read_exact_at, write_all_at};

/// What [`Log::open`](crate::Log::open) found and repaired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecoveryReport {
    /// The stream directory.
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
    /// Segments an interrupted asynchronous roll left under a temporary name, whose
    /// predecessor turned out complete: published under their names (in offset order) and
    /// recovered like the last segment. See [the recovery rules](crate#recovery-rules).
    pub adopted_segments: Vec<PathBuf>,
    /// Leftover temporary files (unpublished segments that could not be adopted included) and
    /// index files without a segment, removed.
    pub removed_files: Vec<PathBuf>,
    /// Files that do not belong to the log (not `*.seg`, `*.idx`, `*.tix`, `*.tmp`), left alone.
    pub ignored_files: Vec<PathBuf>,
}

/// A torn tail cut off by recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    pub fn is_clean(&self) -> bool {
        self.truncated.is_none()
            && self.removed_incomplete_segment.is_none()
            && self.adopted_segments.is_empty()
            && self.rebuilt_indexes.is_empty()
            && self.removed_files.is_empty()
    }
}

impl fmt::Display for RecoveryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} segment(s), offsets {}..{}",
            self.dir.display(),
            self.segments,
            self.start_offset,
            self.end_offset
        )?;
        if self.created {
            write!(f, " (new log)")?;
        }
        if let Some(t) = &self.truncated {
            write!(
                f,
                "\n  truncated torn tail of {} at byte {} ({} bytes dropped: {})",
                t.path.display(),
                t.byte_offset,
                t.bytes_dropped,
                t.reason
            )?;
        }
        if let Some(p) = &self.removed_incomplete_segment {
            write!(f, "\n  removed incomplete segment {}", p.display())?;
        }
        for p in &self.adopted_segments {
            write!(f, "\n  adopted unpublished segment {}", p.display())?;
        }
        for p in &self.rebuilt_indexes {
            write!(f, "\n  rebuilt index {}", p.display())?;
        }
        for p in &self.removed_files {
            write!(f, "\n  removed leftover {}", p.display())?;
        }
        for p in &self.ignored_files {
            write!(f, "\n  ignored foreign file {}", p.display())?;
        }
        Ok(())
    }
}

/// The result of a successful recovery.
pub(crate) struct Recovered {
    pub(crate) segments: Vec<Arc<Segment>>,
    pub(crate) builder: IndexBuilder,
    pub(crate) report: RecoveryReport,
}

struct Loaded {
    base: u64,
    path: PathBuf,
    file: Arc<dyn StorageFile>,
    index: SegmentIndex,
    end: u64,
    size: u64,
    max_ts: u64,
    rebuild_files: bool,
    /// The temporary name of an adopted unpublished segment, renamed to `path` in phase 2.
    adopted_from: Option<PathBuf>,
}

impl Loaded {
    /// A segment as its scan found it; the scan's index builder is returned apart (only the
    /// last segment's is kept).
    fn scanned(
        base: u64,
        path: PathBuf,
        file: Arc<dyn StorageFile>,
        sc: ScanOutcome,
        rebuild_files: bool,
        adopted_from: Option<PathBuf>,
    ) -> (Self, IndexBuilder) {
        let loaded = Loaded {
            base,
            path,
            file,
            index: sc.index,
            end: sc.end,
            size: sc.valid_len,
            max_ts: sc.max_ts.unwrap_or(0),
            rebuild_files,
            adopted_from,
        };
        (loaded, sc.builder)
    }
}

/// Scans a segment file that may end in a torn tail (the last one, or an adopted one).
fn scan_segment(
    file: &dyn StorageFile,
    len: u64,
    base: u64,
    config: &LogConfig,
    path: &Path,
) -> Result<ScanOutcome, OpenError> {
    scan(
        file,
        len,
        HEADER_LEN,
        base,
        config.index_interval_bytes,
        &mut |_| true,
    )
    .map_err(io_at(path))
}

/// The cut recovery makes at `d` in a file of `len` bytes.
fn torn_tail(path: &Path, len: u64, d: &Damage) -> Truncation {
    Truncation {
        path: path.to_path_buf(),
        byte_offset: d.pos,
        bytes_dropped: len - d.pos,
        reason: d.reason,
    }
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> OpenError + '_ {
    move |source| OpenError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub(crate) fn header_error(path: PathBuf, p: HeaderProblem) -> OpenError {
    match p {
        HeaderProblem::Version(version) => OpenError::UnsupportedVersion {
            path,
            version,
            supported: crate::FORMAT_VERSION,
        },
        p => OpenError::BadHeader {
            path,
            reason: p.reason(),
        },
    }
}

fn read_header(file: &dyn StorageFile, len: u64, path: &Path) -> Result<Vec<u8>, OpenError> {
    let mut head = vec![0; len.min(HEADER_LEN) as usize];
    read_exact_at(file, &mut head, 0).map_err(io_at(path))?;
    Ok(head)
}

/// Opens and recovers the log in `dir`.
pub(crate) fn recover(
    storage: &dyn Storage,
    dir: &Path,
    config: &LogConfig,
) -> Result<Recovered, OpenError> {
    config.validate()?;
    storage.create_dir_all(dir).map_err(io_at(dir))?;
    let listing = dir::list(storage, dir).map_err(io_at(dir))?;
    if let Some(bad) = listing.bad.first() {
        return Err(match bad {
            BadEntry::Unparseable(path) => OpenError::UnparseableName { path: path.clone() },
            BadEntry::NotAFile(path) => OpenError::BadHeader {
                path: path.clone(),
                reason: "not a regular file",
            },
        });
    }
    let mut report = RecoveryReport {
        dir: dir.to_path_buf(),
        ignored_files: listing.foreign.clone(),
        ..RecoveryReport::default()
    };
    let mut bases = listing.segment_bases();

    // Phase 1: validate, read-only.
    let mut incomplete = None;
    if let Some(&base) = bases.last() {
        let path = file_path(dir, base, FileKind::Segment);
        let file = storage.open(&path, OpenMode::Read).map_err(io_at(&path))?;
        let len = file.len().map_err(io_at(&path))?;
        let head = read_header(&*file, len, &path)?;
        if check_header(&head, base).is_err()
            && is_interrupted_roll_file(&*file, len, base).map_err(io_at(&path))?
        {
            bases.pop();
            incomplete = Some((base, path));
        }
    }
    let mut loaded: Vec<Loaded> = Vec::with_capacity(bases.len());
    let mut builder = IndexBuilder::new(config.index_interval_bytes);
    for (i, &base) in bases.iter().enumerate() {
        let last = i + 1 == bases.len();
        let path = file_path(dir, base, FileKind::Segment);
        let mode = if last {
            OpenMode::ReadWrite
        } else {
            OpenMode::Read
        };
        let file: Arc<dyn StorageFile> = storage.open(&path, mode).map_err(io_at(&path))?.into();
        let len = file.len().map_err(io_at(&path))?;
        let head = read_header(&*file, len, &path)?;
        check_header(&head, base).map_err(|p| header_error(path.clone(), p))?;
        let files = listing.files.get(&base).copied().unwrap_or_default();
        let cached = if !last && files.idx && files.tix {
            load_index(storage, dir, base, len, &*file)
        } else {
            None
        };
        let rebuild_files = !last && cached.is_none();
        if let Some((info, index)) = cached.clone().filter(|_| !config.verify_on_open) {
            loaded.push(Loaded {
                base,
                path,
                file,
                index,
                end: info.end,
                size: len,
                max_ts: info.max_ts,
                rebuild_files,
                adopted_from: None,
            });
            continue;
        }
        let sc = scan_segment(&*file, len, base, config, &path)?;
        if let Some(d) = &sc.damage {
            if !last || d.resync.is_some() {
                return Err(OpenError::Corrupt {
                    path,
                    byte_offset: d.pos,
                    reason: d.reason,
                });
            }
            report.truncated = Some(torn_tail(&path, len, d));
        }
        let (l, scanned_builder) = Loaded::scanned(base, path, file, sc, rebuild_files, None);
        if last {
            builder = scanned_builder;
        }
        loaded.push(l);
    }
    if incomplete.is_none() && report.truncated.is_none() {
        builder = adopt_pending(storage, dir, config, &listing, &mut loaded, &mut report)?
            .unwrap_or(builder);
    }
    for w in loaded.windows(2) {
        if w[0].end != w[1].base {
            return Err(OpenError::Gap {
                path: w[1].path.clone(),
                expected: w[0].end,
                found: w[1].base,
            });
        }
    }

    // Phase 2: repair.
    let mut leftovers = listing.temps.clone();
    leftovers.extend(
        listing
            .pending
            .values()
            .filter(|p| !loaded.iter().any(|l| l.adopted_from.as_ref() == Some(*p)))
            .cloned(),
    );
    leftovers.extend(listing.orphans(dir));
    for p in leftovers {
        storage.remove(&p).map_err(io_at(&p))?;
        report.removed_files.push(p);
    }
    if let Some((_, path)) = &incomplete {
        storage.remove(path).map_err(io_at(path))?;
        report.removed_incomplete_segment = Some(path.clone());
    }
    if let Some(l) = loaded.last() {
        if let Some(t) = &report.truncated {
            l.file.set_len(t.byte_offset).map_err(io_at(&t.path))?;
        }
        // The previous process may have left unsynced data in the page cache: sync it, so that
        // everything recovered is durable (`durable_offset` starts at the recovered end).
        l.file.sync_data().map_err(io_at(&l.path))?;
    }
    // Publish adopted segments as the seal would have: the segment before each one synced,
    // then its own file, then its name (made durable by the directory sync below). A crash
    // in between leaves what an interrupted seal leaves, and the next open decides again.
    for i in 1..loaded.len() {
        let Some(tmp) = &loaded[i].adopted_from else {
            continue;
        };
        let prev = &loaded[i - 1];
        prev.file.sync_data().map_err(io_at(&prev.path))?;
        let l = &loaded[i];
        l.file.sync_data().map_err(io_at(tmp))?;
        storage.rename(tmp, &l.path).map_err(io_at(&l.path))?;
        report.adopted_segments.push(l.path.clone());
    }
    for l in loaded.iter().filter(|l| l.rebuild_files) {
        let info = SealedInfo {
            covered_len: l.size,
            end: l.end,
            max_ts: l.max_ts,
        };
        report.rebuilt_indexes.extend(
            write_index_files(storage, dir, l.base, &info, &l.index)
                .map_err(|(p, e)| io_at(&p)(e))?,
        );
    }
    if loaded.is_empty() {
        let base = incomplete.as_ref().map_or(0, |(b, _)| *b);
        let (path, file) = create_segment(storage, dir, base).map_err(|(p, e)| io_at(&p)(e))?;
        report.created = incomplete.is_none();
        loaded.push(Loaded {
            base,
            path,
            file,
            index: SegmentIndex::default(),
            end: base,
            size: HEADER_LEN,
            max_ts: 0,
            rebuild_files: false,
            adopted_from: None,
        });
    }
    // Always, even with nothing repaired: names the previous process created may be unsynced.
    storage.sync_dir(dir).map_err(io_at(dir))?;
    let segments: Vec<Arc<Segment>> = loaded
        .into_iter()
        .map(|l| {
            Arc::new(Segment::new(
                l.base, l.path, l.file, l.index, l.end, l.size, l.max_ts,
            ))
        })
        .collect();
    report.segments = segments.len();
    report.start_offset = segments.first().map_or(0, |s| s.base);
    report.end_offset = segments.last().map_or(0, |s| s.end());
    Ok(Recovered {
        segments,
        builder,
        report,
    })
}

/// Phase 1 (read-only) for the segments an interrupted asynchronous roll left unpublished
/// (`<base>.seg.tmp`): takes them into `loaded`, in offset order, while each one starts exactly
/// where the recovered log ends (so the segment before it is complete: every record up to the
/// roll is there and intact, as after a process kill, whose page cache survives) and has an
/// intact header. The first that does not is dropped with every later one (a power cut took
/// part of what came before it, or its header). An adopted segment is recovered like a last
/// segment, except that damage of any kind is a torn tail: nothing in it was ever reported
/// durable. Returns the index builder of the new last segment, if any was adopted.
fn adopt_pending(
    storage: &dyn Storage,
    dir: &Path,
    config: &LogConfig,
    listing: &dir::Listing,
    loaded: &mut Vec<Loaded>,
    report: &mut RecoveryReport,
) -> Result<Option<IndexBuilder>, OpenError> {
    let mut builder = None;
    for (&base, tmp) in &listing.pending {
        let Some(prev) = loaded.last() else {
            break;
        };
        if base <= prev.base || base != prev.end || report.truncated.is_some() {
            break;
        }
        let file: Arc<dyn StorageFile> = storage
            .open(tmp, OpenMode::ReadWrite)
            .map_err(io_at(tmp))?
            .into();
        let len = file.len().map_err(io_at(tmp))?;
        let head = read_header(&*file, len, tmp)?;
        if check_header(&head, base).is_err() {
            break;
        }
        let sc = scan_segment(&*file, len, base, config, tmp)?;
        let path = file_path(dir, base, FileKind::Segment);
        if let Some(d) = &sc.damage {
            report.truncated = Some(torn_tail(&path, len, d));
        }
        // The segment before it is sealed now: its index files are written in phase 2.
        if let Some(prev) = loaded.last_mut() {
            prev.rebuild_files = true;
        }
        let (l, scanned_builder) = Loaded::scanned(base, path, file, sc, false, Some(tmp.clone()));
        builder = Some(scanned_builder);
        loaded.push(l);
    }
    Ok(builder)
}

/// Loads both index files of a sealed segment; `None` if anything is missing or fails a check,
/// including the spot check that the last indexed position holds the indexed offset.
fn load_index(
    storage: &dyn Storage,
    dir: &Path,
    base: u64,
    seg_len: u64,
    seg: &dyn StorageFile,
) -> Option<(SealedInfo, SegmentIndex)> {
    let read = |kind| {
        let f = storage
            .open(&file_path(dir, base, kind), OpenMode::Read)
            .ok()?;
        if f.len().ok()? > index::max_file_len(seg_len) {
            return None;
        }
        read_all(&*f).ok()
    };
    let (info, index) = index::decode_files(
        base,
        seg_len,
        &read(FileKind::OffsetIndex)?,
        &read(FileKind::TimeIndex)?,
    )
    .ok()?;
    let (offset, pos) = index.floor(base, u64::MAX);
    if info.end > base {
        let mut b = [0u8; 8];
        read_exact_at(seg, &mut b, pos + FRAME_PREFIX as u64).ok()?;
        if u64_at(&b, 0) != offset {
            return None;
        }
    }
    Some((info, index))
}

/// Writes the index files of a sealed segment (`*.tmp`, then rename). Not synced: the files are
/// checked on load, so a torn one is just rebuilt. Returns the written paths.
pub(crate) fn write_index_files(
    storage: &dyn Storage,
    dir: &Path,
    base: u64,
    info: &SealedInfo,
    index: &SegmentIndex,
) -> Result<Vec<PathBuf>, (PathBuf, io::Error)> {
    let (idx, tix) = index::encode_files(base, info, index);
    let mut written = Vec::new();
    for (kind, bytes) in [(FileKind::OffsetIndex, idx), (FileKind::TimeIndex, tix)] {
        let path = file_path(dir, base, kind);
        let mut tmp = path.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let f = storage.create(&tmp).map_err(|e| (tmp.clone(), e))?;
        write_all_at(&*f, &bytes, 0).map_err(|e| (tmp.clone(), e))?;
        storage.rename(&tmp, &path).map_err(|e| (path.clone(), e))?;
        written.push(path);
    }
    Ok(written)
}

/// Creates a segment file with its header and syncs it (the caller syncs the directory).
pub(crate) fn create_segment(
    storage: &dyn Storage,
    dir: &Path,
    base: u64,
) -> Result<(PathBuf, Arc<dyn StorageFile>), (PathBuf, io::Error)> {
    let path = file_path(dir, base, FileKind::Segment);
    let run = || -> io::Result<Arc<dyn StorageFile>> {
        let f: Arc<dyn StorageFile> = storage.create(&path)?.into();
        write_all_at(&*f, &header_bytes(base), 0)?;
        f.sync_data()?;
        Ok(f)
    };
    run()
        .map(|f| (path.clone(), f))
        .map_err(|e| (path.clone(), e))
}
