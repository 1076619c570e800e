//! One durable subscription's cursor: a durable pull consumer read by a background fetch.
//!
//! # Fetching
//! [`BackendCursor::fetch`] is one no-wait pull: the server answers at once with what it
//! has for this consumer (one round trip, bounded by the request timeout), never waiting
//! for new messages. A background task wakes the feeder when there may be more: on every
//! message published to the stream's subjects (a core NATS subscription, so appends by
//! other processes count too) and once a second (redeliveries after an ack wait). An
//! append through this backend wakes its stream's cursors at once, so a manual driver sees
//! it in its next step. Deliveries the client-side pattern re-check rejects, and redrive
//! copies meant for another durable subscription, are acknowledged and counted as skipped
//! by the filter. A failed pull (server away) returns no messages and is retried at the
//! next wake; the client reconnects by itself.
//!
//! # Finishing
//! Delivered and filtered messages are acknowledged (confirmed by the server); a dead
//! letter is stored in the DLQ stream, that store is awaited, and only then is the original
//! terminated. A message whose finish failed is dropped locally: the server hands it out
//! again after the ack wait (at-least-once).
//!
//! # Positions
//! `committed` is one past the consumer's ack floor (the stream's end once nothing is out
//! and nothing the filter takes is left), `lag` the stored offsets from the commit on, as
//! on the embedded log (messages acknowledged above the floor count until the floor
//! passes them): what other processes sharing the durable did shows too. The
//! consumer info behind them is read again after any change this process made (append,
//! finish, skip, seek, redrive) and otherwise at most every 200 ms, so the feeder's
//! per-step look at the state costs no round trip while nothing moves.
//!
//! # What is handed out
//! A record whose topic no pattern of the stream matches (a producer writing into the
//! stream's subject namespace by hand) is acknowledged and counted as skipped by the filter.
//! A record that is not a tidings message (a header that does not parse) is dead-lettered
//! [`Rejected`](DeadLetterReason::Rejected), the reason naming the header, and counted as
//! skipped: one bad record never stops the subscription.
//!
//! # Handler starts, not fetches, count (R-DEL-6)
//! The server counts a delivery for every fetch, including messages fetched ahead that no
//! handler started before their process died or closed. So the server's count is used
//! only to notice that a message came back unfinished (delivered more than once): such a
//! *returned* message is handed out alone — nothing else of this subscription is fetched
//! while it is outstanding, and it waits until nothing else is — after one durable write
//! counting the handler start (`<dlq>_s`, see the DLQ's docs). A clean close takes the
//! count back for the returned message it held. A returned message with
//! `max(max_deliveries − 1, 1)` counted starts is dead-lettered
//! [`RetriesExhausted`](DeadLetterReason::RetriesExhausted) with that many attempts plus
//! the first, uncounted one. Bound: a message that kills every process it reaches kills at
//! most `max(max_deliveries, 2)` of them; a message fetched behind it is never
//! dead-lettered for it. Messages never returned cost nothing extra.
//!
//! # Seek and close
//! [`BackendCursor::seek`] deletes the consumer and creates it again at the new start
//! (JetStream cannot move a consumer): unfinished deliveries of every process sharing it
//! are dropped. Another process sharing the name finds its pull refused while the
//! consumer is gone and rebinds to the one the seek creates (the consumer's absence is
//! read from the info request's typed error kind); only a consumer still absent after
//! [`REBIND_GRACE`] stops the cursor. [`BackendCursor::close`] nak's what this process
//! fetched and did not finish, so it is handed out again at once (to the next subscriber
//! of the name, or another process sharing it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tidings::durable::{BackendCursor, CursorSpec, CursorWaker, Finished, Outcome};
use tidings::{
    CursorState, DeadLetterReason, DurableDeadLetter, Message, MessageId, MessageParts, Pattern,
    StartAt, StreamError, Topic,
};

use super::dead_letters::DeadLetters;
use super::stream::{bounds, check_offset};
use super::{Settings, Shared, keep_alive, keyed_prefix, nats_name, subject_prefix};
use crate::classify::{js_error, seam};
use crate::client::consumer::ConsumerSpec;
use crate::client::delivery::Delivery;
use crate::client::durable::Durable;
use crate::codec::{self, Stored, TARGET};
use crate::error::FetchError;
use crate::error::JetStreamError;

