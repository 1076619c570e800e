//! The thread driver: one OS thread per dispatcher slot (R-EXE-1).
//!
//! Each thread loops on the shell's delivery step (poll, run the handler with the lock
//! released, report), and waits on its own condvar — releasing the subscription's lock
//! only by waiting — when idle (or until a retry is due). A publisher wakes an
//! idle thread only when the core says that slot was idle, so a busy dispatcher costs its
//! publishers no system call.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_utils::Backoff;

use crate::error::SubscribeError;
use crate::subscription::shell::{Step, SubscriptionShell};
use crate::sync::{Condvar, Mutex, Ordering, protocol_thread_local};

use super::handles::Handles;
use super::live::LiveCount;
use super::{Executor, Feeder, FeederHandle, Wake};

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

/// A feeder's own thread.
struct FeederThread(Mutex<Option<JoinHandle<()>>>);

impl FeederHandle for FeederThread {
    fn wake(&self) {
        // The feeder waits on its own condition (room, appends) with a bounded wait.
    }
    fn join(&self) {
        if let Some(h) = self.0.lock().take()
            && h.thread().id() != std::thread::current().id()
        {
            let _ = h.join();
        }
    }
}

impl Executor for ThreadExecutor {
    fn start_feeder(
        &self,
        feeder: Arc<dyn Feeder>,
    ) -> Result<Box<dyn FeederHandle>, SubscribeError> {
        let h = std::thread::Builder::new()
            .name(feeder.name())
            .spawn(move || feeder.run())
            .map_err(|e| SubscribeError::Spawn(e.to_string()))?;
        Ok(Box::new(FeederThread(Mutex::new(Some(h)))))
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
