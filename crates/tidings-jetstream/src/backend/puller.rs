//! The standing pull of one cursor: a task on the backend's runtime keeps a local buffer
//! filled within the subscription's window, so [`BackendCursor::fetch`] hands out what
//! is already here without a round trip.
//!
//! # How it pulls
//! One pull request is in flight at a time (the `pulling` lock), each a *no-wait* request
//! for what the window has room for (at most [`MAX_PULL`]): the server answers at once
//! with what it has for this consumer and then ends the request. Deliveries go into the
//! buffer as they arrive, which is put in stream order when the request ends (the server
//! redelivers in its own order), and the first one into an empty buffer wakes the feeder. They are decoded and re-checked against the stream's
//! patterns when handed out, on the fetching thread: this runtime thread also runs the
//! connection and the acknowledgements, so the work is spread over two (a returned
//! message, rare, is decoded here). The task
//! pulls again while the last request came back full and the window has room (at least a
//! quarter of it, or the buffer ran empty), and otherwise waits for a nudge: a publish
//! on the stream's subjects seen by the cursor's watch, an append through this backend, a
//! finish or a fetch that freed room, the watch's idle tick.
//!
//! # Why no waiting pull
//! A pull that waits at the server (`expires`, heartbeats) would save the idle requests,
//! but it breaks a promise the manual driver's callers rely on: *a fetch sees everything
//! stored before it*. With a waiting request parked at the server, a record stored just
//! before a fetch may be on its way to the buffer, or still unsent, or handed to a later
//! request that overtook the parked one; the fetch cannot tell "nothing yet" from "nothing
//! there", so it would answer empty and the manual driver would call the subscription
//! idle with a record stored. A no-wait request has a definite end: when its answer is
//! in, everything the server had for this consumer when it handled the request (up to the
//! batch size) is in the buffer. So a fetch that finds the buffer empty takes the
//! `pulling` lock (waiting out a request in flight, whose deliveries land in the buffer
//! first), and if the buffer is still empty makes one no-wait pull itself: an empty answer
//! then truly means nothing stored before the fetch is left for this consumer.
//!
//! # Bounds
//! The buffer and the messages handed out together stay within the window the feeder
//! asked for, so one process never holds more of a shared consumer than its window. While
//! a returned message waits in the buffer or is handed out alone (see the cursor's
//! "Handler starts, not fetches, count"), nothing more is pulled in the background.
//! Buffered messages are held like handed-out ones: kept alive, nak'ed at close.
//!
//! # Records the client cannot read
//! A pull during which the receiving connection dropped and came back (or that ended with
//! an error) may have met a record whose header block the client library refuses: the
//! consumer's unfinished range is then screened through the stream's message-get API and
//! such records are dead-lettered `Rejected` and terminated (see [`unreadable`]).
//!
//! # Keyed partitions
//! A keyed group's partition cursor pulls in the background only while its lease admits
//! (`CursorShared::admitted`), so a process whose lease lapsed takes nothing from the new
//! owner. While its new owner *gathers* what the last owner left, returned messages do
//! not stop the pull and nothing is handed out: the buffer fills (within the window) until
//! the partition cursor sees every unfinished delivery back, then goes out in stream
//! order.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use futures_util::StreamExt;
use tidings::{DeadLetterReason, Message, MessageId, MessageParts, Pattern, Topic};

use super::acker::Acker;
use super::cursor_state::{CursorShared, Inner};
use super::dead_letters::DeadLetters;
use super::shared::Settings;
use super::unreadable::{self, RawRecord, SCREEN_BATCH, subject_matches};
use crate::client::delivery::{Delivery, Finish};
use crate::client::durable::Durable;
use crate::codec::{self, Stored, TARGET};
use crate::connection::connect::JetStream;
use crate::error::FetchError;
use crate::names::strip_namespaces;

/// Most messages asked for in one pull request.
pub(crate) const MAX_PULL: usize = 512;

/// The standing pull of one cursor (see the [module docs](self)).
pub(crate) struct Puller {
    cursor: Arc<CursorShared>,
    durable: Mutex<Arc<Durable>>,
    dlq: DeadLetters,
    settings: Settings,
    patterns: Arc<Vec<Pattern>>,
    acker: Acker,
    window: usize,
    /// Held by whoever pulls (the task, a fetch that found the buffer empty) and by a seek
    /// or close that must know no pull is in flight.
    pulling: tokio::sync::Mutex<()>,
    /// The main connection: reads and terminates records the client cannot read.
    main: JetStream,
    /// How far the consumer's range was screened for such records.
    screened: Mutex<Screened>,
}

