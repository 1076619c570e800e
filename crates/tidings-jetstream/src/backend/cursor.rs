//! One durable subscription's cursor: a durable pull consumer read by a background fetch.
//!
//! # Fetching
//! A standing pull ([`puller`](super::puller)) keeps a local buffer filled within the
//! subscription's window, so [`BackendCursor::fetch`] hands out what is already here
//! without a round trip. Only a fetch that finds the buffer empty waits: for a pull in
//! flight to land, then for one no-wait pull of its own (one round trip, bounded by the
//! request timeout), so a fetch always sees everything stored before it (the puller's
//! docs say why no waiting pull is used). A background task wakes the feeder and nudges
//! the puller when there may be more: on every message published to the stream's
//! subjects (a core NATS subscription, so appends by other processes count too) and once
//! a second (redeliveries after an ack wait). An append through this backend wakes its
//! stream's cursors at once, so a manual driver sees it in its next step. Deliveries the
//! client-side pattern re-check rejects, and redrive copies meant for another durable
//! subscription, are acknowledged and counted as skipped by the filter. A failed pull
//! (server away) returns no messages and is retried at the next wake; the client
//! reconnects by itself.
//!
//! # Finishing
//! Delivered and filtered messages get plain acknowledgements (no answer asked), sent in
//! order by the cursor's acknowledgement task ([`acker`](super::acker)), which asks for
//! one confirmed answer per batch: [`BackendCursor::finish`] of delivered messages never
//! waits for the server. A lost plain acknowledgement costs one redelivery after the ack
//! wait (at-least-once). Confirmation is awaited only where the code must know:
//! - before [`BackendCursor::close`] returns (its naks go the same way, confirmed last);
//! - before [`BackendCursor::seek`] deletes the consumer (a late acknowledgement would
//!   land on the consumer created in its place, which has the same name);
//! - before [`BackendCursor::commit`] reads the ack floor (and before the snapshot's
//!   refresh task reads it, see below);
//! - for a dead letter: it is stored in the DLQ stream and that store is awaited, then the
//!   original is terminated and that too is awaited before `finish` returns.
//!
//! A message whose finish failed is dropped locally: the server hands it out again after
//! the ack wait (at-least-once).
//!
//! # Positions
//! `committed` is one past the consumer's ack floor (the stream's end once nothing is out
//! and nothing the filter takes is left), `lag` the stored offsets from the commit on, as
//! on the embedded log (messages acknowledged above the floor count until the floor
//! passes them): what other processes sharing the durable did shows too.
//! [`BackendCursor::state`] never waits on the network: it reads a snapshot that opening,
//! `commit`, `seek` and a refresh task of the cursor keep fresh ([`positions`](super::positions):
//! within 200 ms of a change this process made or saw published, within 1 s otherwise,
//! each plus one read, while the server answers).
//!
//! # What is handed out
//! A record whose topic no pattern of the stream matches (a producer writing into the
//! stream's subject namespace by hand) is acknowledged and counted as skipped by the filter.
//! A record that is not a tidings message (a header that does not parse, a subject that is
//! not a topic) is dead-lettered [`Rejected`](DeadLetterReason::Rejected), the reason
//! naming the header or the subject, and counted as skipped: one bad record never stops
//! the subscription. One whose header block the client library cannot parse at all is
//! found by the puller's screen and dealt with the same way (see `unreadable`).
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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tidings::durable::{BackendCursor, CursorSpec, Finished, Outcome};
use tidings::{
    CursorState, DeadLetterReason, DurableDeadLetter, Message, Pattern, StartAt, StreamError,
    StreamErrorKind,
};

use super::acker::Acker;
use super::cursor_state::{CursorShared, Inner};
use super::dead_letters::DeadLetters;
use super::positions::{Positions, Snapshot};
use super::puller::{Puller, decode, reject};
use super::records::{bounds, check_offset};
use super::shared::{Settings, Shared, backend_error};
use super::strays::Strays;
use super::{keep_alive, refresh};
use crate::classify::seam;
use crate::client::consumer::ConsumerSpec;
use crate::client::delivery::{Delivery, Finish};
use crate::error::JetStreamError;
use crate::names::{keyed_prefix, subject_prefix};

