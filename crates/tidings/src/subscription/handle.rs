//! The user's handle on a subscription.

use std::fmt;
use std::sync::{Arc, Weak};

use crate::dlq::DeadLetter;
use crate::message::Message;
use crate::stats::SubscriptionStats;
use crate::topic::Pattern;

use super::shell::SubscriptionShell;

/// Where a [`Subscription`] handle unsubscribes: the broker, behind this trait so the
/// subscription does not know it.
pub(crate) trait Registry: Send + Sync {
    /// Remove subscription `id`; what was still queued, or `None` when it is not
    /// registered (already unsubscribed, or the broker closed).
    fn unsubscribe(&self, id: SubscriptionId) -> Option<Vec<Arc<Message>>>;
}

/// Identifies a subscription within its broker. Ids are never reused by one broker.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct SubscriptionId(pub(crate) u64);

impl SubscriptionId {
    /// The numeric id.
    #[must_use]
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for SubscriptionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sub-{}", self.0)
    }
}

/// What a redrive did (R-DEL-4).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use]
pub struct RedriveReport {
    /// Entries re-offered and accepted (they left the DLQ).
    pub accepted: usize,
    /// Entries re-offered and refused. None is lost: a queue-full refusal (`Overflow`)
    /// dead-letters the message again (a new entry, reason `Overflow`, at the back); any
    /// other refusal (the subscription is closed) puts the original entry back in place.
    pub refused: usize,
}

/// A live subscription (R-CORE-1).
///
/// # Closing
/// Dropping the handle unsubscribes (like [`Subscription::unsubscribe`]); call
/// [`Subscription::detach`] to keep the subscription for the broker's lifetime. Stats and
/// the dead-letter queue stay readable through the handle after unsubscribe.
#[must_use = "dropping a Subscription unsubscribes it; call .detach() to keep it running"]
pub struct Subscription {
    pub(crate) shared: Arc<SubscriptionShell>,
    pub(crate) broker: Weak<dyn Registry>,
    pub(crate) attached: bool,
}

impl Subscription {
    /// The subscription's id.
    #[must_use]
    pub fn id(&self) -> SubscriptionId {
        self.shared.id
    }
    /// Its name (the id unless one was given).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.shared.name
    }
    /// The pattern it subscribed with.
    #[must_use]
    pub fn pattern(&self) -> &Pattern {
        &self.shared.pattern
    }
    /// Counters and gauges now (R-DEL-6, R-BP-3).
    #[must_use]
    pub fn stats(&self) -> SubscriptionStats {
        self.shared.stats()
    }
    /// The dead-letter entries, oldest first (R-DEL-4).
    #[must_use]
    pub fn dead_letters(&self) -> Vec<DeadLetter> {
        self.shared.dead_letters()
    }
    /// Remove and return every dead-letter entry.
    pub fn drain_dead_letters(&self) -> Vec<DeadLetter> {
        self.shared.drain_dead_letters()
    }
    /// Offer the entries `select` picks to this subscription again, in DLQ order.
    /// Filters are not re-applied (they passed once).
    ///
    /// Loss-safe (R-DEL-4): an entry leaves the DLQ only when its message was accepted
    /// again, or refused for a full queue and so dead-lettered again as `Overflow`. On an
    /// unsubscribed or closed subscription every offer is refused and every entry stays.
    /// Under `Overflow::Block` the redrive waits for room like any publisher.
    pub fn redrive(&self, select: impl FnMut(&DeadLetter) -> bool) -> RedriveReport {
        let done = self.shared.redrive(select);
        RedriveReport {
            accepted: done.accepted,
            refused: done.overflowed + done.returned,
        }
    }
    /// Unsubscribe now: later offers are refused, a handler call in flight completes, and
    /// what was still queued is returned (and dead-lettered as `Shutdown` when the DLQ
    /// keeps those). A handler call in flight that then fails retryably is dead-lettered
    /// as `Shutdown` too, after this returned (it is not in the returned list). Safe to
    /// call from inside this subscription's own handler.
    pub fn unsubscribe(mut self) -> Vec<Arc<Message>> {
        self.attached = false;
        self.retire()
    }
    /// Keep the subscription running after this handle is dropped. It ends at
    /// [`Broker::unsubscribe`](crate::Broker::unsubscribe) or broker close.
    pub fn detach(mut self) {
        self.attached = false;
    }

    fn retire(&self) -> Vec<Arc<Message>> {
        match self.broker.upgrade() {
            Some(b) => b.unsubscribe(self.shared.id).unwrap_or_default(),
            None => self.shared.close(),
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if self.attached {
            let _ = self.retire();
        }
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("id", &self.shared.id)
            .field("name", &self.shared.name)
            .field("pattern", &self.shared.pattern.as_str())
            .finish()
    }
}
