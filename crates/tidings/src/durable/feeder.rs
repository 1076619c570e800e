//! The feeder: moves messages from a durable subscription's cursor into its queue, and
//! the messages that finished back to the cursor (R-BP-2, R-LOG-3, R-TIME-2).
//!
//! # Backpressure
//! At most `window` messages are outstanding (fetched from the cursor and not finished).
//! When the window is full — or the queue is, because an in-memory redrive shares it — the
//! feeder waits, it never refuses: the consumer only lags (R-BP-2). A message the queue had
//! no room for is kept and offered first on the next step.
//!
//! # Delayed messages
//! A message with a future delivery time waits in the broker's scheduler (R-TIME-2) and is
//! offered to this subscription alone when due; it stays outstanding meanwhile, so the
//! commit never passes it. Held messages do **not** take room in the window: messages due
//! now behind them are fetched and delivered at once (a backlog of delayed messages must not
//! hold back immediate ones). Memory stays bounded: at most [`max_held`] messages are held
//! per subscription; with that many waiting, the feeder fetches nothing more until some
//! fall due (the consumer lags, nothing is refused: R-BP-2).
//!
//! # Who runs it
//! The driver (R-EXE-4): the feeder is a [`Service`], one bounded [`Service::step`] at a time,
//! stepped by the thread driver's generic service loop, as a pool unit, by a tokio task on
//! the blocking pool, or by `run_until_idle` in the caller's thread under the manual driver.
//! Completions reached on a thread that must not block (a tokio worker) are handed to the
//! next step ([`ServiceHandle::defers_io`]).
//!
//! # The wake/step protocol
//! Every lock and flag here comes from `crate::sync`, so the models in
//! `driver::loom_models` run this code under loom:
//! * whatever may give the feeder work (an append through the cursor's waker, a completion,
//!   a seek, a stop) makes its change, then calls [`CursorFeeder::wake`]; the driver steps
//!   the feeder again after a step that such a wake overlapped;
//! * the step lock makes one step at a time, and lets `seek` and `shutdown` wait for a step
//!   under way (the pool and tokio drivers have no thread to join);
//! * `stop` is read by each step under the step lock: after `shutdown` took that lock, no
//!   step touches the cursor again;
//! * finished messages handed over by a tokio worker wait in `deferred` until the next step,
//!   or `shutdown`, reports them — each exactly once; once `shutdown` took them, a later
//!   hand-over is dropped (those messages stay above the final position and are redelivered
//!   after a restart, like any message not finished before close).
//!
//! # Storing the position when idle
//! An idle feeder lets the cursor store its position, but at most once per
//! [`IDLE_COMMIT_GAP`] on the broker's clock while messages keep arriving: under a steady
//! trickle the feeder runs dry after every append, and storing the position each time
//! (two fsyncs in the embedded log) would compete with the stream's own syncs. A step
//! that skips the store asks to run again when the gap is over, so the position of a
//! subscription that went quiet is stored within that gap. On a clock that moves only
//! when told (a manual clock), or under a driver that steps it only when told (the manual
//! driver: [`ServiceHandle::wakes_on_time`]), there is no gap: every idle step stores.
//! Under that driver a step that waits for room stores too, since the next step waits for
//! the caller's next `run_until_idle`.
//!
//! # Closing
//! [`CursorFeeder::shutdown`] stops the feeder, waits for a step under way, reports what a
//! tokio worker handed over, and closes the cursor (which writes the final position).
//! Messages still outstanding were not finished: they are redelivered after a restart.

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::driver::{Service, ServiceHandle, ServiceStep};
use crate::message::Message;
use crate::subscription::SubscriptionId;
use crate::subscription::shell::FeedOffer;
use crate::sync::{AtomicBool, AtomicUsize, Mutex, Ordering};

use super::source::{BackendCursor, Finished, Outcome};
use super::{StartAt, StreamError};

/// Most messages fetched per step.
const BATCH: usize = 256;
/// Fewest delayed messages a subscription may hold in the scheduler (see [`max_held`]).
const MIN_HELD: usize = 4096;

/// How many delayed messages a durable subscription with this window holds in memory at
/// most: the window or [`MIN_HELD`], whichever is larger.
pub(crate) fn max_held(window: usize) -> usize {
    window.max(MIN_HELD)
}
/// Least time between two stores of the position by an idle feeder (see the module docs).
pub(crate) const IDLE_COMMIT_GAP: Duration = Duration::from_millis(50);

