//! The read path: locate a segment, seek with the sparse index, validate every record read.
//!
//! Every record is checked (length, CRC-32C, body structure, and that its stored offset is the
//! one expected at that position). If the record at an indexed position does not carry the
//! indexed offset, the index is not trusted: the segment is re-read from its first record. Any
//! other failure is [`ReadError::Corrupt`] with the file and byte offset.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::{Bytes, BytesMut};

use crate::error::{AppendError, ReadError};
use crate::log::Shared;
use crate::record::{
    self, FRAME_PREFIX, Frame, StoredRecord, check_frame, check_frame_crc_verified,
};
use crate::segment::{HEADER_LEN, Segment};
use crate::storage::read_exact_at;

const READ_CHUNK: u64 = 64 << 10;

/// Segments holding offsets `from..`, oldest first; empty when `from` precedes the first one.
fn segments_from(sh: &Shared, from: u64) -> Vec<Arc<Segment>> {
    let segs = sh.segments.read();
    let i = segs.partition_point(|s| s.base <= from);
    if i == 0 {
        Vec::new()
    } else {
        segs[i - 1..].to_vec()
    }
}

pub(crate) fn read(sh: &Shared, from: u64, max: usize) -> Result<Vec<StoredRecord>, ReadError> {
    let earliest = sh.start.load(Ordering::Acquire);
    if from < earliest {
        return Err(ReadError::OutOfRetention {
            requested: from,
            earliest,
        });
    }
    let end = sh.visible.load(Ordering::SeqCst);
    if from > end {
        return Err(ReadError::BeyondEnd {
            requested: from,
            end,
        });
    }
    let mut out = Vec::new();
    if from == end || max == 0 {
        return Ok(out);
    }
    let segs = segments_from(sh, from);
    if segs.is_empty() {
        let earliest = sh.start.load(Ordering::Acquire);
        return Err(ReadError::OutOfRetention {
            requested: from,
            earliest,
        });
    }
    out.reserve(max.min((end - from) as usize).min(1024));
    let mut next = from;
    for seg in segs {
        let until = seg.end().min(end);
        if next >= until {
            continue;
        }
        read_segment(sh, &seg, next, until, max, &mut out)?;
        if out.len() >= max || until >= end {
            break;
        }
        next = until;
    }
    Ok(out)
}

/// Decodes the records of `seg` with offsets in `from..until` into `out` until it holds `max`.
///
/// The read loop of [`for_each_frame`], specialised: each record is checked and decoded in one
/// walk over its body ([`record::decode_at`] checks the whole structure; the checksum was
/// verified three frames at a time by [`Chunk::verified_len`]), and key and payload are slices
/// of the chunk (no copy).
fn read_segment(
    sh: &Shared,
    seg: &Segment,
    from: u64,
    until: u64,
    max: usize,
    out: &mut Vec<StoredRecord>,
) -> Result<(), ReadError> {
    let mut walk = Walk::start(seg, from);
    let mut chunk = Chunk::default();
    while walk.off < until {
        let pos = walk.pos;
        let len = chunk.verified_len(sh, seg, pos)?;
        let at = (pos - chunk.start) as usize;
        let rec = record::decode_at(&chunk.bytes, at, len).map_err(|r| corrupt(seg, pos, r))?;
        if !walk.in_sequence(seg, rec.offset)? {
            continue;
        }
        if walk.off >= from {
            out.push(rec);
            if out.len() >= max {
                return Ok(());
            }
        }
        walk.advance(len);
    }
    Ok(())
}

/// Where a walk over a segment's frames stands: the offset and byte position expected next,
/// and whether they still come from the sparse index (a checked cache: when the frame found
/// there is not the one expected, the walk starts over from the segment's first frame).
struct Walk {
    off: u64,
    pos: u64,
    trust_index: bool,
}

impl Walk {
    /// Starts at the indexed frame at or before `from`.
    fn start(seg: &Segment, from: u64) -> Self {
        let (off, pos) = seg.index.read().floor(seg.base, from);
        Self {
            off,
            pos,
            trust_index: pos != HEADER_LEN,
        }
    }

    /// Checks the offset stored in the frame at `self.pos`: `Ok(true)` when it is the one
    /// expected; `Ok(false)` when the index misled the walk, which now restarts from the
    /// segment's first frame; `Corrupt` when the frames themselves are out of sequence.
    fn in_sequence(&mut self, seg: &Segment, stored: u64) -> Result<bool, ReadError> {
        if stored == self.off {
            self.trust_index = false;
            return Ok(true);
        }
        if std::mem::take(&mut self.trust_index) {
            (self.off, self.pos) = (seg.base, HEADER_LEN);
            return Ok(false);
        }
        Err(corrupt(seg, self.pos, "record offset out of sequence"))
    }