/// How far a consumer's range was screened for records the client cannot read.
#[derive(Debug, Default)]
struct Screened {
    /// Every sequence up to this one was read and found readable, or dealt with.
    through: u64,
    /// Found unreadable and not yet terminated (a failure): tried again at the next screen,
    /// each with whether its dead letter is stored already (so it is not stored twice).
    again: BTreeMap<u64, bool>,
}

/// What one pull request brought.
#[derive(Debug, Default)]
pub(crate) struct Pulled {
    /// Deliveries received (whatever became of them).
    pub(crate) received: usize,
    /// The consumer is not on the server (for now: a seek elsewhere recreates it).
    pub(crate) gone: bool,
}

impl Puller {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        cursor: Arc<CursorShared>,
        durable: Durable,
        dlq: DeadLetters,
        settings: Settings,
        patterns: Arc<Vec<Pattern>>,
        acker: Acker,
        window: usize,
        main: JetStream,
    ) -> Self {
        Self {
            cursor,
            durable: Mutex::new(Arc::new(durable)),
            dlq,
            settings,
            patterns,
            acker,
            window: window.max(1),
            pulling: tokio::sync::Mutex::new(()),
            main,
            screened: Mutex::new(Screened::default()),
        }
    }

    /// The consumer pulled from.
    pub(crate) fn durable(&self) -> Arc<Durable> {
        Arc::clone(
            &self
                .durable
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Pulls from `durable` from now on (a seek recreated the consumer); call with the
    /// `pulling` lock held.
    pub(crate) fn replace_durable(&self, durable: Durable) {
        *self
            .durable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(durable);
        // A new consumer hands out its range afresh.
        *self.screened() = Screened::default();
    }

    fn screened(&self) -> std::sync::MutexGuard<'_, Screened> {
        self.screened
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits until no pull is in flight and keeps it so while the guard lives.
    pub(crate) async fn exclusive(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.pulling.lock().await
    }

    /// What a fetch that found the buffer empty does: after any pull in flight answered,
    /// one no-wait pull of up to `max` when the buffer is still empty.
    ///
    /// # Errors
    /// The pull failed ([`FetchError::Unavailable`]); retried at the next wake.
    pub(crate) async fn pull_if_empty(&self, max: usize) -> Result<Pulled, FetchError> {
        let _pulling = self.pulling.lock().await;
        if !self.cursor.lock().buffer.is_empty() {
            return Ok(Pulled::default());
        }
        self.pull_locked(max.clamp(1, MAX_PULL)).await
    }

    /// Waits out a pull in flight. Called once the pulls' lease stopped admitting: every
    /// later pull re-checks it under the same lock, so none starts after this returns and
    /// nothing more lands in the buffer.
    pub(crate) async fn quiesce(&self) {
        drop(self.pulling.lock().await);
    }

    /// How many to pull in the background now (0: none).
    fn want(&self) -> usize {
        if self.cursor.is_closed() || !self.cursor.admitted() {
            return 0;
        }
        let g = self.cursor.lock();
        if g.error.is_some() || g.gone_since.is_some() {
            return 0;
        }
        // A returned message goes out alone (see the cursor's docs), so nothing more is
        // taken while one waits; except while gathering, when everything the last owner
        // left must come in before anything goes out.
        if !g.gathering && (g.alone.is_some() || g.buffer.iter().any(|(_, _, r)| *r)) {
            return 0;
        }
        let room = room(
            g.gathering,
            self.window,
            g.outstanding.len() + g.buffer.len(),
        );
        let worth = (self.window / 4).clamp(1, MAX_PULL);
        if room == 0 || room < worth && !g.buffer.is_empty() {
            return 0;
        }
        room.min(MAX_PULL)
    }

    /// The background task: pulls while there is room and the server has more, then
    /// waits for a nudge. Runs until aborted (the cursor closes).
    pub(crate) async fn run(self: Arc<Self>) {
        loop {
            self.cursor.nudged().await;
            loop {
                if self.want() == 0 {
                    break;
                }
                let _pulling = self.pulling.lock().await;
                let want = self.want();
                if want == 0 {
                    break;
                }
                match self.pull_locked(want).await {
                    Ok(p) if !p.gone && p.received >= want => {}
                    Ok(_) => break,
                    Err(e) => {
                        // Retried at the next nudge (the watch's tick at the latest); the
                        // client reconnects by itself.
                        self.cursor.lock().transient = Some(e.to_string());
                        break;
                    }
                }
            }
        }
    }

    /// One no-wait pull of up to `max`, its deliveries into the buffer; call with the
    /// `pulling` lock held.
    async fn pull_locked(&self, max: usize) -> Result<Pulled, FetchError> {
        let mut pulled = Pulled::default();
        if self.cursor.is_closed() {
            return Ok(pulled);
        }
        // Until every delivery of this pull is in the buffer (dropped on return).
        let _in_flight = self.cursor.pull_begins();
        let durable = self.durable();
        let unavailable = |detail: String| FetchError::Unavailable { detail };
        // A change says the receiving connection dropped during the pull: perhaps on a
        // record the client cannot read (module docs).
        let connects = durable.js.connects();
        let sent = std::time::Instant::now();
        let mut batch = durable
            .consumer
            .fetch()
            .max_messages(max)
            .messages()
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        // The server ends a no-wait request itself; the bound only guards against a
        // connection that went silent.
        let bound = durable.js.request_timeout;
        let mut failed = None;
        loop {
            match tokio::time::timeout(bound, batch.next()).await {
                Err(_) => {
                    if pulled.received == 0 {
                        failed = Some(unavailable(format!(
                            "no answer to the pull within {bound:?}"
                        )));
                    }
                    break;
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    match durable.pull_failed(e.to_string()).await {
                        FetchError::ConsumerGone { .. } => pulled.gone = true,
                        other if pulled.received == 0 => failed = Some(other),
                        _ => {}
                    }
                    break;
                }
                Ok(Some(Ok(m))) => {
                    pulled.received += 1;
                    self.receive(&durable, m).await;
                }
            }
        }
        drop(batch);
        if !pulled.gone && (failed.is_some() || durable.js.connects() != connects) {
            self.screen(&durable).await;
        }
        if let Some(e) = failed {
            return Err(e);
        }
        {
            let mut g = self.cursor.lock();
            g.transient = None;
            g.pulled = g.pulled.max(Some(sent));
            // The server redelivers in its own order, not the stream's: what waits goes
            // out in stream order (a keyed partition's new owner relies on it). Nearly
            // sorted already, so this is a linear pass.
            g.buffer
                .make_contiguous()
                .sort_by_key(|(d, _, _)| d.sequence());
        }
        Ok(pulled)
    }

    /// Screens the consumer's unfinished range for records the client cannot read, at most
    /// [`SCREEN_BATCH`] not screened before, and dead-letters and terminates each one found
    /// (see [`unreadable`]). A failure is noted as transient and tried at the next screen.
    async fn screen(&self, durable: &Durable) {
        let Ok(info) = durable.info().await else {
            return;
        };
        let floor = info.ack_floor.stream_sequence;
        let last = info.delivered.stream_sequence;
        let (from, again) = {
            let mut s = self.screened();
            s.again.retain(|&seq, _| seq > floor);
            (s.through.max(floor) + 1, s.again.clone())
        };
        let to = last.min(from.saturating_add(SCREEN_BATCH - 1));
        // Held here: the client read them.
        let held: HashSet<u64> = self.cursor.held().iter().map(|d| d.sequence()).collect();
        let filters = durable.spec.settings().filter_subjects;
        let stream = &durable.spec.stream;
        let fresh_range = (from..=to).map(|seq| (seq, false));
        for (seq, stored) in again.into_iter().chain(fresh_range) {
            let fresh = seq >= from;
            if !held.contains(&seq) {
                let record = match unreadable::read(&self.main, stream, seq).await {
                    Ok(record) => record,
                    Err(e) => {
                        self.cursor.lock().transient =
                            Some(format!("screening record {seq} of {stream}: {e}"));
                        return;
                    }
                };
                if let Some(record) = record
                    && filters.iter().any(|f| subject_matches(f, &record.subject))
                    && let Some(why) = unreadable::unreadable(&record.header)
                {
                    let outcome = self
                        .reject_unreadable(durable, seq, &record, why, stored)
                        .await;
                    let mut s = self.screened();
                    match outcome {
                        Rejected::Done => s.again.remove(&seq),
                        Rejected::Stored => s.again.insert(seq, true),
                        Rejected::Failed => s.again.insert(seq, stored),
                    };
                }
            }
            if fresh {
                let mut s = self.screened();
                s.through = s.through.max(seq);
            }
        }
    }

    /// Dead-letters record `seq`, which the client cannot read (unless `stored` says its
    /// dead letter is stored already), then terminates it.
    async fn reject_unreadable(
        &self,
        durable: &Durable,
        seq: u64,
        record: &RawRecord,
        why: &str,
        stored: bool,
    ) -> Rejected {
        let (plain, keyed) = durable.spec.namespaces();
        let topic = strip_namespaces(&record.subject, plain, keyed);
        let Some(message) = rejected_message(
            topic,
            seq,
            record.stored,
            record.payload.clone(),
            &self.settings,
        ) else {
            return Rejected::Failed;
        };
        let reason = DeadLetterReason::Rejected {
            error: format!("record {seq} cannot be read by the NATS client: {why}"),
        };
        if !stored && let Err(e) = self.dlq.put(&message, &reason, 1).await {
            self.cursor.lock().transient =
                Some(format!("dead-lettering an unreadable record: {e}"));
            return Rejected::Failed;
        }
        // Stored in the DLQ first; only then is the original given up, confirmed.
        let stream = &durable.spec.stream;
        match unreadable::terminate(&self.main, stream, &durable.spec.durable, seq, why).await {
            Ok(()) => {
                if let Some(strays) = &mut self.cursor.lock().strays {
                    strays.terminated(seq);
                }
                self.cursor.note_skipped();
                Rejected::Done
            }
            Err(e) => {
                self.cursor.lock().transient =
                    Some(format!("terminating unreadable record {seq}: {e}"));
                Rejected::Stored
            }
        }
    }

    /// A keyed partition cursor: whether `d`'s delivery sequence shows deliveries that went
    /// elsewhere, or `d` is one of them back (see [`Strays`](super::strays::Strays)). One found stops the hand-out
    /// at once, before `d` is in the buffer: no fetch hands out `d` or what follows it
    /// until the machine ends the gathering.
    fn count_strays(&self, d: &Delivery) {
        let mut g = self.cursor.lock();
        let Inner {
            strays: Some(strays),
            outstanding,
            buffer,
            gathering,
            ..
        } = &mut *g
        else {
            return;
        };
        let seq = d.sequence();
        let held =
            || outstanding.contains_key(&seq) || buffer.iter().any(|(b, _, _)| b.sequence() == seq);
        if strays.received(d.delivery_sequence, seq, d.delivered, held) {
            *gathering = true;
        }
    }

    /// One delivery into the buffer, or finished here (see [`Taken`]).
    async fn receive(&self, durable: &Durable, m: async_nats::jetstream::Message) {
        let Ok(d) = Delivery::new(m, durable.js.request_timeout, durable.spec.namespaces()) else {
            // No JetStream metadata: not a delivery of this consumer's (it cannot be
            // acknowledged either).
            return;
        };
        self.count_strays(&d);
        match Topic::new(d.topic()) {
            Err(e) => {
                // In the subscription's subject namespace, but not a tidings topic: a
                // foreign producer's record, dead-lettered with the reason (R-DEL-6).
                let why = codec::DecodeError {
                    sequence: d.sequence(),
                    header: None,
                    reason: format!("subject: {e}"),
                };
                reject(&self.cursor, &self.dlq, &self.settings, &d, &why).await;
                return;
            }
            Ok(t) if !durable.spec.pattern.matches(&t) => {
                // The server's filter is a superset of the subscription's pattern: not this
                // subscription's, finished so it is not delivered again.
                self.acker.send(Arc::new(d), Finish::Ack);
                self.cursor.note_skipped();
                return;
            }
            Ok(_) => {}
        }
        let (d, m, returned) = match take(
            &self.cursor,
            &self.dlq,
            &self.acker,
            &self.settings,
            &self.patterns,
            d,
        )
        .await
        {
            Taken::Out(d) => (d, None, false),
            Taken::Returned(d, m) => (d, Some(*m), true),
            Taken::Done => return,
        };
        let was_empty = {
            let mut g = self.cursor.lock();
            let was_empty = g.buffer.is_empty();
            g.buffer.push_back((d, m, returned));
            was_empty
        };
        if was_empty {
            self.cursor.wake_feeder();
        }
    }
}

/// How far dealing with a record the client cannot read got.
enum Rejected {
    /// Dead-lettered and terminated.
    Done,
    /// Dead-lettered, not terminated (no confirmation).
    Stored,
    /// Neither.
    Failed,
}

/// What became of one delivery.
enum Taken {
    /// Hand it out (decoded then).
    Out(Arc<Delivery>),
    /// It came back unfinished: hand it out alone, when nothing else is out.
    Returned(Arc<Delivery>, Box<Message>),
    /// Skipped, dead-lettered here, or already held.
    Done,
}

/// The topic a record that does not decode is dead-lettered under when its own is not one.
const UNDECODABLE: &str = "tidings.undecodable";

/// Dead-letters a record that is not a tidings message ([`DeadLetterReason::Rejected`],
/// the reason naming the field) and terminates it. A failure leaves it to come back after
/// the ack wait.
pub(crate) async fn reject(
    cursor: &CursorShared,
    dlq: &DeadLetters,
    settings: &Settings,
    d: &Delivery,
    why: &codec::DecodeError,
) {
    let Some(message) = rejected_message(
        d.topic(),
        d.sequence(),
        d.published(),
        d.payload_bytes(),
        settings,
    ) else {
        return;
    };
    let reason = DeadLetterReason::Rejected {
        error: why.to_string(),
    };
    let stored = dlq.put(&message, &reason, 1).await;
    if let Err(e) = stored {
        cursor.lock().transient = Some(format!("dead-lettering an undecodable record: {e}"));
        return;
    }
    // Stored in the DLQ first; only then is the original given up, confirmed.
    if d.term().await.is_ok() {
        cursor.note_skipped();
    }
}

/// What the DLQ keeps of a record that is not a tidings message: its payload (none when
/// over the limits) under its topic (or [`UNDECODABLE`] when its subject is not one), its
/// id derived from its sequence, its offset that sequence.
fn rejected_message(
    topic: &str,
    seq: u64,
    stored: SystemTime,
    payload: bytes::Bytes,
    settings: &Settings,
) -> Option<Message> {
    let topic = Topic::new(topic)
        .or_else(|_| Topic::new(UNDECODABLE))
        .ok()?;
    let id = MessageId::from_u128(u128::from(seq));
    let mut parts = MessageParts::new(id, topic.clone(), stored);
    parts.payload = payload;
    parts.offset = Some(seq);
    Message::from_parts(parts, &settings.limits)
        .or_else(|_| {
            let mut parts = MessageParts::new(id, topic, stored);
            parts.offset = Some(seq);
            Message::from_parts(parts, &settings.limits)
        })
        .ok()
}

/// Takes one delivery (see [`Taken`]).
async fn take(
    cursor: &CursorShared,
    dlq: &DeadLetters,
    acker: &Acker,
    settings: &Settings,
    patterns: &[Pattern],
    d: Delivery,
) -> Taken {
    if let Some(target) = d.headers().get(TARGET)
        && target != cursor.name()
    {
        // A redrive copy for another durable subscription.
        acker.send(Arc::new(d), Finish::Ack);
        cursor.note_skipped();
        return Taken::Done;
    }
    let seq = d.sequence();
    let delivered = d.delivered();
    let d = Arc::new(d);
    {
        let mut g = cursor.lock();
        if let Some(held) = g.outstanding.get_mut(&seq) {
            // Handed out again by the server while still held here (an ack wait passed
            // despite the keep-alive): keep the newer handle, do not hand it out twice.
            *held = Arc::clone(&d);
            return Taken::Done;
        }
        if let Some(waiting) = g.buffer.iter_mut().find(|(w, _, _)| w.sequence() == seq) {
            waiting.0 = Arc::clone(&d);
            return Taken::Done;
        }
    }
    if delivered <= 1 {
        // Decoded when handed out, on the fetching thread: this runtime thread also runs
        // the connection and the acknowledgements.
        return Taken::Out(d);
    }
    let message = match decode(&d, settings) {
        Ok(m) => m,
        Err(why) => {
            // One bad record (a foreign producer's) never stops the subscription.
            reject(cursor, dlq, settings, &d, &why).await;
            return Taken::Done;
        }
    };
    if !patterns.iter().any(|p| p.matches(message.topic())) {
        // In the stream's namespace but matched by none of its patterns (R-RT-1): written
        // there by hand, never by tidings.
        acker.send(d, Finish::Ack);
        cursor.note_skipped();
        return Taken::Done;
    }
    Taken::Returned(d, Box::new(message))
}

/// How many messages a cursor with a window of `window` and `held` pulled and not
/// finished may pull now. Gathering (a keyed partition just taken over), a full batch
/// whatever is held: a pull cannot ask for redeliveries only, and a buffer full of newer
/// messages must not keep the last owner's from coming back (bounded by the gathering's
/// deadline and the server's `max_ack_pending`).
pub(crate) fn room(gathering: bool, window: usize, held: usize) -> usize {
    if gathering {
        window
    } else {
        window.saturating_sub(held)
    }
}

/// The tidings message a delivery carries.
pub(crate) fn decode(d: &Delivery, settings: &Settings) -> Result<Message, codec::DecodeError> {
    let header = |n: &str| d.headers().get(n);
    let stored = Stored {
        subject: d.topic(),
        payload: d.payload_bytes(),
        sequence: d.sequence(),
        published: d.published(),
        header: &header,
    };
    codec::decode(&stored, &settings.limits)
}