/// What holding a message until its delivery time did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    /// It is not delayed: offer it now.
    NotDelayed,
    /// The scheduler holds it and calls back when it is due.
    Waiting,
    /// The broker is closing.
    Closed,
}

/// Called with a held message when it falls due.
pub(crate) type OnDue = Box<dyn FnOnce(&Arc<Message>) + Send>;

/// The narrow handle a feeder gets on the subscription it feeds and the broker around it
/// (the broker implements it; the feeder never sees either).
pub(crate) trait FeedSink: Send + Sync + 'static {
    /// Offer a message from the stream, never waiting: the room check and the offer happen
    /// under one subscription lock (the subscription's own answer,
    /// [`SubscriptionShell::offer_from_stream`](crate::subscription::shell::SubscriptionShell::offer_from_stream);
    /// [`FeedOffer::Closed`] once it is gone).
    fn offer(&self, message: &Arc<Message>) -> FeedOffer;
    /// Hold `message` until its delivery time, when it has one in the future (R-TIME-2).
    fn hold(&self, message: &Arc<Message>, on_due: OnDue) -> Held;
}

/// One durable subscription's feeder, owning its cursor.
pub(crate) struct CursorFeeder {
    /// The durable name.
    pub(crate) name: String,
    /// The stream it reads.
    pub(crate) stream: String,
    /// The subscription it feeds.
    pub(crate) sub_id: SubscriptionId,
    pub(crate) cursor: Box<dyn BackendCursor>,
    sink: Arc<dyn FeedSink>,
    window: usize,
    /// Delayed messages held in the scheduler: outstanding in the cursor, but not in the
    /// window (see the module docs).
    held: AtomicUsize,
    /// Asked to stop: the next step returns `Stopped` without touching the cursor.
    stop: AtomicBool,
    /// The driver's handle on this feeder; unset until started (a one-time publication
    /// before the wake in [`CursorFeeder::started`]: a step that finds it unset is idle).
    handle: OnceLock<Box<dyn ServiceHandle>>,
    /// Held for one step (or the final close), so shutdown and seek wait for a step under
    /// way on a pool worker or the blocking pool.
    step: Mutex<()>,
    /// Fetched (or fallen due) and not yet taken by the queue (it was full): offered first
    /// next step.
    backlog: Mutex<VecDeque<Arc<Message>>>,
    /// Finished messages handed over by a thread that must not block (a tokio worker);
    /// `None` once shutdown took the last of them.
    deferred: Mutex<Option<Vec<Finished>>>,
    /// The cursor failed to fetch: no fetch until a seek.
    halted: AtomicBool,
    /// When an idle step last let the cursor store its position (broker clock).
    last_idle: Mutex<Option<Instant>>,
    /// The broker's clock: paces the idle stores.
    clock: Arc<dyn Clock>,
    /// This feeder itself (callbacks hold it weakly).
    me: Weak<CursorFeeder>,
}