struct Tasks {
    watch: tokio::task::JoinHandle<()>,
    keep_alive: tokio::task::JoinHandle<()>,
    puller: tokio::task::JoinHandle<()>,
    acker: tokio::task::JoinHandle<()>,
    refresh: tokio::task::JoinHandle<()>,
}

/// A durable subscription's cursor on JetStream (see the [module docs](self)).
pub(crate) struct JsCursor {
    shared: Arc<Shared>,
    cursor: Arc<CursorShared>,
    puller: Arc<Puller>,
    acker: Acker,
    spec: ConsumerSpec,
    stream: String,
    /// The stream's patterns: a record none matches is skipped.
    patterns: Arc<Vec<Pattern>>,
    dlq: DeadLetters,
    tasks: Mutex<Option<Tasks>>,
}

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
    ConsumerSpec::new(
        stream,
        crate::names::DurableNames::new(stream, name).consumer(),
        filter.clone(),
    )
    .ack_wait(settings.ack_wait)
    .inactive_threshold(settings.inactive_threshold)
    .subject_prefix(plain)
    .namespaces_of(keyed, filters)
}

/// What a cursor is opened as.
pub(crate) enum Role {
    /// A durable subscription's own cursor (or a keyed group's unkeyed one): it creates
    /// (or finds) its DLQ and handler-start streams, three to five round trips.
    Own,
    /// A keyed group's partition cursor: the group's unkeyed cursor, opened first, made
    /// the DLQ streams.
    Partition(Hold),
}

