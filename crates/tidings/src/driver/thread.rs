//! The thread driver: one OS thread per dispatcher slot (R-EXE-1).
//!
//! Each thread loops on the shell's delivery step (poll, run the handler with the lock
//! released, report), and waits on its own condvar — releasing the subscription's lock
//! only by waiting — when idle (or until a retry is due). A publisher wakes an
//! idle thread only when the core says that slot was idle, so a busy dispatcher costs its
//! publishers no system call.
//!
//! Each broker service (a durable feeder, the retention timer, the scheduler's timer; see
//! `super::service`) has a thread of its own running the one generic [`service_loop`].

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;

use crate::error::SubscribeError;
use crate::subscription::shell::{Step, SubscriptionShell};
use crate::sync::{Condvar, Mutex, Ordering, protocol_thread_local, thread};

use super::handles::Handles;
use super::live::LiveCount;
use super::{Executor, Service, ServiceHandle, ServiceStep, Wake};

static NEXT_EXECUTOR: AtomicU64 = AtomicU64::new(1);

/// Spin before parking. Not in the model-checking build: the models check the parking
/// handshake, which spinning only postpones (and multiplies the interleavings to explore).
pub(super) const SPIN: bool = !cfg!(tidings_loom);

protocol_thread_local! {
    /// The executor whose dispatcher runs on this thread (0 = none).
    static CURRENT_EXECUTOR: Cell<u64> = Cell::new(0);
}

/// One condition variable per dispatcher slot: an idle slot's thread waits on it.
pub(super) struct Parking {
    slots: Box<[Condvar]>,
}

impl Parking {
    pub(super) fn new(workers: usize) -> Self {
        Self {
            slots: (0..workers).map(|_| Condvar::new()).collect(),
        }
    }
}

impl Wake for Parking {
    fn wake(&self, _sub: &SubscriptionShell, worker: usize) {
        if let Some(cv) = self.slots.get(worker) {
            cv.notify_one();
        }
    }
    fn wake_all(&self, _sub: &SubscriptionShell) {
        for cv in self.slots.iter() {
            cv.notify_all();
        }
    }
}

pub(crate) struct ThreadExecutor {
    id: u64,
    live: Arc<LiveCount>,
    handles: Mutex<Handles<(String, JoinHandle<()>)>>,
}

impl ThreadExecutor {
    pub(crate) fn new() -> Self {
        Self {
            id: NEXT_EXECUTOR.fetch_add(1, Ordering::Relaxed),
            live: Arc::default(),
            handles: Mutex::default(),
        }
    }

    fn on_this_thread(&self) -> usize {
        usize::from(CURRENT_EXECUTOR.with(Cell::get) == self.id)
    }
}

/// How long the generic service loop waits at most before it steps its service again,
/// woken or not. Services need no such step (every change that gives one work wakes it);
/// it bounds the cost of a wake-up lost outside the service protocol (a backend's cursor
/// waker that does not fire), as the feeder's own loop did before the driver owned it.
pub(super) const SERVICE_MAX_WAIT: Duration = Duration::from_millis(50);

/// The wake-up of a service's thread: a flag set by [`ServiceHandle::wake`] and consumed
/// by the loop's wait, so a wake that arrives while a step runs makes the next wait return
/// at once instead of being lost.
#[derive(Default)]
pub(super) struct Signal {
    woken: Mutex<bool>,
    cv: Condvar,
}

impl Signal {
    /// Leave a wake-up (after the change that gives the service work).
    pub(super) fn wake(&self) {
        *self.woken.lock() = true;
        self.cv.notify_one();
    }

    /// Wait until woken since the last wait, or at most `wait`; take the wake-up.
    fn wait(&self, wait: Duration) {
        let mut woken = self.woken.lock();
        if !*woken {
            // Under the model checker a timed wait waits for a notify: a lost wake-up
            // shows as a deadlock instead of being papered over by the bound.
            let _ = self.cv.wait_for(&mut woken, wait);
        }
        *woken = false;
    }
}

