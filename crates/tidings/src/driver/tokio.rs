//! The tokio driver: a dispatcher slot's task exists only while the slot has work (R-EXE-1,
//! R-EXE-3).
//!
//! # A slot's task
//! Like the pool, the driver is every subscription's waker, and a slot's run flags (in the
//! subscription's shell, `subscription::run_flags`) are its mailbox: the wake that finds the
//! slot's `scheduled` flag clear sets it and spawns the slot's task on the runtime; a wake
//! that finds it set does nothing more, because that task polls again. So there is at most
//! one task per slot (max active == 1), and an idle subscription holds no task, no future,
//! and nothing of the driver's (issue 12: a task is 256 bytes).
//!
//! The task runs the thread driver's loop as an `async fn`: poll the subscription core, run
//! the handler, report the outcome, and yield to the runtime every [`BATCH`] deliveries.
//! When the core says the slot is idle it yields and polls again a few times (a publisher
//! that keeps up finds it still polling, and pays neither a wake-up nor a new task), then
//! polls once more announcing the slot idle and — under the subscription's lock, after
//! that poll — clears `scheduled` and ends. An offer after that poll finds the slot idle
//! and wakes it, which spawns a new task; an offer before it is found by that poll. So no
//! wake-up is lost.
//!
//! While a retry is due later the task stays and sleeps until the due time or a wake-up,
//! whichever comes first: a wake that finds the slot scheduled leaves a permit in the
//! task's registry entry and wakes it (a close, a per-key offer, a manual clock's move —
//! whose `wait_hint` says "until woken", and the broker wakes every slot when it is
//! advanced). When the core says the subscription stopped, the task ends leaving
//! `scheduled` set, so the slot is never run again.
//!
//! The driver keeps a registry of the tasks that exist (its size follows the busy slots,
//! not the subscriptions): for the permits above, for close to wait on, and for naming the
//! tasks still running at close's deadline.
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
//! Close wakes every slot, so each one with work left has a task that sees the close, and
//! waits with a real-time deadline until no task is left. From a thread that is inside a
//! tokio runtime context (a task, `block_on`, `spawn_blocking`), blocking could deadlock the
//! runtime the tasks need, so the sync [`Broker::close`](crate::Broker::close) does not wait
//! there: tasks still running are reported in `CloseReport::unjoined`.
//! [`Broker::close_async`](crate::Broker::close_async) performs the waiting off the runtime's
//! worker threads and so does wait.

use std::cell::Cell;
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll as TaskPoll, Waker};
use std::time::Instant;

use ::tokio::runtime::Handle;
use ::tokio::sync::Notify;

use crate::async_handler::{AsyncHandler, HandlerFuture};
use crate::error::SubscribeError;
use crate::handler::HandlerError;
use crate::message::Message;
use crate::subscription::core::Poll;
use crate::subscription::shell::{Step, SubscriptionShell};
use crate::sync::{Condvar, Mutex, Ordering};

use super::{Executor, FeedStep, Feeder, FeederHandle, Wake};

/// Deliveries a slot makes before yielding to the runtime, so a busy subscription cannot
/// starve other tasks (sync handlers never reach an `.await`).
const BATCH: u32 = 64;

/// Quiet re-polls, each after yielding to the runtime, before an idle slot announces itself
/// and its task ends: a publisher that keeps up finds it polling and skips the wake-up and
/// the new task (a spawn allocates a task and may cost a parked worker's futex round trip).
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

/// The driver's shared state, and every tokio subscription's waker (like the pool, one
/// waker serves all): the runtime, and the registry of the slot tasks that exist now.
struct Shared {
    handle: Handle,
    tasks: Mutex<Tasks>,
    /// Signalled when a task leaves the registry (close waits for none to be left).
    changed: Condvar,
    /// This, for the tasks' guards (`Wake` is called on a plain reference).
    me: Weak<Shared>,
}

impl Shared {
    fn me(&self) -> Arc<Self> {
        self.me
            .upgrade()
            .expect("a waker is reached through its Arc")
    }
}

/// The slot tasks that exist now, by slot. An idle slot has none, so it has no entry: the
/// registry's size follows the busy slots, not the subscriptions.
#[derive(Default)]
struct Tasks {
    by_slot: HashMap<SlotKey, Entry>,
    next_gen: u64,
}

/// A slot: its subscription's address (stable while the slot's task holds the
/// subscription) and the slot's index.
type SlotKey = (usize, usize);

fn key_of(sub: &SubscriptionShell, worker: usize) -> SlotKey {
    (std::ptr::from_ref(sub) as usize, worker)
}

