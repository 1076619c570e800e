//! The pump: reads a stream from a durable subscription's cursor and offers matching
//! messages into the subscription's queue, keeping at most `window` outstanding (R-BP-2).
//!
//! It waits for room instead of refusing, so the queue never overflows; it waits for
//! appends with `Log::wait_for_append` (woken by appends, bounded so stop is noticed), and
//! when idle it writes the commit position if it moved.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tidings_log::ReadError;

use crate::broker::BrokerInner;
use crate::message::Message;
use crate::scheduler::Target;
use crate::subscription::shared::{FeedOffer, SubShared};

use super::codec;
use super::durable::Durable;
use super::error::StreamError;

/// Longest wait before re-checking the stop flag and flushing an idle commit.
const IDLE_WAIT: Duration = Duration::from_millis(50);
/// Most records read per batch.
const BATCH: usize = 256;

/// What offering one stream message did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Offer {
    /// Queued, or finished at once (filtered out).
    Taken,
    /// The subscription's queue has no room (a redrive or another offer took it): nothing
    /// was counted; read this offset again later.
    Full,
    /// The subscription is closed.
    Closed,
}

/// Offer one stream message; a filtered one is finished at once (nothing to deliver, so
/// nothing to redeliver).
fn offer(d: &Durable, sub: &SubShared, offset: u64, message: &Arc<Message>) -> Offer {
    match sub.offer_from_stream(message) {
        FeedOffer::Taken => Offer::Taken,
        FeedOffer::Filtered => {
            d.finish(offset);
            Offer::Taken
        }
        FeedOffer::Full => Offer::Full,
        FeedOffer::Closed => Offer::Closed,
    }
}

/// A record whose message carries a future delivery time waits in the broker's scheduler
/// (R-TIME-2), offered to this subscription alone when due; its offset stays unfinished
/// meanwhile, so the commit never passes it. False when the broker is closing.
fn hold_until_due(
    d: &Arc<Durable>,
    sub: &Arc<SubShared>,
    broker: &BrokerInner,
    due: Instant,
    offset: u64,
    message: Arc<Message>,
) -> bool {
    let (d, s) = (d.clone(), sub.clone());
    let deliver = Box::new(move |m: &Arc<Message>| {
        if offer(&d, &s, offset, m) == Offer::Full {
            // A delayed record falls due while an in-memory redrive fills the queue: the
            // scheduler cannot wait, so the ordinary offer decides (an overflow is
            // dead-lettered durably and finished, never lost).
            let _ = s.offer(m);
        }
    });
    broker.schedule_for(due, message, Target::Only(sub.id, deliver))
}

/// What one pass of the pump did.
pub(crate) enum Pumped {
    /// Read and offered (or skipped) records: call again.
    Progress,
    /// The window is full (or the pump is halted on an error): wait for room.
    NoRoom,
    /// The subscription's queue is full (an in-memory redrive shares it): wait for room.
    QueueFull,
    /// Nothing to read past `from` yet: wait for an append.
    NoRecords(u64),
    /// Stop requested, or the subscription closed.
    Stopped,
}

/// The pump thread (thread, pool and tokio drivers): passes, and between them a bounded
/// wait for room or for an append; an idle pump writes the commit position if it moved.
pub(crate) fn run(d: Arc<Durable>, sub: Arc<SubShared>, broker: Weak<BrokerInner>) {
    loop {
        match pump_once(&d, &sub, &broker) {
            Pumped::Progress => {}
            Pumped::Stopped => return,
            Pumped::NoRoom => {
                let mut st = d.state.lock();
                let blocked = st.error.is_some() || st.pending.len() >= d.window;
                if blocked && !d.stopping() && d.room.wait_for(&mut st, IDLE_WAIT).timed_out() {
                    d.flush_locked(&mut st);
                }
            }
            Pumped::QueueFull => {
                // Woken by every completion (redriven messages included), bounded anyway.
                let mut st = d.state.lock();
                if !d.stopping() && d.room.wait_for(&mut st, IDLE_WAIT).timed_out() {
                    d.flush_locked(&mut st);
                }
            }
            Pumped::NoRecords(from) => {
                d.flush_locked(&mut d.state.lock());
                d.stream.log.wait_for_append(from, IDLE_WAIT);
            }
        }
    }
}

/// One pass, never blocking: read what the window has room for from the cursor and offer
/// the records that match the filter. The manual driver calls this from `run_until_idle`.
pub(crate) fn pump_once(
    d: &Arc<Durable>,
    sub: &Arc<SubShared>,
    broker: &Weak<BrokerInner>,
) -> Pumped {
    let (from, room) = {
        let st = d.state.lock();
        if d.stopping() {
            return Pumped::Stopped;
        }
        if st.error.is_some() || st.pending.len() >= d.window {
            return Pumped::NoRoom;
        }
        (st.cursor, d.window - st.pending.len())
    };
    let records = match d.stream.log.read(from, room.min(BATCH)) {
        Ok(r) => r,
        Err(ReadError::OutOfRetention { earliest, .. }) => {
            // Retention, not memory, is the limit (R-BP-2): skip what is gone, counted.
            let mut st = d.state.lock();
            if st.cursor == from {
                st.skipped += earliest - from;
                st.cursor = earliest;
                tracing::warn!(
                    "tidings: durable {} skipped offsets {from}..{earliest} removed by retention",
                    d.name
                );
            }
            return Pumped::Progress;
        }
        Err(ReadError::BeyondEnd { .. }) => return Pumped::NoRecords(from),
        Err(e) => {
            d.halt(d.stream.read_error(e));
            return Pumped::NoRoom;
        }
    };
    if records.is_empty() {
        return Pumped::NoRecords(from);
    }
    for rec in records {
        let offset = rec.offset;
        let (message, target) = match codec::decode_targeted(rec) {
            Ok((m, target)) => (Arc::new(m), target),
            Err(reason) => {
                // Never skip what we cannot read: stop here, say why (R-LIM-2).
                d.halt(StreamError::Decode {
                    dir: d.stream.dir.clone(),
                    offset,
                    reason,
                });
                break;
            }
        };
        // A redrive copy is for one durable subscription only.
        let wanted =
            d.filter.matches(message.topic()) && target.as_ref().is_none_or(|t| *t == d.name);
        {
            let mut st = d.state.lock();
            if st.cursor != offset || d.stopping() {
                break; // a seek moved the cursor (or we are stopping): re-read.
            }
            st.cursor = offset + 1;
            if !wanted {
                continue;
            }
            st.pending.insert(offset);
        }
        let delayed = message
            .deliver_at()
            .and_then(|_| broker.upgrade())
            .and_then(|b| b.due_time(&message).map(|due| (b, due)));
        let outcome = match delayed {
            Some((b, due)) => {
                if hold_until_due(d, sub, &b, due, offset, message) {
                    Offer::Taken
                } else {
                    Offer::Closed
                }
            }
            None => offer(d, sub, offset, &message),
        };
        if outcome != Offer::Taken {
            // Not taken: read it again (after a restart, when closed).
            let mut st = d.state.lock();
            st.pending.remove(&offset);
            if st.cursor == offset + 1 {
                st.cursor = offset;
            }
            return match outcome {
                Offer::Full => Pumped::QueueFull,
                _ => Pumped::Stopped,
            };
        }
    }
    Pumped::Progress
}
