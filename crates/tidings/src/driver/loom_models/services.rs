//! Model-checked wake protocol of the broker's services (see `driver::service`): the
//! thread driver's service thread and loop, and the pool's service mailbox and
//! `worker_loop`, stepping a service.
//! The durable feeder's protocol on the drivers' service loops is modelled in
//! `durable::loom_models`, and the scheduler's timer in `crate::scheduler` (the arrows
//! point from those to the drivers).

use std::sync::Arc;
use std::time::Instant;

use crate::clock::SystemClock;
use crate::subscription::loom_models::{Tally, check, messages};
use crate::sync::{AtomicBool, Mutex, Ordering};

use super::super::pool::Shared;
use super::super::thread::ThreadExecutor;
use super::super::{Executor, Service, ServiceHandle, ServiceStep};
use super::pool_workers;

/// A service whose steps take the work items handed to it.
#[derive(Default)]
struct CountingService {
    work: Mutex<usize>,
    taken: Tally,
    inside: AtomicBool,
    /// Asked to stop: the next step says so.
    stop: AtomicBool,
}

impl Service for CountingService {
    fn name(&self) -> String {
        "model-service".into()
    }
    fn clock(&self) -> &dyn crate::clock::Clock {
        &SystemClock
    }
    fn step(&self, _now: Instant) -> ServiceStep {
        assert!(
            !self.inside.swap(true, Ordering::AcqRel),
            "two pool workers inside one service"
        );
        let stop = self.stop.load(Ordering::Acquire);
        let items = std::mem::take(&mut *self.work.lock());
        for _ in 0..items {
            self.taken.add(0);
        }
        self.inside.store(false, Ordering::Release);
        if stop {
            ServiceStep::Stopped
        } else {
            ServiceStep::Idle
        }
    }
}

/// The pool's service mailbox (`pending` + `scheduled`) loses no wake-up and never runs one
/// service on two workers (R-EXE-4): work handed over while a step runs is taken by a
/// later step.
///
/// Guards against: clearing `pending` after the step instead of before it — a wake during
/// the step is then forgotten and its work never taken.
#[test]
fn pool_service_mailbox_loses_no_wakeup() {
    check(|| {
        let n = messages();
        let service = Arc::new(CountingService::default());
        let pool = Shared::new(Arc::new(SystemClock));
        let as_service: Arc<dyn Service> = service.clone();
        let handle = pool.attach_service(&as_service);
        let workers = pool_workers(&pool);
        for _ in 0..n {
            *service.work.lock() += 1;
            handle.wake();
        }
        service.taken.wait_for(n);
        pool.stop();
        for w in workers {
            w.join().expect("a pool worker returns");
        }
    });
}

/// The thread driver's service thread loses no wake-up and stops when asked (R-EXE-4): work
/// handed over while its step runs — or after a step that found none, before the thread
/// waits — is taken by a later step; a stop request (made, then woken) ends the thread,
/// which `join` waits for.
///
/// Guards against: the generic loop waiting without checking the wake-up left during its
/// step (loom reports the deadlock).
#[test]
fn thread_service_loop_loses_no_wakeup() {
    check(|| {
        let n = messages();
        let service = Arc::new(CountingService::default());
        let handle = ThreadExecutor::new()
            .start_service(service.clone())
            .expect("a service thread");
        for _ in 0..n {
            *service.work.lock() += 1;
            handle.wake();
        }
        service.taken.wait_for(n);
        service.stop.store(true, Ordering::Release);
        handle.wake();
        handle.join();
    });
}
