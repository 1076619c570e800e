//! The tokio driver: one task per dispatcher slot on a caller-supplied runtime (R-EXE-1,
//! R-EXE-3).
//!
//! Each task runs the same loop as a thread-driver dispatcher, as an `async fn`: poll the
//! subscription core, run the handler, report the outcome; when the core says the slot is
//! idle, await the slot's wake-up (a [`WakeSlot`] stores a permit, like `Notify::notify_one`,
//! so a wake-up that arrives before the task awaits is not lost); when a retry is due later,
//! await the wake-up or a tokio sleep, whichever comes first. With a [`ManualClock`](crate::ManualClock) the
//! clock's `wait_hint` says "until woken" and the broker wakes every slot when the clock is
//! advanced.
//!
//! # Handlers on the runtime
//! * Async handlers ([`AsyncHandler`](crate::AsyncHandler)) are awaited inside the slot's
//!   task; a panic while building or polling the future is caught and treated as a
//!   retryable error, exactly like a sync handler's panic.
//! * Sync handlers are called inline, on a runtime worker thread: **they must not block**
//!   (no long computations, no blocking I/O, no `Broker::request`). Use an async handler,
//!   or move blocking work to `tokio::task::spawn_blocking`, otherwise.
//!
//! # Durable feeders
//! A durable subscription's feeder is one task (R-EXE-4): it awaits a [`Notify`] (an
//! append, room freed, a seek, a stop) and runs each step — log reads, offset commits with
//! their fsync, durable-DLQ appends — through `spawn_blocking`, so no blocking file I/O runs
//! on a runtime worker. Messages finished by a dispatcher task are handed to that step
//! instead of being committed on the worker ([`FeederHandle::defers_io`]).
//!
//! # Waiting for tasks at close
//! Close waits for the tasks with a real-time deadline. From a thread that is inside a
//! tokio runtime context (a task, `block_on`, `spawn_blocking`), blocking could deadlock the
//! runtime the tasks need, so the sync [`Broker::close`](crate::Broker::close) does not wait
//! there: tasks still running are reported in `CloseReport::unjoined`.
//! [`Broker::close_async`](crate::Broker::close_async) performs the waiting off the runtime's
//! worker threads and so does wait.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::task::Poll as TaskPoll;
use std::time::Instant;

use ::tokio::runtime::Handle;
use ::tokio::sync::Notify;
use ::tokio::task::JoinHandle;

use crate::async_handler::{AsyncHandler, HandlerFuture};
use crate::error::SubscribeError;
use crate::handler::HandlerError;
use crate::message::Message;
use crate::subscription::core::Poll;
use crate::subscription::shell::{Step, SubscriptionShell};
use crate::sync::Mutex;

use super::handles::Handles;
use super::live::LiveCount;
use super::wake_slot::WakeSlot;
use super::{Executor, FeedStep, Feeder, FeederHandle, Wake};

/// Deliveries a slot makes before yielding to the runtime, so a busy subscription cannot
/// starve other tasks (sync handlers never reach an `.await`).
const BATCH: u32 = 64;

/// Quiet re-polls, each after yielding to the runtime, before an idle slot announces itself
/// and waits: a publisher that keeps up finds it polling and skips the wake-up (a task
/// wake-up may cost a parked worker's futex round trip).
const IDLE_YIELDS: u32 = 8;

thread_local! {
    /// Set on a thread that may block waiting for tasks even though it is inside a runtime
    /// context (the blocking-pool thread used by `Broker::close_async`).
    static MAY_BLOCK: Cell<bool> = const { Cell::new(false) };
}

/// Run `f` with blocking waits for tokio tasks allowed on this thread (which must not be
/// a runtime worker thread).
pub(crate) fn allow_blocking<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            MAY_BLOCK.with(|c| c.set(self.0));
        }
    }
    let _reset = Reset(MAY_BLOCK.with(|c| c.replace(true)));
    f()
}

/// True when this thread may block waiting for dispatcher tasks.
fn may_block() -> bool {
    MAY_BLOCK.with(Cell::get) || Handle::try_current().is_err()
}

/// One subscription's dispatcher slots: each slot's wake-up and done flag, and the
/// driver's live count. One allocation per subscription, shared by its tasks and its waker;
/// the first slot is inline in it (a serial subscription's only one), the others behind
/// one thin pointer.
struct Slots {
    slots: crate::subscription::slots::Slots<Slot>,
    live: Arc<LiveCount>,
}

/// One dispatcher slot: its task's wake-up, retired when the task's body ends.
type Slot = WakeSlot;

impl Wake for Slots {
    fn wake(&self, _sub: &SubscriptionShell, worker: usize) {
        if let Some(s) = self.slots.get(worker) {
            s.wake();
        }
    }
    fn wake_all(&self, _sub: &SubscriptionShell) {
        // A permit each, so a slot between its poll and its await still finds it.
        for s in self.slots.iter() {
            s.wake();
        }
    }
}