#[derive(Default)]
struct Inner {
    /// Handed out and not finished, by sequence.
    outstanding: HashMap<u64, Arc<Delivery>>,
    /// Why fetching stopped (a record that is not a tidings message, a deleted consumer).
    error: Option<JetStreamError>,
    /// The last failed pull (cleared by a successful one).
    transient: Option<String>,
    /// The sequence after the last one handed out.
    handed: u64,
    /// From the first returned message of a pull on, in stream order, waiting: a returned
    /// one (`true`) goes out alone, the others once no returned one is out.
    returned: std::collections::VecDeque<(Arc<Delivery>, Message, bool)>,
    /// The returned message handed out alone and not finished: its sequence and the
    /// handler starts counted before it.
    alone: Option<(u64, u32)>,
    /// Since when the consumer is missing on the server (a seek elsewhere recreates it).
    gone_since: Option<Instant>,
    /// A keyed group's new partition owner collects what the last owner left before
    /// handing anything out: pulls only queue, in stream order (see `group::partition`).
    gathering: bool,
}

/// What the cursor and its background tasks share.
pub(crate) struct CursorShared {
    inner: Mutex<Inner>,
    waker: CursorWaker,
    name: String,
    skipped_by_filter: AtomicU64,
    keep_alives: AtomicU64,
    closed: AtomicBool,
    /// Keep-alives are sent only while this admits (a keyed group's partition lease).
    keep_alive_while: std::sync::OnceLock<Arc<dyn Fn() -> bool + Send + Sync>>,
}

impl CursorShared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data: keep going.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every delivery held: handed out and not finished, or returned and waiting.
    pub(crate) fn held(&self) -> Vec<Arc<Delivery>> {
        let g = self.lock();
        g.outstanding
            .values()
            .cloned()
            .chain(g.returned.iter().map(|(d, _, _)| Arc::clone(d)))
            .collect()
    }

    /// Whether keep-alives may be sent now (always, unless a lease says otherwise).
    pub(crate) fn may_keep_alive(&self) -> bool {
        self.keep_alive_while.get().is_none_or(|admits| admits())
    }

    pub(crate) fn note_keep_alive(&self, n: usize) {
        self.keep_alives.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Wakes the feeder (an append through this backend, say).
    pub(crate) fn wake(&self) {
        if !self.closed.load(Ordering::Acquire) {
            self.waker.wake();
        }
    }
}

struct Tasks {
    watch: tokio::task::JoinHandle<()>,
    keep_alive: tokio::task::JoinHandle<()>,
}

/// A durable subscription's cursor on JetStream (see the [module docs](self)).
pub(crate) struct JsCursor {
    shared: Arc<Shared>,
    cursor: Arc<CursorShared>,
    durable: Mutex<Arc<Durable>>,
    spec: ConsumerSpec,
    stream: String,
    /// The stream's patterns: a record none matches is skipped.
    patterns: Arc<Vec<Pattern>>,
    dlq: DeadLetters,
    tasks: Mutex<Option<Tasks>>,
    /// The last consumer info read, with the change count before it was read.
    cached: Mutex<Option<(u64, Instant, Positions)>>,
}

/// Where a consumer stands in its stream, from the server.
#[derive(Debug, Clone, Copy)]
struct Positions {
    /// Every offset below it is finished (acknowledged or terminated).
    committed: u64,
    /// The next offset the server would hand out.
    position: u64,
    /// One past the stream's last offset.
    end: u64,
}

impl Positions {
    fn new(info: &async_nats::jetstream::consumer::Info, end: u64) -> Self {
        let floor = info.ack_floor.stream_sequence + 1;
        let delivered = info.delivered.stream_sequence + 1;
        let (committed, position) = match (info.num_ack_pending, info.num_pending) {
            // Nothing out, nothing left that the filter takes: the whole stream is done
            // for this consumer (the server keeps a filtered consumer's floor at the last
            // message it delivered).
            (0, 0) => (end.max(floor), end.max(delivered)),
            // Nothing out: everything delivered is finished.
            (0, _) => (floor.max(delivered), delivered),
            _ => (floor, delivered),
        };
        Self {
            committed,
            position,
            end,
        }
    }
}

