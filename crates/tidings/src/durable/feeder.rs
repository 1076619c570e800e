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
//! commit never passes it.
//!
//! # Who runs it
//! The driver (R-EXE-4): [`Feeder::run`] on a thread of its own under the thread driver,
//! [`Feeder::step`] as a pool unit, a tokio task (steps on the blocking pool), or
//! `run_until_idle` in the caller's thread under the manual driver. Completions reached
//! on a thread that must not block (a tokio worker) are handed to the next step
//! ([`FeederHandle::defers_io`]).
//!
//! # Storing the position when idle
//! An idle feeder lets the cursor store its position, but at most once per
//! [`IDLE_COMMIT_GAP`] on the broker's clock while messages keep arriving: under a steady
//! trickle the feeder runs dry after every append, and storing the position each time
//! (two fsyncs in the embedded log) would compete with the stream's own syncs. A step
//! that skips the store asks to run again when the gap is over, so the position of a
//! subscription that went quiet is stored within that gap. On a clock that moves only
//! when told (a manual clock) there is no gap: every idle step stores.
//!
//! # Closing
//! [`CursorFeeder::shutdown`] stops the feeder, waits for a step under way, reports what a
//! tokio worker handed over, and closes the cursor (which writes the final position).
//! Messages still outstanding were not finished: they are redelivered after a restart.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::clock::Clock;
use crate::driver::{FeedStep, Feeder, FeederHandle};
use crate::message::Message;
use crate::subscription::SubscriptionId;

use super::source::{BackendCursor, Finished, Outcome};
use super::{StartAt, StreamError};

/// Longest wait of the thread driver's loop before it lets an idle cursor store its
/// position and re-checks the stop flag.
const IDLE_WAIT: Duration = Duration::from_millis(50);
/// Most messages fetched per step.
const BATCH: usize = 256;
/// Least time between two stores of the position by an idle feeder (see the module docs).
pub(crate) const IDLE_COMMIT_GAP: Duration = IDLE_WAIT;

