//! The read path: locate a segment, seek with the sparse index, validate every record read.
//!
//! Every record is checked (length, CRC-32C, body structure, and that its stored offset is the
//! one expected at that position). If the record at an indexed position does not carry the
//! indexed offset, the index is not trusted: the segment is re-read from its first record. Any
//! other failure is [`ReadError::Corrupt`] with the file, byte offset and record offset.
//!
//! A read returns the records before the first one that fails (a batch is never
//! all-or-nothing); it fails only when the first record asked for cannot be read.
//! [`next_readable`] finds where reading can go on after a damaged record: the resync search of
//! recovery ([`scan::resync`]) over the segment, or the next segment when a sealed one has no
//! trustworthy record after the damage. What it finds is kept as a *resync point* of the
//! segment, so later reads start past the damage instead of walking into it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::{Bytes, BytesMut};

use crate::error::{AppendError, ReadError};
use crate::log::Shared;
use crate::record::{
    self, FRAME_PREFIX, Frame, StoredRecord, check_frame, check_frame_crc_verified,
};
use crate::scan;
use crate::segment::{HEADER_LEN, Segment};
use crate::storage::read_exact_at;

const READ_CHUNK: u64 = 64 << 10;

/// Segments holding offsets `from..`, oldest first; empty when `from` precedes the first one.
pub(crate) fn segments_from(sh: &Shared, from: u64) -> Vec<Arc<Segment>> {
    let segs = sh.segments.read();
    let i = segs.partition_point(|s| s.base <= from);
    if i == 0 {
        Vec::new()
    } else {
        segs[i - 1..].to_vec()
    }
}

/// The visible end of the log, once `from` is checked to lie within what is kept and
/// visible: every read starts here (`Log::read`, `Log::next_readable`, a `LogReader`).
pub(crate) fn readable_end(sh: &Shared, from: u64) -> Result<u64, ReadError> {
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
    Ok(end)
}

pub(crate) fn read(sh: &Shared, from: u64, max: usize) -> Result<Vec<StoredRecord>, ReadError> {
    let end = readable_end(sh, from)?;
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
        if let Err(e) = read_segment(sh, &seg, next, until, max, &mut out) {
            // The records before the failure are good: hand them out. The next read starts
            // at the failed record and reports it.
            return if out.is_empty() { Err(e) } else { Ok(out) };
        }
        if out.len() >= max || until >= end {
            break;
        }
        next = until;
    }
    Ok(out)
}

/// The first offset at or after `from` that a read can start at (see [`crate::Log::next_readable`]).
pub(crate) fn next_readable(sh: &Shared, from: u64) -> Result<u64, ReadError> {
    let end = readable_end(sh, from)?;
    let Some(seg) = segments_from(sh, from).into_iter().next() else {
        return Err(ReadError::OutOfRetention {
            requested: from,
            earliest: sh.start.load(Ordering::Acquire),
        });
    };
    let until = seg.end().min(end);
    if from >= until {
        return Ok(from);
    }
    // A sealed segment is never written again: its end is final, and the next segment's
    // first record starts right after its header.
    let sealed = sh
        .segments
        .read()
        .last()
        .is_some_and(|last| !std::ptr::eq(Arc::as_ptr(last), Arc::as_ptr(&seg)))
        && seg.end() <= end;
    // Each turn either returns or adds a resync point past the damage it found, and the next
    // walk starts at that point or later: the loop ends within `from - base` turns.
    loop {
        let damage = match for_each_frame(sh, &seg, from, until, &mut |_| Ok(false)) {
            Ok(()) => return Ok(from),
            Err(e) => e,
        };
        let &ReadError::Corrupt {
            byte_offset,
            offset,
            ..
        } = &damage
        else {
            return Err(damage);
        };
        match resync_after(sh, &seg, byte_offset, offset, until)? {
            Some((pos, next)) => {
                seg.add_resync(next, pos);
                if next > from {
                    return Ok(next);
                }
            }
            None if sealed => return Ok(seg.end()),
            None => return Err(damage),
        }
    }
}

/// The first trustworthy record after the damaged record `bad` at byte `pos` of `seg`, as
/// `(byte position, offset)`, when it is visible (below `until`): the resync search of
/// recovery rule 5 ([`scan::resync`]), over the bytes the segment has on storage.
fn resync_after(
    sh: &Shared,
    seg: &Segment,
    pos: u64,
    bad: u64,
    until: u64,
) -> Result<Option<(u64, u64)>, ReadError> {
    flush_for_read(sh, seg)?;
    let file_len = seg.flushed.load(Ordering::Acquire);
    let found = scan::resync(&*seg.file, file_len, pos, bad).map_err(|source| ReadError::Io {
        path: seg.path.clone(),
        source,
    })?;
    Ok(found.filter(|&(_, next)| next > bad && next < until))
}

