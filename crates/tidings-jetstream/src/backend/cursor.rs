//! One durable subscription's cursor: a durable pull consumer read by a background fetch.
//!
//! # Fetching
//! A background task pulls from the consumer into a local buffer, keeping fetched-and-not-
//! finished (buffered plus handed out) at most the subscription's window, and wakes the
//! feeder when it added some. [`BackendCursor::fetch`] only takes from that buffer: it never
//! waits on the network. Deliveries the client-side pattern re-check rejects, and redrive
//! copies meant for another durable subscription, are acknowledged and counted as skipped
//! by the filter. A transient failure (server away) is retried by the task; the client
//! reconnects by itself.
//!
//! # Finishing
//! Delivered and filtered messages are acknowledged (confirmed by the server); a dead
//! letter is stored in the DLQ stream, that store is awaited, and only then is the original
//! terminated. A message whose finish failed is dropped locally: the server hands it out
//! again after the ack wait (at-least-once).
//!
//! # Positions
//! `committed` is one past the consumer's ack floor, `lag` the server's pending plus
//! unacknowledged count: what other processes sharing the durable did shows too.
//!
//! # Seek and close
//! [`BackendCursor::seek`] deletes the consumer and creates it again at the new start
//! (JetStream cannot move a consumer): unfinished deliveries of every process sharing it
//! are dropped. [`BackendCursor::close`] nak's what this process fetched and did not
//! finish, so it is handed out again at once (to the next subscriber of the name, or
//! another process sharing it).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tidings::durable::{
    BackendCursor, CursorSpec, CursorState, CursorWaker, DurableDeadLetter, Finished, Outcome,
};
use tidings::{DeadLetterReason, Message, Pattern, StartAt, StreamError};

use super::codec::{self, Stored, TARGET};
use super::dead_letters::DeadLetters;
use super::stream::{bounds, check_offset};
use super::{Settings, Shared, backend_error, keep_alive, nats_name};
use crate::consumer::{ConsumerSpec, Delivery, Durable};
use crate::error::FetchError;

struct Held {
    delivery: Arc<Delivery>,
    message: Message,
}

#[derive(Default)]
struct Inner {
    buffer: VecDeque<Held>,
    outstanding: HashMap<u64, Arc<Delivery>>,
    /// Why fetching stopped (a record that is not a tidings message, a deleted consumer).
    error: Option<String>,
    /// The last transient failure of the background fetch (cleared by a success).
    transient: Option<String>,
    /// The sequence after the last one handed out.
    handed: u64,
}

/// What the cursor, its background fetch and its keep-alive share.
pub(crate) struct CursorShared {
    inner: Mutex<Inner>,
    room: tokio::sync::Notify,
    waker: CursorWaker,
    name: String,
    window: usize,
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

    /// Every delivery fetched and not finished (buffered or handed out).
    pub(crate) fn held(&self) -> Vec<Arc<Delivery>> {
        let g = self.lock();
        g.buffer
            .iter()
            .map(|h| Arc::clone(&h.delivery))
            .chain(g.outstanding.values().cloned())
            .collect()
    }

    pub(crate) fn note_keep_alive(&self, n: usize) {
        self.keep_alives.fetch_add(n as u64, Ordering::Relaxed);
    }
}

struct Tasks {
    fetch: tokio::task::JoinHandle<()>,
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
}

fn consumer_spec(settings: &Settings, stream: &str, name: &str, filter: &Pattern) -> ConsumerSpec {
    ConsumerSpec::new(stream, nats_name(name), filter.clone())
        .ack_wait(settings.ack_wait)
        .inactive_threshold(settings.inactive_threshold)
}

impl JsCursor {
    pub(crate) fn open(
        shared: Arc<Shared>,
        stream: &str,
        spec: CursorSpec<'_>,
    ) -> Result<Self, StreamError> {
        let cspec = consumer_spec(&shared.settings, stream, spec.name, spec.filter);
        let dlq = DeadLetters::new(shared.js.clone(), stream, spec.name, shared.settings.limits);
        let js = shared.js.clone();
        let (open_spec, d) = (cspec.clone().start(spec.start), dlq.clone());
        let durable = shared.call(shared.bound(4), async move {
            d.ensure().await?;
            js.durable(open_spec).await.map_err(backend_error)
        })?;
        let cursor = Arc::new(CursorShared {
            inner: Mutex::new(Inner::default()),
            room: tokio::sync::Notify::new(),
            waker: spec.waker.clone(),
            name: spec.name.to_owned(),
            window: spec.window.max(1),
            skipped_by_filter: AtomicU64::new(0),
            keep_alives: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        });
        let this = Self {
            shared,
            cursor,
            durable: Mutex::new(Arc::new(durable)),
            spec: cspec,
            stream: stream.to_owned(),
            dlq,
            tasks: Mutex::new(None),
        };
        this.start_tasks();
        Ok(this)
    }