impl CursorFeeder {
    /// A feeder of `sink` from `cursor`, at most `window` outstanding, pacing its idle
    /// stores of the position on `clock`.
    pub(crate) fn new(
        name: &str,
        stream: &str,
        sub_id: SubscriptionId,
        cursor: Box<dyn BackendCursor>,
        sink: Arc<dyn FeedSink>,
        window: usize,
        clock: Arc<dyn Clock>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            name: name.to_owned(),
            stream: stream.to_owned(),
            sub_id,
            cursor,
            sink,
            window: window.max(1),
            held: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            handle: OnceLock::new(),
            step: Mutex::new(()),
            backlog: Mutex::new(VecDeque::new()),
            deferred: Mutex::new(Some(Vec::new())),
            halted: AtomicBool::new(false),
            last_idle: Mutex::new(None),
            clock,
            me: me.clone(),
        })
    }

    /// Hand over the driver's handle; its steps were idle until now.
    pub(crate) fn started(&self, handle: Box<dyn ServiceHandle>) {
        let _ = self.handle.set(handle); // a new feeder: not set before
        self.wake();
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// There may be work: an append, room freed, a seek, a stop request (made before this
    /// call). Never blocks.
    pub(crate) fn wake(&self) {
        if let Some(h) = self.handle.get() {
            h.wake();
        }
    }

    /// Stop the feeder and wait for it (its thread, or a step under way), report what a
    /// tokio worker handed over, then close the cursor: it writes the final position
    /// (outstanding messages stay above it and are redelivered after a restart) and
    /// releases the name. Idempotent.
    pub(crate) fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake();
        if let Some(h) = self.handle.get() {
            h.join();
        }
        let _step = self.step.lock();
        // Closes the hand-over too: what a worker hands over from now on is not reported.
        let items = self.deferred.lock().take();
        if let Some(items) = items
            && !items.is_empty()
        {
            self.report(&items);
        }
        self.cursor.close();
    }

    /// Move the cursor (R-LOG-4) and commit it; what was fetched and not yet offered is
    /// dropped (it lies behind or beyond the new position).
    pub(crate) fn seek(&self, at: StartAt) -> Result<u64, StreamError> {
        let _step = self.step.lock();
        let target = self.cursor.seek(at)?;
        self.backlog.lock().clear();
        self.halted.store(false, Ordering::Release);
        drop(_step);
        self.wake();
        Ok(target)
    }

    /// The completion hook (a dispatcher's thread, outside the subscription lock). Where
    /// that thread must not block (tokio), the items go to the next step; either way the
    /// feeder is woken: room may have been freed in its window or queue.
    pub(crate) fn on_finished(&self, items: Vec<Finished>) {
        if self.handle.get().is_some_and(|h| h.defers_io()) {
            if let Some(deferred) = self.deferred.lock().as_mut() {
                deferred.extend(items);
            }
        } else {
            self.report(&items);
        }
        self.wake();
    }

    /// Manual driver: step the feeder in the caller's thread until it has nothing more to
    /// offer now (an idle step stores the position). Returns the steps that made progress.
    pub(crate) fn run_here(&self) -> usize {
        self.handle.get().map_or(0, |h| h.run_here())
    }

    fn report(&self, items: &[Finished]) {
        if let Err(e) = self.cursor.finish(items) {
            tracing::error!("tidings: durable {}: {e}", self.name);
        }
    }

    /// Report what a worker handed over (under the step lock).
    fn finish_deferred(&self) {
        let items = self.deferred.lock().as_mut().map(std::mem::take);
        if let Some(items) = items
            && !items.is_empty()
        {
            self.report(&items);
        }
    }

    /// Offer one fetched message: held until due when delayed, finished at once when
    /// filtered out.
    fn offer(&self, message: &Arc<Message>) -> FeedOffer {
        if message.deliver_at().is_some() {
            let me = self.me.clone();
            let on_due: OnDue = Box::new(move |m| {
                if let Some(f) = me.upgrade() {
                    f.offer_due(m);
                }
            });
            // Counted before the scheduler can call back (it may, at once, on its thread).
            self.held.fetch_add(1, Ordering::AcqRel);
            match self.sink.hold(message, on_due) {
                Held::Waiting => return FeedOffer::Taken,
                Held::Closed => {
                    self.held.fetch_sub(1, Ordering::AcqRel);
                    return FeedOffer::Closed;
                }
                Held::NotDelayed => {
                    self.held.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
        let offered = self.sink.offer(message);
        if offered == FeedOffer::Filtered {
            self.report(&[Finished::new(message.clone(), Outcome::Filtered)]);
        }
        offered
    }

    /// A held message fell due (on the scheduler's thread, which may be a runtime worker:
    /// a filtered one is reported like a completion; one the queue has no room for waits
    /// in the backlog, taking room in the window).
    fn offer_due(&self, message: &Arc<Message>) {
        // Leaves the scheduler for the queue: it takes room in the window from now on, and
        // the feeder may fetch again if it stopped at the held limit.
        let was = self.held.fetch_sub(1, Ordering::AcqRel);
        if was >= max_held(self.window) {
            self.wake();
        }
        match self.sink.offer(message) {
            FeedOffer::Filtered => {
                self.on_finished(vec![Finished::new(message.clone(), Outcome::Filtered)]);
            }
            // The queue has no room (more fell due at once than it holds): the feeder
            // offers it first when a completion frees room — never an overflow.
            FeedOffer::Full => {
                self.backlog.lock().push_back(message.clone());
                self.wake();
            }
            FeedOffer::Taken | FeedOffer::Closed => {}
        }
    }

    /// Offer `messages` in order; the first the queue refuses and those after it are kept
    /// for the next step. `None` when all were taken.
    fn offer_all(&self, messages: impl IntoIterator<Item = Arc<Message>>) -> Option<Pass> {
        let mut messages = messages.into_iter();
        while let Some(m) = messages.next() {
            match self.offer(&m) {
                FeedOffer::Taken | FeedOffer::Filtered => {}
                // Woken by the next completion.
                FeedOffer::Full => {
                    // The backlog held nothing fetched here (taken at the start of the
                    // step, under the step lock; only messages falling due join it
                    // meanwhile): fetch order is kept.
                    let mut backlog = self.backlog.lock();
                    backlog.push_back(m);
                    backlog.extend(messages);
                    return Some(Pass::Waiting);
                }
                // Never finished: redelivered after a restart.
                FeedOffer::Closed => return Some(Pass::Stopped),
            }
        }
        None
    }

    /// One pass under the step lock: report what was handed over, offer the backlog, then
    /// fetch what the window has room for and offer it.
    fn pass(&self) -> Pass {
        self.finish_deferred();
        let backlog: Vec<Arc<Message>> = self.backlog.lock().drain(..).collect();
        if !backlog.is_empty()
            && let Some(pass) = self.offer_all(backlog)
        {
            return pass;
        }
        if self.halted.load(Ordering::Acquire) {
            return Pass::Waiting; // until a seek
        }
        // Held (delayed) messages are outstanding but take no room in the window.
        let held = self.held.load(Ordering::Acquire);
        let in_window = self.cursor.outstanding().saturating_sub(held);
        let held_room = max_held(self.window).saturating_sub(held);
        if in_window >= self.window || held_room == 0 {
            // Woken when a completion frees room, or a held message falls due.
            return Pass::Waiting;
        }
        let room = (self.window - in_window).min(held_room).min(BATCH);
        let fetched = match self.cursor.fetch_shared(room) {
            Ok(m) => m,
            Err(StreamError::Closed) => return Pass::Stopped,
            Err(e) => {
                tracing::error!("tidings: durable {} stopped fetching: {e}", self.name);
                self.halted.store(true, Ordering::Release);
                return Pass::Waiting;
            }
        };
        if fetched.is_empty() {
            return Pass::Dry; // woken by the next append
        }
        self.offer_all(fetched).unwrap_or(Pass::Again)
    }

    /// Nothing to fetch: let the cursor store its position, unless it did less than
    /// [`IDLE_COMMIT_GAP`] ago; then run again when the gap is over (or on a wake).
    fn idle_store(&self, now: Instant, handle: &dyn ServiceHandle) -> ServiceStep {
        let last = *self.last_idle.lock();
        if let Some(due) = last.map(|at| at + IDLE_COMMIT_GAP)
            && due > now
            // A driver or clock that moves only when told would never reach `due` by
            // itself.
            && handle.wakes_on_time()
            && self.clock.wait_hint(due).is_some()
        {
            return ServiceStep::WakeAt(due);
        }
        self.store(now);
        ServiceStep::Idle
    }

    /// Let the cursor store its position (if it moved) now.
    fn store(&self, now: Instant) {
        *self.last_idle.lock() = Some(now);
        self.cursor.idle();
    }
}

/// What one pass of a step did (see [`CursorFeeder::pass`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Offered what it fetched: there may be more.
    Again,
    /// Nothing to fetch: the stream's end.
    Dry,
    /// Waiting for room (window or queue full) or a seek (halted).
    Waiting,
    /// The cursor or the subscription is closed.
    Stopped,
}

impl Service for CursorFeeder {
    fn name(&self) -> String {
        format!("tidings-feeder-{}", self.name)
    }

    fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    /// One bounded pass that never waits: report what was handed over, offer the backlog,
    /// then fetch what the window has room for and offer it. A feeder that ran dry lets the
    /// cursor store its position (paced, see the module docs).
    fn step(&self, now: Instant) -> ServiceStep {
        let Some(handle) = self.handle.get() else {
            return ServiceStep::Idle; // started, but not yet handed its handle: woken then
        };
        let handle = handle.as_ref();
        let _step = self.step.lock();
        if self.stopping() {
            return ServiceStep::Stopped; // `shutdown` reports what was handed over
        }
        match self.pass() {
            Pass::Again => ServiceStep::Again,
            Pass::Stopped => ServiceStep::Stopped,
            Pass::Dry => {
                let step = self.idle_store(now, handle);
                if !handle.wakes_on_time() {
                    // The caller looks next (see below); the others' cursors keep their
                    // state fresh themselves.
                    self.cursor.refresh();
                }
                step
            }
            Pass::Waiting => {
                // A driver that steps the feeder only when told (the manual driver) may
                // not step it again before the caller looks at the position: store what
                // was finished so far now, and bring the cursor's state up to date. The
                // others step it again as room is freed, and store when it runs dry.
                if !handle.wakes_on_time() {
                    self.store(now);
                    self.cursor.refresh();
                }
                ServiceStep::Idle
            }
        }
    }
}

#[cfg(all(test, not(tidings_loom)))]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::durable::{CursorState, DurableDeadLetter};

    /// A real-time-like clock moved by hand (its `wait_hint` says "sleep", unlike
    /// `ManualClock`, so the feeder paces its idle stores on it).
    struct SteppedClock(Mutex<Instant>);

    impl Clock for SteppedClock {
        fn now(&self) -> Instant {
            *self.0.lock()
        }
        fn wall(&self) -> std::time::SystemTime {
            std::time::SystemTime::UNIX_EPOCH
        }
    }

    /// An empty cursor that counts the idle stores, finished messages and closes it was
    /// asked for.
    #[derive(Default)]
    struct EmptyCursor {
        idles: Arc<AtomicUsize>,
        finished: Arc<AtomicUsize>,
        closed: Arc<AtomicUsize>,
        states: Arc<AtomicUsize>,
    }

    impl BackendCursor for EmptyCursor {
        fn fetch(&self, _max: usize) -> Result<Vec<Message>, StreamError> {
            Ok(Vec::new())
        }
        fn finish(&self, done: &[Finished]) -> Result<(), StreamError> {
            self.finished.fetch_add(done.len(), Ordering::SeqCst);
            Ok(())
        }
        fn idle(&self) {
            self.idles.fetch_add(1, Ordering::SeqCst);
        }
        fn seek(&self, _at: StartAt) -> Result<u64, StreamError> {
            Ok(0)
        }
        fn commit(&self) -> Result<u64, StreamError> {
            Ok(0)
        }
        fn state(&self) -> CursorState {
            self.states.fetch_add(1, Ordering::SeqCst);
            CursorState::default()
        }
        fn outstanding(&self) -> usize {
            0
        }
        fn dead_letters(&self) -> Result<Vec<DurableDeadLetter>, StreamError> {
            Ok(Vec::new())
        }
        fn drain_dead_letters(&self) -> Result<Vec<DurableDeadLetter>, StreamError> {
            Ok(Vec::new())
        }
        fn redrive_dead_letters(
            &self,
            _select: &mut dyn FnMut(&DurableDeadLetter) -> bool,
        ) -> Result<usize, StreamError> {
            Ok(0)
        }
        fn close(&self) {
            self.closed.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A tokio worker's handle: finished messages are handed to the next step.
    struct Deferring;

    impl ServiceHandle for Deferring {
        fn wake(&self) {}
        fn defers_io(&self) -> bool {
            true
        }
    }

    struct NoSink;

    impl FeedSink for NoSink {
        fn offer(&self, _message: &Arc<Message>) -> FeedOffer {
            FeedOffer::Closed
        }
        fn hold(&self, _message: &Arc<Message>, _on_due: OnDue) -> Held {
            Held::Closed
        }
    }

    /// A driver's handle that does nothing; `on_time`: whether its driver steps the feeder
    /// by itself at a due time.
    struct NoHandle {
        on_time: bool,
    }

    impl ServiceHandle for NoHandle {
        fn wake(&self) {}
        fn wakes_on_time(&self) -> bool {
            self.on_time
        }
    }

    /// A started feeder over an empty cursor on `clock`, and the cursor's idle-store count.
    fn idle_feeder(clock: Arc<dyn Clock>) -> (Arc<CursorFeeder>, Arc<AtomicUsize>) {
        idle_feeder_on(clock, true)
    }

    fn idle_feeder_on(
        clock: Arc<dyn Clock>,
        on_time: bool,
    ) -> (Arc<CursorFeeder>, Arc<AtomicUsize>) {
        let cursor = EmptyCursor::default();
        let idles = cursor.idles.clone();
        let feeder = CursorFeeder::new(
            "bill",
            "orders",
            SubscriptionId(1),
            Box::new(cursor),
            Arc::new(NoSink),
            8,
            clock,
        );
        feeder.started(Box::new(NoHandle { on_time }));
        (feeder, idles)
    }

    /// R-LOG-3: an idle feeder stores the position at once, then at most once per gap
    /// while it keeps running dry, asking to run again when the gap is over.
    #[test]
    fn idle_stores_are_paced_by_the_gap() {
        let t0 = Instant::now();
        let clock = Arc::new(SteppedClock(Mutex::new(t0)));
        let (feeder, idles) = idle_feeder(clock.clone());
        assert_eq!(feeder.step(clock.now()), ServiceStep::Idle);
        assert_eq!(idles.load(Ordering::SeqCst), 1);
        // Dry again within the gap: no store, run again at its end.
        *clock.0.lock() = t0 + IDLE_COMMIT_GAP / 2;
        assert_eq!(
            feeder.step(clock.now()),
            ServiceStep::WakeAt(t0 + IDLE_COMMIT_GAP)
        );
        assert_eq!(idles.load(Ordering::SeqCst), 1);
        // The gap is over: the store happens.
        *clock.0.lock() = t0 + IDLE_COMMIT_GAP;
        assert_eq!(feeder.step(clock.now()), ServiceStep::Idle);
        assert_eq!(idles.load(Ordering::SeqCst), 2);
    }

    /// On a clock that moves only when told, every idle step stores (no pacing).
    #[test]
    fn a_manual_clock_stores_on_every_idle_step() {
        let clock = Arc::new(crate::ManualClock::new());
        let (feeder, idles) = idle_feeder(clock.clone());
        for n in 1..=3 {
            assert_eq!(feeder.step(clock.now()), ServiceStep::Idle);
            assert_eq!(idles.load(Ordering::SeqCst), n);
        }
    }

    /// Under a driver that steps the feeder only when told (the manual driver), every idle
    /// step stores too: a due time would wait for the next `run_until_idle`.
    #[test]
    fn a_driver_that_steps_only_when_told_stores_on_every_idle_step() {
        let clock = Arc::new(SteppedClock(Mutex::new(Instant::now())));
        let (feeder, idles) = idle_feeder_on(clock.clone(), false);
        for n in 1..=3 {
            assert_eq!(feeder.step(clock.now()), ServiceStep::Idle);
            assert_eq!(idles.load(Ordering::SeqCst), n);
        }
    }

    /// A step asks the cursor how much it holds through `outstanding`, never through
    /// `state`, which costs a remote backend a round trip per step (issue 28).
    #[test]
    fn a_step_never_asks_the_cursor_for_its_state() {
        let clock = Arc::new(crate::ManualClock::new());
        let cursor = EmptyCursor::default();
        let states = cursor.states.clone();
        let feeder = CursorFeeder::new(
            "bill",
            "orders",
            SubscriptionId(1),
            Box::new(cursor),
            Arc::new(NoSink),
            8,
            clock.clone(),
        );
        feeder.started(Box::new(NoHandle { on_time: true }));
        for _ in 0..3 {
            assert_eq!(feeder.step(clock.now()), ServiceStep::Idle);
        }
        assert_eq!(states.load(Ordering::SeqCst), 0);
    }

    /// A stopped feeder's step touches nothing; `shutdown` reports what a worker handed
    /// over, once, and a hand-over after it is dropped (redelivered after a restart).
    #[test]
    fn shutdown_reports_the_hand_over_once() {
        let clock = Arc::new(crate::ManualClock::new());
        let cursor = EmptyCursor::default();
        let (finished, closed) = (cursor.finished.clone(), cursor.closed.clone());
        let feeder = CursorFeeder::new(
            "bill",
            "orders",
            SubscriptionId(1),
            Box::new(cursor),
            Arc::new(NoSink),
            8,
            clock.clone(),
        );
        feeder.started(Box::new(Deferring));
        let done = |n: usize| {
            let m = crate::message::MessageBuilder::new("t")
                .build_detached()
                .expect("a message");
            vec![Finished::new(Arc::new(m), Outcome::Delivered); n]
        };
        feeder.on_finished(done(2));
        assert_eq!(
            finished.load(Ordering::SeqCst),
            0,
            "handed over, not reported"
        );
        feeder.shutdown();
        assert_eq!(finished.load(Ordering::SeqCst), 2);
        assert_eq!(closed.load(Ordering::SeqCst), 1);
        assert_eq!(feeder.step(clock.now()), ServiceStep::Stopped);
        feeder.on_finished(done(1));
        feeder.shutdown();
        assert_eq!(
            finished.load(Ordering::SeqCst),
            2,
            "nothing after the shutdown"
        );
    }
}
