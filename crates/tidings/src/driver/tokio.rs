//! The tokio driver: a dispatcher slot's task exists only while the slot has work (R-EXE-1,
//! R-EXE-3).
//!
//! # A slot's task
//! Like the pool, the driver is every subscription's waker, and a slot's run flags (in the
//! subscription's shell, `subscription::run_flags`) are its mailbox: the wake that finds the
//! slot's `scheduled` flag clear sets it and spawns the slot's task on the runtime; a wake
//! that finds it set does nothing more, because that task polls again. So there is at most
//! one task per slot (max active == 1), and an idle subscription holds no task, no future,
//! and nothing of the driver's (a task is 256 bytes).
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
//! whichever comes first: a wake that finds the slot scheduled leaves a wake-up in the
//! slot's flags and, if the task sleeps, wakes it (`super::sleepers`: a close, a per-key
//! offer, a manual clock's move — whose `wait_hint` says "until woken", and the broker
//! wakes every slot when it is advanced). A wake that finds the task running costs one
//! read-modify-write of those flags, and no lock. When the core says the subscription
//! stopped, the task ends leaving `scheduled` set, so the slot is never run again.
//!
//! The driver counts the tasks that exist (an atomic: starting and ending a task takes no
//! lock), for close to wait on; the tasks still running at close's deadline are named
//! from the subscriptions' `running` flags.
//!
//! # Handlers on the runtime
//! * Async handlers ([`AsyncHandler`](crate::AsyncHandler)) are awaited inside the slot's
//!   task; a panic while building or polling the future is caught and treated as a
//!   retryable error, exactly like a sync handler's panic.
//! * Sync handlers are called inline, on a runtime worker thread: **they must not block**
//!   (no long computations, no blocking I/O, no `Broker::request`). Use an async handler,
//!   or move blocking work to `tokio::task::spawn_blocking`, otherwise.
//!
//! # Services
//! A broker service (a durable subscription's feeder, the retention and scheduler timers;
//! see `super::service`) is one task (R-EXE-4): it runs each step — log reads, offset
//! commits with their fsync, durable-DLQ appends — through `spawn_blocking`, so no blocking
//! file I/O runs on a runtime worker, then awaits a [`Notify`] (an append, room freed, a
//! seek, a clock jump, a stop) or the step's due time. Messages finished by a dispatcher
//! task are handed to the feeder's next step instead of being committed on the worker
//! ([`ServiceHandle::defers_io`]).
//!
//! # Waiting for tasks at close
//! Close wakes every slot, so each one with work left has a task that sees the close, and
//! waits with a real-time deadline until no task is left. From a thread that is inside a
//! tokio runtime context (a task, `block_on`, `spawn_blocking`), blocking could deadlock the
//! runtime the tasks need, so the sync [`Broker::close`](crate::Broker::close) does not wait
//! there: the tasks in a handler call then are reported in `CloseReport::unjoined` (each
//! slot's run flags say whether its task is in one, from the poll that hands a delivery out
//! to its report). A task in no handler call is not: it sees the close at its next poll and
//! ends with no user code left to run — a handler that closes its own broker leaves a clean
//! report when the other slots are idle, as under the thread and pool drivers.
//! [`Broker::close_async`](crate::Broker::close_async) performs the waiting off the runtime's
//! worker threads and so does wait.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Weak};
use std::task::Poll as TaskPoll;
use std::time::Instant;

use ::tokio::runtime::Handle;
use ::tokio::sync::Notify;

use crate::async_handler::{AsyncHandler, HandlerFuture};
use crate::error::SubscribeError;
use crate::handler::HandlerError;
use crate::message::Message;
use crate::subscription::core::Poll;
use crate::subscription::shell::{Step, SubscriptionShell};
use crate::sync::Ordering;

use super::live::LiveCount;
use super::sleepers::{Sleepers, SlotKey, Woken, key_of};
use super::{Executor, Service, ServiceHandle, ServiceStep, Wake};

/// Deliveries a slot makes before yielding to the runtime, so a busy subscription cannot
/// starve other tasks (sync handlers never reach an `.await`).
const BATCH: u32 = 64;

