//! A durable subscription: cursor state, commit rule, durable DLQ, and the user's handle
//! (R-LOG-3, R-LOG-4, R-BP-2, R-BP-3).

use std::collections::BTreeSet;
use std::fmt;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::{Condvar, Mutex};
use tidings_log::Log;

use crate::broker::BrokerInner;
use crate::dlq::DeadLetterReason;
use crate::driver::{FeedStep, Feeder, FeederHandle};
use crate::message::Message;
use crate::subscription::Subscription;
use crate::subscription::shared::{Finished, SubShared};
use crate::topic::Pattern;

use super::StreamInner;
use super::codec;
use super::commit::OffsetStore;
use super::config::StartAt;
use super::dlq_record;
use super::error::{CommitFailed, StreamError};
use super::pump::{self, Pumped};

#[derive(Debug)]
pub(crate) struct CursorState {
    /// Next offset the pump reads.
    pub(crate) cursor: u64,
    /// Offsets offered and not yet finished (queued, in flight, waiting to retry).
    pub(crate) pending: BTreeSet<u64>,
    /// Last position written to the offset file.
    pub(crate) committed: u64,
    pub(crate) since_commit: usize,
    /// Offsets skipped because retention removed them before they were read.
    pub(crate) skipped: u64,
    /// Set when the pump halted (unreadable record, failed commit); cleared by `seek`.
    pub(crate) error: Option<String>,
    /// Set by the final flush of `shutdown`: from then on nothing is committed or appended
    /// to the durable DLQ (a successor may own the files already); what finishes late is
    /// redelivered after a restart.
    pub(crate) retired: bool,
    /// Set by a failed commit: nothing is committed or read any more (never cleared).
    pub(crate) poisoned: Option<CommitFailed>,
}

impl CursorState {
    /// Lowest offset not yet finished: everything below it is done.
    pub(crate) fn watermark(&self) -> u64 {
        self.pending.first().copied().unwrap_or(self.cursor)
    }
}

/// Where a durable cursor starts, and the committed position it replaced when that lay
/// beyond the stream's end.
pub(crate) struct Position {
    pub(crate) at: u64,
    pub(crate) clamped_from: Option<u64>,
}

/// The subscription a durable cursor feeds, how many of its messages may be outstanding,
/// the broker (for delayed records, R-TIME-2), and the durable itself (`Arc::new_cyclic`).
pub(crate) struct Feed {
    pub(crate) sub: Weak<SubShared>,
    pub(crate) window: usize,
    pub(crate) broker: Weak<BrokerInner>,
    pub(crate) me: Weak<Durable>,
}

pub(crate) struct Durable {
    pub(crate) name: String,
    pub(crate) stream: Arc<StreamInner>,
    pub(crate) filter: Pattern,
    pub(crate) store: OffsetStore,
    pub(crate) dlq: Log,
    pub(crate) state: Mutex<CursorState>,
    /// The pump waits here for room in the window.
    pub(crate) room: Condvar,
    pub(crate) window: usize,
    pub(crate) commit_every: usize,
    pub(crate) stop: AtomicBool,
    /// The driver's handle on this feeder (R-EXE-4); unset under the manual driver until
    /// started, and for a subscription whose start failed.
    pub(crate) feeder: OnceLock<Box<dyn FeederHandle>>,
    /// Held for one step (a pass, or the final flush), so shutdown waits for a step that
    /// is under way on a pool worker or the blocking pool.
    step: Mutex<()>,
    /// Finished messages handed over by a thread that must not block (a tokio worker):
    /// their DLQ appends and commits run in the feeder's next step.
    deferred: Mutex<Vec<Finished>>,
    /// This durable itself (the feeder's steps need an `Arc`).
    me: Weak<Durable>,
    pub(crate) broker: Weak<BrokerInner>,
    /// The subscription it feeds (for the manual driver, which pumps in `run_until_idle`).
    pub(crate) sub: Weak<SubShared>,
    /// The committed position found at open, when it lay beyond the stream's end and was
    /// clamped to the end.
    pub(crate) clamped_from: Option<u64>,
    /// Serialises drains and redrives of the durable DLQ (list, hand over, remove).
    dlq_ops: Mutex<()>,
}