    /// Moves past the frame just checked, `len` bytes long.
    fn advance(&mut self, len: usize) {
        self.pos += len as u64;
        self.off += 1;
    }
}

pub(crate) fn offset_for_time(sh: &Shared, t: u64) -> Result<u64, ReadError> {
    let end = sh.visible.load(Ordering::SeqCst);
    let segs: Vec<Arc<Segment>> = sh.segments.read().clone();
    for seg in segs {
        if seg.base >= end {
            break;
        }
        if seg.max_ts().is_none_or(|m| m < t) {
            continue;
        }
        let from = seg.index.read().time_floor(seg.base, t);
        let until = seg.end().min(end);
        let mut found = None;
        for_each_frame(sh, &seg, from, until, &mut |frame| {
            if frame.timestamp_ms >= t {
                found = Some(frame.offset);
                return Ok(false);
            }
            Ok(true)
        })?;
        if let Some(o) = found {
            return Ok(o);
        }
    }
    Ok(end)
}

/// A checked frame: what a scan by time needs of it.
pub(crate) struct FrameRef {
    pub(crate) offset: u64,
    pub(crate) timestamp_ms: u64,
}

fn corrupt(seg: &Segment, pos: u64, reason: &'static str) -> ReadError {
    ReadError::Corrupt {
        path: seg.path.clone(),
        byte_offset: pos,
        reason,
    }
}

/// Calls `f` for every record of `seg` with offset in `from..until` until it returns `false`.
pub(crate) fn for_each_frame(
    sh: &Shared,
    seg: &Segment,
    from: u64,
    until: u64,
    f: &mut dyn FnMut(FrameRef) -> Result<bool, ReadError>,
) -> Result<(), ReadError> {
    let mut walk = Walk::start(seg, from);
    let mut chunk = Chunk::default();
    while walk.off < until {
        let pos = walk.pos;
        let (len, stored, ts) = match chunk.frame(sh, seg, pos)? {
            Frame::Good {
                len,
                offset,
                timestamp_ms,
            } => (len, offset, timestamp_ms),
            Frame::Bad(reason) => return Err(corrupt(seg, pos, reason)),
            Frame::Incomplete { .. } => {
                return Err(corrupt(
                    seg,
                    pos,
                    "record extends past the end of the segment",
                ));
            }
        };
        if !walk.in_sequence(seg, stored)? {
            continue;
        }
        if walk.off >= from
            && !f(FrameRef {
                offset: walk.off,
                timestamp_ms: ts,
            })?
        {
            return Ok(());
        }
        walk.advance(len);
    }
    Ok(())
}

/// Chunk buffers of recent reads. Records are slices of the chunk they were read into (no copy
/// per record), so a chunk can be reused only once every record read from it is dropped: `take`
/// reuses the first such chunk (no zeroing, no fresh pages), and allocates otherwise. Holds at
/// most [`POOL_CHUNKS`] handles; a chunk still in use when pushed out is simply freed later by
/// its last record.
#[derive(Debug, Default)]
pub(crate) struct ChunkPool(parking_lot::Mutex<Vec<Bytes>>);

const POOL_CHUNKS: usize = 8;

impl ChunkPool {
    /// A buffer of exactly `len` bytes (contents unspecified).
    fn take(&self, len: usize) -> BytesMut {
        let mut pool = self.0.lock();
        let mut i = 0;
        while i < pool.len() {
            if pool[i].len() >= len && pool[i].is_unique() {
                let b = pool.swap_remove(i);
                if let Ok(mut m) = b.try_into_mut() {
                    m.truncate(len);
                    return m;
                }
            } else {
                i += 1;
            }
        }
        drop(pool);
        BytesMut::zeroed(len)
    }

    /// Remembers `chunk` for reuse once its records are gone (only full-size chunks).
    fn give(&self, chunk: &Bytes) {
        if chunk.len() != READ_CHUNK as usize {
            return;
        }
        let mut pool = self.0.lock();
        if pool.len() >= POOL_CHUNKS {
            pool.remove(0);
        }
        pool.push(chunk.clone());
    }
}

#[derive(Default)]
struct Chunk {
    bytes: Bytes,
    start: u64,
    /// Positions (in the file) of frames of `bytes` whose checksum was verified ahead, three at
    /// a time (see [`crate::crc`]); `NOT_VERIFIED` in unused slots.
    verified: [u64; 3],
}

const NOT_VERIFIED: u64 = u64::MAX;

