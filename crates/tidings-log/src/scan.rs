//! Sequential scan of a segment file: validates every record, rebuilds the indexes, and on the
//! first damaged record searches the rest of the file for a valid record (the *resync* search)
//! that tells a torn tail from corruption in the middle.

use std::io;

use crate::index::{IndexBuilder, SegmentIndex};
use crate::record::{FRAME_PREFIX, Frame, MIN_BODY, MIN_FRAME, check_frame, u32_at, u64_at};
use crate::storage::{StorageFile, read_exact_at};

const WINDOW: usize = 256 << 10;

/// A good record seen by the scan.
pub(crate) struct ScannedFrame<'a> {
    pub(crate) offset: u64,
    pub(crate) timestamp_ms: u64,
    pub(crate) pos: u64,
    pub(crate) bytes: &'a [u8],
}

/// Where a scan stopped before the end of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Damage {
    /// Byte position of the first bad record.
    pub(crate) pos: u64,
    /// What check failed.
    pub(crate) reason: &'static str,
    /// Position and offset of the first valid record found after `pos`, if any. `None` means
    /// nothing after the damage parses as a record: a torn tail.
    pub(crate) resync: Option<(u64, u64)>,
}

/// Result of a scan.
#[derive(Debug, Clone)]
pub(crate) struct ScanOutcome {
    /// Offset after the last good record.
    pub(crate) end: u64,
    /// Byte position after the last good record.
    pub(crate) valid_len: u64,
    pub(crate) records: u64,
    pub(crate) min_ts: Option<u64>,
    pub(crate) max_ts: Option<u64>,
    pub(crate) index: SegmentIndex,
    pub(crate) builder: IndexBuilder,
    pub(crate) damage: Option<Damage>,
}

/// Scans `file` (of length `file_len`) from byte `pos`, where a record with offset `expected`
/// should start, to the end of the file, the first damaged record, or until `visit` returns
/// `false`.
pub(crate) fn scan(
    file: &dyn StorageFile,
    file_len: u64,
    mut pos: u64,
    expected: u64,
    index_interval: u32,
    visit: &mut dyn FnMut(ScannedFrame<'_>) -> bool,
) -> io::Result<ScanOutcome> {
    let mut out = ScanOutcome {
        end: expected,
        valid_len: pos,
        records: 0,
        min_ts: None,
        max_ts: None,
        index: SegmentIndex::default(),
        builder: IndexBuilder::new(index_interval),
        damage: None,
    };
    let mut win = Window::default();
    while pos < file_len {
        let avail = win.get(file, file_len, pos, FRAME_PREFIX)?;
        let frame = match check_frame(avail) {
            Frame::Incomplete { need } if pos + need as u64 <= file_len => {
                check_frame(win.get(file, file_len, pos, need)?)
            }
            f => f,
        };
        let reason = match frame {
            Frame::Good {
                len,
                offset,
                timestamp_ms,
            } if offset == out.end => {
                let bytes = &win.get(file, file_len, pos, len)?[..len];
                if let Some(p) = out.builder.on_record(offset, pos, len as u64, timestamp_ms) {
                    p.apply(&mut out.index);
                }
                let more = visit(ScannedFrame {
                    offset,
                    timestamp_ms,
                    pos,
                    bytes,
                });
                out.records += 1;
                out.min_ts = Some(out.min_ts.map_or(timestamp_ms, |m| m.min(timestamp_ms)));
                out.max_ts = Some(out.max_ts.map_or(timestamp_ms, |m| m.max(timestamp_ms)));
                out.end += 1;
                pos += len as u64;
                out.valid_len = pos;
                if !more {
                    break;
                }
                continue;
            }
            Frame::Good { .. } => "record offset out of sequence",
            Frame::Incomplete { .. } => "incomplete record at end of file",
            Frame::Bad(reason) => reason,
        };
        let resync = resync(file, file_len, pos, out.end)?;
        out.damage = Some(Damage {
            pos,
            reason,
            resync,
        });
        break;
    }
    Ok(out)
}

/// Searches `(damaged, file_len)` byte by byte for a valid record whose offset is at least
/// `expected` (and not impossibly far ahead).
pub(crate) fn resync(
    file: &dyn StorageFile,
    file_len: u64,
    damaged: u64,
    expected: u64,
) -> io::Result<Option<(u64, u64)>> {
    let start = damaged + 1;
    if start + MIN_FRAME as u64 > file_len {
        return Ok(None);
    }
    let mut rest = vec![0; (file_len - start) as usize];
    read_exact_at(file, &mut rest, start)?;
    let max_offset = expected.saturating_add((file_len - damaged) / MIN_FRAME as u64 + 1);
    for q in 0..=rest.len() - MIN_FRAME {
        let body_len = u32_at(&rest, q) as usize;
        if body_len < MIN_BODY || q + FRAME_PREFIX + body_len > rest.len() {
            continue;
        }
        let offset = u64_at(&rest, q + FRAME_PREFIX);
        if offset < expected || offset > max_offset {
            continue;
        }
        if let Frame::Good { offset, .. } = check_frame(&rest[q..]) {
            return Ok(Some((start + q as u64, offset)));
        }
    }
    Ok(None)
}

/// A read window over a file.
#[derive(Default)]
struct Window {
    buf: Vec<u8>,
    start: u64,
}

impl Window {
    /// Bytes from `pos` on, at least `need` of them unless the file ends first.
    fn get(
        &mut self,
        file: &dyn StorageFile,
        file_len: u64,
        pos: u64,
        need: usize,
    ) -> io::Result<&[u8]> {
        let end = self.start + self.buf.len() as u64;
        let want_end = (pos + need as u64).min(file_len);
        if pos < self.start || want_end > end {
            let len = (need.max(WINDOW) as u64).min(file_len - pos) as usize;
            self.buf.resize(len, 0);
            read_exact_at(file, &mut self.buf, pos)?;
            self.start = pos;
        }
        Ok(&self.buf[(pos - self.start) as usize..])
    }
}