/// How long a cached consumer info may answer [`BackendCursor::state`] when this process
/// changed nothing since: what other processes sharing the stream do shows within it.
const INFO_TTL: Duration = Duration::from_millis(200);

/// How often the feeder is woken without a publish seen (redeliveries after an ack wait,
/// publishes missed while reconnecting).
const IDLE_WAKE: Duration = Duration::from_secs(1);

/// How long a cursor waits for its consumer to be there again (a seek by another process
/// deletes and recreates it) before it stops with an error.
pub(crate) const REBIND_GRACE: Duration = Duration::from_secs(10);

/// The consumer of a plain durable subscription: records of both namespaces, keyed ones
/// under any partition.
pub(crate) fn consumer_spec(
    settings: &Settings,
    stream: &str,
    name: &str,
    filter: &Pattern,
) -> ConsumerSpec {
    let (plain, keyed) = (subject_prefix(stream), keyed_prefix(stream));
    let filters = [plain.clone(), format!("{keyed}*.")];
    ConsumerSpec::new(stream, nats_name(name), filter.clone())
        .ack_wait(settings.ack_wait)
        .inactive_threshold(settings.inactive_threshold)
        .subject_prefix(plain)
        .namespaces_of(keyed, filters)
}

impl JsCursor {
    /// Opens the cursor on the JetStream stream `stream`, which captures `subjects`.
    pub(crate) fn open(
        shared: Arc<Shared>,
        stream: &str,
        subjects: Vec<String>,
        patterns: Vec<Pattern>,
        spec: CursorSpec<'_>,
    ) -> Result<Self, StreamError> {
        let cspec = consumer_spec(&shared.settings, stream, spec.name, spec.filter);
        Self::open_as(shared, stream, subjects, patterns, spec, cspec)
    }

    /// [`JsCursor::open`] on the consumer `cspec` (a keyed group's partition or unkeyed
    /// consumer); the DLQ and redrive target stay `spec.name`'s. `subjects`: what wakes it.
    pub(crate) fn open_as(
        shared: Arc<Shared>,
        stream: &str,
        subjects: Vec<String>,
        patterns: Vec<Pattern>,
        spec: CursorSpec<'_>,
        cspec: ConsumerSpec,
    ) -> Result<Self, StreamError> {
        let dlq = DeadLetters::new(shared.js.clone(), stream, spec.name, shared.settings.limits);
        let js = shared.js.clone();
        let (open_spec, d) = (cspec.clone().start(spec.start), dlq.clone());
        let durable = shared.call(shared.bound(4), async move {
            d.ensure().await?;
            js.durable(open_spec)
                .await
                .map_err(|e| seam("opening the durable consumer", e))
        })?;
        let cursor = Arc::new(CursorShared {
            inner: Mutex::new(Inner::default()),
            waker: spec.waker.clone(),
            name: spec.name.to_owned(),
            skipped_by_filter: AtomicU64::new(0),
            keep_alives: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            keep_alive_while: std::sync::OnceLock::new(),
        });
        let watch = shared
            .rt
            .spawn(watch(shared.js.clone(), subjects, Arc::clone(&cursor)));
        let keep_alive = shared.rt.spawn(keep_alive::run(
            Arc::clone(&cursor),
            shared.settings.keep_alive,
        ));
        Ok(Self {
            shared,
            cursor,
            durable: Mutex::new(Arc::new(durable)),
            spec: cspec,
            stream: stream.to_owned(),
            patterns: Arc::new(patterns),
            dlq,
            tasks: Mutex::new(Some(Tasks { watch, keep_alive })),
            cached: Mutex::new(None),
        })
    }

    /// What the stream's append path wakes.
    pub(crate) fn shared_state(&self) -> Arc<CursorShared> {
        Arc::clone(&self.cursor)
    }

    /// Send keep-alives only while `admits` (a keyed group's partition lease).
    pub(crate) fn keep_alive_while(&self, admits: Arc<dyn Fn() -> bool + Send + Sync>) {
        let _ = self.cursor.keep_alive_while.set(admits);
    }

    /// Collect (`true`): pulls only queue what they bring, in stream order, handing out
    /// nothing; `false`: hand the queue out as usual.
    pub(crate) fn set_gathering(&self, on: bool) {
        self.cursor.lock().gathering = on;
    }