impl Durable {
    /// Move the cursor and commit the new position (see [`DurableSubscription::seek`]; the
    /// admin action `Broker::seek_subscription` takes the same step).
    pub(crate) fn seek(&self, at: StartAt) -> Result<u64, StreamError> {
        let target = self.stream.resolve(at)?;
        let mut st = self.state.lock();
        if st.retired {
            return Err(StreamError::Closed);
        }
        self.commit_locked(&mut st, target)?;
        st.cursor = target;
        st.pending.clear();
        st.committed = target;
        st.since_commit = 0;
        st.error = None;
        drop(st);
        self.room.notify_all();
        self.wake_feeder();
        Ok(target)
    }

    pub(crate) fn new(
        name: String,
        stream: Arc<StreamInner>,
        filter: Pattern,
        store: OffsetStore,
        dlq: Log,
        position: Position,
        feed: Feed,
    ) -> Self {
        let Position {
            at: position,
            clamped_from,
        } = position;
        let Feed {
            sub,
            window,
            broker,
            me,
        } = feed;
        let commit_every = stream.commit_every;
        Self {
            name,
            stream,
            filter,
            store,
            dlq,
            state: Mutex::new(CursorState {
                cursor: position,
                pending: BTreeSet::new(),
                committed: position,
                since_commit: 0,
                skipped: 0,
                error: None,
                retired: false,
                poisoned: None,
            }),
            room: Condvar::new(),
            window,
            commit_every,
            stop: AtomicBool::new(false),
            feeder: OnceLock::new(),
            step: Mutex::new(()),
            deferred: Mutex::new(Vec::new()),
            me,
            broker,
            sub,
            clamped_from,
            dlq_ops: Mutex::new(()),
        }
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    pub(crate) fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
        drop(self.state.lock());
        self.room.notify_all();
        self.wake_feeder();
    }

    /// Tell the driver this feeder may have work (an append, room freed, a seek, stop).
    pub(crate) fn wake_feeder(&self) {
        if let Some(f) = self.feeder.get() {
            f.wake();
        }
    }

    /// Stop the feeder and wait for it (its thread, or a step under way), finish what a
    /// tokio worker handed over, write the final position (abandoned messages are still
    /// pending, so they stay above it and are redelivered after a restart), then retire:
    /// no later commit, and the durable DLQ log is closed, releasing its directory lock, so
    /// the name can be subscribed again at once (R-LOG-3). Idempotent.
    pub(crate) fn shutdown(&self) {
        self.request_stop();
        if let Some(f) = self.feeder.get() {
            f.join();
        }
        let _step = self.step.lock();
        self.finish_deferred();
        let mut st = self.state.lock();
        self.flush_locked(&mut st);
        st.retired = true;
        if let Err(e) = self.dlq.close() {
            tracing::error!("tidings: durable {} closing its DLQ log: {e}", self.name);
        }
    }

    /// Write the watermark if it moved (never once retired or poisoned).
    pub(crate) fn flush_locked(&self, st: &mut CursorState) {
        if st.retired || st.poisoned.is_some() {
            return;
        }
        let wm = st.watermark();
        if wm == st.committed {
            st.since_commit = 0;
            return;
        }
        if let Err(e) = self.commit_locked(st, wm) {
            tracing::error!("tidings: durable {}: {e}", self.name);
        }
    }

    /// Write `position`; a failure poisons the cursor (never retried: after a failed fsync
    /// the file's state is unknown).
    pub(crate) fn commit_locked(
        &self,
        st: &mut CursorState,
        position: u64,
    ) -> Result<(), StreamError> {
        if let Some(p) = &st.poisoned {
            return Err(p.clone().into());
        }
        match self.store.store(position) {
            Ok(()) => {
                st.committed = position;
                st.since_commit = 0;
                Ok(())
            }
            Err(e) => {
                let failed = CommitFailed {
                    path: self.store.path().to_path_buf(),
                    position,
                    reason: e.to_string(),
                };
                st.error = Some(failed.to_string());
                st.poisoned = Some(failed.clone());
                Err(failed.into())
            }
        }
    }

    pub(crate) fn halt(&self, e: StreamError) {
        tracing::error!("tidings: durable {} halted: {e}", self.name);
        self.state.lock().error = Some(e.to_string());
    }

    /// `offset` finished (delivered, dead-lettered durably, or filtered).
    pub(crate) fn finish(&self, offset: u64) {
        let mut st = self.state.lock();
        if st.pending.remove(&offset) {
            st.since_commit += 1;
            if st.since_commit >= self.commit_every {
                self.flush_locked(&mut st);
            }
        }
        drop(st);
        self.room.notify_all();
    }

