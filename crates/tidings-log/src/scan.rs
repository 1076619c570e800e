//! Sequential scan of a segment file: validates every record, rebuilds the indexes, and on the
//! first damaged record searches the rest of the file for a valid record (the *resync* search)
//! that tells a torn tail from corruption in the middle.
//!
//! Memory is bounded whatever the file holds: the scan reads through one window of at most
//! [`WINDOW`] bytes; a record larger than that is checked by streaming it in [`CHUNK`]-byte
//! pieces (CRC) and reading only its fixed fields and header names (structure). The resync search
//! and the interrupted-roll check stream the same way.

use std::io;

use crate::config::MAX_RECORD_BYTES;
use crate::index::{IndexBuilder, SegmentIndex};
use crate::record::{
    FRAME_PREFIX, Frame, MIN_BODY, MIN_FRAME, check_body_streaming, check_frame,
    frame_crc_with_len, u32_at, u64_at,
};
use crate::segment::{HEADER_LEN, is_interrupted_roll};
use crate::storage::{StorageFile, read_exact_at};

/// Most bytes a scan holds in its read window (the resync search holds two windows).
pub(crate) const WINDOW: usize = 256 << 10;
/// Piece size when streaming a record larger than [`WINDOW`].
pub(crate) const CHUNK: usize = 64 << 10;

static ZEROS: [u8; WINDOW] = [0; WINDOW];

/// A good record seen by the scan.
pub(crate) struct ScannedFrame<'a> {
    pub(crate) offset: u64,
    pub(crate) timestamp_ms: u64,
    pub(crate) pos: u64,
    /// Frame length, prefix included.
    pub(crate) len: usize,
    /// The whole frame, when it fits in the scan's window (records up to [`WINDOW`] bytes);
    /// `None` for larger ones, which the scan checked by streaming.
    pub(crate) bytes: Option<&'a [u8]>,
}