/// One slot task, from its spawn to its end.
struct Entry {
    /// Tells this task's entry from a successor's: a task that left its slot is replaced
    /// by the next one spawned for it before it has removed its own entry.
    generation: u64,
    /// For the close report's name, made only when reported.
    sub: Weak<SubscriptionShell>,
    /// Set by the task on its first poll, so close called from the task itself does not
    /// report it.
    id: Option<::tokio::task::Id>,
    /// A wake-up left for the task while it waits for a retry's due time (or, under a
    /// manual clock, for the clock to move): a stored permit, so a wake that comes before
    /// the task waits is not lost. At worst a stale one costs the task one more poll.
    woken: bool,
    /// The task's waker while it waits.
    waker: Option<Waker>,
}

impl Shared {
    /// Wake slot `worker` of `sub` (the pool's mailbox protocol, with a task for a worker):
    /// the waker that sets the slot's `scheduled` flag spawns its task; a slot already
    /// scheduled has a task that will poll again — or waits for a due time, and is given a
    /// permit.
    fn schedule(&self, sub: &SubscriptionShell, worker: usize) {
        let Some(flags) = sub.run_flags(worker) else {
            return;
        };
        if flags.scheduled.swap(true, Ordering::AcqRel) {
            let mut tasks = self.tasks.lock();
            if let Some(e) = tasks.by_slot.get_mut(&key_of(sub, worker)) {
                e.woken = true;
                if let Some(w) = e.waker.take() {
                    drop(tasks);
                    w.wake();
                }
            }
            return;
        }
        let Some(sub) = sub.weak().upgrade() else {
            // Being dropped: nothing is left to deliver, and the slot is never run again.
            return;
        };
        let generation = {
            let mut tasks = self.tasks.lock();
            let generation = tasks.next_gen;
            tasks.next_gen += 1;
            tasks.by_slot.insert(
                key_of(&sub, worker),
                Entry {
                    generation,
                    sub: Arc::downgrade(&sub),
                    id: None,
                    woken: false,
                    waker: None,
                },
            );
            generation
        };
        let guard = TaskGuard {
            shared: self.me(),
            key: key_of(&sub, worker),
            generation,
        };
        // Not under the registry's lock: a runtime that is shut down drops the future (and
        // so the guard, which takes the lock) inside `spawn`.
        drop(self.handle.spawn(run_slot(sub, worker, guard)));
    }
}

impl Wake for Shared {
    fn wake(&self, sub: &SubscriptionShell, worker: usize) {
        self.schedule(sub, worker);
    }
    fn wake_all(&self, sub: &SubscriptionShell) {
        for w in 0..sub.workers() {
            self.wake(sub, w);
        }
    }
}

/// Removes its task's registry entry when the task's body ends — also when the runtime
/// drops it unfinished (runtime shutdown), so close never waits for a task that no longer
/// exists.
struct TaskGuard {
    shared: Arc<Shared>,
    key: SlotKey,
    generation: u64,
}

impl TaskGuard {
    /// Record the running task's id (see [`Entry::id`]).
    fn set_id(&self) {
        if let Some(e) = self.shared.tasks.lock().by_slot.get_mut(&self.key)
            && e.generation == self.generation
        {
            e.id = ::tokio::task::try_id();
        }
    }

    /// Ready once a permit was left (taking it); otherwise the task's waker is stored for
    /// the next [`Shared::schedule`] that finds the slot scheduled.
    fn poll_woken(&self, cx: &Context<'_>) -> TaskPoll<()> {
        let mut tasks = self.shared.tasks.lock();
        match tasks.by_slot.get_mut(&self.key) {
            Some(e) if e.generation == self.generation => {
                if std::mem::take(&mut e.woken) {
                    e.waker = None;
                    TaskPoll::Ready(())
                } else {
                    match &mut e.waker {
                        Some(w) if w.will_wake(cx.waker()) => {}
                        w => *w = Some(cx.waker().clone()),
                    }
                    TaskPoll::Pending
                }
            }
            // Cannot happen while the task holds the slot; poll again rather than hang.
            _ => TaskPoll::Ready(()),
        }
    }

    /// Wait for a permit. The future is one reference.
    fn woken(&self) -> impl std::future::Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| self.poll_woken(cx))
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        let mut tasks = self.shared.tasks.lock();
        if tasks
            .by_slot
            .get(&self.key)
            .is_some_and(|e| e.generation == self.generation)
        {
            tasks.by_slot.remove(&self.key);
            // Give back the room a burst of tasks took (once it is mostly unused, so
            // steady churn does not reallocate): idle subscriptions hold nothing here.
            let (len, cap) = (tasks.by_slot.len(), tasks.by_slot.capacity());
            if cap > 64 && len * 4 < cap {
                tasks.by_slot.shrink_to(len * 2);
            }
        }
        drop(tasks);
        self.shared.changed.notify_all();
    }
}

pub(crate) struct TokioExecutor {
    shared: Arc<Shared>,
}

