//! The dead-letter queue of one subscription (R-DEL-4).
//!
//! Bounded: when full, the oldest entry is evicted and counted (`evicted`), so the DLQ can
//! never grow without limit and never loses an entry without a counter saying so.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use crate::message::Message;

/// Why a message was dead-lettered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadLetterReason {
    /// The retry policy gave up (R-DEL-1).
    RetriesExhausted {
        /// Attempts made.
        attempts: u32,
        /// The last handler error.
        last_error: String,
    },
    /// The handler returned a non-retryable error (R-DEL-1).
    Rejected {
        /// The handler's error.
        error: String,
    },
    /// Its TTL passed before it was dequeued (R-TIME-1).
    Expired,
    /// The queue was full under `Reject` or a `Block` timeout (R-BP-1).
    Overflow,
    /// Evicted by `DropOldest` with `keep` set (R-BP-1).
    DroppedOldest,
    /// Still undelivered when the subscription or broker closed (R-CORE-6).
    Shutdown,
}

impl DeadLetterReason {
    /// A short stable name: `retries_exhausted`, `rejected`, `expired`, `overflow`,
    /// `dropped_oldest`, `shutdown`.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            DeadLetterReason::RetriesExhausted { .. } => "retries_exhausted",
            DeadLetterReason::Rejected { .. } => "rejected",
            DeadLetterReason::Expired => "expired",
            DeadLetterReason::Overflow => "overflow",
            DeadLetterReason::DroppedOldest => "dropped_oldest",
            DeadLetterReason::Shutdown => "shutdown",
        }
    }
}

impl fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeadLetterReason::RetriesExhausted {
                attempts,
                last_error,
            } => write!(
                f,
                "retries exhausted after {attempts} attempts: {last_error}"
            ),
            DeadLetterReason::Rejected { error } => write!(f, "rejected: {error}"),
            other => f.write_str(other.name()),
        }
    }
}

/// One dead-lettered message.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// The message, shared with every other holder.
    pub message: Arc<Message>,
    /// Why it is here.
    pub reason: DeadLetterReason,
    /// Handler attempts made (0 when it never reached the handler).
    pub attempts: u32,
    /// Wall-clock time it was dead-lettered.
    pub at: SystemTime,
}

impl DeadLetter {
    /// The last handler error, when there was one.
    #[must_use]
    pub fn last_error(&self) -> Option<&str> {
        match &self.reason {
            DeadLetterReason::RetriesExhausted { last_error, .. } => Some(last_error),
            DeadLetterReason::Rejected { error } => Some(error),
            _ => None,
        }
    }
}

#[derive(Debug)]
pub(crate) struct DeadLetterQueue {
    entries: VecDeque<DeadLetter>,
    capacity: usize,
    evicted: u64,
}

impl DeadLetterQueue {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            entries: VecDeque::new(),
            capacity,
            evicted: 0,
        }
    }

    pub(crate) fn push(&mut self, entry: DeadLetter) {
        if self.capacity == 0 {
            self.evicted += 1;
            return;
        }
        if self.entries.len() == self.capacity {
            self.entries.pop_front();
            self.evicted += 1;
        }
        self.entries.push_back(entry);
    }

    pub(crate) fn list(&self) -> Vec<DeadLetter> {
        self.entries.iter().cloned().collect()
    }

    pub(crate) fn drain(&mut self) -> Vec<DeadLetter> {
        self.entries.drain(..).collect()
    }

    /// Remove and return the entries `select` picks, keeping the rest in order.
    pub(crate) fn take_where(
        &mut self,
        mut select: impl FnMut(&DeadLetter) -> bool,
    ) -> Vec<DeadLetter> {
        let mut taken = Vec::new();
        let mut kept = VecDeque::with_capacity(self.entries.len());
        for e in self.entries.drain(..) {
            if select(&e) {
                taken.push(e);
            } else {
                kept.push_back(e);
            }
        }
        self.entries = kept;
        taken
    }

    /// Put entries taken by [`take_where`](Self::take_where) back at the front, in their
    /// order (a redrive that could not re-offer them). Beyond capacity the oldest are
    /// evicted and counted, as on `push`.
    pub(crate) fn restore(&mut self, entries: Vec<DeadLetter>) {
        for e in entries.into_iter().rev() {
            self.entries.push_front(e);
        }
        while self.entries.len() > self.capacity {
            self.entries.pop_front();
            self.evicted += 1;
        }
    }

    /// The entries, oldest first (snapshot and admin pages, src/ops).
    pub(crate) fn iter(&self) -> impl Iterator<Item = &DeadLetter> {
        self.entries.iter()
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn evicted(&self) -> u64 {
        self.evicted
    }
}