/// Marks its task done and decrements the live count when the task's body ends — also
/// when the runtime drops it unfinished (runtime shutdown), so close never waits for a task
/// that no longer exists. (`JoinHandle::is_finished` lags behind: it turns true only after
/// the task's output is stored, so close asks this flag instead.)
struct LiveGuard {
    slots: Arc<Slots>,
    worker: usize,
}

impl LiveGuard {
    fn slot(&self) -> &Slot {
        &self.slots.slots[self.worker]
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.slot().retire();
        self.slots.live.exit();
    }
}

/// A spawned dispatcher task. Its name (for the close report) is made only when it is
/// reported, so a live task does not carry a string.
struct Task {
    sub: std::sync::Weak<SubscriptionShell>,
    slots: Arc<Slots>,
    worker: usize,
    handle: JoinHandle<()>,
}

impl Task {
    fn is_done(&self) -> bool {
        self.slots.slots[self.worker].is_retired()
    }

    fn name(&self) -> String {
        match self.sub.upgrade() {
            Some(sub) => format!("tidings-{}-{}", sub.name, self.worker),
            None => format!("tidings-?-{}", self.worker),
        }
    }
}

pub(crate) struct TokioExecutor {
    handle: Handle,
    live: Arc<LiveCount>,
    tasks: Mutex<Handles<Task>>,
}

impl TokioExecutor {
    pub(crate) fn new(handle: Handle) -> Self {
        Self {
            handle,
            live: Arc::default(),
            tasks: Mutex::default(),
        }
    }
}

/// The tokio driver's handle on a feeder task.
struct FeederTask(Arc<Notify>);

impl FeederHandle for FeederTask {
    fn wake(&self) {
        // A stored permit: a wake before the task awaits is not lost.
        self.0.notify_one();
    }
    fn defers_io(&self) -> bool {
        true
    }
}

/// A feeder's task: each step on the blocking pool, waits on the notify.
async fn feed(feeder: std::sync::Weak<dyn Feeder>, notify: Arc<Notify>) {
    loop {
        let Some(f) = feeder.upgrade() else {
            return;
        };
        let step = ::tokio::task::spawn_blocking(move || f.step()).await;
        match step {
            Ok(FeedStep::Again) => ::tokio::task::yield_now().await,
            Ok(FeedStep::Idle) => notify.notified().await,
            Ok(FeedStep::WakeAt(at)) => {
                let hint = feeder.upgrade().and_then(|f| f.wait_hint(at));
                match hint {
                    Some(d) if d.is_zero() => {}
                    Some(d) => {
                        ::tokio::select! {
                            () = notify.notified() => {}
                            () = ::tokio::time::sleep(d) => {}
                        }
                    }
                    None => notify.notified().await,
                }
            }
            // Stopped, or the runtime is shutting down.
            Ok(FeedStep::Stopped) | Err(_) => return,
        }
    }
}

impl Executor for TokioExecutor {
    fn start_feeder(
        &self,
        feeder: Arc<dyn Feeder>,
    ) -> Result<Box<dyn FeederHandle>, SubscribeError> {
        let notify = Arc::new(Notify::new());
        drop(
            self.handle
                .spawn(feed(Arc::downgrade(&feeder), notify.clone())),
        );
        Ok(Box::new(FeederTask(notify)))
    }

    fn start(&self, sub: &Arc<SubscriptionShell>) -> Result<(), SubscribeError> {
        let slots = Arc::new(Slots {
            slots: crate::subscription::slots::Slots::new(sub.workers(), Slot::new),
            live: self.live.clone(),
        });
        sub.set_waker(slots.clone());
        let mut tasks = self.tasks.lock();
        for worker in 0..sub.workers() {
            self.live.enter(1);
            let guard = LiveGuard {
                slots: slots.clone(),
                worker,
            };
            let handle = self.handle.spawn(dispatch(sub.clone(), guard));
            let task = Task {
                sub: Arc::downgrade(sub),
                slots: slots.clone(),
                worker,
                handle,
            };
            tasks.push(task, Task::is_done);
        }
        Ok(())
    }

    fn wait_stopped(&self, deadline: Option<Instant>) -> bool {
        if !may_block() {
            return self.live.running() == 0;
        }
        self.live.wait_at_most(0, deadline)
    }

    fn join(&self, deadline: Instant) -> Vec<String> {
        self.wait_stopped(Some(deadline));
        let me = ::tokio::task::try_id();
        self.tasks
            .lock()
            .take()
            .into_iter()
            .filter(|t| !t.is_done() && Some(t.handle.id()) != me)
            .map(|t| t.name())
            .collect()
    }

