//! `verify`: check every record of every segment and report every problem.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::dir::BadEntry;
use crate::error::ToolError;
use crate::scan::{is_interrupted_roll_file, scan};
use crate::segment::{FileKind, HEADER_LEN, check_header, file_path};
use crate::storage::{FsStorage, Storage};

use super::{IndexStatus, index_status, listing, open_segment};

/// Kinds of problems [`verify`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProblemKind {
    /// A record fails its checks and valid data follows it (or it is in a sealed segment):
    /// `Log::open` refuses the log.
    Corrupt,
    /// Incomplete or invalid bytes at the end of the last segment with nothing valid after them:
    /// `Log::open` truncates them.
    TornTail,
    /// A last segment holding only a partial header or zeros: `Log::open` removes it.
    IncompleteSegment,
    /// A segment header is invalid (bad magic, version, checksum, truncated): `Log::open` refuses.
    BadHeader,
    /// Segments do not follow each other: `Log::open` refuses.
    Gap,
    /// Index files are missing, stale or wrong: `Log::open` rebuilds them.
    BadIndex,
    /// A file with a log extension but an unparseable name, or not a regular file: `Log::open`
    /// refuses.
    BadName,
    /// A leftover temporary file: `Log::open` removes it.
    Leftover,
}

impl ProblemKind {
    /// Whether `Log::open` refuses the log because of this (otherwise it repairs it).
    pub fn prevents_open(self) -> bool {
        matches!(
            self,
            ProblemKind::Corrupt | ProblemKind::BadHeader | ProblemKind::Gap | ProblemKind::BadName
        )
    }
}

/// One problem found by [`verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// What kind of problem.
    pub kind: ProblemKind,
    /// The file.
    pub path: PathBuf,
    /// Byte offset inside the file, where it applies.
    pub byte_offset: Option<u64>,
    /// Details.
    pub detail: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = if self.kind.prevents_open() {
            "error"
        } else {
            "repairable"
        };
        write!(f, "{what}: {:?} in {}", self.kind, self.path.display())?;
        if let Some(b) = self.byte_offset {
            write!(f, " at byte {b}")?;
        }
        write!(f, ": {}", self.detail)
    }
}

/// What [`verify`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifyReport {
    /// The stream directory.
    pub dir: PathBuf,
    /// Segments checked.
    pub segments: usize,
    /// Valid records checked.
    pub records: u64,
    /// Bytes of segment files read.
    pub bytes: u64,
    /// Every problem, in directory order.
    pub problems: Vec<Problem>,
}

impl VerifyReport {
    /// No problem at all.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }

    /// Whether some problem makes `Log::open` refuse the log.
    pub fn prevents_open(&self) -> bool {
        self.problems.iter().any(|p| p.kind.prevents_open())
    }
}

impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.is_ok() {
            "OK"
        } else if self.prevents_open() {
            "CORRUPT"
        } else {
            "REPAIRABLE"
        };
        write!(
            f,
            "{verdict}: {}: {} segment(s), {} record(s), {} bytes checked, {} problem(s)",
            self.dir.display(),
            self.segments,
            self.records,
            self.bytes,
            self.problems.len()
        )?;
        for p in &self.problems {
            write!(f, "\n  {p}")?;
        }
        Ok(())
    }
}

/// Checks the checksum and structure of every record of every segment, the headers, the
/// contiguity of segments and the index files; reports every problem with path and byte offset
/// (after a bad record it resynchronises on the next valid record and goes on).
pub fn verify(dir: impl AsRef<Path>) -> Result<VerifyReport, ToolError> {
    verify_with_storage(&FsStorage, dir.as_ref())
}

/// [`verify`] on any [`Storage`].
pub fn verify_with_storage(storage: &dyn Storage, dir: &Path) -> Result<VerifyReport, ToolError> {
    verify_with_progress(storage, dir, &mut |_, _| {})
}