/// How a keyed group's lease holds a partition cursor, set before its first pull.
pub(crate) struct Hold {
    /// Background pulls only while this admits (the lease, active).
    pub(crate) admits: Arc<dyn Fn() -> bool + Send + Sync>,
    /// Keep-alives only while this holds (the lease, active or handing over: running
    /// handlers finish here).
    pub(crate) keeps: Arc<dyn Fn() -> bool + Send + Sync>,
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
        Self::open_as(shared, stream, subjects, patterns, spec, cspec, Role::Own)
    }

    /// [`JsCursor::open`] on the consumer `cspec` (a keyed group's partition or unkeyed
    /// consumer); the DLQ and redrive target stay `spec.name`'s. `subjects`: what wakes it.
    ///
    /// A partition cursor is held by its lease from its first pull on (`Hold`), and
    /// counts the deliveries out elsewhere from the consumer's state in the open's answer
    /// ([`Strays`]): it gathers while the last owner left some unfinished.
    pub(crate) fn open_as(
        shared: Arc<Shared>,
        stream: &str,
        subjects: Vec<String>,
        patterns: Vec<Pattern>,
        spec: CursorSpec<'_>,
        cspec: ConsumerSpec,
        role: Role,
    ) -> Result<Self, StreamError> {
        let dlq = DeadLetters::new(shared.js.clone(), stream, spec.name, shared.settings.limits);
        let js = shared.js.clone();
        let role_ensures = matches!(role, Role::Own);
        let (open_spec, d, nats) = (
            cspec.clone().start(spec.start),
            dlq.clone(),
            stream.to_owned(),
        );
        let (durable, first) = shared.call(shared.bound(5), async move {
            if role_ensures {
                d.ensure().await?;
            }
            let durable = js
                .durable(open_spec)
                .await
                .map_err(|e| seam("opening the durable consumer", e))?;
            // The first snapshot: the consumer's info from its creation, the stream's end.
            let (_, end) = bounds(&js, &nats).await?;
            let first = Positions::new(durable.consumer.cached_info(), end);
            Ok((durable, first))
        })?;
        let cursor = Arc::new(CursorShared {
            inner: Mutex::new(Inner::default()),
            waker: spec.waker.clone(),
            nudge: tokio::sync::Notify::new(),
            name: spec.name.to_owned(),
            skipped_by_filter: AtomicU64::new(0),
            keep_alives: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            admits: std::sync::OnceLock::new(),
            keeps: std::sync::OnceLock::new(),
            positions: Snapshot::default(),
            pull_epoch: AtomicU64::new(0),
        });
        if let Role::Partition(hold) = role {
            let _ = cursor.admits.set(hold.admits);
            let _ = cursor.keeps.set(hold.keeps);
            let at = durable.when_opened();
            let unfinished = usize::try_from(at.unfinished).unwrap_or(usize::MAX);
            let mut g = cursor.lock();
            g.strays = Some(Strays::at_open(
                at.deliveries,
                unfinished,
                at.floor,
                at.through,
            ));
            g.gathering = unfinished > 0;
        }
        cursor.positions.store(cursor.positions.begin(), first);
        let noted = Arc::downgrade(&cursor);
        let (acker, acker_task) = Acker::new(move |e| {
            if let Some(c) = noted.upgrade() {
                c.lock().transient = Some(e);
            }
        });
        let patterns = Arc::new(patterns);
        let puller = Arc::new(Puller::new(
            Arc::clone(&cursor),
            durable,
            dlq.clone(),
            shared.settings.clone(),
            Arc::clone(&patterns),
            acker.clone(),
            spec.window,
            shared.js.clone(),
        ));
        let tasks = Tasks {
            acker: shared.rt.spawn(acker_task),
            puller: shared.rt.spawn(Arc::clone(&puller).run()),
            watch: shared
                .rt
                .spawn(watch(shared.js.clone(), subjects, Arc::clone(&cursor))),
            keep_alive: shared.rt.spawn(keep_alive::run(
                Arc::clone(&cursor),
                shared.settings.keep_alive,
            )),
            refresh: shared.rt.spawn(refresh::run(refresh::Refresh {
                cursor: Arc::clone(&cursor),
                puller: Arc::clone(&puller),
                acker: acker.clone(),
                js: shared.js.clone(),
                stream: stream.to_owned(),
            })),
        };
        // Fill the buffer before the first fetch asks.
        cursor.nudge();
        Ok(Self {
            shared,
            cursor,
            puller,
            acker,
            spec: cspec,
            stream: stream.to_owned(),
            patterns,
            dlq,
            tasks: Mutex::new(Some(tasks)),
        })
    }

    /// What the stream's append path wakes.
    pub(crate) fn shared_state(&self) -> Arc<CursorShared> {
        Arc::clone(&self.cursor)
    }

    /// Waits out a background pull in flight (see [`Puller::quiesce`]): a keyed group's
    /// retired partition cursor, before the partition's next cursor reads what is
    /// unfinished — a delivery landing here after that reading would be missed by the new
    /// cursor's gathering, and its successors could start first.
    pub(crate) fn quiesce_pulls(&self) {
        let puller = Arc::clone(&self.puller);
        let _ = self.shared.call(self.shared.bound(1), async move {
            puller.quiesce().await;
            Ok(())
        });
    }

    /// Deliveries out elsewhere (see [`Strays`]): how many, whether more were found since
    /// the last call (`(0, false)` for a cursor that does not count them), and when the
    /// last answered pull was sent, once a reading of the server's delivery count sent
    /// after it was taken in (`None` before).
    pub(crate) fn strays(&self) -> (usize, bool, Option<Instant>) {
        let mut g = self.cursor.lock();
        // Confirmed by a count read after a pull answered (see `Machine::may_hand_out`).
        let pulled = g.pulled.filter(|&p| g.counted.is_some_and(|c| c >= p));
        let (out, fresh) = g
            .strays
            .as_mut()
            .map_or((0, false), |s| (s.out(), s.take_fresh()));
        (out, fresh, pulled)
    }

    /// The gathering ended (nothing out elsewhere, or the wait's bound passed): hand the
    /// buffer out again, in stream order, and wait no more for what is still out. False,
    /// and still gathering, when more deliveries were found out elsewhere since
    /// [`JsCursor::strays`] looked.
    pub(crate) fn end_gathering(&self) -> bool {
        let mut g = self.cursor.lock();
        let inner = &mut *g;
        if let Some(s) = &mut inner.strays {
            if s.take_fresh() {
                return false;
            }
            s.forgive();
        }
        inner.gathering = false;
        true
    }

    /// Whether the buffer is held back (a keyed partition's new owner gathering).
    pub(crate) fn gathering(&self) -> bool {
        self.cursor.gathering()
    }

    /// Drop what this process holds without telling the server (a lease that lapsed:
    /// another process may hold those messages now); [`BackendCursor::close`] then naks
    /// nothing.
    pub(crate) fn forget(&self) {
        let mut g = self.cursor.lock();
        g.outstanding.clear();
        g.buffer.clear();
        g.alone = None;
    }

    /// The consumer's unfinished deliveries as the server answered the open (no round
    /// trip).
    pub(crate) fn unfinished_at_open(&self) -> u64 {
        self.puller.durable().when_opened().unfinished
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
            old.puller.abort();
            old.acker.abort();
            old.refresh.abort();
        }
    }

    /// Waits until every finish sent so far was confirmed by the server.
    fn confirm_finishes(&self) -> Result<(), StreamError> {
        let acker = self.acker.clone();
        self.shared.call(self.shared.bound(1), async move {
            acker
                .flush()
                .await
                .map_err(|e| backend_error(StreamErrorKind::Unavailable, e))
        })
    }

    /// Reads the positions now (one round trip) and keeps them as the snapshot.
    fn info(&self) -> Result<Positions, StreamError> {
        let ticket = self.cursor.positions.begin();
        let durable = self.puller.durable();
        let (js, stream) = (self.shared.js.clone(), self.stream.clone());
        let info = self.shared.call(self.shared.bound(1), async move {
            Positions::read(&durable, &js, &stream).await
        })?;
        self.cursor.positions.store(ticket, info);
        Ok(info)
    }

    /// Dead-letters records that are not tidings messages (one bad record, a foreign
    /// producer's, never stops the subscription).
    fn reject_all(&self, rejected: Vec<(Arc<Delivery>, crate::codec::DecodeError)>) {
        let (cursor, dlq, settings) = (
            Arc::clone(&self.cursor),
            self.dlq.clone(),
            self.shared.settings.clone(),
        );
        let bound = self
            .shared
            .bound(2 * u32::try_from(rejected.len()).unwrap_or(u32::MAX / 2));
        let done = self.shared.call(bound, async move {
            for (d, why) in &rejected {
                reject(&cursor, &dlq, &settings, d, why).await;
            }
            Ok(())
        });
        if let Err(e) = done {
            // Not terminated: they come back after the ack wait.
            self.cursor.lock().transient = Some(e.to_string());
        }
    }

    /// Hands out what waits in the buffer: the returned message at its front alone when
    /// nothing else is out, else the others up to `max` while no returned one is out;
    /// `None` when the buffer is empty.
    fn hand_out_buffered(&self, max: usize) -> Option<Vec<Message>> {
        let (d, m) = {
            let mut g = self.cursor.lock();
            if g.alone.is_some() || g.gathering {
                return Some(Vec::new());
            }
            let (_, _, returned) = g.buffer.front()?;
            if !returned {
                let mut out = Vec::with_capacity(max.min(g.buffer.len()));
                let mut rejected = Vec::new();
                while out.len() < max && g.buffer.front().is_some_and(|(_, _, r)| !r) {
                    let Some((d, m, _)) = g.buffer.pop_front() else {
                        break;
                    };
                    let m = match m.map_or_else(|| decode(&d, &self.shared.settings), Ok) {
                        Ok(m) => m,
                        Err(why) => {
                            rejected.push((d, why));
                            continue;
                        }
                    };
                    if !self.patterns.iter().any(|p| p.matches(m.topic())) {
                        // In the stream's namespace but matched by none of its patterns
                        // (R-RT-1): written there by hand, never by tidings.
                        self.acker.send(d, Finish::Ack);
                        self.cursor.note_skipped();
                        continue;
                    }
                    let seq = d.sequence();
                    g.handed = g.handed.max(seq + 1);
                    g.outstanding.insert(seq, d);
                    out.push(m);
                }
                // Everything buffered was skipped: the caller pulls, so a fetch still sees
                // everything stored before it.
                let drained = out.is_empty() && g.buffer.is_empty();
                drop(g);
                if !rejected.is_empty() {
                    self.reject_all(rejected);
                }
                return if drained { None } else { Some(out) };
            }
            if !g.outstanding.is_empty() {
                return Some(Vec::new());
            }
            let (d, m, _) = g.buffer.pop_front()?;
            let Some(m) = m else {
                return Some(Vec::new());
            };
            (d, m)
        };
        let (dlq, settings) = (self.dlq.clone(), self.shared.settings.clone());
        let (dd, mm) = (Arc::clone(&d), m.clone());
        let counted = self.shared.call(self.shared.bound(4), async move {
            count_start(&dlq, &settings, &dd, &mm).await
        });
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
                g.buffer.push_front((d, Some(m), true));
                Some(Vec::new())
            }
        }
    }
}

