//! The pool driver: a fixed set of worker threads shared by every subscription (R-EXE-1).
//!
//! Each dispatcher slot is an actor mailbox with a *scheduled* flag: a slot enters the run
//! queue only when it has work and is not already queued or running, so no two workers are
//! ever inside one slot (max active == 1 per slot). A worker runs a slot for at most
//! [`BATCH`] deliveries, then puts it at the back of the run queue, so one hot subscription
//! cannot starve the others. A retry wait occupies no worker: the slot is parked on the
//! pool's timer thread, which re-schedules it when due.
//!
//! Memory per idle subscription is the subscription itself plus one flag per slot: no
//! thread, no stack.
//!
//! A durable subscription's feeder is a schedulable unit too (R-EXE-4): woken by an append
//! to its stream, room freed in its window, a seek or a stop; a worker runs one bounded
//! step (at most one read batch), then re-queues it at the back or leaves it idle. So idle
//! durable subscriptions cost no OS thread each.

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::clock::{Clock, wait_until};
use crate::error::SubscribeError;
use crate::subscription::core::Poll;
use crate::subscription::shared::SubShared;

use super::live::LiveCount;
use super::{Executor, FeedStep, Feeder, FeederHandle, Wake};

/// Most deliveries a worker makes for one slot before yielding it.
pub const BATCH: usize = 64;

static NEXT_POOL: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static CURRENT_POOL: Cell<u64> = const { Cell::new(0) };
}

enum Task {
    /// A subscription's dispatcher slot.
    Slot { sub: Arc<SubShared>, worker: usize },
    /// A feeder's step.
    Feeder(Arc<FeederMailbox>),
}

/// The mailbox of one feeder: `scheduled` while queued or running (so no two workers are
/// inside one feeder), `pending` when woken since its current step began.
struct FeederMailbox {
    scheduled: AtomicBool,
    pending: AtomicBool,
    feeder: Weak<dyn Feeder>,
    pool: Arc<Shared>,
}

impl FeederMailbox {
    fn enqueue(self: &Arc<Self>) {
        self.pool
            .run_queue
            .lock()
            .push_back(Task::Feeder(self.clone()));
        self.pool.work.notify_one();
    }
}

impl FeederMailbox {
    fn wake(self: &Arc<Self>) {
        // `pending` before `scheduled`: a step that ends after this sees `pending` and runs
        // again; one that already ended cleared `scheduled`, so this queues it.
        self.pending.store(true, Ordering::SeqCst);
        if !self.scheduled.swap(true, Ordering::SeqCst) {
            self.enqueue();
        }
    }
}

/// The pool's handle on a feeder.
struct PoolFeeder(Arc<FeederMailbox>);

impl FeederHandle for PoolFeeder {
    fn wake(&self) {
        self.0.wake();
    }
}

struct Timer {
    due: Instant,
    seq: u64,
    target: TimerTarget,
}

/// What a pool timer wakes.
enum TimerTarget {
    /// A dispatcher slot waiting for a retry.
    Slot(Weak<SubShared>, usize),
    /// A feeder waiting for its next due time (a timer service).
    Feeder(Weak<FeederMailbox>),
}

impl PartialEq for Timer {
    fn eq(&self, o: &Self) -> bool {
        (self.due, self.seq) == (o.due, o.seq)
    }
}
impl Eq for Timer {}
impl PartialOrd for Timer {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Timer {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.due, self.seq).cmp(&(o.due, o.seq))
    }
}

struct Shared {
    id: u64,
    run_queue: Mutex<VecDeque<Task>>,
    work: Condvar,
    timers: Mutex<(BinaryHeap<Reverse<Timer>>, u64)>,
    timer_changed: Condvar,
    shutdown: AtomicBool,
    /// Slots that have not yet reported `Stopped`.
    live_slots: LiveCount,
    /// Worker and timer threads still running.
    live_threads: LiveCount,
    clock: Arc<dyn Clock>,
}

/// The mailbox flags of one subscription's slots.
struct Mailbox {
    scheduled: Box<[AtomicBool]>,
    sub: Weak<SubShared>,
    pool: Arc<Shared>,
}

impl Mailbox {
    fn schedule(&self, worker: usize) {
        let Some(flag) = self.scheduled.get(worker) else {
            return;
        };
        if flag.swap(true, Ordering::AcqRel) {
            return; // already queued or running: it will see the new work
        }
        let Some(sub) = self.sub.upgrade() else {
            return;
        };
        self.pool
            .run_queue
            .lock()
            .push_back(Task::Slot { sub, worker });
        self.pool.work.notify_one();
    }
}