/// [`verify_with_storage`], calling `progress(segments_done, segments_total)` after each
/// segment (for a progress display on long logs).
pub fn verify_with_progress(
    storage: &dyn Storage,
    dir: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<VerifyReport, ToolError> {
    let listing = listing(storage, dir)?;
    let mut rep = VerifyReport {
        dir: dir.to_path_buf(),
        segments: 0,
        records: 0,
        bytes: 0,
        problems: Vec::new(),
    };
    let push = |rep: &mut VerifyReport, kind, path: &Path, byte_offset, detail: String| {
        rep.problems.push(Problem {
            kind,
            path: path.to_path_buf(),
            byte_offset,
            detail,
        })
    };
    for b in &listing.bad {
        match b {
            BadEntry::Unparseable(p) => push(
                &mut rep,
                ProblemKind::BadName,
                p,
                None,
                "name is not a 20-digit offset".into(),
            ),
            BadEntry::NotAFile(p) => push(
                &mut rep,
                ProblemKind::BadName,
                p,
                None,
                "not a regular file".into(),
            ),
        }
    }
    for p in &listing.temps {
        push(
            &mut rep,
            ProblemKind::Leftover,
            p,
            None,
            "leftover temporary file".into(),
        );
    }
    for p in listing.pending.values() {
        push(
            &mut rep,
            ProblemKind::Leftover,
            p,
            None,
            "segment not yet published (an interrupted asynchronous roll): opening the log adopts \
             it if the segment before it is complete, and removes it otherwise"
                .into(),
        );
    }
    for p in listing.orphans(dir) {
        push(
            &mut rep,
            ProblemKind::Leftover,
            &p,
            None,
            "index file without a segment".into(),
        );
    }
    let bases = listing.segment_bases();
    let mut prev_end: Option<u64> = None;
    for (i, &base) in bases.iter().enumerate() {
        let last = i + 1 == bases.len();
        let path = file_path(dir, base, FileKind::Segment);
        let (file, len, head) = open_segment(storage, &path)?;
        rep.segments += 1;
        rep.bytes += len;
        if let Some(end) = prev_end
            && end != base
        {
            push(
                &mut rep,
                ProblemKind::Gap,
                &path,
                None,
                format!("previous segment ends at offset {end}, this one starts at {base}"),
            );
        }
        if let Err(p) = check_header(&head, base) {
            let interrupted = last
                && is_interrupted_roll_file(&*file, len, base).map_err(|source| ToolError::Io {
                    path: path.clone(),
                    source,
                })?;
            if interrupted {
                push(
                    &mut rep,
                    ProblemKind::IncompleteSegment,
                    &path,
                    Some(0),
                    "interrupted roll: partial header or zeros only".into(),
                );
            } else {
                push(
                    &mut rep,
                    ProblemKind::BadHeader,
                    &path,
                    Some(0),
                    p.reason().into(),
                );
            }
            prev_end = None;
            continue;
        }
        let (mut pos, mut expected) = (HEADER_LEN, base);
        let mut recs = Vec::new();
        let mut clean = true;
        loop {
            let sc = scan(&*file, len, pos, expected, u32::MAX, &mut |fr| {
                recs.push((fr.pos, fr.timestamp_ms));
                true
            })
            .map_err(|source| ToolError::Io {
                path: path.clone(),
                source,
            })?;
            rep.records += sc.records;
            expected = sc.end;
            let Some(d) = sc.damage else { break };
            clean = false;
            let (kind, what) = match (d.resync, last) {
                (None, true) => (ProblemKind::TornTail, "torn tail, truncated on open"),
                (None, false) => (ProblemKind::Corrupt, "damaged end of a sealed segment"),
                (Some(_), _) => (ProblemKind::Corrupt, "valid records follow"),
            };
            push(
                &mut rep,
                kind,
                &path,
                Some(d.pos),
                format!(
                    "{} ({what}; {} bytes from here to the end)",
                    d.reason,
                    len - d.pos
                ),
            );
            let Some((rpos, roff)) = d.resync else { break };
            (pos, expected) = (rpos, roff);
        }
        prev_end = Some(expected);
        if !last {
            match index_status(storage, dir, base, len, clean.then_some(&recs[..])) {
                (IndexStatus::Valid | IndexStatus::Active, _) => {}
                (s, kind) => push(
                    &mut rep,
                    ProblemKind::BadIndex,
                    &file_path(dir, base, kind),
                    None,
                    format!("index {s}; rebuilt on open"),
                ),
            }
        }
        progress(i as u64 + 1, bases.len() as u64);
    }
    Ok(rep)
}