/// Wakes the feeder and the standing pull on every publish to `subjects` and every
/// [`IDLE_WAKE`]; see the [module docs](self).
async fn watch(
    js: crate::connection::connect::JetStream,
    subjects: Vec<String>,
    cursor: Arc<CursorShared>,
) {
    let mut subs = Vec::new();
    // On the receiving connection: what is published here is whatever others wrote, and a
    // header block the client cannot parse costs the connection it arrives on a reconnect.
    // Without it (or a subscription) the periodic wake still finds everything, later.
    if let Ok(js) = js.receiving().await {
        for s in subjects {
            if let Ok(sub) = js.client.subscribe(s).await {
                subs.push(sub);
            }
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
                } else {
                    // The stream's end moved: the positions snapshot is read again soon.
                    cursor.note_change();
                }
            }
            _ = tick.tick() => {}
        }
        cursor.wake();
    }
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

impl BackendCursor for JsCursor {
    fn fetch(&self, max: usize) -> Result<Vec<Message>, StreamError> {
        if self.cursor.is_closed() {
            return Err(StreamError::Closed);
        }
        if let Some(e) = &self.cursor.lock().error {
            return Err(e.clone().into());
        }
        if max == 0 {
            return Ok(Vec::new());
        }
        if let Some(out) = self.hand_out_buffered(max) {
            // Room or not, the puller looks.
            self.cursor.nudge();
            return Ok(out);
        }
        // The buffer is empty: wait out a pull in flight, then pull once here, so nothing
        // stored before this fetch is missed (see the puller's docs).
        let puller = Arc::clone(&self.puller);
        let pulled = self.shared.call(self.shared.bound(2), async move {
            Ok(puller.pull_if_empty(max).await)
        });
        let pulled = match pulled {
            Ok(Ok(p)) => p,
            // Retried at the next wake; the client reconnects by itself. What a pull that
            // timed out took comes back after the ack wait.
            Ok(Err(e)) => {
                self.cursor.lock().transient = Some(e.to_string());
                return Ok(Vec::new());
            }
            Err(e) => {
                self.cursor.lock().transient = Some(e.to_string());
                return Ok(Vec::new());
            }
        };
        {
            let mut g = self.cursor.lock();
            if pulled.gone {
                let since = *g.gone_since.get_or_insert_with(Instant::now);
                if since.elapsed() < REBIND_GRACE {
                    // A seek elsewhere deletes and recreates it: pull again at the next
                    // wake.
                    g.transient = Some("the durable consumer is not on the server".to_owned());
                    return Ok(Vec::new());
                }
                let stop = JetStreamError::new(
                    StreamErrorKind::Unavailable,
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
        }
        let out = self.hand_out_buffered(max).unwrap_or_default();
        self.cursor.nudge();
        Ok(out)
    }

    fn finish(&self, done: &[Finished]) -> Result<(), StreamError> {
        let mut dead = Vec::new();
        let mut wake = false;
        let mut any = false;
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
                let Some(d) = g.outstanding.remove(&seq) else {
                    continue;
                };
                any = true;
                match &f.outcome {
                    Outcome::DeadLettered { reason, attempts } => {
                        dead.push((d, Arc::clone(&f.message), reason.clone(), *attempts));
                    }
                    // Plain, in order, confirmed once per batch (module docs, "Finishing").
                    _ => self.acker.send(d, Finish::Ack),
                }
            }
        }
        if !any {
            return Ok(());
        }
        let mut result = Ok(());
        if !dead.is_empty() {
            let (dlq, acker) = (self.dlq.clone(), self.acker.clone());
            let bound = self
                .shared
                .bound(2 * u32::try_from(dead.len()).unwrap_or(u32::MAX / 2));
            result = self.shared.call(bound, async move {
                let mut first_error = None;
                let mut terminated = false;
                for (d, message, reason, attempts) in dead {
                    // Stored in the DLQ first; only then is the original given up.
                    match dlq.put(&message, &reason, attempts).await {
                        Ok(()) => {
                            acker.send(d, Finish::Term);
                            terminated = true;
                        }
                        Err(e) => {
                            first_error.get_or_insert(e);
                        }
                    }
                }
                if terminated && let Err(e) = acker.flush().await {
                    first_error.get_or_insert(backend_error(
                        StreamErrorKind::Unavailable,
                        format_args!("terminating a dead letter: {e}"),
                    ));
                }
                first_error.map_or(Ok(()), Err)
            });
        }
        self.cursor.note_change();
        if wake {
            // The next returned message may go out now.
            self.cursor.wake();
        } else {
            // Room in the window: the standing pull may refill.
            self.cursor.nudge();
        }
        result
    }