    /// One bounded pass of the feeder (pool, tokio and manual drivers): finish what was
    /// handed over, then read and offer what the window has room for; an idle feeder
    /// writes the commit position if it moved.
    pub(crate) fn step_once(&self) -> FeedStep {
        if self.feeder.get().is_none() {
            return FeedStep::Idle; // started, but not yet handed its handle: woken then
        }
        let _step = self.step.lock();
        self.finish_deferred();
        let (Some(d), Some(sub)) = (self.me.upgrade(), self.sub.upgrade()) else {
            return FeedStep::Stopped;
        };
        match pump::pump_once(&d, &sub, &self.broker) {
            Pumped::Progress => FeedStep::Again,
            Pumped::Stopped => FeedStep::Stopped,
            // Woken when room is freed (a completion) or the halt is cleared (a seek).
            Pumped::NoRoom | Pumped::QueueFull => FeedStep::Idle,
            Pumped::NoRecords(_) => {
                // Idle at the end of the stream: write the position if it moved; woken
                // by the next append.
                self.flush_locked(&mut self.state.lock());
                FeedStep::Idle
            }
        }
    }

    /// The completion hook (runs on a dispatcher thread, outside the subscription lock).
    /// Where that thread must not block (tokio), the items go to the feeder's next step.
    /// Either way the feeder is woken: room may have been freed in its window or queue.
    pub(crate) fn on_finished(&self, items: Vec<Finished>) {
        if self.feeder.get().is_some_and(|f| f.defers_io()) {
            self.deferred.lock().extend(items);
        } else {
            self.finish_items(items);
            self.room.notify_all();
        }
        self.wake_feeder();
    }

    /// Finish what a non-blocking thread handed over (see `on_finished`).
    fn finish_deferred(&self) {
        let items = std::mem::take(&mut *self.deferred.lock());
        if !items.is_empty() {
            self.finish_items(items);
        }
    }

    /// Append dead letters to the durable DLQ, then finish the offsets.
    fn finish_items(&self, items: Vec<Finished>) {
        for f in items {
            let Some(offset) = f.message.log_offset else {
                continue;
            };
            if self.state.lock().retired {
                // Finished after the handle was dropped: not committed, redelivered later.
                continue;
            }
            if let Some((reason, attempts)) = &f.dead_letter
                && let Err(e) = self.append_dlq(&f.message, reason, *attempts, offset)
            {
                // Not durable in the DLQ: never commit past it (redelivered after restart).
                tracing::error!("tidings: durable {} DLQ append failed: {e}", self.name);
                self.state.lock().error = Some(e.to_string());
                continue;
            }
            self.finish(offset);
        }
    }

    /// The live entries of the durable DLQ with their DLQ offsets, oldest first: the log
    /// replayed, removed entries left out.
    fn dlq_entries(&self) -> Result<Vec<(u64, DurableDeadLetter)>, StreamError> {
        let log = &self.dlq;
        let dir = log.dir().to_path_buf();
        let mut entries = std::collections::BTreeMap::new();
        let mut from = log.start_offset();
        loop {
            let recs = log.read(from, 256).map_err(|source| StreamError::Read {
                dir: dir.clone(),
                source,
            })?;
            if recs.is_empty() {
                return Ok(entries.into_iter().collect());
            }
            for r in recs {
                let at = r.offset;
                from = at + 1;
                let record = dlq_record::decode_any(r).map_err(|reason| StreamError::Decode {
                    dir: dir.clone(),
                    offset: at,
                    reason,
                })?;
                match record {
                    dlq_record::DlqRecord::Entry(message, meta) => {
                        entries.insert(
                            at,
                            DurableDeadLetter {
                                message: *message,
                                reason: meta.reason,
                                attempts: meta.attempts,
                            },
                        );
                    }
                    dlq_record::DlqRecord::Removed(gone) => {
                        for g in gone {
                            entries.remove(&g);
                        }
                    }
                }
            }
        }
    }

    /// Durably record that the entries at these DLQ offsets left the DLQ.
    fn remove_dlq(&self, offsets: &[u64]) -> Result<(), StreamError> {
        self.dlq
            .append(&dlq_record::encode_removal(offsets))
            .map(drop)
            .map_err(|source| StreamError::Append {
                dir: self.dlq.dir().to_path_buf(),
                source,
            })
    }

