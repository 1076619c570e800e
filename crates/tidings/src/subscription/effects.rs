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

/// A message that finished for good: delivered (`dead_letter: None`) or dead-lettered with
/// this reason and attempt count. Reported to a durable subscription's finished hook, which
/// advances its committed position.
#[derive(Debug, Clone)]
pub(crate) struct Finished {
    pub(crate) message: Arc<Message>,
    pub(crate) dead_letter: Option<(DeadLetterReason, u32)>,
}

/// What the shell must do, outside the lock, after a core step.
#[derive(Debug, Default)]
#[must_use = "the shell must apply a core step's effects"]
pub(crate) struct Effects {
    /// Publish these dead letters to the subscription's dead-letter topic (R-DEL-4).
    pub(crate) forward: Vec<DeadLetter>,
    /// Report these finished messages to the finished hook (durable subscriptions only).
    pub(crate) finished: Vec<Finished>,
    /// Room was made: wake the publishers blocked under `Overflow::Block`.
    pub(crate) room: bool,
}

impl Effects {
    /// Nothing to do.
    pub(crate) fn is_empty(&self) -> bool {
        self.forward.is_empty() && self.finished.is_empty() && !self.room
    }

    /// Add `later`'s effects after these (order is kept: finished reports stay in the order
    /// the messages finished).
    pub(crate) fn absorb(&mut self, later: Effects) {
        // The common case on the delivery path: a step with nothing to do.
        if later.is_empty() {
            return;
        }
        if self.is_empty() {
            *self = later;
            return;
        }
        self.forward.extend(later.forward);
        self.finished.extend(later.finished);
        self.room |= later.room;
    }
}