impl Chunk {
    fn covers(&self, pos: u64, need: u64) -> bool {
        pos >= self.start && pos + need <= self.start + self.bytes.len() as u64
    }

    /// Makes `pos..pos + need` available, flushing the writer if those bytes are still buffered.
    fn fill(&mut self, sh: &Shared, seg: &Segment, pos: u64, need: u64) -> Result<bool, ReadError> {
        if self.covers(pos, need) {
            return Ok(true);
        }
        let mut flushed = seg.flushed.load(Ordering::Acquire);
        if pos + need > flushed && pos + need <= seg.size() {
            flush_for_read(sh, seg)?;
            flushed = seg.flushed.load(Ordering::Acquire);
        }
        if pos + need > flushed {
            return Ok(false);
        }
        let len = need.max(READ_CHUNK.min(flushed - pos)) as usize;
        let mut buf = sh.chunks.take(len);
        read_exact_at(&*seg.file, &mut buf, pos).map_err(|source| ReadError::Io {
            path: seg.path.clone(),
            source,
        })?;
        self.bytes = buf.freeze();
        sh.chunks.give(&self.bytes);
        self.start = pos;
        self.verified = [NOT_VERIFIED; 3];
        Ok(true)
    }

    /// The length of the complete frame at `pos`, with its checksum verified (the structure is
    /// left to the decoder); `Corrupt` when it is incomplete or fails a check.
    fn verified_len(&mut self, sh: &Shared, seg: &Segment, pos: u64) -> Result<usize, ReadError> {
        if self.covers(pos, FRAME_PREFIX as u64) {
            let at = (pos - self.start) as usize;
            if let Some(len) = record::complete_frame_len(&self.bytes[at..])
                && (self.verified.contains(&pos) || self.verify_ahead(at))
            {
                return Ok(len);
            }
        }
        match self.frame(sh, seg, pos)? {
            Frame::Good { len, .. } => Ok(len),
            Frame::Bad(reason) => Err(corrupt(seg, pos, reason)),
            Frame::Incomplete { .. } => Err(corrupt(
                seg,
                pos,
                "record extends past the end of the segment",
            )),
        }
    }

    fn frame(&mut self, sh: &Shared, seg: &Segment, pos: u64) -> Result<Frame, ReadError> {
        if !self.fill(sh, seg, pos, FRAME_PREFIX as u64)? {
            return Ok(Frame::Incomplete { need: FRAME_PREFIX });
        }
        let at = (pos - self.start) as usize;
        if self.verified.contains(&pos) {
            return Ok(check_frame_crc_verified(&self.bytes[at..]));
        }
        if self.verify_ahead(at) {
            return Ok(check_frame_crc_verified(&self.bytes[at..]));
        }
        match check_frame(&self.bytes[at..]) {
            Frame::Incomplete { need } if need > FRAME_PREFIX => {
                if !self.fill(sh, seg, pos, need as u64)? {
                    return Ok(Frame::Incomplete { need });
                }
                let at = (pos - self.start) as usize;
                Ok(check_frame(&self.bytes[at..]))
            }
            f => Ok(f),
        }
    }
}

impl Chunk {
    /// Checksums the frame at `bytes[at..]` and the two after it, if complete in this chunk,
    /// together; remembers which passed. Returns whether the first did (when not, the full
    /// check runs and says why).
    fn verify_ahead(&mut self, at: usize) -> bool {
        let b = &self.bytes[..];
        let rest = |from: Option<usize>| from.map_or(&[][..], |f| &b[f..]);
        let len0 = record::complete_frame_len(&b[at..]);
        let at1 = len0.map(|l| at + l);
        let len1 = at1.and_then(|a| record::complete_frame_len(&b[a..]));
        let at2 = at1.zip(len1).map(|(a, l)| a + l);
        let ok = record::crc3_ahead([rest(Some(at)), rest(at1), rest(at2)]);
        let to_pos = |a: Option<usize>, ok: bool| match a {
            Some(a) if ok => self.start + a as u64,
            _ => NOT_VERIFIED,
        };
        self.verified = [
            to_pos(Some(at), ok[0]),
            to_pos(at1, ok[1]),
            to_pos(at2, ok[2]),
        ];
        ok[0]
    }
}

fn flush_for_read(sh: &Shared, seg: &Segment) -> Result<(), ReadError> {
    let mut w = sh.writer.lock();
    if !std::ptr::eq(Arc::as_ptr(&w.active), seg) {
        return Ok(());
    }
    w.flush(sh).map_err(|e| match e {
        AppendError::Io { path, source } => ReadError::Io { path, source },
        _ => ReadError::Poisoned,
    })
}
