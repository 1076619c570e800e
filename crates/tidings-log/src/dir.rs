//! Listing and classifying the files of a stream directory.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use crate::segment::{FileKind, NameKind, classify};
use crate::storage::Storage;

/// Which files exist for one base offset.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SegFiles {
    pub(crate) seg: bool,
    pub(crate) idx: bool,
    pub(crate) tix: bool,
}

/// An entry the log cannot accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BadEntry {
    /// Log extension, name not a 20-digit offset.
    Unparseable(PathBuf),
    /// A log name that is not a regular file.
    NotAFile(PathBuf),
}

/// The classified content of a stream directory.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    pub(crate) files: BTreeMap<u64, SegFiles>,
    pub(crate) temps: Vec<PathBuf>,
    /// Segments an asynchronous roll left unpublished (`<base>.seg.tmp`), by base offset.
    pub(crate) pending: BTreeMap<u64, PathBuf>,
    pub(crate) foreign: Vec<PathBuf>,
    pub(crate) bad: Vec<BadEntry>,
}

impl Listing {
    /// Base offsets that have a segment file, ascending.
    pub(crate) fn segment_bases(&self) -> Vec<u64> {
        self.files
            .iter()
            .filter(|(_, f)| f.seg)
            .map(|(&b, _)| b)
            .collect()
    }

    /// Index files whose segment does not exist.
    pub(crate) fn orphans(&self, dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for (&base, f) in self.files.iter().filter(|(_, f)| !f.seg) {
            if f.idx {
                out.push(crate::segment::file_path(dir, base, FileKind::OffsetIndex));
            }
            if f.tix {
                out.push(crate::segment::file_path(dir, base, FileKind::TimeIndex));
            }
        }
        out
    }
}

pub(crate) fn list(storage: &dyn Storage, dir: &Path) -> io::Result<Listing> {
    let mut out = Listing::default();
    let mut entries = storage.list_dir(dir)?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    for e in entries {
        let path = dir.join(&e.name);
        let kind = match e.name.to_str() {
            Some(name) => classify(name),
            None => NameKind::Foreign,
        };
        match kind {
            NameKind::Log(..)
            | NameKind::Unparseable
            | NameKind::Temp
            | NameKind::PendingSegment(_)
                if !e.is_file =>
            {
                out.bad.push(BadEntry::NotAFile(path));
            }
            NameKind::Log(kind, base) => {
                let f = out.files.entry(base).or_default();
                match kind {
                    FileKind::Segment => f.seg = true,
                    FileKind::OffsetIndex => f.idx = true,
                    FileKind::TimeIndex => f.tix = true,
                }
            }
            NameKind::Unparseable => out.bad.push(BadEntry::Unparseable(path)),
            NameKind::Temp => out.temps.push(path),
            NameKind::PendingSegment(base) => {
                out.pending.insert(base, path);
            }
            NameKind::Foreign => out.foreign.push(path),
            NameKind::Lock => {}
        }
    }
    Ok(out)
}
