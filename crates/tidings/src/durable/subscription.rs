//! The user's handle on a durable subscription (R-LOG-3, R-LOG-4, R-BP-3, R-DEL-4).

use std::fmt;
use std::sync::{Arc, Weak};

use crate::stats::SubscriptionStats;
use crate::subscription::{Subscription, SubscriptionId};

use super::feeder::CursorFeeder;
use super::registry::Durables;
use super::source::{CursorState, DurableDeadLetter};
use super::{CommitFailed, StartAt, StreamError};

/// A durable subscription (R-LOG-3): a cursor over a stream feeding an ordinary
/// [`Subscription`].
///
/// The handle has the methods a durable subscription's user needs: its [`id`](Self::id),
/// [`stats`](Self::stats), position ([`committed`](Self::committed),
/// [`lag`](Self::lag), [`seek`](Self::seek), …) and durable dead-letter store. The
/// underlying [`Subscription`] is reached through [`subscription`](Self::subscription) for
/// the rest (its options' name and pattern, its in-memory dead-letter queue).
///
/// # Dead letters
/// A dead-lettered message (rejected, out of retries, expired) is stored in the
/// subscription's **durable** dead-letter store (R-DEL-4) before its offset is committed; it survives restarts and is
/// read with [`durable_dead_letters`](Self::durable_dead_letters), removed with
/// [`drain_durable_dead_letters`](Self::drain_durable_dead_letters) and sent back through
/// the stream with [`redrive_durable_dead_letters`](Self::redrive_durable_dead_letters).
/// The in-memory dead-letter queue of the underlying subscription
/// (`subscription().dead_letters()`, with its `redrive` and `drain_dead_letters`) holds
/// them too, as for any subscription, for this process's lifetime only.
///
/// # Delivery
/// At-least-once across restarts. The position committed is the lowest offset not yet
/// finished (delivered, filtered, or dead-lettered and stored in the durable DLQ); after a
/// crash the messages redelivered are exactly those finished above the last committed
/// position. Messages abandoned at close are never committed.
///
/// # Backpressure
/// At most `capacity` messages are outstanding; beyond that the subscription only lags
/// ([`DurableSubscription::lag`], R-BP-2, R-BP-3).
///
/// # Closing
/// Dropping the handle stops the feeder, writes the position, releases the name (it can be
/// subscribed again at once) and unsubscribes.
pub struct DurableSubscription {
    pub(crate) sub: Subscription,
    pub(crate) feeder: Arc<CursorFeeder>,
    pub(crate) registry: Weak<Durables>,
}