    fn tokio_handle(&self) -> Option<Handle> {
        Some(self.handle.clone())
    }
}

/// What a dispatcher slot waits for before its next step.
enum Wait {
    /// Nothing: step again.
    No,
    /// Let other tasks run first.
    Yield,
    /// A wake-up.
    Woken,
    /// A wake-up or this long, whichever comes first.
    WokenOr(std::time::Duration),
}

/// One dispatcher slot's task (the thread driver's loop, awaiting instead of blocking).
///
/// Its future is what an idle slot's task holds, and its size decides the task's (tokio
/// rounds a task up to a multiple of 128 bytes): it owns the subscription and the guard,
/// keeps two counters, and awaits one thing at a time — a one-reference wake-up
/// ([`WakeSlot::woken`]) or a yield inline; an async handler's delivery and a timed wait are
/// boxed when taken, not carried by every task (issue 12). No borrow of either is held
/// across an await.
async fn dispatch(sub: Arc<SubscriptionShell>, guard: LiveGuard) {
    let worker = guard.worker;
    let mut batch = 0u32;
    let mut idle_polls = 0u32;
    loop {
        let announce = idle_polls >= IDLE_YIELDS;
        let step = match sub.async_handler() {
            // The shell's delivery step, as every driver runs it.
            None => sub.lock().step(worker, announce),
            Some(handler) => Box::pin(step_async(&sub, handler, worker, announce)).await,
        };
        let wait = match step {
            Step::Delivered => {
                idle_polls = 0;
                batch += 1;
                if batch >= BATCH {
                    batch = 0;
                    Wait::Yield
                } else {
                    Wait::No
                }
            }
            Step::Stopped => break,
            Step::Idle if !announce => {
                idle_polls += 1;
                Wait::Yield
            }
            Step::Idle => {
                idle_polls = 0;
                batch = 0;
                Wait::Woken
            }
            Step::WakeAt(t) => {
                batch = 0;
                match sub.clock().wait_hint(t) {
                    Some(d) if d.is_zero() => Wait::Yield,
                    Some(d) => Wait::WokenOr(d),
                    None => Wait::Woken,
                }
            }
        };
        match wait {
            Wait::No => {}
            Wait::Yield => ::tokio::task::yield_now().await,
            Wait::Woken => guard.slot().woken().await,
            Wait::WokenOr(d) => Box::pin(woken_or_after(guard.slot(), d)).await,
        }
    }
    drop(guard);
}

/// The delivery step around an await: poll, await the async handler, report.
async fn step_async(
    sub: &SubscriptionShell,
    handler: &Arc<dyn AsyncHandler>,
    worker: usize,
    announce: bool,
) -> Step {
    match sub.poll(worker, announce) {
        Poll::Deliver(delivery) => {
            // R-OPS-3 span, R-OPS-2 duration histogram (src/ops/trace.rs).
            let outcome = crate::telemetry::trace::in_process_span_async(
                &delivery.message,
                &sub.name,
                &sub.process_metric,
                delivery.attempt,
                run_async(handler, delivery.message.clone()),
            )
            .await;
            sub.complete(delivery, outcome);
            Step::Delivered
        }
        Poll::WakeAt(t) => Step::WakeAt(t),
        Poll::Idle => Step::Idle,
        Poll::Stopped => Step::Stopped,
    }
}

/// Wait for a wake or for `d`, whichever comes first (a retry's due time).
async fn woken_or_after(slot: &Slot, d: std::time::Duration) {
    ::tokio::select! {
        () = slot.woken() => {}
        () = ::tokio::time::sleep(d) => {}
    }
}

/// Await an async handler, turning a panic (while building or polling its future) into a
/// retryable error (R-DEL-1), without spawning a task per delivery.
async fn run_async(
    handler: &Arc<dyn AsyncHandler>,
    message: Arc<Message>,
) -> Result<(), HandlerError> {
    let mut fut: HandlerFuture<'_> =
        match catch_unwind(AssertUnwindSafe(|| handler.handle(message))) {
            Ok(fut) => fut,
            Err(payload) => return Err(HandlerError::from_panic(payload.as_ref())),
        };
    std::future::poll_fn(
        move |cx| match catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(poll) => poll,
            Err(payload) => TaskPoll::Ready(Err(HandlerError::from_panic(payload.as_ref()))),
        },
    )
    .await
}

#[cfg(all(test, target_pointer_width = "64", not(tidings_loom)))]
mod tests {
    // Issue 12: one of these per subscription; a serial one's slot is inline (32 bytes),
    // the others' pointer and the live count one word each.
    #[test]
    fn a_subscriptions_slot_record_stays_small() {
        assert_eq!(std::mem::size_of::<super::Slots>(), 48);
    }
}