/// What offering one message to the subscription did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offered {
    /// Queued (or dead-lettered at once; the completion reports it).
    Taken,
    /// The subscription's filters excluded it: finished without delivery.
    Filtered,
    /// The queue has no room: nothing was counted; offer it again later.
    Full,
    /// The subscription is closed.
    Closed,
}

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
    /// under one subscription lock.
    fn offer(&self, message: &Arc<Message>) -> Offered;
    /// Offer a message that fell due while the queue is full: the ordinary overflow policy
    /// decides (an overflow is dead-lettered durably and finished, never lost); the
    /// scheduler cannot wait.
    fn offer_due_anyway(&self, message: &Arc<Message>);
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
    stop: AtomicBool,
    /// The driver's handle on this feeder; unset until started.
    handle: OnceLock<Box<dyn FeederHandle>>,
    /// Held for one step (or the final close), so shutdown and seek wait for a step under
    /// way on a pool worker or the blocking pool.
    step: Mutex<()>,
    /// Fetched, not yet taken by the queue (it was full): offered first next step.
    backlog: Mutex<VecDeque<Arc<Message>>>,
    /// Finished messages handed over by a thread that must not block (a tokio worker).
    deferred: Mutex<Vec<Finished>>,
    /// The cursor failed to fetch: no fetch until a seek.
    halted: AtomicBool,
    /// When an idle step last let the cursor store its position (broker clock).
    last_idle: Mutex<Option<Instant>>,
    /// The broker's clock: paces the idle stores.
    clock: Arc<dyn Clock>,
    /// The thread driver's loop waits here for a wake.
    woken: Mutex<bool>,
    wakeup: Condvar,
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
            stop: AtomicBool::new(false),
            handle: OnceLock::new(),
            step: Mutex::new(()),
            backlog: Mutex::new(VecDeque::new()),
            deferred: Mutex::new(Vec::new()),
            halted: AtomicBool::new(false),
            last_idle: Mutex::new(None),
            clock,
            woken: Mutex::new(false),
            wakeup: Condvar::new(),
            me: me.clone(),
        })
    }

    /// Hand over the driver's handle; its steps were idle until now.
    pub(crate) fn started(&self, handle: Box<dyn FeederHandle>) {
        let _ = self.handle.set(handle); // a new feeder: not set before
        self.wake();
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// There may be work: an append, room freed, a seek, a stop request. Never blocks.
    pub(crate) fn wake(&self) {
        *self.woken.lock() = true;
        self.wakeup.notify_all();
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
        self.finish_deferred();
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
            self.deferred.lock().extend(items);
        } else {
            self.report(&items);
        }
        self.wake();
    }

    fn report(&self, items: &[Finished]) {
        if let Err(e) = self.cursor.finish(items) {
            tracing::error!("tidings: durable {}: {e}", self.name);
        }
    }

    fn finish_deferred(&self) {
        let items = std::mem::take(&mut *self.deferred.lock());
        if !items.is_empty() {
            self.report(&items);
        }
    }

    /// Offer one fetched message: held until due when delayed, finished at once when
    /// filtered out.
    fn offer(&self, message: &Arc<Message>) -> Offered {
        if message.deliver_at().is_some() {
            let me = self.me.clone();
            let on_due: OnDue = Box::new(move |m| {
                if let Some(f) = me.upgrade() {
                    f.offer_due(m);
                }
            });
            match self.sink.hold(message, on_due) {
                Held::Waiting => return Offered::Taken,
                Held::Closed => return Offered::Closed,
                Held::NotDelayed => {}
            }
        }
        let offered = self.sink.offer(message);
        if offered == Offered::Filtered {
            self.report(&[Finished::new(message.clone(), Outcome::Filtered)]);
        }
        offered
    }

    /// A held message fell due (on the scheduler's thread, which may be a runtime worker:
    /// a filtered one is reported like a completion).
    fn offer_due(&self, message: &Arc<Message>) {
        match self.sink.offer(message) {
            Offered::Filtered => {
                self.on_finished(vec![Finished::new(message.clone(), Outcome::Filtered)]);
            }
            Offered::Full => self.sink.offer_due_anyway(message),
            Offered::Taken | Offered::Closed => {}
        }
    }

    /// Offer `messages` in order; the first the queue refuses and those after it are kept
    /// for the next step. `None` when all were taken.
    fn offer_all(&self, messages: impl IntoIterator<Item = Arc<Message>>) -> Option<FeedStep> {
        let mut messages = messages.into_iter();
        while let Some(m) = messages.next() {
            match self.offer(&m) {
                Offered::Taken | Offered::Filtered => {}
                // Woken by the next completion.
                Offered::Full => {
                    // The backlog is empty here (taken at the start of the step, under
                    // the step lock): fetch order is kept.
                    let mut backlog = self.backlog.lock();
                    backlog.push_back(m);
                    backlog.extend(messages);
                    return Some(FeedStep::Idle);
                }
                // Never finished: redelivered after a restart.
                Offered::Closed => return Some(FeedStep::Stopped),
            }
        }
        None
    }

    /// One bounded pass that never waits: report what was handed over, offer the backlog,
    /// then fetch what the window has room for and offer it. An idle feeder lets the
    /// cursor store its position.
    fn step_once(&self) -> FeedStep {
        if self.handle.get().is_none() {
            return FeedStep::Idle; // started, but not yet handed its handle: woken then
        }
        let _step = self.step.lock();
        self.finish_deferred();
        if self.stopping() {
            return FeedStep::Stopped;
        }
        let backlog: Vec<Arc<Message>> = self.backlog.lock().drain(..).collect();
        if !backlog.is_empty()
            && let Some(step) = self.offer_all(backlog)
        {
            return step;
        }
        if self.halted.load(Ordering::Acquire) {
            return FeedStep::Idle; // until a seek
        }
        let outstanding = self.cursor.state().outstanding;
        if outstanding >= self.window {
            return FeedStep::Idle; // woken when a completion frees room
        }
        let fetched = match self.cursor.fetch((self.window - outstanding).min(BATCH)) {
            Ok(m) => m,
            Err(StreamError::Closed) => return FeedStep::Stopped,
            Err(e) => {
                tracing::error!("tidings: durable {} stopped fetching: {e}", self.name);
                self.halted.store(true, Ordering::Release);
                return FeedStep::Idle;
            }
        };
        if fetched.is_empty() {
            // Idle at the end of the stream: store the position if it moved (paced);
            // woken by the next append.
            return self.idle_store();
        }
        match self.offer_all(fetched.into_iter().map(Arc::new)) {
            Some(step) => step,
            None => FeedStep::Again,
        }
    }

    /// Nothing to fetch: let the cursor store its position, unless it did less than
    /// [`IDLE_COMMIT_GAP`] ago; then run again when the gap is over (or on a wake).
    fn idle_store(&self) -> FeedStep {
        let now = self.clock.now();
        let mut last = self.last_idle.lock();
        if let Some(due) = last.map(|at| at + IDLE_COMMIT_GAP)
            && due > now
            // A clock that moves only when told would never reach `due` by itself.
            && self.clock.wait_hint(due).is_some()
        {
            return FeedStep::WakeAt(due);
        }
        *last = Some(now);
        drop(last);
        self.cursor.idle();
        FeedStep::Idle
    }

    /// The thread driver's loop: steps, and between them a bounded wait for a wake (until
    /// a step's `WakeAt`, at most [`IDLE_WAIT`]). A wait that times out lets the cursor
    /// store its position.
    fn run_loop(&self) {
        loop {
            let wait = match self.step_once() {
                FeedStep::Again => continue,
                FeedStep::Stopped => return,
                FeedStep::Idle => IDLE_WAIT,
                FeedStep::WakeAt(at) => self
                    .clock
                    .wait_hint(at)
                    .map_or(IDLE_WAIT, |d| d.min(IDLE_WAIT)),
            };
            let mut woken = self.woken.lock();
            let timed_out =
                !*woken && !self.stopping() && self.wakeup.wait_for(&mut woken, wait).timed_out();
            *woken = false;
            drop(woken);
            if timed_out {
                *self.last_idle.lock() = Some(self.clock.now());
                self.cursor.idle();
            }
        }
    }

    /// Manual driver: step until nothing more can be done now, then let the cursor store
    /// its position. Returns the steps that made progress.
    pub(crate) fn run_now(&self) -> usize {
        let mut progress = 0;
        while self.step_once() == FeedStep::Again {
            progress += 1;
        }
        self.cursor.idle();
        progress
    }
}