impl DurableSubscription {
    /// The underlying subscription, for what is not specific to a durable one: its
    /// options' name and pattern, and its in-memory dead-letter queue.
    pub fn subscription(&self) -> &Subscription {
        &self.sub
    }
    /// The subscription's id within its broker (as in the broker's snapshot and the
    /// admin API).
    #[must_use]
    pub fn id(&self) -> SubscriptionId {
        self.sub.id()
    }
    /// The subscription's counters (R-DEL-6): delivered, retried, dead-lettered, filtered,
    /// queue depth. Every message the feeder offered is accounted for.
    #[must_use]
    pub fn stats(&self) -> SubscriptionStats {
        self.sub.stats()
    }
    /// The durable name (the key of its committed position).
    #[must_use]
    pub fn durable_name(&self) -> &str {
        &self.feeder.name
    }
    /// The stream it reads.
    #[must_use]
    pub fn stream(&self) -> &str {
        &self.feeder.stream
    }
    /// Position, commit, lag, outstanding and halt state, read at once.
    #[must_use]
    pub fn state(&self) -> CursorState {
        self.feeder.cursor.state()
    }
    /// The committed position: every offset below it is finished, durably.
    #[must_use]
    pub fn committed(&self) -> u64 {
        self.state().committed
    }
    /// The next offset the feeder will read.
    #[must_use]
    pub fn position(&self) -> u64 {
        self.state().position
    }
    /// Messages fetched and not yet finished (≤ capacity).
    #[must_use]
    pub fn outstanding(&self) -> usize {
        self.state().outstanding
    }
    /// Records in the stream not yet committed: `end_offset - committed` (R-BP-3).
    #[must_use]
    pub fn lag(&self) -> u64 {
        self.state().lag
    }
    /// The committed position found when this subscription opened, if it lay beyond the
    /// end of the stream (a hand-edited or foreign offset file, or a stream that lost its
    /// tail in a power cut under `Fsync::Never` or `Fsync::Interval`).
    ///
    /// Policy (R-LOG-3, R-LIM-2): such a position is never trusted, because new messages
    /// would get offsets below it and be skipped silently. It is clamped to the stream's end
    /// at open, the clamp is committed at once and logged with `tracing::warn!`, and this
    /// method reports the position that was found. Every message appended afterwards is
    /// delivered. `None` when the committed position was within the stream.
    #[must_use]
    pub fn clamped_from(&self) -> Option<u64> {
        self.state().clamped_from
    }
    /// Offsets skipped because retention removed them before they were read.
    #[must_use]
    pub fn skipped(&self) -> u64 {
        self.state().skipped
    }
    /// Records skipped because they could not be read (damaged on disk), R-LIM-2, R-DEL-6.
    ///
    /// A damaged record costs only itself: the records before it are delivered, and the
    /// cursor goes on at the next record the backend can read after it; each skip is counted
    /// here, logged with `tracing::error!`, and the last one is described (offsets, file,
    /// byte, check that failed) in [`CursorState::unreadable_reason`]. Where nothing
    /// readable can be found after the damage, the subscription halts there instead:
    /// [`error`](Self::error) names the file and offset.
    #[must_use]
    pub fn unreadable(&self) -> u64 {
        self.state().unreadable
    }
    /// The failed commit that poisoned this subscription's cursor, if one did (R-LOG-3):
    /// it then reads and commits nothing more; subscribe again to resume from the last
    /// position committed.
    #[must_use]
    pub fn poisoned(&self) -> Option<CommitFailed> {
        self.state().poisoned
    }
    /// Why the feeder halted (unreadable record, failed commit or DLQ append), if it did.
    #[must_use]
    pub fn error(&self) -> Option<String> {
        self.state().error
    }
    /// Write the current position now (instead of waiting for the batch); returns it.
    ///
    /// # Errors
    /// [`StreamError::Closed`] once the broker closed; [`StreamError::Poisoned`] when this
    /// or an earlier commit failed (see [`CommitFailed`]).
    pub fn commit(&self) -> Result<u64, StreamError> {
        self.feeder.cursor.commit()
    }
    /// Move the cursor (R-LOG-4) and commit the new position at once; returns it. Messages
    /// already queued are still delivered but no longer hold the position back. Clears a
    /// halt.
    ///
    /// # Errors
    /// [`StreamError::OutOfRetention`] / [`StreamError::BeyondEnd`] for an offset outside the
    /// stream, [`StreamError::Closed`] once the broker closed, [`StreamError::Poisoned`]
    /// after a failed commit; nothing changes then. A poisoned cursor is not cleared.
    pub fn seek(&self, at: StartAt) -> Result<u64, StreamError> {
        self.feeder.seek(at)
    }
    /// The entries of the durable dead-letter store still in it (not drained or redriven),
    /// oldest first, with their typed reasons (R-DEL-4). Survives restarts.
    ///
    /// # Errors
    /// Reading the DLQ failed, or it holds a record tidings did not write (R-LIM-2).
    pub fn durable_dead_letters(&self) -> Result<Vec<DurableDeadLetter>, StreamError> {
        self.feeder.cursor.dead_letters()
    }

    /// Remove every entry from the durable dead-letter store and return them, oldest first
    /// (R-DEL-4). The removal is durable once this returns `Ok`; the in-memory DLQ of the
    /// underlying [`Subscription`] is not touched.
    ///
    /// # Errors
    /// Reading the DLQ or recording the removal failed (then nothing was removed), or the
    /// broker closed ([`StreamError::Closed`]).
    pub fn drain_durable_dead_letters(&self) -> Result<Vec<DurableDeadLetter>, StreamError> {
        self.feeder.cursor.drain_dead_letters()
    }

    /// Redrive the durable dead letters `select` picks (R-DEL-4): each is appended again to
    /// the stream, in DLQ order, as a copy reserved for this subscription (other durable
    /// subscriptions of the stream skip it), and delivered like any stream message, at its
    /// new offset. Returns how many were redriven.
    ///
    /// Loss-safe: the copies are appended and synced to the stream *before* the entries
    /// leave the DLQ, so a crash in between redelivers an entry (it stays listed), never
    /// loses it. Filters are applied again (the message is unchanged, so they pass).
    ///
    /// # Errors
    /// Reading the DLQ, appending to or syncing the stream, or recording the removal
    /// failed, or the broker closed. Entries redriven before an append failure are removed
    /// from the DLQ; the others stay.
    pub fn redrive_durable_dead_letters(
        &self,
        mut select: impl FnMut(&DurableDeadLetter) -> bool,
    ) -> Result<usize, StreamError> {
        self.feeder.cursor.redrive_dead_letters(&mut select)
    }
}

impl Drop for DurableSubscription {
    fn drop(&mut self) {
        self.feeder.shutdown();
        if let Some(registry) = self.registry.upgrade() {
            let key = (self.feeder.stream.clone(), self.feeder.name.clone());
            let mut feeders = registry.feeders.lock();
            let map = &mut feeders.open;
            if map
                .get(&key)
                .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&self.feeder)))
            {
                map.remove(&key);
            }
        }
        // `self.sub` drops next: unsubscribe; what was queued is abandoned, not committed.
    }
}

impl fmt::Debug for DurableSubscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DurableSubscription")
            .field("name", &self.feeder.name)
            .field("stream", &self.feeder.stream)
            .field("committed", &self.committed())
            .finish()
    }
}