    fn append_dlq(
        &self,
        message: &Message,
        reason: &DeadLetterReason,
        attempts: u32,
        offset: u64,
    ) -> Result<u64, StreamError> {
        let rec = dlq_record::encode(message, reason, attempts, offset);
        self.dlq.append(&rec).map_err(|source| StreamError::Append {
            dir: self.dlq.dir().to_path_buf(),
            source,
        })
    }
}

impl Feeder for Durable {
    fn name(&self) -> String {
        format!("tidings-pump-{}", self.name)
    }
    fn step(&self) -> FeedStep {
        self.step_once()
    }
    fn run(&self) {
        if let (Some(d), Some(sub)) = (self.me.upgrade(), self.sub.upgrade()) {
            pump::run(d, sub, self.broker.clone());
        }
    }
}

/// An entry of a durable subscription's dead-letter log.
#[derive(Debug, Clone)]
pub struct DurableDeadLetter {
    /// The message (its [`Message::offset`] is its offset in the stream).
    pub message: Message,
    /// The reason, as [`DeadLetterReason`]'s display text.
    pub reason: String,
    /// Handler attempts made.
    pub attempts: u32,
}

/// A durable subscription (R-LOG-3): a cursor over a stream feeding an ordinary
/// [`Subscription`] (it derefs to it: stats, in-memory DLQ, redrive).
///
/// # Delivery
/// At-least-once across restarts. The position committed is the lowest offset not yet
/// finished (delivered, or dead-lettered and appended to the durable DLQ log); after a
/// crash the messages redelivered are exactly those finished above the last committed
/// position. Messages abandoned at close are never committed.
///
/// # Backpressure
/// At most `capacity` messages are outstanding; beyond that the subscription only lags
/// ([`DurableSubscription::lag`], R-BP-2, R-BP-3).
///
/// # Closing
/// Dropping the handle stops the pump, writes the position and unsubscribes.
pub struct DurableSubscription {
    pub(crate) sub: Subscription,
    pub(crate) durable: Arc<Durable>,
    pub(crate) stream_name: String,
    pub(crate) broker: Weak<BrokerInner>,
}

impl DurableSubscription {
    /// The underlying subscription.
    pub fn subscription(&self) -> &Subscription {
        &self.sub
    }
    /// The durable name (the key of its committed position).
    #[must_use]
    pub fn durable_name(&self) -> &str {
        &self.durable.name
    }
    /// The stream it reads.
    #[must_use]
    pub fn stream(&self) -> &str {
        &self.stream_name
    }
    /// The committed position: every offset below it is finished, durably.
    #[must_use]
    pub fn committed(&self) -> u64 {
        self.durable.state.lock().committed
    }
    /// The next offset the pump will read.
    #[must_use]
    pub fn position(&self) -> u64 {
        self.durable.state.lock().cursor
    }
    /// Messages offered and not yet finished (≤ capacity).
    #[must_use]
    pub fn outstanding(&self) -> usize {
        self.durable.state.lock().pending.len()
    }
    /// Records in the stream not yet committed: `end_offset - committed` (R-BP-3).
    #[must_use]
    pub fn lag(&self) -> u64 {
        let committed = self.committed();
        self.durable
            .stream
            .log
            .end_offset()
            .saturating_sub(committed)
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
        self.durable.clamped_from
    }
    /// Offsets skipped because retention removed them before they were read.
    #[must_use]
    pub fn skipped(&self) -> u64 {
        self.durable.state.lock().skipped
    }
    /// The failed commit that poisoned this subscription's cursor, if one did (R-LOG-3):
    /// it then reads and commits nothing more; subscribe again to resume from the last
    /// position committed.
    #[must_use]
    pub fn poisoned(&self) -> Option<CommitFailed> {
        self.durable.state.lock().poisoned.clone()
    }
    /// Why the pump halted (unreadable record, failed commit or DLQ append), if it did.
    #[must_use]
    pub fn error(&self) -> Option<String> {
        self.durable.state.lock().error.clone()
    }
    /// The committed-position file, `<data_dir>/consumers/<stream>/<name>.offset`.
    #[must_use]
    pub fn offset_file(&self) -> &std::path::Path {
        self.durable.store.path()
    }
    /// Write the current position now (instead of waiting for the batch); returns it.
    ///
    /// # Errors
    /// [`StreamError::Closed`] once the broker closed; [`StreamError::Poisoned`] when this
    /// or an earlier commit failed (see [`CommitFailed`]).
    pub fn commit(&self) -> Result<u64, StreamError> {
        let mut st = self.durable.state.lock();
        if st.retired {
            return Err(StreamError::Closed);
        }
        let wm = st.watermark();
        self.durable.commit_locked(&mut st, wm)?;
        Ok(wm)
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
        self.durable.seek(at)
    }
    /// The entries of the durable dead-letter log still in it (not drained or redriven),
    /// oldest first (R-DEL-4). Survives restarts.
    ///
    /// # Errors
    /// Reading the DLQ log failed, or it holds a record tidings did not write (R-LIM-2).
    pub fn durable_dead_letters(&self) -> Result<Vec<DurableDeadLetter>, StreamError> {
        let entries = self.durable.dlq_entries()?;
        Ok(entries.into_iter().map(|(_, e)| e).collect())
    }