    fn seek(&self, at: StartAt) -> Result<u64, StreamError> {
        if self.cursor.is_closed() {
            return Err(StreamError::Closed);
        }
        let js = self.shared.js.clone();
        let (stream, spec) = (self.stream.clone(), self.spec.clone());
        let (puller, acker, cursor) = (
            Arc::clone(&self.puller),
            self.acker.clone(),
            Arc::clone(&self.cursor),
        );
        let start = at;
        // Reads of the snapshot begun before are void from here on.
        let _ = cursor.positions().next_epoch();
        let info = self.shared.call(self.shared.bound(7), async move {
            // No pull in flight while the consumer is replaced.
            let _pulling = puller.exclusive().await;
            {
                let mut g = cursor.lock();
                // Void once the consumer is deleted; late finishes of them are ignored.
                g.outstanding.clear();
                g.buffer.clear();
                g.alone = None;
                g.gone_since = None;
                g.error = None;
                g.handed = 0;
            }
            // Every finish sent lands before the delete: none can reach the consumer
            // created in its place under the same name. A server away fails the delete
            // below anyway.
            let _ = acker.flush().await;
            if let StartAt::Offset(n) = start
                && n != 0
            {
                let (first, end) = bounds(&js, &stream).await?;
                check_offset(n, first, end)?;
            }
            js.delete_consumer(&stream, spec.durable())
                .await
                .map_err(|e| seam("deleting the durable consumer to seek", e))?;
            let durable = js
                .durable(spec.start(start))
                .await
                .map_err(|e| seam("creating the durable consumer at the new start", e))?;
            // Read before a pull moves it (the lock is still held).
            let info = durable.info().await;
            puller.replace_durable(durable);
            // A read begun before the new consumer is in place is void too.
            let ticket = cursor.positions().next_epoch();
            let (_, end) = bounds(&js, &stream).await?;
            let info = info.map_err(|e| seam("reading the durable consumer's state", e))?;
            Ok((ticket, Positions::new(&info, end)))
        });
        self.cursor.note_change();
        self.cursor.wake();
        let (ticket, info) = info?;
        self.cursor.positions().store(ticket, info);
        Ok(info.position)
    }