    /// How many queued deliveries have a sequence of at most `seq`.
    pub(crate) fn waiting_through(&self, seq: u64) -> usize {
        let g = self.cursor.lock();
        g.returned
            .iter()
            .filter(|(d, _, _)| d.sequence() <= seq)
            .count()
    }

    /// Drop what this process holds without telling the server (a lease that lapsed:
    /// another process may hold those messages now); [`BackendCursor::close`] then naks
    /// nothing.
    pub(crate) fn forget(&self) {
        let mut g = self.cursor.lock();
        g.outstanding.clear();
        g.returned.clear();
        g.alone = None;
    }

    /// The consumer's unfinished deliveries and the last stream sequence it delivered.
    pub(crate) fn unfinished(&self) -> Result<(u64, u64), StreamError> {
        let durable = self.durable();
        self.shared.call(self.shared.bound(1), async move {
            let info = durable
                .info()
                .await
                .map_err(|e| seam("reading the durable consumer's state", e))?;
            Ok((info.num_ack_pending as u64, info.delivered.stream_sequence))
        })
    }

    fn durable(&self) -> Arc<Durable> {
        Arc::clone(
            &self
                .durable
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    fn stop_tasks(&self) {
        let old = self
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(old) = old {
            old.watch.abort();
            old.keep_alive.abort();
        }
    }

    fn info(&self) -> Result<Positions, StreamError> {
        let before = self.shared.changes();
        let durable = self.durable();
        let (js, stream) = (self.shared.js.clone(), self.stream.clone());
        let info = self.shared.call(self.shared.bound(1), async move {
            let (info, bounds) = tokio::join!(durable.info(), bounds(&js, &stream));
            let (_, end) = bounds?;
            let info = info.map_err(|e| seam("reading the durable consumer's state", e))?;
            Ok(Positions::new(&info, end))
        })?;
        *self
            .cached
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((before, Instant::now(), info));
        Ok(info)
    }

    /// The cached info when nothing changed since it was read and it is recent, else a
    /// fresh one: the feeder asks for the state at every step.
    fn recent_info(&self) -> Result<Positions, StreamError> {
        {
            let cached = self
                .cached
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some((at_change, read, info)) = &*cached
                && *at_change == self.shared.changes()
                && read.elapsed() < INFO_TTL
            {
                return Ok(*info);
            }
        }
        self.info()
    }
}

/// Wakes the feeder on every publish to `subjects` and every [`IDLE_WAKE`]; see the
/// [module docs](self).
async fn watch(js: crate::connect::JetStream, subjects: Vec<String>, cursor: Arc<CursorShared>) {
    let mut subs = Vec::new();
    for s in subjects {
        // Without the subscription the periodic wake still finds everything, later.
        if let Ok(sub) = js.client.subscribe(s).await {
            subs.push(sub);
        }
    }
    let mut published = futures_util::stream::select_all(subs);
    let mut tick = tokio::time::interval(IDLE_WAKE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            m = published.next(), if !published.is_empty() => {
                if m.is_none() {
                    published = futures_util::stream::select_all(Vec::new());
                }
            }
            _ = tick.tick() => {}
        }
        cursor.wake();
    }
}

/// What became of one delivery.
enum Taken {
    /// Hand it out.
    Out(Arc<Delivery>, Message),
    /// It came back unfinished: hand it out alone, when nothing else is out.
    Returned(Arc<Delivery>, Message),
    /// Skipped, dead-lettered here, or already held.
    Done,
}

/// The topic a record that does not decode is dead-lettered under when its own is not one.
const UNDECODABLE: &str = "tidings.undecodable";

/// Dead-letters a record that is not a tidings message ([`DeadLetterReason::Rejected`],
/// the reason naming the field) and terminates it. A failure leaves it to come back after
/// the ack wait.
async fn reject(
    cursor: &CursorShared,
    dlq: &DeadLetters,
    settings: &Settings,
    d: &Delivery,
    why: &codec::DecodeError,
) {
    let Ok(topic) = Topic::new(d.topic()).or_else(|_| Topic::new(UNDECODABLE)) else {
        return;
    };
    let id = MessageId::from_u128(u128::from(d.sequence()));
    let mut parts = MessageParts::new(id, topic.clone(), d.published());
    parts.payload = d.payload_bytes();
    parts.offset = Some(d.sequence());
    let message = Message::from_parts(parts, &settings.limits).or_else(|_| {
        let mut parts = MessageParts::new(id, topic, d.published());
        parts.offset = Some(d.sequence());
        Message::from_parts(parts, &settings.limits)
    });
    let Ok(message) = message else {
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
    if d.term().await.is_ok() {
        cursor.skipped_by_filter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Takes one delivery (see [`Taken`]); `Err` is the reason fetching must stop.
async fn take(
    cursor: &CursorShared,
    dlq: &DeadLetters,
    settings: &Settings,
    patterns: &[Pattern],
    d: Delivery,
) -> Result<Taken, JetStreamError> {
    if let Some(target) = d.headers().get(TARGET)
        && target != cursor.name
    {
        // A redrive copy for another durable subscription.
        d.ack()
            .await
            .map_err(|e| js_error("acknowledging a redrive copy for another name", e))?;
        cursor.skipped_by_filter.fetch_add(1, Ordering::Relaxed);
        return Ok(Taken::Done);
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
            return Ok(Taken::Done);
        }
        if let Some(waiting) = g.returned.iter_mut().find(|(w, _, _)| w.sequence() == seq) {
            waiting.0 = Arc::clone(&d);
            return Ok(Taken::Done);
        }
    }
    let decoded = {
        let header = |n: &str| d.headers().get(n).map(str::to_owned);
        let stored = Stored {
            subject: d.topic(),
            payload: d.payload_bytes(),
            sequence: seq,
            published: d.published(),
            header: &header,
        };
        codec::decode(&stored, &settings.limits)
    };
    let message = match decoded {
        Ok(m) => m,
        Err(why) => {
            // One bad record (a foreign producer's) never stops the subscription.
            reject(cursor, dlq, settings, &d, &why).await;
            return Ok(Taken::Done);
        }
    };
    if !patterns.iter().any(|p| p.matches(message.topic())) {
        // In the stream's namespace but matched by none of its patterns (R-RT-1): written
        // there by hand, never by tidings.
        d.ack()
            .await
            .map_err(|e| js_error("acknowledging a record no pattern matches", e))?;
        cursor.skipped_by_filter.fetch_add(1, Ordering::Relaxed);
        return Ok(Taken::Done);
    }
    if delivered > 1 {
        return Ok(Taken::Returned(d, message));
    }
    Ok(Taken::Out(d, message))
}

/// Before a returned message is handed out alone: its counted handler starts, and either
/// one more counted (`Some(before)`), or, at the limit, the message dead-lettered (`None`).
async fn count_start(
    dlq: &DeadLetters,
    settings: &Settings,
    d: &Delivery,
    m: &Message,
) -> Result<Option<u32>, StreamError> {
    let seq = d.sequence();
    let starts = dlq.starts(seq).await?;
    if starts >= settings.max_deliveries.saturating_sub(1).max(1) {
        // Started this many times alone, plus the first time, and never finished: its
        // processes died running it.
        let attempts = starts.saturating_add(1);
        let reason = DeadLetterReason::RetriesExhausted {
            attempts,
            last_error: format!(
                "its handler started {attempts} times without being finished (the \
                 processes running it stopped or lost the server)"
            ),
        };
        dlq.put(m, &reason, attempts).await?;
        d.term()
            .await
            .map_err(|e| seam("terminating a dead-lettered message", e))?;
        return Ok(None);
    }
    dlq.set_starts(seq, starts + 1).await?;
    Ok(Some(starts))
}

/// What one pull brought.
#[derive(Default)]
struct Pulled {
    out: Vec<(Arc<Delivery>, Message)>,
    returned: Vec<(Arc<Delivery>, Message, bool)>,
    /// The consumer is not on the server (for now: a seek elsewhere recreates it).
    gone: bool,
}

impl JsCursor {
    /// Hands out what waits behind a returned message: the returned one alone when nothing
    /// else is out, the others up to `max` while no returned one is out; `None` when
    /// nothing waits.
    fn fetch_returned(&self, max: usize) -> Option<Vec<Message>> {
        let (d, m) = {
            let mut g = self.cursor.lock();
            if g.alone.is_some() {
                return Some(Vec::new());
            }
            let (_, _, returned) = g.returned.front()?;
            if !returned {
                let mut out = Vec::new();
                while out.len() < max && g.returned.front().is_some_and(|(_, _, r)| !r) {
                    let (d, m, _) = g.returned.pop_front()?;
                    let seq = d.sequence();
                    g.handed = g.handed.max(seq + 1);
                    g.outstanding.insert(seq, d);
                    out.push(m);
                }
                return Some(out);
            }
            if !g.outstanding.is_empty() {
                return Some(Vec::new());
            }
            let (d, m, _) = g.returned.pop_front()?;
            (d, m)
        };
        let (dlq, settings) = (self.dlq.clone(), self.shared.settings.clone());
        let (dd, mm) = (Arc::clone(&d), m.clone());
        let counted = self.shared.call(self.shared.bound(4), async move {
            count_start(&dlq, &settings, &dd, &mm).await
        });
        self.shared.changed();
        let mut g = self.cursor.lock();
        match counted {
            Ok(Some(before)) => {
                let seq = d.sequence();
                g.alone = Some((seq, before));
                g.handed = g.handed.max(seq + 1);
                g.outstanding.insert(seq, d);
                Some(vec![m])
            }
            Ok(None) => {
                drop(g);
                self.cursor.wake();
                Some(Vec::new())
            }
            Err(e) => {
                // Server away: tried again at the next wake (kept alive meanwhile).
                g.transient = Some(e.to_string());
                g.returned.push_front((d, m, true));
                Some(Vec::new())
            }
        }
    }
}

impl BackendCursor for JsCursor {
    fn fetch(&self, max: usize) -> Result<Vec<Message>, StreamError> {
        if self.cursor.closed.load(Ordering::Acquire) {
            return Err(StreamError::Closed);
        }
        if let Some(e) = &self.cursor.lock().error {
            return Err(e.clone().into());
        }
        if max == 0 {
            return Ok(Vec::new());
        }
        let gathering = self.cursor.lock().gathering;
        if !gathering && let Some(alone) = self.fetch_returned(max) {
            return Ok(alone);
        }
        let durable = self.durable();
        let (cursor, dlq) = (Arc::clone(&self.cursor), self.dlq.clone());
        let settings = self.shared.settings.clone();
        let patterns = Arc::clone(&self.patterns);
        let bound = self
            .shared
            .bound(2 + u32::try_from(max.min(64)).unwrap_or(64));
        let pulled = self.shared.call(bound, async move {
            let pulled: Result<Pulled, JetStreamError> = async {
                let fetched = match durable.fetch(max, Duration::ZERO).await {
                    Ok(f) => f,
                    Err(FetchError::ConsumerGone { .. }) => {
                        return Ok(Pulled {
                            gone: true,
                            ..Pulled::default()
                        });
                    }
                    Err(e) => {
                        // Retried at the next wake; the client reconnects by itself.
                        cursor.lock().transient = Some(e.to_string());
                        return Ok(Pulled::default());
                    }
                };
                cursor
                    .skipped_by_filter
                    .fetch_add(fetched.skipped, Ordering::Relaxed);
                let mut pulled = Pulled::default();
                for d in fetched.deliveries {
                    match take(&cursor, &dlq, &settings, &patterns, d).await? {
                        // Stream order: nothing overtakes a returned message.
                        Taken::Out(d, m) if pulled.returned.is_empty() => pulled.out.push((d, m)),
                        Taken::Out(d, m) => pulled.returned.push((d, m, false)),
                        Taken::Returned(d, m) => pulled.returned.push((d, m, true)),
                        Taken::Done => {}
                    }
                }
                cursor.lock().transient = None;
                Ok(pulled)
            }
            .await;
            Ok(pulled)
        });
        let pulled = match pulled {
            Ok(Ok(p)) => p,
            Ok(Err(stop)) => {
                self.cursor.lock().error = Some(stop.clone());
                return Err(stop.into());
            }
            // No answer in time: nothing handed out; what the pull took comes back after
            // the ack wait.
            Err(e) => {
                self.cursor.lock().transient = Some(e.to_string());
                return Ok(Vec::new());
            }
        };
        self.shared.changed();
        let mut g = self.cursor.lock();
        if pulled.gone {
            let since = *g.gone_since.get_or_insert_with(Instant::now);
            if since.elapsed() < REBIND_GRACE {
                // A seek elsewhere deletes and recreates it: pull again at the next wake.
                g.transient = Some("the durable consumer is not on the server".to_owned());
                return Ok(Vec::new());
            }
            let stop = JetStreamError::new(
                tidings::StreamErrorKind::Unavailable,
                format_args!(
                    "the durable consumer was deleted on the server and not recreated \
                     within {REBIND_GRACE:?} (inactivity threshold, or an administrator); \
                     seek to create it again"
                ),
            );
            g.error = Some(stop.clone());
            return Err(stop.into());
        }
        g.gone_since = None;
        let handed_now = if g.gathering {
            let fresh = pulled.out.into_iter().map(|(d, m)| (d, m, false));
            g.returned.extend(fresh);
            Vec::new()
        } else {
            pulled.out
        };
        let mut out = Vec::with_capacity(handed_now.len());
        for (d, m) in handed_now {
            let seq = d.sequence();
            g.handed = g.handed.max(seq + 1);
            g.outstanding.insert(seq, d);
            out.push(m);
        }
        g.returned.extend(pulled.returned);
        // The server redelivers in its own order, not the stream's: what waits goes out in
        // stream order.
        g.returned
            .make_contiguous()
            .sort_by_key(|(d, _, _)| d.sequence());
        Ok(out)
    }

    fn finish(&self, done: &[Finished]) -> Result<(), StreamError> {
        let mut work = Vec::with_capacity(done.len());
        let mut wake = false;
        {
            let mut g = self.cursor.lock();
            for f in done {
                let Some(seq) = f.message.offset() else {
                    continue;
                };
                if g.alone.is_some_and(|(alone, _)| alone == seq) {
                    g.alone = None;
                    wake = true;
                }
                // Unknown: finished after a seek or close; the server hands it out again.
                if let Some(d) = g.outstanding.remove(&seq) {
                    work.push((d, Arc::clone(&f.message), f.outcome.clone()));
                }
            }
        }
        if work.is_empty() {
            return Ok(());
        }
        let dlq = self.dlq.clone();
        let bound = self
            .shared
            .bound(2 * u32::try_from(work.len()).unwrap_or(u32::MAX / 2));
        let result = self.shared.call(bound, async move {
            let mut acks = Vec::new();
            let mut first_error = None;
            for (d, message, outcome) in &work {
                match outcome {
                    Outcome::DeadLettered { reason, attempts } => {
                        // Stored in the DLQ first; only then is the original given up.
                        let stored = dlq.put(message, reason, *attempts).await;
                        match stored {
                            Ok(()) => {
                                if let Err(e) = d.term().await {
                                    first_error.get_or_insert(seam("terminating a dead letter", e));
                                }
                            }
                            Err(e) => {
                                first_error.get_or_insert(e);
                            }
                        }
                    }
                    _ => acks.push(d.ack()),
                }
            }
            for r in futures_util::future::join_all(acks).await {
                if let Err(e) = r {
                    first_error.get_or_insert(seam("acknowledging", e));
                }
            }
            first_error.map_or(Ok(()), Err)
        });
        self.shared.changed();
        if wake {
            // The next returned message may go out now.
            self.cursor.wake();
        }
        result
    }

    fn seek(&self, at: StartAt) -> Result<u64, StreamError> {
        if self.cursor.closed.load(Ordering::Acquire) {
            return Err(StreamError::Closed);
        }
        let js = self.shared.js.clone();
        let (stream, spec) = (self.stream.clone(), self.spec.clone());
        let start = at;
        {
            let mut g = self.cursor.lock();
            // Void once the consumer is deleted; late finishes of them are ignored.
            g.outstanding.clear();
            g.returned.clear();
            g.alone = None;
            g.gone_since = None;
            g.error = None;
            g.handed = 0;
        }
        let durable = self.shared.call(self.shared.bound(5), async move {
            if let StartAt::Offset(n) = start
                && n != 0
            {
                let (first, end) = bounds(&js, &stream).await?;
                check_offset(n, first, end)?;
            }
            js.delete_consumer(&stream, spec.durable())
                .await
                .map_err(|e| seam("deleting the durable consumer to seek", e))?;
            js.durable(spec.start(start))
                .await
                .map_err(|e| seam("creating the durable consumer at the new start", e))
        });
        let durable = durable?;
        *self
            .durable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(durable);
        self.shared.changed();
        // Read before the feeder's next fetch moves it.
        let info = self.info();
        self.cursor.waker.wake();
        Ok(info?.position)
    }

    fn commit(&self) -> Result<u64, StreamError> {
        if self.cursor.closed.load(Ordering::Acquire) {
            return Err(StreamError::Closed);
        }
        // Every acknowledgement was confirmed by the server: the ack floor is the commit.
        Ok(self.info()?.committed)
    }

    fn state(&self) -> CursorState {
        let (outstanding, handed, error) = {
            let g = self.cursor.lock();
            (
                g.outstanding.len(),
                g.handed,
                g.error.as_ref().map(ToString::to_string),
            )
        };
        let mut state = CursorState::default();
        state.outstanding = outstanding;
        state.skipped_by_filter = self.cursor.skipped_by_filter.load(Ordering::Relaxed);
        state.error = error;
        // Server away: the last positions read (the client reconnects by itself); the
        // failure shows as the error only when nothing was ever read.
        let info = self.recent_info().map_err(|e| {
            let cached = self
                .cached
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .map(|(_, _, info)| info);
            (cached, e)
        });
        let info = match info {
            Ok(info) | Err((Some(info), _)) => info,
            Err((None, e)) => {
                state.position = handed;
                state.error.get_or_insert_with(|| e.to_string());
                return state;
            }
        };
        state.committed = info.committed;
        state.position = info.position.max(handed);
        // As on the embedded log: every stored offset from the commit on, those finished
        // above it included.
        state.lag = info.end.saturating_sub(info.committed);
        state
    }

    fn dead_letters(&self) -> Result<Vec<DurableDeadLetter>, StreamError> {
        let dlq = self.dlq.clone();
        let entries = self
            .shared
            .call(self.shared.bound(64), async move { dlq.list().await })?;
        Ok(entries.into_iter().map(|(_, e)| e).collect())
    }

    fn drain_dead_letters(&self) -> Result<Vec<DurableDeadLetter>, StreamError> {
        self.shared.changed();
        let dlq = self.dlq.clone();
        let entries = self.shared.call(self.shared.bound(66), async move {
            let entries = dlq.list().await?;
            if let Some((last, _)) = entries.last() {
                dlq.purge_through(*last).await?;
            }
            Ok(entries)
        })?;
        Ok(entries.into_iter().map(|(_, e)| e).collect())
    }

    fn redrive_dead_letters(
        &self,
        select: &mut dyn FnMut(&DurableDeadLetter) -> bool,
    ) -> Result<usize, StreamError> {
        let dlq = self.dlq.clone();
        let entries = self
            .shared
            .call(self.shared.bound(64), async move { dlq.list().await })?;
        let chosen: Vec<(u64, DurableDeadLetter)> =
            entries.into_iter().filter(|(_, e)| select(e)).collect();
        let mut done = 0;
        for (seq, entry) in chosen {
            let dlq = self.dlq.clone();
            self.shared.call(self.shared.bound(3), async move {
                dlq.redrive(seq, &entry).await
            })?;
            done += 1;
        }
        if done > 0 {
            self.shared.changed();
            self.cursor.waker.wake();
        }
        Ok(done)
    }

    fn close(&self) {
        if self.cursor.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.stop_tasks();
        let mut held = self.cursor.held();
        let alone = {
            let mut g = self.cursor.lock();
            g.outstanding.clear();
            g.returned.clear();
            g.alone.take()
        };
        if held.is_empty() {
            return;
        }
        let dlq = self.dlq.clone();
        // Handed out again at once rather than after the ack wait, in stream order (the
        // server redelivers in the order it was told).
        held.sort_by_key(|d| d.sequence());
        let bound = self
            .shared
            .bound(u32::try_from(held.len() + 1).unwrap_or(u32::MAX / 2));
        let _ = self.shared.call(bound, async move {
            if let Some((seq, before)) = alone {
                // A clean close is no death: the start counted for it is taken back.
                let _ = dlq.set_starts(seq, before).await;
            }
            for d in &held {
                if d.nak(None).await.is_err() {
                    // Server away: the rest come back after the ack wait anyway.
                    break;
                }
            }
            Ok(())
        });
    }
}

impl Drop for JsCursor {
    fn drop(&mut self) {
        self.close();
    }
}