/// Quiet re-polls, each after yielding to the runtime, before an idle slot announces itself
/// and its task ends: a publisher that keeps up finds it polling and skips the wake-up and
/// the new task (a spawn allocates a task and may cost a parked worker's futex round trip).
/// With many busy subscriptions the run queue is long, so one yield lasts about as long as
/// a publisher takes to reach every subscription once, and the grace decides whether the
/// next message finds the tasks alive. The value comes from the 100,000-subscription case of
/// `tidings-bench` (the figures per value are in BENCHMARKS.md, "Measurements behind design
/// choices").
const IDLE_YIELDS: u32 = 16;

thread_local! {
    /// Set on a thread that may block waiting for tasks even though it is inside a runtime
    /// context (the blocking-pool thread used by `Broker::close_async`).
    static MAY_BLOCK: Cell<bool> = const { Cell::new(false) };
    /// The driver (its `Shared`'s address) and slot whose handler runs on this thread now
    /// (see [`in_slot`]).
    static IN_SLOT: Cell<Option<(usize, SlotKey)>> = const { Cell::new(None) };
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
/// waker serves all): the runtime, the count of slot tasks that exist now, and the wakers
/// of those asleep.
struct Shared {
    handle: Handle,
    /// Slot tasks spawned and not yet ended (close waits for none to be left).
    live: LiveCount,
    /// Slot tasks waiting for a retry's due time (or a manual clock's move).
    sleepers: Sleepers,
    /// This, for the tasks' guards (`Wake` is called on a plain reference).
    me: Weak<Shared>,
}

impl Shared {
    fn me(&self) -> Arc<Self> {
        self.me
            .upgrade()
            .expect("a waker is reached through its Arc")
    }

    /// The slot of this driver whose handler runs on this thread, if any (a handler of
    /// another broker's driver is none of this one's tasks).
    fn current_slot(&self) -> Option<SlotKey> {
        let me = std::ptr::from_ref(self) as usize;
        IN_SLOT
            .with(Cell::get)
            .and_then(|(driver, key)| (driver == me).then_some(key))
    }

    /// Wake slot `worker` of `sub` (the pool's mailbox protocol, with a task for a worker):
    /// the waker that sets the slot's `scheduled` flag spawns its task; a slot already
    /// scheduled has a task that will poll again — or sleeps until a due time, and is
    /// woken ([`Sleepers::wake`]). A task spawned here re-polls `grace` times when it finds
    /// the slot idle before it ends (see [`IDLE_YIELDS`]).
    fn schedule(&self, sub: &SubscriptionShell, worker: usize, grace: u32) {
        let Some(flags) = sub.run_flags(worker) else {
            return;
        };
        if flags.scheduled.swap(true, Ordering::AcqRel) {
            self.sleepers.wake(flags, key_of(sub, worker));
            return;
        }
        let Some(sub) = sub.weak().upgrade() else {
            // Being dropped: nothing is left to deliver, and the slot is never run again.
            return;
        };
        // Counted before the task can end (a shut-down runtime drops the future, and so the
        // guard, inside `spawn`).
        self.live.enter(1);
        let guard = TaskGuard(self.me());
        drop(self.handle.spawn(run_slot(sub, worker, guard, grace)));
    }
}

impl Wake for Shared {
    fn wake(&self, sub: &SubscriptionShell, worker: usize) {
        self.schedule(sub, worker, IDLE_YIELDS);
    }
    fn wake_all(&self, sub: &SubscriptionShell) {
        for w in 0..sub.workers() {
            self.wake(sub, w);
        }
    }
}

/// Counts its task out when the task's body ends — also when the runtime drops it
/// unfinished (runtime shutdown), so close never waits for a task that no longer exists.
struct TaskGuard(Arc<Shared>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.live.exit();
    }
}

/// Runs `f` marked as the user code of `shared`'s slot `key` on this thread: the sync
/// `close` called from a handler does not report its own slot as unjoined.
fn in_slot<R>(shared: &Shared, key: SlotKey, f: impl FnOnce() -> R) -> R {
    struct Reset(Option<(usize, SlotKey)>);
    impl Drop for Reset {
        fn drop(&mut self) {
            IN_SLOT.with(|c| c.set(self.0));
        }
    }
    let driver = std::ptr::from_ref(shared) as usize;
    let _reset = Reset(IN_SLOT.with(|c| c.replace(Some((driver, key)))));
    f()
}

pub(crate) struct TokioExecutor {
    shared: Arc<Shared>,
}

impl TokioExecutor {
    pub(crate) fn new(handle: Handle) -> Self {
        Self {
            shared: Arc::new_cyclic(|me| Shared {
                handle,
                live: LiveCount::default(),
                sleepers: Sleepers::default(),
                me: me.clone(),
            }),
        }
    }
}

