//! What publish and close tell the caller (R-CORE-5, R-CORE-6).

use std::sync::Arc;

use crate::message::{Message, MessageId};
use crate::subscription::{Refusal, SubscriptionId};

/// The outcome of one publish, known without waiting for delivery (R-CORE-5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishReport {
    /// The id stamped on the message.
    pub id: MessageId,
    /// Subscriptions whose queue accepted it.
    pub accepted: usize,
    /// Subscriptions that refused it, and why.
    pub refused: Vec<(SubscriptionId, Refusal)>,
    /// True when the message was held for delayed delivery: it will be offered when due,
    /// and `accepted`/`refused` are zero/empty now.
    pub scheduled: bool,
    /// Durable streams that hold the message, in name order (R-LOG-1): it was appended to
    /// each, or (see `duplicate_in`) each already held it. Under `Fsync::Always` it is
    /// synced in each of them when publish returns.
    pub streams: Vec<String>,
    /// The streams of `streams` that already held a message with this id within their
    /// duplicate window (R-DEL-7, [`StreamConfig::duplicate_window`](crate::StreamConfig::duplicate_window)):
    /// nothing was stored there, and their durable subscriptions get nothing new. Buffered
    /// subscriptions are not a stream's: they were offered the message all the same
    /// (`accepted`/`refused`).
    pub duplicate_in: Vec<String>,
}

impl PublishReport {
    /// Number of subscriptions the message matched (accepted + refused).
    #[must_use]
    pub fn matched(&self) -> usize {
        self.accepted + self.refused.len()
    }
    /// True when at least one stream already held the message (R-DEL-7): a retried
    /// publish that had been stored before.
    #[must_use]
    pub fn is_duplicate(&self) -> bool {
        !self.duplicate_in.is_empty()
    }
    /// Refusals with the given reason.
    #[must_use]
    pub fn refused_for(&self, reason: Refusal) -> usize {
        self.refused.iter().filter(|(_, r)| *r == reason).count()
    }
}

/// A message left undelivered at close.
#[derive(Debug, Clone)]
pub struct Undelivered {
    /// The subscription it was queued (or, for a durable subscription's delayed record,
    /// scheduled) for; `None` for a delayed publish still waiting in the scheduler.
    pub subscription: Option<SubscriptionId>,
    /// The message.
    pub message: Arc<Message>,
}

/// What `close` left behind (R-CORE-6). Every later `close` returns a copy of it.
///
/// # Closed, three ways
/// * an operation started after close fails with an `Err` (`PublishError::Closed`,
///   `SubscribeError::Closed`, `RequestError::Closed` — also for a request that was
///   waiting when close began);
/// * an offer that raced with a subscription's close (or a publisher blocked under
///   `Overflow::Block` that close woke) is listed in its `PublishReport` as
///   `Refusal::Closed`: the message never entered that queue;
/// * a message that *had* entered a queue and was not delivered is a `Shutdown` dead
///   letter and is listed here, in `undelivered`: exactly those, no more, no fewer.
#[derive(Debug, Clone, Default)]
pub struct CloseReport {
    /// Messages queued, waiting to retry, or scheduled that were not delivered: exactly
    /// the `Shutdown` dead letters of close (kept in the DLQs when `keep_shutdown`), plus
    /// delayed messages cancelled in the scheduler.
    pub undelivered: Vec<Undelivered>,
    /// Dispatcher threads still running a handler when the join deadline passed; they were
    /// detached and exit when their handler returns.
    pub unjoined: Vec<String>,
}

impl CloseReport {
    /// True when nothing was left behind.
    #[must_use]
    pub fn is_clean(&self) -> bool {
        self.undelivered.is_empty() && self.unjoined.is_empty()
    }
}
