//! Segment files: names, the header, and the in-memory handle of one segment.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::RwLock;

use crate::index::SegmentIndex;
use crate::storage::StorageFile;

/// Segment header length in bytes.
pub(crate) const HEADER_LEN: u64 = 32;
/// Segment magic.
pub(crate) const SEGMENT_MAGIC: [u8; 8] = *b"TDNGSEG\0";
/// On-disk format version written and read by this build.
pub const FORMAT_VERSION: u16 = 1;

/// Kinds of files in a stream directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum FileKind {
    Segment,
    OffsetIndex,
    TimeIndex,
}

impl FileKind {
    pub(crate) fn ext(self) -> &'static str {
        match self {
            FileKind::Segment => "seg",
            FileKind::OffsetIndex => "idx",
            FileKind::TimeIndex => "tix",
        }
    }
}

/// `<base offset, 20 digits>.<ext>`.
pub(crate) fn file_name(base: u64, kind: FileKind) -> String {
    format!("{base:020}.{}", kind.ext())
}

pub(crate) fn file_path(dir: &Path, base: u64, kind: FileKind) -> PathBuf {
    dir.join(file_name(base, kind))
}

/// What a directory entry name means to the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NameKind {
    /// A log file with its base offset.
    Log(FileKind, u64),
    /// A log extension with an unparseable stem.
    Unparseable,
    /// A segment an asynchronous roll started and whose predecessor's seal had not published
    /// yet (`<base>.seg.tmp`, see [`pending_path`]).
    PendingSegment(u64),
    /// A leftover temporary file (any other `*.tmp`).
    Temp,
    /// The directory's lock file, or the application's `META` file: not the log's to list.
    Lock,
    /// Anything else.
    Foreign,
}

pub(crate) fn classify(name: &str) -> NameKind {
    if let Some(stem) = name.strip_suffix(".tmp") {
        return match classify(stem) {
            NameKind::Log(FileKind::Segment, base) => NameKind::PendingSegment(base),
            _ => NameKind::Temp,
        };
    }
    if name == crate::storage::LOCK_FILE || name == crate::storage::META_FILE {
        return NameKind::Lock;
    }
    let Some((stem, ext)) = name.rsplit_once('.') else {
        return NameKind::Foreign;
    };
    let kind = match ext {
        "seg" => FileKind::Segment,
        "idx" => FileKind::OffsetIndex,
        "tix" => FileKind::TimeIndex,
        _ => return NameKind::Foreign,
    };
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return NameKind::Unparseable;
    }
    match stem.parse() {
        Ok(base) => NameKind::Log(kind, base),
        Err(_) => NameKind::Unparseable,
    }
}

/// The exact header of a segment with this base offset.
pub(crate) fn header_bytes(base: u64) -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[..8].copy_from_slice(&SEGMENT_MAGIC);
    h[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[16..24].copy_from_slice(&base.to_le_bytes());
    let crc = crc32c::crc32c(&h[..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

/// What is wrong with a segment header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeaderProblem {
    Truncated,
    BadMagic,
    Version(u16),
    BadChecksum,
    BaseMismatch,
}

impl HeaderProblem {
    pub(crate) fn reason(self) -> &'static str {
        match self {
            HeaderProblem::Truncated => "file is shorter than the 32-byte segment header",
            HeaderProblem::BadMagic => "bad magic (not a tidings segment)",
            HeaderProblem::Version(_) => "unsupported format version",
            HeaderProblem::BadChecksum => "header checksum mismatch",
            HeaderProblem::BaseMismatch => "base offset in the header does not match the file name",
        }
    }
}

/// Checks a header (the first bytes of the file, at most [`HEADER_LEN`]). The version is checked
/// before the checksum because a future version may lay the rest of the header out differently.
pub(crate) fn check_header(bytes: &[u8], base: u64) -> Result<(), HeaderProblem> {
    if bytes.len() < HEADER_LEN as usize {
        return Err(HeaderProblem::Truncated);
    }
    if bytes[..8] != SEGMENT_MAGIC {
        return Err(HeaderProblem::BadMagic);
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    if version != FORMAT_VERSION {
        return Err(HeaderProblem::Version(version));
    }
    if crc32c::crc32c(&bytes[..28]) != crate::record::u32_at(bytes, 28) {
        return Err(HeaderProblem::BadChecksum);
    }
    if bytes[..HEADER_LEN as usize] != header_bytes(base) {
        return Err(HeaderProblem::BaseMismatch);
    }
    Ok(())
}

/// Whether the whole content of a last segment is what an interrupted roll leaves: a prefix of
/// the expected header (torn header write), or only zeros (length reached the disk, data did
/// not).
pub(crate) fn is_interrupted_roll(content: &[u8], base: u64) -> bool {
    let expected = header_bytes(base);
    content.iter().all(|&b| b == 0)
        || (content.len() < expected.len() && expected.starts_with(content))
}

/// One segment: its file and what the log knows about it.
#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) base: u64,
    /// The segment's name. A segment started by an asynchronous roll is written under
    /// [`pending_path`] until its predecessor's seal publishes it (see [`crate::writeback`]).
    pub(crate) path: PathBuf,
    pub(crate) file: Arc<dyn StorageFile>,
    pub(crate) index: RwLock<SegmentIndex>,
    /// Offset after the last record written into this segment.
    pub(crate) end: AtomicU64,
    /// Logical size in bytes, write-buffered bytes included.
    pub(crate) size: AtomicU64,
    /// Bytes handed to the storage (the file length, for this process).
    pub(crate) flushed: AtomicU64,
    /// Largest timestamp of the segment's records (meaningless while it has none).
    pub(crate) max_ts: AtomicU64,
    /// Whether the file is under its name `path`, durably (the directory was synced since).
    /// Only then can a sync of the file make its records durable. False only for the segment
    /// an asynchronous roll started, until the seal of the segment before it publishes it.
    pub(crate) published: AtomicBool,
    /// `(offset, byte position)` of records found past damaged ones
    /// ([`crate::Log::next_readable`]), ordered by offset: reads start there rather than walk
    /// into the damage again. In memory only, one per damaged record at most.
    pub(crate) resyncs: RwLock<Vec<(u64, u64)>>,
}

/// The name an unpublished segment is written under: `<name>.seg.tmp`. Recovery adopts it only
/// when the segment before it is complete, and removes it otherwise, so a crash before the
/// publication never leaves a gap or a segment after a torn one.
pub(crate) fn pending_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".tmp");
    PathBuf::from(p)
}

