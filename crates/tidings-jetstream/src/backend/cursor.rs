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
//! # Seek and close
//! [`BackendCursor::seek`] deletes the consumer and creates it again at the new start
//! (JetStream cannot move a consumer): unfinished deliveries of every process sharing it
//! are dropped. [`BackendCursor::close`] nak's what this process fetched and did not
//! finish, so it is handed out again at once (to the next subscriber of the name, or
//! another process sharing it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tidings::durable::{BackendCursor, CursorSpec, CursorWaker, Finished, Outcome};
use tidings::{
    CursorState, DeadLetterReason, DurableDeadLetter, Message, Pattern, StartAt, StreamError,
};

use super::codec::{self, Stored, TARGET};
use super::dead_letters::DeadLetters;
use super::stream::{bounds, check_offset};
use super::{Settings, Shared, keep_alive, nats_name};
use crate::classify::{js_error, seam};
use crate::client::consumer::ConsumerSpec;
use crate::client::delivery::Delivery;
use crate::client::durable::Durable;
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
}

/// What the cursor and its background tasks share.
pub(crate) struct CursorShared {
    inner: Mutex<Inner>,
    waker: CursorWaker,
    name: String,
    skipped_by_filter: AtomicU64,
    keep_alives: AtomicU64,
    closed: AtomicBool,
}

impl CursorShared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data: keep going.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every delivery handed out and not finished.
    pub(crate) fn held(&self) -> Vec<Arc<Delivery>> {
        self.lock().outstanding.values().cloned().collect()
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

fn consumer_spec(settings: &Settings, stream: &str, name: &str, filter: &Pattern) -> ConsumerSpec {
    ConsumerSpec::new(stream, nats_name(name), filter.clone())
        .ack_wait(settings.ack_wait)
        .inactive_threshold(settings.inactive_threshold)
}

impl JsCursor {
    /// Opens the cursor on the JetStream stream `stream`, which captures `subjects`.
    pub(crate) fn open(
        shared: Arc<Shared>,
        stream: &str,
        subjects: Vec<String>,
        spec: CursorSpec<'_>,
    ) -> Result<Self, StreamError> {
        let cspec = consumer_spec(&shared.settings, stream, spec.name, spec.filter);
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
            dlq,
            tasks: Mutex::new(Some(Tasks { watch, keep_alive })),
            cached: Mutex::new(None),
        })
    }

    /// What the stream's append path wakes.
    pub(crate) fn shared_state(&self) -> Arc<CursorShared> {
        Arc::clone(&self.cursor)
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

/// `e` as this crate's error: the [`JetStreamError`] it carries, or one of its kind caused
/// by it.
fn into_js(context: &str, e: StreamError) -> JetStreamError {
    let kind = e.kind();
    match e {
        StreamError::Backend { source, .. } if source.is::<JetStreamError>() => source
            .downcast::<JetStreamError>()
            .map_or_else(|_| JetStreamError::new(kind, context), |j| *j),
        other => JetStreamError::new(kind, context).caused_by(other),
    }
}

/// Takes one delivery: `Some` to hand out, `None` when it was skipped, dead-lettered here
/// or is already held; `Err` is the reason fetching must stop.
async fn take(
    cursor: &CursorShared,
    dlq: &DeadLetters,
    settings: &Settings,
    d: Delivery,
) -> Result<Option<(Arc<Delivery>, Message)>, JetStreamError> {
    if let Some(target) = d.headers().get(TARGET)
        && target != cursor.name
    {
        // A redrive copy for another durable subscription.
        d.ack()
            .await
            .map_err(|e| js_error("acknowledging a redrive copy for another name", e))?;
        cursor.skipped_by_filter.fetch_add(1, Ordering::Relaxed);
        return Ok(None);
    }
    let seq = d.sequence();
    let delivered = d.delivered();
    let d = Arc::new(d);
    if let Some(held) = cursor.lock().outstanding.get_mut(&seq) {
        // Handed out again by the server while still held here (an ack wait passed
        // despite the keep-alive): keep the newer handle, do not hand it out twice.
        *held = Arc::clone(&d);
        return Ok(None);
    }
    let message = {
        let header = |n: &str| d.headers().get(n).map(str::to_owned);
        let stored = Stored {
            subject: d.topic(),
            payload: d.payload_bytes(),
            sequence: seq,
            published: d.published(),
            header: &header,
        };
        codec::decode(&stored, &settings.limits)
            .map_err(|e| js_error(format_args!("durable {}", cursor.name), e))?
    };
    if delivered > u64::from(settings.max_deliveries) {
        // The processes it was handed to stopped before finishing it, this many times:
        // dead-letter it rather than risk the next one.
        let attempts = u32::try_from(delivered - 1).unwrap_or(u32::MAX);
        let reason = DeadLetterReason::RetriesExhausted {
            attempts,
            last_error: format!(
                "handed out {attempts} times without being finished (the processes \
                 holding it stopped or lost the server)"
            ),
        };
        dlq.put(&message, &reason, attempts)
            .await
            .map_err(|e| into_js("storing a dead letter", e))?;
        d.term()
            .await
            .map_err(|e| js_error("terminating a dead-lettered message", e))?;
        return Ok(None);
    }
    Ok(Some((d, message)))
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
        let durable = self.durable();
        let (cursor, dlq) = (Arc::clone(&self.cursor), self.dlq.clone());
        let settings = self.shared.settings.clone();
        let bound = self
            .shared
            .bound(2 + u32::try_from(max.min(64)).unwrap_or(64));
        let pulled = self.shared.call(bound, async move {
            let pulled: Result<Vec<(Arc<Delivery>, Message)>, JetStreamError> = async {
                let fetched = match durable.fetch(max, Duration::ZERO).await {
                    Ok(f) => f,
                    Err(e @ FetchError::ConsumerGone { .. }) => {
                        return Err(js_error(
                            "the durable consumer was deleted on the server (inactivity \
                             threshold, or an administrator); seek to create it again",
                            e,
                        ));
                    }
                    Err(e) => {
                        // Retried at the next wake; the client reconnects by itself.
                        cursor.lock().transient = Some(e.to_string());
                        return Ok(Vec::new());
                    }
                };
                cursor
                    .skipped_by_filter
                    .fetch_add(fetched.skipped, Ordering::Relaxed);
                let mut out = Vec::with_capacity(fetched.deliveries.len());
                for d in fetched.deliveries {
                    if let Some((d, m)) = take(&cursor, &dlq, &settings, d).await? {
                        out.push((d, m));
                    }
                }
                cursor.lock().transient = None;
                Ok(out)
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
        let mut out = Vec::with_capacity(pulled.len());
        for (d, m) in pulled {
            let seq = d.sequence();
            g.handed = g.handed.max(seq + 1);
            g.outstanding.insert(seq, d);
            out.push(m);
        }
        Ok(out)
    }

    fn finish(&self, done: &[Finished]) -> Result<(), StreamError> {
        let mut work = Vec::with_capacity(done.len());
        {
            let mut g = self.cursor.lock();
            for f in done {
                let Some(seq) = f.message.offset() else {
                    continue;
                };
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
        self.cursor.lock().outstanding.clear();
        if held.is_empty() {
            return;
        }
        // Handed out again at once rather than after the ack wait, in stream order (the
        // server redelivers in the order it was told).
        held.sort_by_key(|d| d.sequence());
        let bound = self
            .shared
            .bound(u32::try_from(held.len()).unwrap_or(u32::MAX / 2));
        let _ = self.shared.call(bound, async move {
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