    /// Remove every entry from the durable dead-letter log and return them, oldest first
    /// (R-DEL-4). The removal is durable once this returns `Ok`; the in-memory DLQ of the
    /// underlying [`Subscription`] is not touched.
    ///
    /// # Errors
    /// Reading the DLQ log or appending the removal failed (then nothing was removed), or
    /// the broker closed ([`StreamError::Closed`]).
    pub fn drain_durable_dead_letters(&self) -> Result<Vec<DurableDeadLetter>, StreamError> {
        self.durable.drain_dead_letters()
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
    pub fn redrive_durable(
        &self,
        select: impl FnMut(&DurableDeadLetter) -> bool,
    ) -> Result<usize, StreamError> {
        self.durable.redrive_dead_letters(select)
    }
}

/// The durable DLQ steps, shared by [`DurableSubscription`] and the admin actions
/// (src/ops/actions.rs), so both are loss-safe and serialised the same way.
impl Durable {
    /// See [`DurableSubscription::drain_durable_dead_letters`].
    pub(crate) fn drain_dead_letters(&self) -> Result<Vec<DurableDeadLetter>, StreamError> {
        let _ops = self.dlq_ops.lock();
        self.check_open()?;
        let entries = self.dlq_entries()?;
        let offsets: Vec<u64> = entries.iter().map(|(at, _)| *at).collect();
        if !offsets.is_empty() {
            self.remove_dlq(&offsets)?;
        }
        Ok(entries.into_iter().map(|(_, e)| e).collect())
    }

    /// See [`DurableSubscription::redrive_durable`].
    pub(crate) fn redrive_dead_letters(
        &self,
        mut select: impl FnMut(&DurableDeadLetter) -> bool,
    ) -> Result<usize, StreamError> {
        let _ops = self.dlq_ops.lock();
        self.check_open()?;
        let stream = &self.stream;
        let append_error = |source| StreamError::Append {
            dir: stream.dir.clone(),
            source,
        };
        let mut done = Vec::new();
        let mut failure = None;
        for (at, e) in self.dlq_entries()? {
            if !select(&e) {
                continue;
            }
            match stream
                .log
                .append(&codec::encode_for(&e.message, &self.name))
            {
                Ok(_) => {
                    done.push(at);
                    stream.appended();
                }
                Err(source) => {
                    failure = Some(append_error(source));
                    break;
                }
            }
        }
        if !done.is_empty() {
            stream.log.sync().map_err(append_error)?;
            self.remove_dlq(&done)?;
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(done.len()),
        }
    }

    /// The live entries of the durable DLQ, oldest first (admin pages, src/ops).
    pub(crate) fn dead_letters(&self) -> Result<Vec<DurableDeadLetter>, StreamError> {
        Ok(self.dlq_entries()?.into_iter().map(|(_, e)| e).collect())
    }

    fn check_open(&self) -> Result<(), StreamError> {
        if self.state.lock().retired {
            return Err(StreamError::Closed);
        }
        Ok(())
    }
}

impl Deref for DurableSubscription {
    type Target = Subscription;
    fn deref(&self) -> &Subscription {
        &self.sub
    }
}

impl Drop for DurableSubscription {
    fn drop(&mut self) {
        self.durable.shutdown();
        if let Some(b) = self.broker.upgrade() {
            let key = (self.stream_name.clone(), self.durable.name.clone());
            let mut map = b.streams.durables.lock();
            if map
                .get(&key)
                .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&self.durable)))
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
            .field("name", &self.durable.name)
            .field("stream", &self.stream_name)
            .field("committed", &self.committed())
            .finish()
    }
}