    fn commit(&self) -> Result<u64, StreamError> {
        if self.cursor.is_closed() {
            return Err(StreamError::Closed);
        }
        // The ack floor counts only what the server applied.
        self.confirm_finishes()?;
        Ok(self.info()?.committed)
    }

    fn state(&self) -> CursorState {
        // Local only (the seam's promise): the cursor's own state and the positions
        // snapshot its network work keeps fresh (see `positions`). No lock here is ever
        // held across a network call.
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
        state.position = handed;
        if let Some(info) = self.cursor.positions().get() {
            state.committed = info.committed;
            state.position = info.position.max(handed);
            // As on the embedded log: every stored offset from the commit on, those
            // finished above it included.
            state.lag = info.end.saturating_sub(info.committed);
        }
        state
    }

    fn refresh(&self) {
        // The feeder's, never an accessor's: reads only when something changed since the
        // snapshot's read began. Server away: the snapshot keeps the last values.
        if self.cursor.is_closed() || !self.cursor.positions().dirty() {
            return;
        }
        if self.acker.unconfirmed() {
            let _ = self.confirm_finishes();
        }
        let _ = self.info();
    }

    fn outstanding(&self) -> usize {
        // Handed out and not finished; what waits in the buffer is not handed out.
        self.cursor.lock().outstanding.len()
    }