impl Segment {
    pub(crate) fn new(
        base: u64,
        path: PathBuf,
        file: Arc<dyn StorageFile>,
        index: SegmentIndex,
        end: u64,
        size: u64,
        max_ts: u64,
    ) -> Self {
        Self {
            base,
            path,
            file,
            index: RwLock::new(index),
            end: AtomicU64::new(end),
            size: AtomicU64::new(size),
            flushed: AtomicU64::new(size),
            max_ts: AtomicU64::new(max_ts),
            published: AtomicBool::new(true),
            resyncs: RwLock::new(Vec::new()),
        }
    }

    /// The last resync point at or before `offset`.
    pub(crate) fn resync_floor(&self, offset: u64) -> Option<(u64, u64)> {
        let points = self.resyncs.read();
        let i = points.partition_point(|&(o, _)| o <= offset);
        i.checked_sub(1).map(|i| points[i])
    }

    /// Remembers that the record `offset` starts at byte `pos` and is readable.
    pub(crate) fn add_resync(&self, offset: u64, pos: u64) {
        let mut points = self.resyncs.write();
        if let Err(i) = points.binary_search_by_key(&offset, |&(o, _)| o) {
            points.insert(i, (offset, pos));
        }
    }

    /// An empty segment whose file (at [`pending_path`]) holds only the header, not yet
    /// published.
    pub(crate) fn unpublished(base: u64, path: PathBuf, file: Arc<dyn StorageFile>) -> Self {
        let seg = Self::new(
            base,
            path,
            file,
            SegmentIndex::default(),
            base,
            HEADER_LEN,
            0,
        );
        seg.published.store(false, Ordering::Release);
        seg
    }

    pub(crate) fn is_published(&self) -> bool {
        self.published.load(Ordering::Acquire)
    }

    pub(crate) fn end(&self) -> u64 {
        self.end.load(Ordering::Acquire)
    }

    pub(crate) fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    /// The largest timestamp, or `None` when the segment has no records.
    pub(crate) fn max_ts(&self) -> Option<u64> {
        (self.end() > self.base).then(|| self.max_ts.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_roundtrip_and_classify() {
        assert_eq!(file_name(42, FileKind::Segment), "00000000000000000042.seg");
        assert_eq!(
            classify("00000000000000000042.tix"),
            NameKind::Log(FileKind::TimeIndex, 42)
        );
        assert_eq!(classify("42.seg"), NameKind::Unparseable);
        assert_eq!(classify("9999999999999999999x.idx"), NameKind::Unparseable);
        assert_eq!(classify("99999999999999999999.seg"), NameKind::Unparseable); // > u64::MAX
        assert_eq!(classify("00000000000000000042.idx.tmp"), NameKind::Temp);
        assert_eq!(
            classify("00000000000000000042.seg.tmp"),
            NameKind::PendingSegment(42)
        );
        assert_eq!(classify("42.seg.tmp"), NameKind::Temp);
        assert_eq!(classify("00000000000000000042.seg.tmp.tmp"), NameKind::Temp);
        assert_eq!(classify("README"), NameKind::Foreign);
        assert_eq!(classify("notes.txt"), NameKind::Foreign);
    }

    #[test]
    fn header_checks() {
        let h = header_bytes(7);
        assert_eq!(check_header(&h, 7), Ok(()));
        assert_eq!(check_header(&h, 8), Err(HeaderProblem::BaseMismatch));
        assert_eq!(check_header(&h[..31], 7), Err(HeaderProblem::Truncated));
        for bit in 0..256 {
            let mut b = h;
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(check_header(&b, 7).is_err(), "flip {bit}");
        }
        assert!(is_interrupted_roll(&h[..10], 7));
        assert!(is_interrupted_roll(&[0; 100], 7));
        assert!(!is_interrupted_roll(&h[..20], 8));
        assert!(!is_interrupted_roll(&h, 7));
    }
}
