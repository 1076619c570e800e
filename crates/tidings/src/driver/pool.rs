//! The pool driver: a fixed set of worker threads shared by every subscription (R-EXE-1).
//!
//! Each dispatcher slot is an actor mailbox with a *scheduled* flag: a slot enters the run
//! queue only when it has work and is not already queued or running, so no two workers are
//! ever inside one slot (max active == 1 per slot). A worker runs a slot for at most
//! [`BATCH`] deliveries, then puts it at the back of the run queue, so one hot subscription
//! cannot starve the others. A retry wait occupies no worker: the slot is parked on the
//! pool's timer thread, which re-schedules it when due.
//!
//! Memory per idle subscription is the subscription itself: its slots' mailbox flags live
//! in the subscription's shell (`subscription::run_flags`), the run queue holds the
//! subscription, and the waker every subscription is given is the pool itself. So
//! scheduling and running a subscription touch no second allocation, and an idle one holds
//! no thread, no stack, and nothing of the driver's.
//!
//! A broker service (a durable subscription's feeder, the retention and scheduler timers;
//! see `super::service`) is a schedulable unit too (R-EXE-4): woken by an append to its
//! stream, room freed in its window, a seek, a clock jump or a stop; a worker runs one
//! bounded step (a feeder's: at most one read batch), then re-queues it at the back, parks
//! it on the pool's timer until its due time, or leaves it idle. So idle durable
//! subscriptions cost no OS thread each.

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::clock::Clock;
use crate::error::SubscribeError;
use crate::subscription::run_flags::RunFlags;
use crate::subscription::shell::{Step, SubscriptionShell};
use crate::sync::{
    AtomicBool, AtomicU8, Condvar, Mutex, MutexGuard, Ordering, protocol_thread_local, wait_until,
};
use crossbeam_utils::Backoff;

use super::live::LiveCount;
use super::thread::SPIN;
use super::{Executor, Service, ServiceHandle, ServiceStep, Wake};

/// Most deliveries a worker makes for one slot before yielding it.
pub const BATCH: usize = 64;

static NEXT_POOL: AtomicU64 = AtomicU64::new(1);

protocol_thread_local! {
    /// The pool whose worker runs on this thread (0 = none).
    static CURRENT_POOL: Cell<u64> = Cell::new(0);
}

enum Task {
    /// A subscription's dispatcher slot. The task does not keep the subscription alive;
    /// the worker takes it (and checks that it still exists) when it runs the slot.
    Slot {
        sub: Weak<SubscriptionShell>,
        worker: usize,
    },
    /// A service's step.
    Service(Arc<ServiceMailbox>),
}

/// The mailbox of one service: one state word, [`SCHEDULED`] while queued or running (so
/// no two workers are inside one service) and [`PENDING`] when woken since its current step
/// began. One word, changed only by read-modify-writes, so every wake is ordered against
/// the step's end without relying on sequential consistency across two flags.
struct ServiceMailbox {
    state: AtomicU8,
    service: Weak<dyn Service>,
    pool: Arc<Shared>,
}

impl ServiceMailbox {
    fn enqueue(self: &Arc<Self>) {
        self.pool
            .run_queue
            .lock()
            .push_back(Task::Service(self.clone()));
        self.pool.work.notify_one();
    }
}

/// [`ServiceMailbox`] state: queued or running.
const SCHEDULED: u8 = 1;
/// [`ServiceMailbox`] state: woken since the current step began.
const PENDING: u8 = 2;

impl ServiceMailbox {
    /// New work: mark it pending, and queue the service unless it is queued or running
    /// already (a running step ends by seeing `PENDING` and runs again).
    fn wake(self: &Arc<Self>) {
        let before = self.state.fetch_or(SCHEDULED | PENDING, Ordering::AcqRel);
        if before & SCHEDULED == 0 {
            self.enqueue();
        }
    }

    /// A step begins: what woke it is being handled.
    fn begin_step(&self) {
        self.state.fetch_and(!PENDING, Ordering::AcqRel);
    }