/// The thread driver's loop for every service (R-EXE-4): step at the clock's `now`; after a
/// step that may have more to do step again, otherwise wait for a wake or the next due
/// time, at most [`SERVICE_MAX_WAIT`]; return once the service stopped.
pub(super) fn service_loop(service: &dyn Service, signal: &Signal) {
    loop {
        let clock = service.clock();
        let wait = match service.step(clock.now()) {
            ServiceStep::Again => continue,
            ServiceStep::Stopped => return,
            ServiceStep::Idle => SERVICE_MAX_WAIT,
            // `None`: a clock that moves only when told wakes its services when it does.
            ServiceStep::WakeAt(at) => clock
                .wait_hint(at)
                .map_or(SERVICE_MAX_WAIT, |d| d.min(SERVICE_MAX_WAIT)),
        };
        if !wait.is_zero() {
            signal.wait(wait);
        }
    }
}

/// A service's own thread. Spawned through `crate::sync`, unlike the dispatchers' threads:
/// the models run the real `start_service` and `join` on model threads.
struct ServiceThread {
    signal: Arc<Signal>,
    thread: Mutex<Option<thread::JoinHandle<()>>>,
}

impl ServiceHandle for ServiceThread {
    fn wake(&self) {
        self.signal.wake();
    }
    fn join(&self) {
        let h = self.thread.lock().take();
        if let Some(h) = h
            && h.thread().id() != thread::current().id()
        {
            let _ = h.join();
        }
    }
}

impl Executor for ThreadExecutor {
    fn start_service(
        &self,
        service: Arc<dyn Service>,
    ) -> Result<Box<dyn ServiceHandle>, SubscribeError> {
        let signal = Arc::new(Signal::default());
        let waiter = signal.clone();
        let h = thread::Builder::new()
            .name(service.name())
            .spawn(move || service_loop(service.as_ref(), &waiter))
            .map_err(|e| SubscribeError::Spawn(e.to_string()))?;
        Ok(Box::new(ServiceThread {
            signal,
            thread: Mutex::new(Some(h)),
        }))
    }

    fn start(&self, sub: &Arc<SubscriptionShell>) -> Result<(), SubscribeError> {
        let parking = Arc::new(Parking::new(sub.workers()));
        sub.set_waker(parking.clone());
        let mut handles = self.handles.lock();
        for worker in 0..sub.workers() {
            let name = format!("tidings-{}-{worker}", sub.name);
            let (task, parking, live, id) =
                (sub.clone(), parking.clone(), self.live.clone(), self.id);
            live.enter(1);
            let spawned = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || {
                    CURRENT_EXECUTOR.with(|c| c.set(id));
                    dispatch_loop(&task, &parking, worker);
                    live.exit();
                });
            match spawned {
                Ok(h) => handles.push((name, h), |(_, h)| h.is_finished()),
                Err(e) => {
                    self.live.exit();
                    drop(handles);
                    sub.close();
                    return Err(SubscribeError::Spawn(e.to_string()));
                }
            }
        }
        Ok(())
    }

    fn wait_stopped(&self, deadline: Option<Instant>) -> bool {
        self.live.wait_at_most(self.on_this_thread(), deadline)
    }

    fn join(&self, deadline: Instant, _subs: &[Arc<SubscriptionShell>]) -> Vec<String> {
        // Once every dispatcher has decremented the live count it is only returning, so
        // joining it cannot block for long; `is_finished` may still lag behind the count.
        let all_stopped = self.wait_stopped(Some(deadline));
        let handles = self.handles.lock().take();
        let me = std::thread::current().id();
        let mut unjoined = Vec::new();
        for (name, h) in handles {
            if h.thread().id() == me {
                continue;
            }
            if all_stopped || h.is_finished() {
                let _ = h.join();
            } else {
                unjoined.push(name);
            }
        }
        unjoined
    }
}

pub(super) fn dispatch_loop(sub: &SubscriptionShell, parking: &Parking, worker: usize) {
    let slot = &parking.slots[worker];
    // Spin, then yield, before parking: a dispatcher that keeps up with its publisher
    // finds the next message without a futex round trip (the way crossbeam channels wait).
    let backoff = Backoff::new();
    // The report of one delivery and the poll for the next share one lock acquisition.
    let mut locked = sub.lock();
    loop {
        // While spinning, an idle poll is not announced: publishers skip the wake-up
        // until this slot is about to wait.
        let spinning = SPIN && !backoff.is_completed();
        match locked.step(worker, !spinning) {
            Step::Delivered => backoff.reset(),
            Step::Stopped => break,
            Step::Idle if spinning => {
                locked.unlocked(|| backoff.snooze());
            }
            Step::Idle => {
                locked.park(slot, None);
                backoff.reset();
            }
            Step::WakeAt(t) => locked.park(slot, Some(t)),
        }
    }
}