impl Wake for Mailbox {
    fn wake(&self, worker: usize) {
        self.schedule(worker);
    }
    fn wake_all(&self) {
        for w in 0..self.scheduled.len() {
            self.schedule(w);
        }
    }
    fn unschedule(&self, worker: usize) {
        if let Some(flag) = self.scheduled.get(worker) {
            flag.store(false, Ordering::Release);
        }
    }
}

pub(crate) struct PoolExecutor {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl PoolExecutor {
    pub(crate) fn new(workers: usize, clock: Arc<dyn Clock>) -> Result<Self, std::io::Error> {
        let shared = Arc::new(Shared {
            id: NEXT_POOL.fetch_add(1, Ordering::Relaxed),
            run_queue: Mutex::new(VecDeque::new()),
            work: Condvar::new(),
            timers: Mutex::new((BinaryHeap::new(), 0)),
            timer_changed: Condvar::new(),
            shutdown: AtomicBool::new(false),
            live_slots: LiveCount::default(),
            live_threads: LiveCount::default(),
            clock,
        });
        let pool = Self {
            shared,
            threads: Mutex::new(Vec::with_capacity(workers + 1)),
        };
        for i in 0..workers.max(1) {
            pool.spawn(format!("tidings-pool-{i}"), worker_loop)?;
        }
        pool.spawn("tidings-pool-timer".into(), timer_loop)?;
        Ok(pool)
    }

    /// Start one pool thread running `body`; on failure stop the ones already started.
    fn spawn(&self, name: String, body: fn(&Arc<Shared>)) -> Result<(), std::io::Error> {
        let s = self.shared.clone();
        s.live_threads.enter(1);
        let spawned = std::thread::Builder::new().name(name).spawn(move || {
            body(&s);
            s.live_threads.exit();
        });
        match spawned {
            Ok(h) => {
                self.threads.lock().push(h);
                Ok(())
            }
            Err(e) => {
                self.shared.live_threads.exit();
                self.stop_threads();
                Err(e)
            }
        }
    }

    /// Tell the worker and timer threads to exit once idle.
    fn stop_threads(&self) {
        self.shared.shutdown.store(true, Ordering::Release);
        drop(self.shared.run_queue.lock());
        self.shared.work.notify_all();
        drop(self.shared.timers.lock());
        self.shared.timer_changed.notify_all();
    }

    fn on_pool_thread(&self) -> bool {
        CURRENT_POOL.with(Cell::get) == self.shared.id
    }
}

impl Executor for PoolExecutor {
    fn start_feeder(
        &self,
        feeder: Arc<dyn Feeder>,
    ) -> Result<Box<dyn FeederHandle>, SubscribeError> {
        let handle = PoolFeeder(Arc::new(FeederMailbox {
            scheduled: AtomicBool::new(false),
            pending: AtomicBool::new(false),
            feeder: Arc::downgrade(&feeder),
            pool: self.shared.clone(),
        }));
        // A first step reads what the stream already holds.
        handle.wake();
        Ok(Box::new(handle))
    }

    fn start(&self, sub: &Arc<SubShared>) -> Result<(), SubscribeError> {
        let mailbox = Arc::new(Mailbox {
            scheduled: (0..sub.workers()).map(|_| AtomicBool::new(false)).collect(),
            sub: Arc::downgrade(sub),
            pool: self.shared.clone(),
        });
        self.shared.live_slots.enter(sub.workers());
        sub.set_waker(mailbox.clone());
        // Run each slot once so it reaches its idle state (and sees anything already queued).
        mailbox.wake_all();
        Ok(())
    }

    fn wait_stopped(&self, deadline: Option<Instant>) -> bool {
        let me = usize::from(self.on_pool_thread());
        self.shared.live_slots.wait_at_most(me, deadline)
    }