    /// A step ended with nothing more to do: go idle, unless a wake arrived during the
    /// step — then stay scheduled and return true (queue it again).
    fn end_step(&self) -> bool {
        self.state
            .compare_exchange(SCHEDULED, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    }
}

/// The pool's handle on a service.
pub(crate) struct PoolService(Arc<ServiceMailbox>);

impl ServiceHandle for PoolService {
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
    Slot(Weak<SubscriptionShell>, usize),
    /// A service waiting for its next due time.
    Service(Weak<ServiceMailbox>),
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

pub(crate) struct Shared {
    id: u64,
    run_queue: Mutex<VecDeque<Task>>,
    work: Condvar,
    timers: Mutex<(BinaryHeap<Reverse<Timer>>, u64)>,
    timer_changed: Condvar,
    shutdown: AtomicBool,
    /// Slots that have not yet reported `Stopped`.
    pub(super) live_slots: LiveCount,
    /// Worker and timer threads still running.
    live_threads: LiveCount,
    clock: Arc<dyn Clock>,
}

/// A dispatcher slot's mailbox: its run flags, in the subscription's shell (see
/// `subscription::run_flags`). A publisher's wake and a worker's run touch these and the
/// subscription, nothing else of the driver's (so 100,000 subscriptions cost memory only).
struct Mailbox<'a> {
    sub: &'a SubscriptionShell,
    worker: usize,
    flags: &'a RunFlags,
}

impl<'a> Mailbox<'a> {
    /// Slot `worker` of `sub` (`None`: no such slot).
    fn of(sub: &'a SubscriptionShell, worker: usize) -> Option<Self> {
        let flags = sub.run_flags(worker)?;
        Some(Self { sub, worker, flags })
    }

    /// Queue the slot on `pool` unless it is queued or running already.
    fn schedule(&self, pool: &Shared) {
        if self.flags.scheduled.swap(true, Ordering::AcqRel) {
            return; // already queued or running: it will see the new work
        }
        // The subscription is taken (and checked to exist) by the worker that runs it.
        pool.run_queue.lock().push_back(Task::Slot {
            sub: self.sub.weak(),
            worker: self.worker,
        });
        pool.work.notify_one();
    }

    /// A worker enters the slot until the guard drops.
    fn enter(&self) -> Occupied<'a> {
        let running = &self.flags.running;
        let was = running.swap(true, Ordering::AcqRel);
        if cfg!(any(debug_assertions, tidings_loom)) {
            assert!(!was, "two pool workers inside one dispatcher slot");
        }
        Occupied(running)
    }

    /// The slot goes idle: leave it, then clear its flag — in that order, so the worker the
    /// cleared flag lets in next finds it empty. Called with the subscription's lock held:
    /// an offer after this sees the slot idle and schedules it again, so no wake-up is lost.
    ///
    /// The flag is cleared by a read-modify-write, like every other change to it: a plain
    /// store racing `schedule`'s swap is a pattern loom mis-models (it lets the store slip
    /// between the swap's read and write), and one kind of access keeps the model exact.
    fn leave(&self, occupied: Occupied<'_>) {
        drop(occupied);
        let was = self.flags.scheduled.swap(false, Ordering::AcqRel);
        debug_assert!(was, "a running slot is scheduled");
    }
}

/// A worker is inside a slot (see [`Mailbox::enter`]).
struct Occupied<'a>(&'a AtomicBool);

impl Drop for Occupied<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The pool is every subscription's waker: a wake queues the subscription's slot.
impl Wake for Shared {
    fn wake(&self, sub: &SubscriptionShell, worker: usize) {
        if let Some(mailbox) = Mailbox::of(sub, worker) {
            mailbox.schedule(self);
        }
    }
    fn wake_all(&self, sub: &SubscriptionShell) {
        for w in 0..sub.workers() {
            self.wake(sub, w);
        }
    }
}

pub(crate) struct PoolExecutor {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl PoolExecutor {
    pub(crate) fn new(workers: usize, clock: Arc<dyn Clock>) -> Result<Self, std::io::Error> {
        let pool = Self {
            shared: Shared::new(clock),
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
        self.shared.stop();
    }

    fn on_pool_thread(&self) -> bool {
        CURRENT_POOL.with(Cell::get) == self.shared.id
    }
}

impl Executor for PoolExecutor {
    fn start_service(
        &self,
        service: Arc<dyn Service>,
    ) -> Result<Box<dyn ServiceHandle>, SubscribeError> {
        Ok(Box::new(self.shared.attach_service(&service)))
    }

    fn start(&self, sub: &Arc<SubscriptionShell>) -> Result<(), SubscribeError> {
        self.shared.attach(sub);
        Ok(())
    }