impl Feeder for CursorFeeder {
    fn name(&self) -> String {
        format!("tidings-feeder-{}", self.name)
    }
    fn step(&self) -> FeedStep {
        self.step_once()
    }
    fn run(&self) {
        self.run_loop();
    }
    fn wait_hint(&self, at: Instant) -> Option<Duration> {
        self.clock.wait_hint(at)
    }
}

#[cfg(test)]
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

    /// An empty cursor that counts the idle stores it was asked for.
    #[derive(Default)]
    struct EmptyCursor {
        idles: Arc<AtomicUsize>,
    }

    impl BackendCursor for EmptyCursor {
        fn fetch(&self, _max: usize) -> Result<Vec<Message>, StreamError> {
            Ok(Vec::new())
        }
        fn finish(&self, _done: &[Finished]) -> Result<(), StreamError> {
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
            CursorState::default()
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
        fn close(&self) {}
    }

    struct NoSink;

    impl FeedSink for NoSink {
        fn offer(&self, _message: &Arc<Message>) -> Offered {
            Offered::Closed
        }
        fn offer_due_anyway(&self, _message: &Arc<Message>) {}
        fn hold(&self, _message: &Arc<Message>, _on_due: OnDue) -> Held {
            Held::Closed
        }
    }

    struct NoHandle;

    impl FeederHandle for NoHandle {
        fn wake(&self) {}
    }

    /// A started feeder over an empty cursor on `clock`, and the cursor's idle-store count.
    fn idle_feeder(clock: Arc<dyn Clock>) -> (Arc<CursorFeeder>, Arc<AtomicUsize>) {
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
        feeder.started(Box::new(NoHandle));
        (feeder, idles)
    }

    /// R-LOG-3: an idle feeder stores the position at once, then at most once per gap
    /// while it keeps running dry, asking to run again when the gap is over.
    #[test]
    fn idle_stores_are_paced_by_the_gap() {
        let t0 = Instant::now();
        let clock = Arc::new(SteppedClock(Mutex::new(t0)));
        let (feeder, idles) = idle_feeder(clock.clone());
        assert_eq!(feeder.step_once(), FeedStep::Idle);
        assert_eq!(idles.load(Ordering::SeqCst), 1);
        // Dry again within the gap: no store, run again at its end.
        *clock.0.lock() = t0 + IDLE_COMMIT_GAP / 2;
        assert_eq!(feeder.step_once(), FeedStep::WakeAt(t0 + IDLE_COMMIT_GAP));
        assert_eq!(idles.load(Ordering::SeqCst), 1);
        // The gap is over: the store happens.
        *clock.0.lock() = t0 + IDLE_COMMIT_GAP;
        assert_eq!(feeder.step_once(), FeedStep::Idle);
        assert_eq!(idles.load(Ordering::SeqCst), 2);
    }

    /// On a clock that moves only when told, every idle step stores (no pacing).
    #[test]
    fn a_manual_clock_stores_on_every_idle_step() {
        let (feeder, idles) = idle_feeder(Arc::new(crate::ManualClock::new()));
        for n in 1..=3 {
            assert_eq!(feeder.step_once(), FeedStep::Idle);
            assert_eq!(idles.load(Ordering::SeqCst), n);
        }
    }
}