    fn join(&self, deadline: Instant) -> Vec<String> {
        self.wait_stopped(Some(deadline));
        self.stop_threads();
        // A pool thread exits as soon as its current slot's handler returns; once the
        // live count says every other one has, joining them cannot block for long.
        let all_exited = self
            .shared
            .live_threads
            .wait_at_most(usize::from(self.on_pool_thread()), Some(deadline));
        let me = std::thread::current().id();
        let mut unjoined = Vec::new();
        for h in std::mem::take(&mut *self.threads.lock()) {
            if h.thread().id() == me {
                continue;
            }
            if all_exited || h.is_finished() {
                let _ = h.join();
            } else {
                unjoined.push(h.thread().name().unwrap_or("tidings-pool").to_owned());
            }
        }
        unjoined
    }
}

fn worker_loop(pool: &Arc<Shared>) {
    CURRENT_POOL.with(|c| c.set(pool.id));
    loop {
        let task = {
            let mut q = pool.run_queue.lock();
            loop {
                if let Some(t) = q.pop_front() {
                    break t;
                }
                if pool.shutdown.load(Ordering::Acquire) {
                    return;
                }
                pool.work.wait(&mut q);
            }
        };
        match task {
            Task::Slot { sub, worker } => run_slot(pool, sub, worker),
            Task::Feeder(mailbox) => run_feeder(&mailbox),
        }
    }
}

/// Run one step of a feeder, then re-queue it, leave it idle, or drop it (stopped/gone).
fn run_feeder(mailbox: &Arc<FeederMailbox>) {
    let Some(feeder) = mailbox.feeder.upgrade() else {
        return; // its owner is gone: `scheduled` stays set, it is never queued again
    };
    mailbox.pending.store(false, Ordering::SeqCst);
    let step = feeder.step();
    match step {
        FeedStep::Again => mailbox.enqueue(),
        FeedStep::Stopped => {}
        FeedStep::Idle | FeedStep::WakeAt(_) => {
            if let FeedStep::WakeAt(due) = step {
                park(
                    &mailbox.pool,
                    due,
                    TimerTarget::Feeder(Arc::downgrade(mailbox)),
                );
            }
            mailbox.scheduled.store(false, Ordering::SeqCst);
            if mailbox.pending.load(Ordering::SeqCst)
                && !mailbox.scheduled.swap(true, Ordering::SeqCst)
            {
                mailbox.enqueue();
            }
        }
    }
}

/// Run one slot for up to `BATCH` deliveries, then re-queue, park or retire it.
fn run_slot(pool: &Arc<Shared>, sub: Arc<SubShared>, worker: usize) {
    let mailbox_flag = |sub: &SubShared| sub.mailbox_clear(worker);
    for _ in 0..BATCH {
        let mut core = sub.core.lock();
        match sub.poll_locked(&mut core, worker) {
            Poll::Deliver(delivery) => {
                let forwards = core.take_forwards();
                drop(core);
                sub.forward(forwards);
                let outcome = sub.run(&delivery);
                sub.complete(delivery, outcome);
            }
            Poll::Idle => {
                // Clear the flag under the core lock: an offer after this sees the slot
                // idle and schedules it again, so no wake-up is lost.
                mailbox_flag(&sub);
                // The poll may have dead-lettered (expired) messages: forward them too, or
                // a durable source never hears they finished.
                let forwards = core.take_forwards();
                drop(core);
                sub.forward(forwards);
                return;
            }
            Poll::WakeAt(due) => {
                mailbox_flag(&sub);
                let forwards = core.take_forwards();
                drop(core);
                sub.forward(forwards);
                park(pool, due, TimerTarget::Slot(Arc::downgrade(&sub), worker));
                return;
            }
            Poll::Stopped => {
                let forwards = core.take_forwards();
                drop(core);
                sub.forward(forwards);
                pool.live_slots.exit();
                return;
            }
        }
    }
    // Batch used up: yield the slot to the back of the run queue (fairness).
    pool.run_queue.lock().push_back(Task::Slot { sub, worker });
    pool.work.notify_one();
}

/// Put `target` on the pool's timer until `due`.
fn park(pool: &Shared, due: Instant, target: TimerTarget) {
    let mut timers = pool.timers.lock();
    let seq = timers.1;
    timers.1 += 1;
    timers.0.push(Reverse(Timer { due, seq, target }));
    drop(timers);
    pool.timer_changed.notify_one();
}

fn timer_loop(pool: &Arc<Shared>) {
    let mut timers = pool.timers.lock();
    loop {
        if pool.shutdown.load(Ordering::Acquire) {
            return;
        }
        let now = pool.clock.now();
        while timers.0.peek().is_some_and(|Reverse(t)| t.due <= now) {
            let Some(Reverse(t)) = timers.0.pop() else {
                break;
            };
            match t.target {
                TimerTarget::Slot(sub, worker) => {
                    if let Some(sub) = sub.upgrade() {
                        sub.wake(worker);
                    }
                }
                // Due work runs on a worker, never on the timer thread.
                TimerTarget::Feeder(mailbox) => {
                    if let Some(mailbox) = mailbox.upgrade() {
                        mailbox.wake();
                    }
                }
            }
        }
        // A manual clock wakes every slot itself when it moves.
        let next = timers.0.peek().map(|Reverse(t)| t.due);
        wait_until(pool.clock.as_ref(), &pool.timer_changed, &mut timers, next);
    }
}
