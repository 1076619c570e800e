//! [`LogReader`]: a lending reader. Each record it hands out borrows its read buffer
//! ([`RecordRef`]) until the next call, so reading costs no reference count, allocation or
//! copy per record; the checks are those of [`Log::read`](crate::Log::read), through the same
//! segment walk (`reader::Cursor`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::error::ReadError;
use crate::log::Shared;
use crate::reader::{Cursor, readable_end, segments_from};
use crate::record_ref::RecordRef;
use crate::segment::Segment;

/// Reads records in offset order from a position, lending each one ([`RecordRef`]) until the
/// next call: no reference count, allocation or copy per record. Made by
/// [`Log::reader`](crate::Log::reader).
///
/// # Ordering
///
/// [`LogReader::next`] returns the records from the start position on, each once, in offset
/// order, across segments. At the end of the visible log it returns `Ok(None)`; a later call
/// returns the records appended since (the reader follows the tail).
///
/// # Failure
///
/// Every record is checked as [`Log::read`](crate::Log::read) checks it. At a record that
/// fails, `next` returns [`ReadError::Corrupt`] (file, byte offset, record offset) and stays
/// there: every later call returns the same error. To go on past it, ask
/// [`Log::next_readable`](crate::Log::next_readable) for that offset and
/// [`seek`](LogReader::seek) there — the damaged record costs only itself. `next` also fails
/// with [`ReadError::OutOfRetention`] once retention removed the position, and with
/// [`ReadError::Io`].
///
/// A reader holds the segment it reads (an open file handle) and one 64 KiB read chunk.
pub struct LogReader<'a> {
    sh: &'a Shared,
    /// Offset of the next record to return.
    next: u64,
    /// The segment being read, the end of what may be read in it, and the walk over it.
    at: Option<Position>,
}

struct Position {
    seg: Arc<Segment>,
    until: u64,
    cursor: Cursor,
}

impl std::fmt::Debug for LogReader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogReader")
            .field("position", &self.next)
            .field("at", &self.at)
            .finish()
    }
}

impl std::fmt::Debug for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Position")
            .field("segment", &self.seg.base)
            .field("until", &self.until)
            .finish_non_exhaustive()
    }
}

impl<'a> LogReader<'a> {
    pub(crate) fn new(sh: &'a Shared, from: u64) -> Self {
        Self {
            sh,
            next: from,
            at: None,
        }
    }

    /// The offset of the record the next call of [`LogReader::next`] returns (or fails at).
    #[must_use]
    pub fn position(&self) -> u64 {
        self.next
    }

    /// Moves the reader to `offset` (for example past a damaged record, to the offset
    /// [`Log::next_readable`](crate::Log::next_readable) returned). Errors for a position out
    /// of range come from the next [`LogReader::next`].
    pub fn seek(&mut self, offset: u64) {
        self.next = offset;
        self.at = None;
    }

    /// The next record, borrowed until the next call; `Ok(None)` at the end of the visible
    /// log. See the type's docs for failures.
    #[allow(clippy::should_implement_trait)] // a lending iterator: `Iterator` cannot lend
    pub fn next(&mut self) -> Result<Option<RecordRef<'_>>, ReadError> {
        let Some(frame @ (at, len)) = self.next_frame()? else {
            return Ok(None);
        };
        let Some(p) = &mut self.at else {
            return Ok(None);
        };
        let record = p.cursor.accept(&p.seg, frame, |chunk| {
            RecordRef::decode(&chunk[at..at + len])
        })?;
        self.next += 1;
        Ok(Some(record))
    }

    /// The frame of record `self.next`, checksummed, in its segment's chunk.
    fn next_frame(&mut self) -> Result<Option<(usize, usize)>, ReadError> {
        loop {
            if let Some(p) = &mut self.at
                && let Some(frame) = p.cursor.peek(self.sh, &p.seg, self.next, p.until)?
            {
                return Ok(Some(frame));
            }
            if !self.position_at_next()? {
                return Ok(None);
            }
        }
    }

    /// Finds the segment holding `self.next` below the visible end (the same one, further
    /// on, when records were appended to it): `false` when there is nothing to read.
    fn position_at_next(&mut self) -> Result<bool, ReadError> {
        let sh = self.sh;
        let from = self.next;
        let end = readable_end(sh, from)?;
        if from == end {
            return Ok(false);
        }
        if let Some(p) = &mut self.at {
            let until = p.seg.end().min(end);
            if p.cursor.offset() == from && from < until {
                p.until = until;
                return Ok(true);
            }
        }
        let Some(seg) = segments_from(sh, from).into_iter().next() else {
            return Err(ReadError::OutOfRetention {
                requested: from,
                earliest: sh.start.load(Ordering::Acquire),
            });
        };
        let until = seg.end().min(end);
        if from >= until {
            // Between a segment's last record and the next segment's publication in the
            // list: nothing visible to read yet.
            return Ok(false);
        }
        self.at = Some(Position {
            cursor: Cursor::start(&seg, from),
            seg,
            until,
        });
        Ok(true)
    }
}
