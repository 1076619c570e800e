//! What one step of the sans-IO core asks of its shell.
//!
//! Every `handle_*` / `poll_work` call of [`Core`](super::core::Core) returns the effects
//! of that step, instead of leaving them in the core for a later collection: the shell
//! applies them once the subscription's lock is released. A step that returns no effects
//! needs nothing done; one whose effects are dropped loses a dead-letter forward or a
//! finished report, which `#[must_use]` makes a compile-time warning.

use std::sync::Arc;

use crate::dlq::{DeadLetter, DeadLetterReason};
use crate::message::Message;

// `Finished` and `Outcome` are the durable seam's public types (`tidings::durable`
// re-exports them for backends: `BackendCursor::finish`). They are defined here, by the
// subscription whose finished hook produces them, because the arrows point from durable
// code to the subscription and never back: one type from the hook to the cursor, with no
// mapping between mirrors.

/// A message that finished for good, reported to its cursor.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Finished {
    /// The message (its [`Message::offset`] is its offset in the stream).
    pub message: Arc<Message>,
    /// How it finished.
    pub outcome: Outcome,
}

impl Finished {
    /// `message` finished with `outcome`.
    #[must_use]
    pub fn new(message: Arc<Message>, outcome: Outcome) -> Self {
        Self { message, outcome }
    }
}

/// How a message finished.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Its handler succeeded.
    Delivered,
    /// The subscription's filter (header filters, predicate) excluded it.
    Filtered,
    /// It was dead-lettered; the cursor stores it in the durable DLQ.
    DeadLettered {
        /// Why.
        reason: DeadLetterReason,
        /// Handler attempts made.
        attempts: u32,
    },
}

/// Called (outside the subscription lock) with messages that finished for good.
pub(crate) type FinishedHook = Arc<dyn Fn(Vec<Finished>) + Send + Sync>;

/// What the shell must do, outside the lock, after a core step.
///
/// Almost every step on the delivery path has nothing to do, so an empty `Effects` is one
/// flag and a null pointer: made, absorbed, checked and dropped in a few instructions, where
/// lists of their own would be built and dropped on every poll and completion.
#[derive(Debug, Default)]
#[must_use = "the shell must apply a core step's effects"]
pub(crate) struct Effects {
    /// Room was made: wake the publishers blocked under `Overflow::Block`.
    pub(crate) room: bool,
    /// Dead letters to forward and finished reports; `None` when both are empty.
    lists: Option<Box<Lists>>,
}

/// The effects that carry messages.
#[derive(Default)]
pub(crate) struct Lists {
    /// Publish these dead letters to the subscription's dead-letter topic (R-DEL-4).
    pub(crate) forward: Vec<DeadLetter>,
    /// Report these finished messages to `on_finished` (durable subscriptions only).
    pub(crate) finished: Vec<Finished>,
    /// The durable subscription's finished hook, when `finished` is not empty.
    pub(crate) on_finished: Option<FinishedHook>,
}

impl std::fmt::Debug for Lists {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lists")
            .field("forward", &self.forward)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl Effects {
    /// The effects of one step: `room`, and the lists (allocated only when one is not
    /// empty).
    #[inline]
    pub(crate) fn new(room: bool, lists: Lists) -> Self {
        let lists =
            (!lists.forward.is_empty() || !lists.finished.is_empty()).then(|| Box::new(lists));
        Self { room, lists }
    }

    /// At most the room flag: the delivery path's common case.
    #[inline]
    pub(crate) fn only_room(room: bool) -> Self {
        Self { room, lists: None }
    }

    /// Nothing to do.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.lists.is_none() && !self.room
    }

    /// The lists, taken (the shell applies them).
    pub(crate) fn into_lists(self) -> (bool, Lists) {
        (self.room, self.lists.map(|l| *l).unwrap_or_default())
    }

    /// Add `later`'s effects after these (order is kept: finished reports stay in the order
    /// the messages finished).
    #[inline]
    pub(crate) fn absorb(&mut self, later: Effects) {
        self.room |= later.room;
        let Some(more) = later.lists else {
            return;
        };
        match &mut self.lists {
            None => self.lists = Some(more),
            Some(lists) => {
                let Lists {
                    forward,
                    finished,
                    on_finished,
                } = *more;
                lists.forward.extend(forward);
                lists.finished.extend(finished);
                if lists.on_finished.is_none() {
                    lists.on_finished = on_finished;
                }
            }
        }
    }
}

// `StartGate` is the durable seam's too (re-exported by `tidings::durable`), defined here
// for the same reason: the subscription asks it, and durable code points at the
// subscription, never back.

/// Asked by the subscription before every handler attempt of a message its cursor handed
/// out (first attempts and retries alike), under the subscription's lock: it must answer
/// at once, never blocking on I/O.
///
/// A message the gate does not admit is *released*: its handler does not run, it is not
/// reported finished (so its cursor neither commits nor acknowledges it), its key is free
/// again, and it is counted in [`SubscriptionStats::released`](crate::SubscriptionStats).
/// A backend releases what this process may no longer start — a key another process
/// owns now, a lease that lapsed or is being handed over, or a stale copy of a message
/// that was handed out again since — and delivers it again where it may start.
pub trait StartGate: Send + Sync {
    /// Whether the handler may start on `message` now. `message` is the allocation
    /// [`BackendCursor::fetch_shared`](crate::durable::BackendCursor::fetch_shared) handed out, so a gate may tell copies of one offset
    /// apart by pointer.
    fn admit(&self, message: &Arc<Message>) -> bool;
}