impl TokioExecutor {
    pub(crate) fn new(handle: Handle) -> Self {
        Self {
            shared: Arc::new_cyclic(|me| Shared {
                handle,
                tasks: Mutex::default(),
                changed: Condvar::new(),
                me: me.clone(),
            }),
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
            self.shared
                .handle
                .spawn(feed(Arc::downgrade(&feeder), notify.clone())),
        );
        Ok(Box::new(FeederTask(notify)))
    }

    fn start(&self, sub: &Arc<SubscriptionShell>) -> Result<(), SubscribeError> {
        sub.set_waker(self.shared.clone());
        // Run each slot once, so it sees anything already queued and reaches its idle
        // state (then its task ends).
        self.shared.wake_all(sub);
        Ok(())
    }

    fn wait_stopped(&self, deadline: Option<Instant>) -> bool {
        let mut tasks = self.shared.tasks.lock();
        if !may_block() {
            return tasks.by_slot.is_empty();
        }
        while !tasks.by_slot.is_empty() {
            match deadline {
                Some(d) => {
                    if self.shared.changed.wait_until(&mut tasks, d).timed_out() {
                        return tasks.by_slot.is_empty();
                    }
                }
                None => self.shared.changed.wait(&mut tasks),
            }
        }
        true
    }

    fn join(&self, deadline: Instant) -> Vec<String> {
        self.wait_stopped(Some(deadline));
        let me = ::tokio::task::try_id();
        let tasks = self.shared.tasks.lock();
        let left: Vec<_> = tasks
            .by_slot
            .iter()
            .filter(|(_, e)| e.id.is_none() || e.id != me)
            .map(|(&(_, worker), e)| (e.sub.clone(), worker))
            .collect();
        drop(tasks);
        // Named with the lock released: upgrading and dropping a subscription may run
        // its teardown.
        left.into_iter()
            .map(|(sub, worker)| match sub.upgrade() {
                Some(sub) => format!("tidings-{}-{}", sub.name, worker),
                None => format!("tidings-?-{worker}"),
            })
            .collect()
    }

    fn tokio_handle(&self) -> Option<Handle> {
        Some(self.shared.handle.clone())
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

/// One slot task: the thread driver's loop, awaiting instead of blocking, from the slot's
/// idle→scheduled edge until it is idle again (or stopped).
///
/// The task holds the slot's `scheduled` flag for its whole life, so no second task is
/// spawned for the slot meanwhile (max active == 1). It gives the flag back only on an
/// announced idle poll, under the subscription's lock (see [`RunFlags::leave`](crate::subscription::run_flags::RunFlags::leave)). While a retry is
/// due later it stays, waiting for the due time or a permit ([`TaskGuard::woken`]); on
/// `Stopped` it ends keeping the flag, so the slot is never run again.
async fn run_slot(sub: Arc<SubscriptionShell>, worker: usize, guard: TaskGuard) {
    guard.set_id();
    let flags = sub.run_flags(worker).expect("a scheduled slot exists");
    let was = flags.running.swap(true, Ordering::AcqRel);
    debug_assert!(!was, "two tasks inside one dispatcher slot");
    let mut batch = 0u32;
    let mut idle_polls = 0u32;
    loop {
        let announce = idle_polls >= IDLE_YIELDS;
        let step = match sub.async_handler() {
            // The shell's delivery step, as every driver runs it.
            None => {
                let mut locked = sub.lock();
                let step = locked.step(worker, announce);
                if step == Step::Idle && announce {
                    flags.leave();
                    return;
                }
                step
            }
            Some(handler) => {
                let step = Box::pin(step_async(&sub, handler, worker, announce)).await;
                if step == Step::Idle && announce {
                    return; // `step_async` left the slot
                }
                step
            }
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
            Step::Stopped => {
                flags.running.store(false, Ordering::Release);
                break;
            }
            // A short grace before the task ends: a publisher that keeps up finds it still
            // polling, and neither wakes it nor pays for a new task.
            Step::Idle => {
                idle_polls += 1;
                Wait::Yield
            }
            Step::WakeAt(t) => {
                batch = 0;
                idle_polls = 0;
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
            Wait::Woken => guard.woken().await,
            Wait::WokenOr(d) => Box::pin(woken_or_after(&guard, d)).await,
        }
    }
    drop(guard);
}

/// The delivery step around an await: poll, await the async handler, report. An announced
/// idle poll leaves the slot (see [`RunFlags::leave`](crate::subscription::run_flags::RunFlags::leave)) under the same lock.
async fn step_async(
    sub: &SubscriptionShell,
    handler: &Arc<dyn AsyncHandler>,
    worker: usize,
    announce: bool,
) -> Step {
    let poll = {
        let mut locked = sub.lock();
        let poll = locked.poll(worker, announce);
        if matches!(poll, Poll::Idle) && announce {
            sub.run_flags(worker)
                .expect("a scheduled slot exists")
                .leave();
        }
        poll
    };
    match poll {
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
async fn woken_or_after(guard: &TaskGuard, d: std::time::Duration) {
    ::tokio::select! {
        () = guard.woken() => {}
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
