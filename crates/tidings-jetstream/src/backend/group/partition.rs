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
//! one still on its way back. The same holds for deliveries a late pull of the last owner
//! took after the take: the cursor finds them by the consumer's delivery sequence and
//! gathers again ([`strays`](super::super::strays)).

use tidings::durable::BackendCursor;
use tidings::{CursorState, Message, StreamError};

use super::super::cursor::JsCursor;
#[cfg(doc)]
use super::super::cursor::Role;

/// One partition's cursor (see the [module docs](self)).
pub(crate) struct PartitionCursor {
    inner: JsCursor,
}

impl PartitionCursor {
    /// Wraps `inner`, just opened for a partition (with [`Role::Partition`]).
    pub(crate) fn new(inner: JsCursor) -> Self {
        Self { inner }
    }

    /// The consumer's unfinished deliveries (the last owner's), as the server answered
    /// the open.
    pub(crate) fn unfinished(&self) -> usize {
        usize::try_from(self.inner.unfinished_at_open()).unwrap_or(usize::MAX)
    }

    /// Retired: waits out a pull in flight, so nothing lands here after the partition's
    /// next cursor read what is unfinished.
    pub(crate) fn retire(&self) {
        self.inner.quiesce_pulls();
    }

    /// Deliveries out elsewhere: how many, whether more were found since the last call
    /// (see [`strays`](super::super::strays)), and when the last answered pull was sent.
    pub(crate) fn strays(&self) -> (usize, bool, Option<std::time::Instant>) {
        self.inner.strays()
    }

    /// Whether it holds its buffer back.
    pub(crate) fn gathering(&self) -> bool {
        self.inner.gathering()
    }

    /// Hand the buffer out again; false (still gathering) when more deliveries were found
    /// out elsewhere meanwhile.
    pub(crate) fn end_gathering(&self) -> bool {
        self.inner.end_gathering()
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