/// The tokio driver's handle on a service's task.
struct ServiceTask(Arc<Notify>);

impl ServiceHandle for ServiceTask {
    fn wake(&self) {
        // A stored permit: a wake before the task awaits, or while its step runs, is not
        // lost.
        self.0.notify_one();
    }
    fn defers_io(&self) -> bool {
        true
    }
}

/// A service's task: each step on the blocking pool, then a wait for the notify or the
/// step's due time.
async fn run_service(service: std::sync::Weak<dyn Service>, notify: Arc<Notify>) {
    loop {
        let Some(s) = service.upgrade() else {
            return;
        };
        let step = ::tokio::task::spawn_blocking(move || {
            let step = s.step(s.clock().now());
            // The real wait until the due time, asked of the service's clock while the
            // service is at hand (the task holds it only weakly).
            let hint = match step {
                ServiceStep::WakeAt(at) => s.clock().wait_hint(at),
                _ => None,
            };
            (step, hint)
        })
        .await;
        match step {
            Ok((ServiceStep::Again, _)) => ::tokio::task::yield_now().await,
            Ok((ServiceStep::Idle, _)) => notify.notified().await,
            Ok((ServiceStep::WakeAt(_), hint)) => match hint {
                Some(d) if d.is_zero() => {}
                Some(d) => {
                    ::tokio::select! {
                        () = notify.notified() => {}
                        () = ::tokio::time::sleep(d) => {}
                    }
                }
                // A clock that moves only when told wakes its services when it does.
                None => notify.notified().await,
            },
            // Stopped, or the runtime is shutting down.
            Ok((ServiceStep::Stopped, _)) | Err(_) => return,
        }
    }
}

impl Executor for TokioExecutor {
    fn start_service(
        &self,
        service: Arc<dyn Service>,
    ) -> Result<Box<dyn ServiceHandle>, SubscribeError> {
        let notify = Arc::new(Notify::new());
        drop(
            self.shared
                .handle
                .spawn(run_service(Arc::downgrade(&service), notify.clone())),
        );
        Ok(Box::new(ServiceTask(notify)))
    }

    fn start(&self, sub: &Arc<SubscriptionShell>) -> Result<(), SubscribeError> {
        sub.set_waker(self.shared.clone());
        // Run each slot once, so it sees anything already queued and reaches its idle
        // state; then its task ends at once: no publisher is known to keep up yet, and an
        // idle subscription should hold no task (100,000 new subscriptions would otherwise
        // keep 100,000 tasks through their grace).
        for worker in 0..sub.workers() {
            self.shared.schedule(sub, worker, 0);
        }
        Ok(())
    }

    fn wait_stopped(&self, deadline: Option<Instant>) -> bool {
        let me = usize::from(self.shared.current_slot().is_some());
        if !may_block() {
            return self.shared.live.running() <= me;
        }
        self.shared.live.wait_at_most(me, deadline)
    }