    fn wait_stopped(&self, deadline: Option<Instant>) -> bool {
        let me = usize::from(self.on_pool_thread());
        self.shared.live_slots.wait_at_most(me, deadline)
    }

    fn join(&self, deadline: Instant, _subs: &[Arc<SubscriptionShell>]) -> Vec<String> {
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

impl Shared {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Arc<Self> {
        Arc::new(Shared {
            id: NEXT_POOL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            run_queue: Mutex::new(VecDeque::new()),
            work: Condvar::new(),
            timers: Mutex::new((BinaryHeap::new(), 0)),
            timer_changed: Condvar::new(),
            shutdown: AtomicBool::new(false),
            live_slots: LiveCount::default(),
            live_threads: LiveCount::default(),
            clock,
        })
    }

    /// Make the pool the new subscription's waker and run each of its slots once, so it
    /// reaches its idle state (and sees anything already queued).
    pub(super) fn attach(self: &Arc<Self>, sub: &Arc<SubscriptionShell>) {
        self.live_slots.enter(sub.workers());
        sub.set_waker(self.clone());
        self.wake_all(sub);
    }

    /// Give a service a mailbox and queue its first step (a feeder reads what the stream
    /// already holds).
    pub(crate) fn attach_service(self: &Arc<Self>, service: &Arc<dyn Service>) -> PoolService {
        let handle = PoolService(Arc::new(ServiceMailbox {
            state: AtomicU8::new(0),
            service: Arc::downgrade(service),
            pool: self.clone(),
        }));
        handle.wake();
        handle
    }

    /// Tell the worker and timer threads to exit once idle.
    pub(crate) fn stop(&self) {
        self.shutdown.store(true, Ordering::Release);
        drop(self.run_queue.lock());
        self.work.notify_all();
        drop(self.timers.lock());
        self.timer_changed.notify_all();
    }
}

pub(crate) fn worker_loop(pool: &Arc<Shared>) {
    CURRENT_POOL.with(|c| c.set(pool.id));
    loop {
        let task = {
            let mut q = pool.run_queue.lock();
            // Spin, then yield, before sleeping: a publisher that keeps the pool busy
            // finds a worker awake, and its wake-up costs no futex round trip.
            let backoff = Backoff::new();
            loop {
                if let Some(t) = q.pop_front() {
                    break t;
                }
                if pool.shutdown.load(Ordering::Acquire) {
                    return;
                }
                if SPIN && !backoff.is_completed() {
                    MutexGuard::unlocked(&mut q, || backoff.snooze());
                } else {
                    pool.work.wait(&mut q);
                }
            }
        };
        match task {
            Task::Slot { sub, worker } => run_slot(pool, sub, worker),
            Task::Service(mailbox) => run_service(&mailbox),
        }
    }
}

/// Run one step of a service, then re-queue it, leave it idle, or drop it (stopped/gone).
fn run_service(mailbox: &Arc<ServiceMailbox>) {
    let Some(service) = mailbox.service.upgrade() else {
        return; // its owner is gone: it stays `SCHEDULED`, so it is never queued again
    };
    mailbox.begin_step();
    let step = service.step(service.clock().now());
    match step {
        ServiceStep::Again => mailbox.enqueue(),
        ServiceStep::Stopped => {}
        ServiceStep::Idle | ServiceStep::WakeAt(_) => {
            if let ServiceStep::WakeAt(due) = step {
                park(
                    &mailbox.pool,
                    due,
                    TimerTarget::Service(Arc::downgrade(mailbox)),
                );
            }
            if mailbox.end_step() {
                mailbox.enqueue();
            }
        }
    }
}

/// Run one slot for up to `BATCH` deliveries, then re-queue, park or retire it.
fn run_slot(pool: &Arc<Shared>, weak: Weak<SubscriptionShell>, worker: usize) {
    let Some(sub) = weak.upgrade() else {
        // The subscription is gone (this task outlived it): the slot can never run again.
        // Its flags went with it, so this is its one report.
        pool.live_slots.exit();
        return;
    };
    let mailbox = Mailbox::of(&sub, worker).expect("a scheduled slot exists");
    let occupied = mailbox.enter();
    // Dropping `locked` releases the lock and applies the steps' effects.
    let mut locked = sub.lock();
    // Deliveries, not steps: a step may deliver several messages (a batch).
    let mut budget = BATCH;
    while budget > 0 {
        match locked.step_within(worker, true, &mut budget) {
            Step::Delivered => {}
            Step::Idle => {
                mailbox.leave(occupied);
                return;
            }
            Step::WakeAt(due) => {
                mailbox.leave(occupied);
                drop(locked);
                park(pool, due, TimerTarget::Slot(Arc::downgrade(&sub), worker));
                return;
            }
            Step::Stopped => {
                drop(locked);
                pool.live_slots.exit();
                return;
            }
        }
    }
    drop(locked);
    // Batch used up: yield the slot to the back of the run queue (fairness).
    drop(occupied);
    drop(sub);
    pool.run_queue
        .lock()
        .push_back(Task::Slot { sub: weak, worker });
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
                TimerTarget::Service(mailbox) => {
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

#[cfg(all(test, not(tidings_loom)))]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use super::*;
    use crate::clock::SystemClock;
    use crate::message::MessageBuilder;
    use crate::options::{Concurrency, SubscribeOptions};

    const PATIENCE: Duration = Duration::from_secs(60);

    fn shell(options: &SubscribeOptions, seen: Arc<AtomicUsize>) -> Arc<SubscriptionShell> {
        let handler = move |_: &crate::message::Message| {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        };
        crate::subscription::shell::detached(options, handler)
    }

    fn workers(pool: &Arc<Shared>, n: usize) -> Vec<std::thread::JoinHandle<()>> {
        (0..n)
            .map(|_| {
                let pool = pool.clone();
                std::thread::spawn(move || worker_loop(&pool))
            })
            .collect()
    }

    fn stop(pool: &Arc<Shared>, threads: Vec<std::thread::JoinHandle<()>>) {
        pool.stop();
        for t in threads {
            t.join().unwrap();
        }
    }

    // R-EXE-1, R-CORE-6: a subscription closed and dropped while its slot waits in the run
    // queue (the queue holds it only weakly) is reported stopped once, so close does not
    // wait for a slot that can never run.
    #[test]
    fn a_subscription_dropped_while_queued_is_reported_stopped() {
        let pool = Shared::new(Arc::new(SystemClock));
        let seen = Arc::new(AtomicUsize::new(0));
        let sub = shell(&SubscribeOptions::default(), seen);
        pool.attach(&sub); // queues its one slot; no worker runs yet
        sub.close();
        drop(sub);
        assert_eq!(pool.run_queue.lock().len(), 1, "the slot is still queued");
        let threads = workers(&pool, 2);
        let stopped = pool
            .live_slots
            .wait_at_most(0, Some(Instant::now() + PATIENCE));
        stop(&pool, threads);
        assert!(
            stopped,
            "the dropped subscription's slot was reported stopped"
        );
    }

    // R-EXE-1, R-CORE-3: a subscription of several slots (lanes) gets one set of flags per
    // slot — the first inline in its shell, the others beside it: a wake storm of every slot while
    // messages flow delivers each message once, and each slot stops once at close.
    #[test]
    fn every_slot_of_a_lanes_subscription_is_scheduled_and_stops() {
        const N: usize = 3_000;
        let pool = Shared::new(Arc::new(SystemClock));
        let seen = Arc::new(AtomicUsize::new(0));
        let options = SubscribeOptions::new()
            .concurrency(Concurrency::Lanes(3))
            .capacity(N);
        let sub = shell(&options, seen.clone());
        assert_eq!(sub.workers(), 3);
        pool.attach(&sub);
        let threads = workers(&pool, 2);
        let storm = {
            let sub = sub.clone();
            std::thread::spawn(move || {
                for _ in 0..2_000 {
                    sub.wake_all();
                    std::thread::yield_now();
                }
            })
        };
        for i in 0..N {
            let m = Arc::new(
                MessageBuilder::new("t")
                    .key(format!("k{}", i % 7))
                    .build_detached()
                    .unwrap(),
            );
            sub.offer(&m).expect("room for every message");
        }
        storm.join().unwrap();
        let deadline = Instant::now() + PATIENCE;
        while seen.load(std::sync::atomic::Ordering::SeqCst) < N && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), N);
        sub.close();
        let stopped = pool.live_slots.wait_at_most(0, Some(deadline));
        stop(&pool, threads);
        assert!(stopped, "every slot stopped");
    }
}