    fn durable(&self) -> Arc<Durable> {
        Arc::clone(
            &self
                .durable
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    fn start_tasks(&self) {
        let fetch = self.shared.rt.spawn(fetch_loop(
            Arc::clone(&self.cursor),
            self.durable(),
            self.dlq.clone(),
            self.shared.settings.clone(),
        ));
        let keep_alive = self.shared.rt.spawn(keep_alive::run(
            Arc::clone(&self.cursor),
            self.shared.settings.keep_alive,
        ));
        let old = self
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .replace(Tasks { fetch, keep_alive });
        if let Some(old) = old {
            old.fetch.abort();
            old.keep_alive.abort();
        }
    }

    fn stop_tasks(&self) {
        let old = self
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(old) = old {
            old.fetch.abort();
            old.keep_alive.abort();
        }
    }

    fn info(&self) -> Result<async_nats::jetstream::consumer::Info, StreamError> {
        let durable = self.durable();
        self.shared.call(self.shared.bound(1), async move {
            durable.info().await.map_err(backend_error)
        })
    }
}

/// Pulls into the buffer while there is room; see the [module docs](self).
async fn fetch_loop(
    cursor: Arc<CursorShared>,
    durable: Arc<Durable>,
    dlq: DeadLetters,
    settings: Settings,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        if cursor.closed.load(Ordering::Acquire) {
            return;
        }
        let room = {
            let g = cursor.lock();
            if g.error.is_some() {
                return;
            }
            cursor
                .window
                .saturating_sub(g.buffer.len() + g.outstanding.len())
        };
        if room == 0 {
            cursor.room.notified().await;
            continue;
        }
        match durable.fetch(room, settings.fetch_wait).await {
            Ok(fetched) => {
                backoff = Duration::from_millis(50);
                cursor.lock().transient = None;
                cursor
                    .skipped_by_filter
                    .fetch_add(fetched.skipped, Ordering::Relaxed);
                let mut added = false;
                for d in fetched.deliveries {
                    match take(&cursor, &dlq, &settings, d).await {
                        Ok(true) => added = true,
                        Ok(false) => {}
                        Err(stop) => {
                            cursor.lock().error = Some(stop);
                            cursor.waker.wake();
                            return;
                        }
                    }
                }
                if added {
                    cursor.waker.wake();
                }
            }
            Err(FetchError::ConsumerGone { durable }) => {
                cursor.lock().error = Some(format!(
                    "durable consumer {durable} was deleted on the server (inactivity \
                     threshold, or an administrator); seek to create it again"
                ));
                cursor.waker.wake();
                return;
            }
            Err(e) => {
                cursor.lock().transient = Some(e.to_string());
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// Takes one delivery: buffered (`true`), skipped or dead-lettered here (`false`), or the
/// reason fetching must stop.
async fn take(
    cursor: &CursorShared,
    dlq: &DeadLetters,
    settings: &Settings,
    d: Delivery,
) -> Result<bool, String> {
    if let Some(target) = d.headers().get(TARGET)
        && target != cursor.name
    {
        // A redrive copy for another durable subscription.
        d.ack().await.map_err(|e| e.to_string())?;
        cursor.skipped_by_filter.fetch_add(1, Ordering::Relaxed);
        return Ok(false);
    }
    let seq = d.sequence();
    let delivered = d.delivered();
    let d = Arc::new(d);
    {
        let mut g = cursor.lock();
        // Handed out again by the server while still held here (an ack wait passed
        // despite the keep-alive): keep the newer handle, do not hand it out twice.
        if let Some(held) = g.outstanding.get_mut(&seq) {
            *held = Arc::clone(&d);
            return Ok(false);
        }
        if let Some(held) = g.buffer.iter_mut().find(|h| h.delivery.sequence() == seq) {
            held.delivery = Arc::clone(&d);
            return Ok(false);
        }
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
        codec::decode(&stored, &settings.limits).map_err(|e| e.to_string())?
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
            .map_err(|e| e.to_string())?;
        d.term().await.map_err(|e| e.to_string())?;
        return Ok(false);
    }
    cursor.lock().buffer.push_back(Held {
        delivery: d,
        message,
    });
    Ok(true)
}

impl BackendCursor for JsCursor {
    fn fetch(&self, max: usize) -> Result<Vec<Message>, StreamError> {
        if self.cursor.closed.load(Ordering::Acquire) {
            return Err(StreamError::Closed);
        }
        let mut g = self.cursor.lock();
        if let Some(e) = &g.error {
            return Err(backend_error(e));
        }
        let n = max.min(g.buffer.len());
        let mut out = Vec::with_capacity(n);
        for held in g.buffer.drain(..n).collect::<Vec<_>>() {
            let seq = held.delivery.sequence();
            g.handed = g.handed.max(seq + 1);
            g.outstanding.insert(seq, held.delivery);
            out.push(held.message);
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
        self.cursor.room.notify_one();
        if work.is_empty() {
            return Ok(());
        }
        let dlq = self.dlq.clone();
        let bound = self
            .shared
            .bound(2 * u32::try_from(work.len()).unwrap_or(u32::MAX / 2));
        self.shared.call(bound, async move {
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
                                    first_error.get_or_insert(backend_error(e));
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
                    first_error.get_or_insert(backend_error(e));
                }
            }
            first_error.map_or(Ok(()), Err)
        })
    }

    fn seek(&self, at: StartAt) -> Result<u64, StreamError> {
        if self.cursor.closed.load(Ordering::Acquire) {
            return Err(StreamError::Closed);
        }
        let js = self.shared.js.clone();
        let (stream, spec) = (self.stream.clone(), self.spec.clone());
        let start = at;
        self.stop_tasks();
        {
            let mut g = self.cursor.lock();
            g.buffer.clear();
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
                .map_err(backend_error)?;
            js.durable(spec.start(start)).await.map_err(backend_error)
        });
        let durable = match durable {
            Ok(d) => d,
            Err(e) => {
                // The old consumer may still exist: keep fetching from it.
                self.start_tasks();
                return Err(e);
            }
        };
        *self
            .durable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(durable);
        // Read before the background fetch moves it.
        let info = self.info();
        self.start_tasks();
        self.cursor.waker.wake();
        Ok(info?.delivered.stream_sequence + 1)
    }

    fn commit(&self) -> Result<u64, StreamError> {
        if self.cursor.closed.load(Ordering::Acquire) {
            return Err(StreamError::Closed);
        }
        // Every acknowledgement was confirmed by the server: the ack floor is the commit.
        Ok(self.info()?.ack_floor.stream_sequence + 1)
    }

    fn state(&self) -> CursorState {
        let (outstanding, buffered_front, handed, error) = {
            let g = self.cursor.lock();
            (
                g.outstanding.len(),
                g.buffer.front().map(|h| h.delivery.sequence()),
                g.handed,
                g.error.clone(),
            )
        };
        let mut state = CursorState::default();
        state.outstanding = outstanding;
        state.skipped_by_filter = self.cursor.skipped_by_filter.load(Ordering::Relaxed);
        state.error = error;
        match self.info() {
            Ok(info) => {
                state.committed = info.ack_floor.stream_sequence + 1;
                state.position = buffered_front
                    .unwrap_or(info.delivered.stream_sequence + 1)
                    .max(handed);
                state.lag = info.num_pending + info.num_ack_pending as u64;
            }
            Err(e) => {
                state.position = handed;
                if state.error.is_none() {
                    state.error = Some(e.to_string());
                }
            }
        }
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
            self.cursor.waker.wake();
        }
        Ok(done)
    }

    fn close(&self) {
        if self.cursor.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.stop_tasks();
        self.cursor.room.notify_one();
        let mut held = self.cursor.held();
        {
            let mut g = self.cursor.lock();
            g.buffer.clear();
            g.outstanding.clear();
        }
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