/// Decodes the records of `seg` with offsets in `from..until` into `out` until it holds `max`.
///
/// The loop of [`Cursor::peek`] and [`Cursor::accept`], kept specialised here (a `for` over
/// each run, the decode inlined): written as calls of the cursor it took 8% more instructions
/// per record (callgrind, `tidings-bench --quick log/read/batches`). Each frame is checked and
/// decoded in one walk over its body ([`record::decode_into`] checks the whole structure); key
/// and payload are slices of the chunk (no copy).
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
        let frames = chunk.next_run(sh, seg, walk.pos, walk.off, until - walk.off)?;
        for &(at, len) in &frames.frames[..frames.n] {
            let (pos, off) = (walk.pos, walk.off);
            let frame = &chunk.bytes[at..at + len];
            if !walk.in_sequence(seg, record::stored_offset(frame))? {
                break;
            }
            if walk.off >= from {
                record::decode_into(&chunk.bytes, at, len, out)
                    .map_err(|r| corrupt(seg, pos, off, r))?;
                if out.len() >= max {
                    return Ok(());
                }
            } else if let Frame::Bad(reason) = check_frame_crc_verified(frame) {
                return Err(corrupt(seg, pos, off, reason));
            }
            walk.advance(len);
        }
    }
    Ok(())
}

/// A walk over one segment's frames, for the lending reader and the time lookups
/// ([`read_segment`] is the same loop, specialised): where it stands ([`Walk`]), the chunk it
/// reads from, and the run of frames of that chunk already checksummed (three at a time,
/// [`Chunk::verified_run`]). A frame the run stops at (not complete in the chunk, or a failed
/// checksum) goes through [`Chunk::frame`], which reads more or says what is wrong.
#[derive(Default)]
pub(crate) struct Cursor {
    walk: Walk,
    chunk: Chunk,
    run: Run,
    /// Frames of `run` already passed.
    done: usize,
}

impl Cursor {
    /// A cursor over `seg` positioned at the indexed frame or resync point at or before
    /// `from` (see [`Walk::start`]).
    pub(crate) fn start(seg: &Segment, from: u64) -> Self {
        Self {
            walk: Walk::start(seg, from),
            ..Self::default()
        }
    }

    /// The offset of the frame the cursor stands at.
    pub(crate) fn offset(&self) -> u64 {
        self.walk.off
    }

    /// The next frame with an offset in `from..until`, as `(position in the chunk, length)`:
    /// complete, checksummed and carrying the offset expected; its structure is the caller's
    /// to check, with [`Cursor::accept`]. The frames before `from` (after an index seek) are
    /// checked whole and passed. `None` at `until`; `Corrupt` at a frame that fails a check,
    /// and again at every call until the cursor is dropped.
    #[inline]
    pub(crate) fn peek(
        &mut self,
        sh: &Shared,
        seg: &Segment,
        from: u64,
        until: u64,
    ) -> Result<Option<(usize, usize)>, ReadError> {
        loop {
            if self.walk.off >= until {
                return Ok(None);
            }
            if self.done == self.run.n {
                self.run = self.chunk.next_run(
                    sh,
                    seg,
                    self.walk.pos,
                    self.walk.off,
                    until - self.walk.off,
                )?;
                self.done = 0;
            }
            let (at, len) = self.run.frames[self.done];
            let frame = &self.chunk.bytes[at..at + len];
            if !self.walk.in_sequence(seg, record::stored_offset(frame))? {
                // The index misled the walk, which starts over from the segment's start.
                self.run = Run::default();
                self.done = 0;
                continue;
            }
            if self.walk.off >= from {
                return Ok(Some((at, len)));
            }
            if let Frame::Bad(reason) = check_frame_crc_verified(frame) {
                return Err(self.corrupt(seg, reason));
            }
            self.walk.advance(len);
            self.done += 1;
        }
    }

    /// Checks the frame [`Cursor::peek`] returned with `check` (given the chunk; the frame is
    /// `chunk[at..at + len]`) and moves past it when the check passes; `Corrupt` for it
    /// otherwise (and the cursor stays at it). What `check` returns may borrow the chunk.
    #[inline]
    pub(crate) fn accept<'c, T>(
        &'c mut self,
        seg: &Segment,
        (_, len): (usize, usize),
        check: impl FnOnce(&'c Bytes) -> Result<T, &'static str>,
    ) -> Result<T, ReadError> {
        match check(&self.chunk.bytes) {
            Ok(t) => {
                // Fields, not `pass`: `t` may borrow the chunk.
                self.walk.advance(len);
                self.done += 1;
                Ok(t)
            }
            Err(reason) => Err(corrupt(seg, self.walk.pos, self.walk.off, reason)),
        }
    }