    fn join(&self, deadline: Instant, subs: &[Arc<SubscriptionShell>]) -> Vec<String> {
        // Inside the runtime nothing is waited for (see `wait_stopped`).
        let waited = may_block();
        self.wait_stopped(Some(deadline));
        let me = self.shared.current_slot();
        let left = self
            .shared
            .live
            .running()
            .saturating_sub(usize::from(me.is_some()));
        if left == 0 {
            return Vec::new();
        }
        // After waiting, the tasks left run a handler (anything else sees the close within
        // the grace): their slots are the running ones. Without waiting, every task is still
        // there; one that is not in a handler call sees the close at its next poll and ends
        // with no user code left to run, so it is not left behind: only the slots in a
        // handler call are (a task in its idle grace or asleep until a retry is not
        // running user code, and reporting it would make every later close unclean).
        let mut names = Vec::new();
        for sub in subs {
            for worker in 0..sub.workers() {
                let Some(flags) = sub.run_flags(worker) else {
                    continue;
                };
                if !flags.running.load(Ordering::Acquire) || me == Some(key_of(sub, worker)) {
                    continue;
                }
                if waited || flags.in_handler() {
                    names.push(format!("tidings-{}-{}", sub.name, worker));
                }
            }
        }
        // After waiting: tasks of subscriptions removed before close. (Without waiting,
        // tasks that are starting or ending look the same, and run no handler.)
        if waited {
            names.resize(names.len().max(left), "tidings-(unsubscribed)".to_owned());
        }
        names
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
/// due later it stays, waiting for the due time or a wake-up ([`Sleepers::woken`]); on
/// `Stopped` it ends keeping the flag, so the slot is never run again.
async fn run_slot(sub: Arc<SubscriptionShell>, worker: usize, guard: TaskGuard, grace: u32) {
    let shared = &guard.0;
    let key = key_of(&sub, worker);
    let flags = sub.run_flags(worker).expect("a scheduled slot exists");
    let was = flags.running.swap(true, Ordering::AcqRel);
    debug_assert!(!was, "two tasks inside one dispatcher slot");
    let mut batch = 0u32;
    let mut idle_polls = 0u32;
    loop {
        let announce = idle_polls >= grace;
        let step = match sub.async_handler() {
            // The shell's delivery step (`Locked::step_marked`), the slot marked in a
            // handler call from the poll that hands the delivery out to its report (see
            // `join`). It delivers a batch where the subscription allows one (N messages
            // per lock, as on the other drivers), within what is left of this turn's
            // `BATCH` deliveries.
            None => {
                let mut locked = sub.lock();
                let left = (BATCH - batch) as usize;
                let mut budget = left;
                let step = in_slot(shared, key, || {
                    locked.step_marked(worker, announce, &mut budget, || flags.enter_handler())
                });
                if step == Step::Delivered {
                    // Reported (every message of the batch settled) under this lock.
                    flags.leave_handler();
                    batch += (left - budget).saturating_sub(1) as u32;
                }
                if step == Step::Idle && announce {
                    flags.leave();
                    return;
                }
                step
            }
            Some(handler) => {
                let step = Box::pin(step_async(shared, &sub, handler, worker, announce)).await;
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
            Wait::Woken => shared.sleepers.woken(flags, key).await,
            Wait::WokenOr(d) => {
                Box::pin(woken_or_after(shared.sleepers.woken(flags, key), d)).await;
            }
        }
    }
    drop(guard);
}

/// The delivery step around an await: poll, await the async handler, report. An announced
/// idle poll leaves the slot (see [`RunFlags::leave`](crate::subscription::run_flags::RunFlags::leave)) under the same lock.
async fn step_async(
    shared: &Shared,
    sub: &SubscriptionShell,
    handler: &Arc<dyn AsyncHandler>,
    worker: usize,
    announce: bool,
) -> Step {
    let flags = sub.run_flags(worker).expect("a scheduled slot exists");
    let poll = {
        let mut locked = sub.lock();
        let poll = locked.poll(worker, announce);
        match poll {
            Poll::Idle if announce => flags.leave(),
            // In a handler call until its report (see `join`), marked under the lock.
            Poll::Deliver(_) => flags.enter_handler(),
            _ => {}
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
                run_async(
                    shared,
                    handler,
                    delivery.message.clone(),
                    key_of(sub, worker),
                ),
            )
            .await;
            sub.complete(delivery, outcome);
            flags.leave_handler();
            Step::Delivered
        }
        Poll::WakeAt(t) => Step::WakeAt(t),
        Poll::Idle => Step::Idle,
        Poll::Stopped => Step::Stopped,
    }
}

/// Wait for a wake or for `d`, whichever comes first (a retry's due time).
async fn woken_or_after(woken: Woken<'_>, d: std::time::Duration) {
    ::tokio::select! {
        () = woken => {}
        () = ::tokio::time::sleep(d) => {}
    }
}

/// Await an async handler, turning a panic (while building or polling its future) into a
/// retryable error (R-DEL-1), without spawning a task per delivery.
async fn run_async(
    shared: &Shared,
    handler: &Arc<dyn AsyncHandler>,
    message: Arc<Message>,
    key: SlotKey,
) -> Result<(), HandlerError> {
    let mut fut: HandlerFuture<'_> = match in_slot(shared, key, || {
        catch_unwind(AssertUnwindSafe(|| handler.handle(message)))
    }) {
        Ok(fut) => fut,
        Err(payload) => return Err(HandlerError::from_panic(payload.as_ref())),
    };
    std::future::poll_fn(move |cx| {
        match in_slot(shared, key, || {
            catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx)))
        }) {
            Ok(poll) => poll,
            Err(payload) => TaskPoll::Ready(Err(HandlerError::from_panic(payload.as_ref()))),
        }
    })
    .await
}
