//! Per-subscription counters (R-DEL-6, R-BP-3).
//!
//! # Conservation
//! At every quiescent point, for every subscription:
//!
//! ```text
//! offered  = accepted + refused.total()
//! accepted = delivered + dead_lettered.total() + released + queued + in_flight
//! ```
//!
//! `released` counts messages a durable subscription's cursor took back unstarted (a keyed
//! group's key moved to another process, R-DIST-6): they are delivered again there.
//!
//! `dead_lettered` counts every accepted message that left without a successful delivery,
//! by reason, whether or not the policy kept a DLQ entry for it. Refused `Overflow` messages
//! are counted under `refused.overflow` (they were never accepted) and, under `Reject` and
//! `Block`, also get a DLQ entry so they can be redriven.

use std::time::Duration;

use crate::dlq::DeadLetterReason;

/// Offers refused, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RefusedCounts {
    /// The filter (predicate or header filter) did not match.
    pub filtered: u64,
    /// The queue was full (R-BP-1).
    pub overflow: u64,
    /// The subscription was closed or unsubscribed.
    pub closed: u64,
}

impl RefusedCounts {
    /// Sum of all reasons.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.filtered + self.overflow + self.closed
    }
}

/// Accepted messages that left without a successful delivery, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeadLetterCounts {
    /// Retry policy gave up.
    pub retries_exhausted: u64,
    /// Handler rejected (non-retryable error).
    pub rejected: u64,
    /// TTL passed before dequeue.
    pub expired: u64,
    /// Evicted by `DropOldest` (kept in the DLQ or not).
    pub dropped_oldest: u64,
    /// Undelivered at unsubscribe or close.
    pub shutdown: u64,
}

impl DeadLetterCounts {
    /// Sum of all reasons.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.retries_exhausted + self.rejected + self.expired + self.dropped_oldest + self.shutdown
    }

    pub(crate) fn count(&mut self, reason: &DeadLetterReason) {
        match reason {
            DeadLetterReason::RetriesExhausted { .. } => self.retries_exhausted += 1,
            DeadLetterReason::Rejected { .. } => self.rejected += 1,
            DeadLetterReason::Expired => self.expired += 1,
            DeadLetterReason::DroppedOldest => self.dropped_oldest += 1,
            DeadLetterReason::Shutdown => self.shutdown += 1,
            // Overflow refusals are counted as refusals, never as accepted-then-lost.
            DeadLetterReason::Overflow => {}
        }
    }
}

/// A snapshot of one subscription's counters and gauges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubscriptionStats {
    /// Messages offered to the subscription.
    pub offered: u64,
    /// Offers that entered the queue.
    pub accepted: u64,
    /// Offers refused, by reason.
    pub refused: RefusedCounts,
    /// Messages whose handler succeeded.
    pub delivered: u64,
    /// Accepted messages that left without a successful delivery, by reason.
    pub dead_lettered: DeadLetterCounts,
    /// Messages waiting in the queue.
    pub queued: u64,
    /// Messages taken from the queue and not yet finished (running, waiting to retry, or
    /// deferred by their handler).
    pub in_flight: u64,
    /// Handler calls made (first attempts and retries); a call the handler took back with
    /// [`HandlerError::defer_until`](crate::HandlerError::defer_until) is not counted.
    pub attempts: u64,
    /// Handler calls that failed (errors and panics; a deferral is not a failure).
    pub failures: u64,
    /// Messages taken off the queue and handed back to their cursor unstarted, because its
    /// start gate refused them (a keyed group's key moved to another process, or the lease
    /// lapsed: R-DIST-6). Not delivered here, not finished here: the stream delivers them
    /// again where they may start. Always 0 without a gate.
    pub released: u64,
    /// Entries currently in the DLQ.
    pub dlq_len: u64,
    /// DLQ entries evicted because the DLQ was full.
    pub dlq_evicted: u64,
    /// Dead letters whose forward to the dead-letter topic failed (e.g. the broker was
    /// closed, or a stream append failed); their DLQ entries stay (R-DEL-4, R-DEL-6).
    pub dlq_forward_failures: u64,
    /// Publishers waiting for room under `Overflow::Block` right now (R-BP-3).
    pub blocked_publishers: u64,
    /// How long the oldest queued message has waited since it entered the queue (at publish,
    /// or when a delayed message became due), on the broker clock's wall time, the one that
    /// stamps messages; zero if that clock was stepped back since. `None` when nothing is
    /// queued (R-BP-3).
    pub oldest_age: Option<Duration>,
}

impl SubscriptionStats {
    /// True when the conservation equations of R-DEL-6 hold.
    #[must_use]
    pub fn is_conserved(&self) -> bool {
        self.offered == self.accepted + self.refused.total()
            && self.accepted
                == self.delivered
                    + self.dead_lettered.total()
                    + self.released
                    + self.queued
                    + self.in_flight
    }
}