/// Where a scan stopped before the end of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Damage {
    /// Byte position of the first bad record.
    pub(crate) pos: u64,
    /// What check failed.
    pub(crate) reason: &'static str,
    /// Position and offset of the first trustworthy valid record found after `pos`, if any (see
    /// [`resync`]). `None` means a torn tail.
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
        let reason = match check_at(&mut win, file, file_len, pos)? {
            Frame::Good {
                len,
                offset,
                timestamp_ms,
            } if offset == out.end => {
                let bytes = if len <= WINDOW {
                    Some(&win.get(file, file_len, pos, len)?[..len])
                } else {
                    None
                };
                if let Some(p) = out.builder.on_record(offset, pos, len as u64, timestamp_ms) {
                    p.apply(&mut out.index);
                }
                let more = visit(ScannedFrame {
                    offset,
                    timestamp_ms,
                    pos,
                    len,
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

/// Checks the frame at `pos` in bounded memory: through `win` when it fits in [`WINDOW`],
/// streamed otherwise.
fn check_at(
    win: &mut Window,
    file: &dyn StorageFile,
    file_len: u64,
    pos: u64,
) -> io::Result<Frame> {
    match check_frame(win.get(file, file_len, pos, FRAME_PREFIX)?) {
        Frame::Incomplete { need } if pos + need as u64 <= file_len => {
            if need <= WINDOW {
                Ok(check_frame(win.get(file, file_len, pos, need)?))
            } else {
                check_streaming(file, pos, need)
            }
        }
        f => Ok(f),
    }
}

/// Checks the complete frame of `len` bytes at `pos` without holding it in memory.
pub(crate) fn check_streaming(file: &dyn StorageFile, pos: u64, len: usize) -> io::Result<Frame> {
    let mut prefix = [0u8; FRAME_PREFIX];
    read_exact_at(file, &mut prefix, pos)?;
    let body = pos + FRAME_PREFIX as u64;
    let body_len = len - FRAME_PREFIX;
    let crc = crc_of(file, body, body_len as u64)?;
    if frame_crc_with_len(u32_at(&prefix, 0), crc, body_len) != u32_at(&prefix, 4) {
        return Ok(Frame::Bad("checksum mismatch"));
    }
    let mut read = |at: usize, buf: &mut [u8]| read_exact_at(file, buf, body + at as u64);
    if let Err(reason) = check_body_streaming(body_len, &mut read)? {
        return Ok(Frame::Bad(reason));
    }
    let mut fixed = [0u8; 16];
    read_exact_at(file, &mut fixed, body)?;
    Ok(Frame::Good {
        len,
        offset: u64_at(&fixed, 0),
        timestamp_ms: u64_at(&fixed, 8),
    })
}

/// CRC-32C of `len` bytes of `file` from `start`, streamed in [`CHUNK`]-byte pieces.
fn crc_of(file: &dyn StorageFile, start: u64, len: u64) -> io::Result<u32> {
    let mut crc = 0;
    let mut buf = vec![0; (len as usize).min(CHUNK)];
    let mut at = start;
    while at < start + len {
        let n = ((start + len - at) as usize).min(CHUNK);
        read_exact_at(file, &mut buf[..n], at)?;
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        at += n as u64;
    }
    Ok(crc)
}

/// Searches `(damaged, file_len)` for a valid record that proves the damage at `damaged` is in
/// the middle of the log rather than a torn tail. Returns its position and offset, or `None`.
///
/// A candidate is a complete, valid frame whose offset is at least `expected` (and not
/// impossibly far ahead). When the length prefix at `damaged` is readable and in range, the
/// damaged record *claims an extent* (`damaged .. damaged + 8 + body_len`); bytes inside it are
/// that record's payload — user data, which may well contain valid frames — so a candidate
/// inside the extent is trusted only with evidence that the length itself is what was damaged:
/// the candidate is the very next record (`expected + 1`) and the damaged record, read with the
/// length that would end it exactly there, passes its own CRC. Candidates at or after the extent
/// are trusted. Without a readable length every candidate after `damaged` is trusted.
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
    let mut prefix = [0u8; FRAME_PREFIX];
    read_exact_at(file, &mut prefix, damaged)?;
    let claimed = u32_at(&prefix, 0) as usize;
    let extent_end = if (MIN_BODY..=MAX_RECORD_BYTES as usize).contains(&claimed) {
        damaged + (FRAME_PREFIX + claimed) as u64
    } else {
        start
    };
    let stored_crc = u32_at(&prefix, 4);
    // Running CRC-32C of the damaged record's body bytes `damaged + 8 .. crc_pos`.
    let body = damaged + FRAME_PREFIX as u64;
    let (mut body_crc, mut crc_pos) = (0u32, body);
    let max_offset = expected.saturating_add((file_len - damaged) / MIN_FRAME as u64 + 1);
    let mut buf = vec![0; WINDOW.min((file_len - start) as usize)];
    let mut other = Window::default();
    let mut s = start;
    while s + MIN_FRAME as u64 <= file_len {
        let n = ((file_len - s) as usize).min(WINDOW);
        read_exact_at(file, &mut buf[..n], s)?;
        let step = n - MIN_FRAME + 1;
        // Zero bytes cannot start a frame (the length would be 0): skip zero-filled stretches.
        if buf[..n] != ZEROS[..n] {
            for i in 0..step {
                let body_len = u32_at(&buf, i) as usize;
                let q = s + i as u64;
                if !(MIN_BODY..=MAX_RECORD_BYTES as usize).contains(&body_len)
                    || q + (FRAME_PREFIX + body_len) as u64 > file_len
                {
                    continue;
                }
                let offset = u64_at(&buf, i + FRAME_PREFIX);
                if offset < expected || offset > max_offset {
                    continue;
                }
                let inside = q < extent_end;
                if inside && offset != expected + 1 {
                    continue;
                }
                if inside {
                    // Evidence first (amortised linear over the extent), so that payload bytes
                    // shaped like large frames cannot make the search quadratic.
                    if q < body + MIN_BODY as u64 {
                        continue;
                    }
                    let claimed_len = q - body;
                    body_crc = crc32c::crc32c_combine(
                        body_crc,
                        crc_of(file, crc_pos, q - crc_pos)?,
                        (q - crc_pos) as usize,
                    );
                    crc_pos = q;
                    let crc =
                        frame_crc_with_len(claimed_len as u32, body_crc, claimed_len as usize);
                    if crc != stored_crc {
                        continue;
                    }
                }
                let len = FRAME_PREFIX + body_len;
                let frame = if i + len <= n {
                    check_frame(&buf[i..i + len])
                } else {
                    check_at(&mut other, file, file_len, q)?
                };
                let Frame::Good { offset, .. } = frame else {
                    continue;
                };
                return Ok(Some((q, offset)));
            }
        }
        s += step as u64;
    }
    Ok(None)
}

/// Whether the last segment's whole content (`len` bytes) is what an interrupted roll leaves:
/// a prefix of its header, or only zeros. Streams the file: bounded memory for any length.
pub(crate) fn is_interrupted_roll_file(
    file: &dyn StorageFile,
    len: u64,
    base: u64,
) -> io::Result<bool> {
    if len < HEADER_LEN {
        let mut content = vec![0; len as usize];
        read_exact_at(file, &mut content, 0)?;
        return Ok(is_interrupted_roll(&content, base));
    }
    let mut buf = vec![0; (len as usize).min(WINDOW)];
    let mut at = 0;
    while at < len {
        let n = ((len - at) as usize).min(WINDOW);
        read_exact_at(file, &mut buf[..n], at)?;
        if buf[..n] != ZEROS[..n] {
            return Ok(false);
        }
        at += n as u64;
    }
    Ok(true)
}

/// A read window over a file, never larger than [`WINDOW`].
#[derive(Default)]
struct Window {
    buf: Vec<u8>,
    start: u64,
}

impl Window {
    /// Bytes from `pos` on, at least `need` (at most [`WINDOW`]) of them unless the file ends
    /// first.
    fn get(
        &mut self,
        file: &dyn StorageFile,
        file_len: u64,
        pos: u64,
        need: usize,
    ) -> io::Result<&[u8]> {
        debug_assert!(need <= WINDOW);
        let end = self.start + self.buf.len() as u64;
        let want_end = (pos + need as u64).min(file_len);
        if pos < self.start || want_end > end {
            let len = (WINDOW as u64).min(file_len - pos) as usize;
            self.buf.resize(len, 0);
            read_exact_at(file, &mut self.buf, pos)?;
            self.start = pos;
        }
        Ok(&self.buf[(pos - self.start) as usize..])
    }
}