    fn dead_letters(&self) -> Result<Vec<DurableDeadLetter>, StreamError> {
        let dlq = self.dlq.clone();
        let entries = self
            .shared
            .call(self.shared.bound(64), async move { dlq.list().await })?;
        Ok(entries.into_iter().map(|(_, e)| e).collect())
    }

    fn drain_dead_letters(&self) -> Result<Vec<DurableDeadLetter>, StreamError> {
        self.cursor.note_change();
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
            self.cursor.note_change();
            self.cursor.waker.wake();
        }
        Ok(done)
    }

    fn close(&self) {
        if self.cursor.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let (puller, acker, cursor, dlq) = (
            Arc::clone(&self.puller),
            self.acker.clone(),
            Arc::clone(&self.cursor),
            self.dlq.clone(),
        );
        let held = self.cursor.held().len();
        let bound = self
            .shared
            .bound(2 + u32::try_from(held / 256).unwrap_or(u32::MAX / 4));
        let _ = self.shared.call(bound, async move {
            // A pull in flight lands in the buffer first; none starts after (closed).
            let _pulling = puller.exclusive().await;
            let (mut held, alone) = {
                let mut g = cursor.lock();
                let g = &mut *g;
                let held: Vec<Arc<Delivery>> = g
                    .outstanding
                    .drain()
                    .map(|(_, d)| d)
                    .chain(g.buffer.drain(..).map(|(d, _, _)| d))
                    .collect();
                (held, g.alone.take())
            };
            if let Some((seq, before)) = alone {
                // A clean close is no death: the start counted for it is taken back.
                let _ = dlq.set_starts(seq, before).await;
            }
            // Handed out again at once rather than after the ack wait, in stream order
            // (the server redelivers in the order it was told).
            held.sort_by_key(|d| d.sequence());
            for d in held {
                acker.send(d, Finish::Nak);
            }
            // Server away: what is not confirmed comes back after the ack wait anyway.
            let _ = acker.flush().await;
            Ok(())
        });
        self.stop_tasks();
    }
}

impl Drop for JsCursor {
    fn drop(&mut self) {
        self.close();
    }
}