    fn corrupt(&self, seg: &Segment, reason: &'static str) -> ReadError {
        corrupt(seg, self.walk.pos, self.walk.off, reason)
    }
}

/// Where a walk over a segment's frames stands: the offset and byte position expected next,
/// and whether they still come from the sparse index or a resync point (a checked cache: when
/// the frame found there is not the one expected, the walk starts over from the segment's
/// first frame).
#[derive(Default)]
struct Walk {
    off: u64,
    pos: u64,
    trust_index: bool,
}

impl Walk {
    /// Starts at the indexed frame or resync point at or before `from`, whichever is later.
    fn start(seg: &Segment, from: u64) -> Self {
        let indexed = seg.index.read().floor(seg.base, from);
        let resynced = seg.resync_floor(from);
        let (off, pos) = resynced.filter(|r| r.0 > indexed.0).unwrap_or(indexed);
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
        Err(corrupt(
            seg,
            self.pos,
            self.off,
            "record offset out of sequence",
        ))
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

fn corrupt(seg: &Segment, pos: u64, offset: u64, reason: &'static str) -> ReadError {
    ReadError::Corrupt {
        path: seg.path.clone(),
        byte_offset: pos,
        offset,
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
    let mut cursor = Cursor::start(seg, from);
    while let Some(frame @ (at, len)) = cursor.peek(sh, seg, from, until)? {
        let offset = cursor.offset();
        let timestamp_ms = cursor.accept(seg, frame, |chunk| {
            match check_frame_crc_verified(&chunk[at..at + len]) {
                Frame::Good { timestamp_ms, .. } => Ok(timestamp_ms),
                Frame::Bad(reason) => Err(reason),
                // The cursor's frames are complete.
                Frame::Incomplete { .. } => Err("incomplete record"),
            }
        })?;
        if !f(FrameRef {
            offset,
            timestamp_ms,
        })? {
            return Ok(());
        }
    }
    Ok(())
}

/// Chunk buffers of recent reads, with where they were read from. Records are slices of the
/// chunk they were read into (no copy per record), so a chunk can be reused only once every
/// record read from it is dropped: `take` reuses the first such chunk (no zeroing, no fresh
/// pages), and allocates otherwise. Holds at most [`POOL_CHUNKS`] handles; a chunk still in
/// use when pushed out is simply freed later by its last record.
///
/// A read that starts where an earlier one stopped finds the rest of that read's last chunk
/// here ([`ChunkPool::covering`]) instead of reading those bytes again: a batch rarely ends at
/// a chunk's end, so without this every sequential batch re-read half a chunk on average.
/// That is safe because a segment's bytes below its flushed end never change while the log is
/// open (appends only write past it, and only `open` truncates), and no two segments of one
/// log share a base offset.
#[derive(Debug, Default)]
pub(crate) struct ChunkPool(parking_lot::Mutex<Vec<Cached>>);

#[derive(Debug)]
struct Cached {
    /// Base offset of the segment the bytes were read from.
    base: u64,
    /// File position of `bytes[0]`.
    start: u64,
    bytes: Bytes,
}

const POOL_CHUNKS: usize = 8;

impl ChunkPool {
    /// A buffer of exactly `len` bytes (contents unspecified).
    fn take(&self, len: usize) -> BytesMut {
        let mut pool = self.0.lock();
        let mut i = 0;
        while i < pool.len() {
            if pool[i].bytes.len() >= len && pool[i].bytes.is_unique() {
                let b = pool.swap_remove(i).bytes;
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

    /// Remembers `bytes`, read from segment `base` at `start`, for reuse once its records are
    /// gone and for later reads of the same bytes (only full-size chunks).
    fn give(&self, base: u64, start: u64, bytes: &Bytes) {
        if bytes.len() != READ_CHUNK as usize {
            return;
        }
        let mut pool = self.0.lock();
        if pool.len() >= POOL_CHUNKS {
            pool.remove(0);
        }
        pool.push(Cached {
            base,
            start,
            bytes: bytes.clone(),
        });
    }

    /// A chunk read earlier from segment `base` that holds `pos..pos + need`, with its start.
    fn covering(&self, base: u64, pos: u64, need: u64) -> Option<(u64, Bytes)> {
        let pool = self.0.lock();
        pool.iter()
            .rev()
            .find(|c| {
                c.base == base && c.start <= pos && pos + need <= c.start + c.bytes.len() as u64
            })
            .map(|c| (c.start, c.bytes.clone()))
    }
}

#[derive(Default)]
struct Chunk {
    bytes: Bytes,
    /// File position of `bytes[0]`.
    start: u64,
}

/// Up to three frames of a chunk, `(position in the chunk, length)`, in file order.
#[derive(Default)]
struct Run {
    frames: [(usize, usize); 3],
    n: usize,
}

impl Run {
    fn one(at: usize, len: usize) -> Self {
        Self {
            frames: [(at, len), (0, 0), (0, 0)],
            n: 1,
        }
    }

    fn is_empty(&self) -> bool {
        self.n == 0
    }
}

impl Chunk {
    fn covers(&self, pos: u64, need: u64) -> bool {
        pos >= self.start && pos + need <= self.start + self.bytes.len() as u64
    }

    /// The frames at `pos` and after it (at most three, at most `limit`) that are complete in
    /// this chunk and pass their checksum, which is computed for the three together (see
    /// [`crate::crc`]). Stops before the first that is incomplete or fails: empty when that is
    /// the first, or when the chunk does not hold `pos`. The structure is left to the caller.
    fn verified_run(&self, pos: u64, limit: u64) -> Run {
        let mut run = Run::default();
        if !self.covers(pos, 0) {
            return run;
        }
        let b = &self.bytes[..];
        let mut at = (pos - self.start) as usize;
        let mut parts = [([0u8; 4], &[][..]); 3];
        let mut stored = [0u32; 3];
        let mut n = 0;
        while n < 3 && (n as u64) < limit {
            let Some(len) = record::complete_frame_len(&b[at..]) else {
                break;
            };
            let frame = &b[at..at + len];
            parts[n] = (
                [frame[0], frame[1], frame[2], frame[3]],
                &frame[FRAME_PREFIX..],
            );
            stored[n] = record::u32_at(frame, 4);
            run.frames[n] = (at, len);
            at += len;
            n += 1;
        }
        if n == 0 {
            return run;
        }
        let crcs = crate::crc::frame_crc3(parts);
        run.n = (0..n).take_while(|&i| crcs[i] == stored[i]).count();
        run
    }

    /// The checked frames from `pos` on (at most three, at most `limit`): the
    /// [`verified_run`](Self::verified_run) already in the chunk, or else the one frame at
    /// `pos` (the record `off`), read into the chunk if needed and fully checked; `Corrupt`
    /// when that frame is incomplete or fails a check.
    fn next_run(
        &mut self,
        sh: &Shared,
        seg: &Segment,
        pos: u64,
        off: u64,
        limit: u64,
    ) -> Result<Run, ReadError> {
        let run = self.verified_run(pos, limit);
        if !run.is_empty() {
            return Ok(run);
        }
        let len = self.checked_len(sh, seg, pos, off)?;
        Ok(Run::one((pos - self.start) as usize, len))
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
        if let Some((start, bytes)) = sh.chunks.covering(seg.base, pos, need) {
            (self.start, self.bytes) = (start, bytes);
            return Ok(true);
        }
        let len = need.max(READ_CHUNK.min(flushed - pos)) as usize;
        let mut buf = sh.chunks.take(len);
        read_exact_at(&*seg.file, &mut buf, pos).map_err(|source| ReadError::Io {
            path: seg.path.clone(),
            source,
        })?;
        self.bytes = buf.freeze();
        sh.chunks.give(seg.base, pos, &self.bytes);
        self.start = pos;
        Ok(true)
    }

    /// The length of the complete frame at `pos`, read into the chunk if needed, with its
    /// checksum verified (the structure is left to the caller); `Corrupt` when it is
    /// incomplete or fails a check.
    fn checked_len(
        &mut self,
        sh: &Shared,
        seg: &Segment,
        pos: u64,
        off: u64,
    ) -> Result<usize, ReadError> {
        match self.frame(sh, seg, pos)? {
            Frame::Good { len, .. } => Ok(len),
            Frame::Bad(reason) => Err(corrupt(seg, pos, off, reason)),
            Frame::Incomplete { .. } => past_segment_end(seg, pos, off),
        }
    }

    /// The fully checked frame at `pos`, reading it into the chunk first if needed.
    fn frame(&mut self, sh: &Shared, seg: &Segment, pos: u64) -> Result<Frame, ReadError> {
        if !self.fill(sh, seg, pos, FRAME_PREFIX as u64)? {
            return Ok(Frame::Incomplete { need: FRAME_PREFIX });
        }
        let at = (pos - self.start) as usize;
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

/// A frame below the visible end that does not fit in its segment's written bytes.
fn past_segment_end<T>(seg: &Segment, pos: u64, off: u64) -> Result<T, ReadError> {
    Err(corrupt(
        seg,
        pos,
        off,
        "record extends past the end of the segment",
    ))
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
