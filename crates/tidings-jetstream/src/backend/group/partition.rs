//! One key partition's cursor in a keyed group: the partition's consumer
//! (`<durable>_k<p>`), pulled only by the member holding its lease (R-DIST-6), opened under
//! one lease term. What it may do and when is the member's machine's decision
//! ([`super::machine`]); this is the I/O.
//!
//! # Taking over
//! When this member takes the partition, the last owner may have left deliveries
//! unfinished: given back by a clean hand-over (nak'd), or still held by a process that
//! died, stopped or was cut off (they come back after the ack wait). The cursor reads how
//! many there are ([`PartitionCursor::unfinished`]); the machine hands out nothing until
//! they are all back or its deadline passed, and what was gathered goes out **in stream
//! order** (the server redelivers in its own order, which is not the stream's). Without
//! this a later message of a key, never delivered before, could start ahead of an earlier
//! one still on its way back.

use std::sync::Arc;

use tidings::durable::BackendCursor;
use tidings::{CursorState, Message, StreamError};

use super::super::cursor::JsCursor;

/// One partition's cursor (see the [module docs](self)).
pub(crate) struct PartitionCursor {
    inner: JsCursor,
}

impl PartitionCursor {
    /// Wraps `inner`, just opened for a partition: it pulls only while `admits` and keeps
    /// its deliveries alive only while `keeps`.
    pub(crate) fn new(
        inner: JsCursor,
        admits: Arc<dyn Fn() -> bool + Send + Sync>,
        keeps: Arc<dyn Fn() -> bool + Send + Sync>,
    ) -> Self {
        inner.hold_while(admits, keeps);
        Self { inner }
    }

    /// The consumer's unfinished deliveries (the last owner's) and the last stream
    /// sequence it delivered, as the server answered the open.
    pub(crate) fn unfinished(&self) -> (usize, u64) {
        let (n, through) = self.inner.unfinished_at_open();
        (usize::try_from(n).unwrap_or(usize::MAX), through)
    }

    /// Retired: waits out a pull in flight, so nothing lands here after the partition's
    /// next cursor read what is unfinished.
    pub(crate) fn retire(&self) {
        self.inner.quiesce_pulls();
    }

    /// Collect without handing out (`true`), or hand out again (`false`).
    pub(crate) fn set_gathering(&self, on: bool) {
        self.inner.set_gathering(on);
    }

    /// How many gathered deliveries have a sequence of at most `seq`.
    pub(crate) fn waiting_through(&self, seq: u64) -> usize {
        self.inner.waiting_through(seq)
    }

    /// Up to `max` messages (none while gathering: the call nudges the standing pull).
    pub(crate) fn fetch(&self, max: usize) -> Result<Vec<Message>, StreamError> {
        self.inner.fetch(max)
    }

    /// Finish these messages (they were handed out by this cursor).
    pub(crate) fn finish(&self, done: &[tidings::durable::Finished]) -> Result<(), StreamError> {
        self.inner.finish(done)
    }

    /// Position, commit and lag of the partition's consumer.
    pub(crate) fn state(&self) -> CursorState {
        self.inner.state()
    }

    /// Brings the state's snapshot up to date if something changed (the feeder's call).
    pub(crate) fn refresh(&self) {
        self.inner.refresh();
    }

    /// A clean hand-over's end: what is held goes back to the server at once, in stream
    /// order (nak).
    pub(crate) fn give_back(&self) {
        self.inner.close();
    }

    /// The lease lapsed: another member may hold these messages now; tell the server
    /// nothing.
    pub(crate) fn abandon(&self) {
        self.inner.forget();
        self.inner.close();
    }
}
