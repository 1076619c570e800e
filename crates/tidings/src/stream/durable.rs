//! A durable subscription: cursor state, commit rule, durable DLQ, and the user's handle
//! (R-LOG-3, R-LOG-4, R-BP-2, R-BP-3).

use std::collections::BTreeSet;
use std::fmt;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};
use tidings_log::{Log, Record, StoredRecord};

use crate::broker::BrokerInner;
use crate::dlq::DeadLetterReason;
use crate::message::Message;
use crate::subscription::Subscription;
use crate::subscription::shared::{Finished, SubShared};
use crate::topic::Pattern;

use super::StreamInner;
use super::codec;
use super::commit::OffsetStore;
use super::config::StartAt;
use super::error::StreamError;

/// Header carrying the dead-letter reason in a durable DLQ record.
const DLQ_REASON: &str = "tidings-dlq-reason";
/// Header carrying the attempt count in a durable DLQ record.
const DLQ_ATTEMPTS: &str = "tidings-dlq-attempts";
/// Header carrying the original stream offset in a durable DLQ record.
const DLQ_OFFSET: &str = "tidings-dlq-offset";

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
}

impl CursorState {
    /// Lowest offset not yet finished: everything below it is done.
    pub(crate) fn watermark(&self) -> u64 {
        self.pending.first().copied().unwrap_or(self.cursor)
    }
}

/// The subscription a durable cursor feeds, and how many of its messages may be outstanding.
pub(crate) struct Feed {
    pub(crate) sub: Weak<SubShared>,
    pub(crate) window: usize,
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
    pub(crate) pump: Mutex<Option<JoinHandle<()>>>,
    /// The subscription it feeds (for the manual driver, which pumps in `run_until_idle`).
    pub(crate) sub: Weak<SubShared>,
}

impl Durable {
    pub(crate) fn new(
        name: String,
        stream: Arc<StreamInner>,
        filter: Pattern,
        store: OffsetStore,
        dlq: Log,
        position: u64,
        feed: Feed,
    ) -> Self {
        let Feed { sub, window } = feed;
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
            }),
            room: Condvar::new(),
            window,
            commit_every,
            stop: AtomicBool::new(false),
            pump: Mutex::new(None),
            sub,
        }
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    pub(crate) fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
        drop(self.state.lock());
        self.room.notify_all();
    }

    /// Stop and join the pump, then write the final position (abandoned messages are still
    /// pending, so they stay above it and are redelivered after a restart).
    pub(crate) fn shutdown(&self) {
        self.request_stop();
        if let Some(h) = self.pump.lock().take()
            && h.thread().id() != std::thread::current().id()
        {
            let _ = h.join();
        }
        self.flush_locked(&mut self.state.lock());
    }

    /// Write the watermark if it moved.
    pub(crate) fn flush_locked(&self, st: &mut CursorState) {
        let wm = st.watermark();
        if wm == st.committed {
            st.since_commit = 0;
            return;
        }
        match self.store.store(wm) {
            Ok(()) => {
                st.committed = wm;
                st.since_commit = 0;
            }
            Err(e) => {
                tracing::error!("tidings: durable {} could not commit: {e}", self.name);
                st.error = Some(e.to_string());
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

    /// The completion hook (runs on a dispatcher thread, outside the subscription lock).
    pub(crate) fn on_finished(&self, items: Vec<Finished>) {
        for f in items {
            let Some(offset) = f.message.log_offset else {
                continue;
            };
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

    fn append_dlq(
        &self,
        message: &Message,
        reason: &DeadLetterReason,
        attempts: u32,
        offset: u64,
    ) -> Result<u64, StreamError> {
        let mut rec = codec::encode(message);
        rec.headers
            .push((DLQ_REASON.into(), reason.to_string().into_bytes().into()));
        rec.headers.push((
            DLQ_ATTEMPTS.into(),
            attempts.to_string().into_bytes().into(),
        ));
        rec.headers
            .push((DLQ_OFFSET.into(), offset.to_string().into_bytes().into()));
        self.dlq.append(&rec).map_err(|source| StreamError::Append {
            dir: self.dlq.dir().to_path_buf(),
            source,
        })
    }
}

/// Decode one record of a durable dead-letter log (also used by the offline tools).
pub(crate) fn decode_dead_letter(r: StoredRecord) -> Result<DurableDeadLetter, &'static str> {
    let mut message = codec::decode(r)?;
    let reason = message.header(DLQ_REASON).unwrap_or_default().to_owned();
    let attempts = message
        .header(DLQ_ATTEMPTS)
        .and_then(|a| a.parse().ok())
        .unwrap_or(0);
    message.log_offset = message.header(DLQ_OFFSET).and_then(|o| o.parse().ok());
    Ok(DurableDeadLetter {
        message,
        reason,
        attempts,
    })
}

/// The stream record that redrives a durable dead-letter record: the original message
/// without the dead-letter metadata (used by the offline tools).
pub(crate) fn redrive_record(r: &StoredRecord) -> Record {
    let mut rec = r.to_record();
    for name in [DLQ_OFFSET, DLQ_ATTEMPTS, DLQ_REASON] {
        if rec.headers.last().is_some_and(|(k, _)| k == name) {
            rec.headers.pop();
        }
    }
    rec
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
    /// Offsets skipped because retention removed them before they were read.
    #[must_use]
    pub fn skipped(&self) -> u64 {
        self.durable.state.lock().skipped
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
    pub fn commit(&self) -> Result<u64, StreamError> {
        let mut st = self.durable.state.lock();
        let wm = st.watermark();
        self.durable.store.store(wm)?;
        st.committed = wm;
        st.since_commit = 0;
        Ok(wm)
    }
    /// Move the cursor (R-LOG-4) and commit the new position at once; returns it. Messages
    /// already queued are still delivered but no longer hold the position back. Clears a
    /// halt.
    ///
    /// # Errors
    /// [`StreamError::OutOfRetention`] / [`StreamError::BeyondEnd`] for an offset outside the
    /// stream; nothing changes then.
    pub fn seek(&self, at: StartAt) -> Result<u64, StreamError> {
        let target = self.durable.stream.resolve(at)?;
        let mut st = self.durable.state.lock();
        self.durable.store.store(target)?;
        st.cursor = target;
        st.pending.clear();
        st.committed = target;
        st.since_commit = 0;
        st.error = None;
        drop(st);
        self.durable.room.notify_all();
        Ok(target)
    }
    /// Every entry of the durable dead-letter log, oldest first.
    pub fn durable_dead_letters(&self) -> Result<Vec<DurableDeadLetter>, StreamError> {
        let log = &self.durable.dlq;
        let dir = log.dir().to_path_buf();
        let removed = super::offline::Removed::load(&dir)?;
        let mut out = Vec::new();
        let mut from = log.start_offset();
        loop {
            let recs = log.read(from, 256).map_err(|source| StreamError::Read {
                dir: dir.clone(),
                source,
            })?;
            if recs.is_empty() {
                return Ok(out);
            }
            for r in recs {
                let offset = r.offset;
                from = offset + 1;
                if removed.contains(offset) {
                    continue;
                }
                out.push(decode_dead_letter(r).map_err(|reason| StreamError::Decode {
                    dir: dir.clone(),
                    offset,
                    reason,
                })?);
            }
        }
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
