//! One key partition's cursor in a keyed group: the partition's consumer
//! (`<durable>_k<p>`), pulled only by the member holding its lease (R-DIST-6).
//!
//! # Taking over
//! When this member takes the partition, the last owner may have left deliveries
//! unfinished: given back by a clean hand-over (nak'd), or still held by a process that
//! died or stopped (they come back after the ack wait). The cursor reads how many there
//! are, and hands out nothing until they are all back — at most the ack wait plus
//! [`GATHER_SLACK`] — then hands them out first, **in stream order** (the server
//! redelivers in its own order, which is not the stream's). Without this a later message
//! of a key, never delivered before, could start ahead of an earlier one still on its
//! way back.
//!
//! # Pulling and keep-alives
//! Only while the lease admits starts: a process whose lease lapsed (a pause, a lost
//! server) neither takes the partition's messages from the new owner nor keeps its old
//! deliveries from coming back.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidings::durable::BackendCursor;
use tidings::{CursorState, Message, StreamError};

use super::super::cursor::JsCursor;

/// Beyond the ack wait, how long a new owner waits for the last owner's deliveries.
pub(crate) const GATHER_SLACK: Duration = Duration::from_secs(2);

/// Waiting for the last owner's unfinished deliveries.
#[derive(Debug, Clone, Copy)]
struct Gather {
    /// Those delivered before the take-over: sequences up to this.
    through: u64,
    /// How many were unfinished.
    count: usize,
    /// When to stop waiting.
    until: Instant,
}

/// One partition's cursor (see the [module docs](self)).
pub(crate) struct PartitionCursor {
    inner: JsCursor,
    gather: Mutex<Option<Gather>>,
}

impl PartitionCursor {
    /// Wraps `inner`, just opened by the member that took the partition; keep-alives only
    /// while `admits`.
    pub(crate) fn new(
        inner: JsCursor,
        ack_wait: Duration,
        admits: Arc<dyn Fn() -> bool + Send + Sync>,
    ) -> Result<Self, StreamError> {
        inner.hold_while(admits);
        let (unfinished, through) = inner.unfinished()?;
        let gather = (unfinished > 0).then(|| {
            inner.set_gathering(true);
            Gather {
                through,
                count: usize::try_from(unfinished).unwrap_or(usize::MAX),
                until: Instant::now() + ack_wait + GATHER_SLACK,
            }
        });
        Ok(Self {
            inner,
            gather: Mutex::new(gather),
        })
    }

    /// Up to `max` messages; nothing while gathering (see the module docs). Call only
    /// while the lease admits starts.
    pub(crate) fn fetch(&self, max: usize) -> Result<Vec<Message>, StreamError> {
        let mut gather = self
            .gather
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(g) = *gather {
            // Hands out nothing while gathering; it nudges the standing pull, which fills
            // the buffer within the window.
            let got = self.inner.fetch(max)?;
            debug_assert!(got.is_empty(), "a gathering cursor hands out nothing");
            if self.inner.waiting_through(g.through) < g.count && Instant::now() < g.until {
                return Ok(Vec::new());
            }
            self.inner.set_gathering(false);
            *gather = None;
        }
        drop(gather);
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
