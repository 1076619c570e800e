//! The manual driver: nothing runs until the caller drives it (R-EXE-2).
//!
//! Delivery happens in [`Broker::run_until_idle`](crate::Broker::run_until_idle), in the
//! caller's thread, subscription by subscription in id order — so with a manual clock,
//! every test of fan-out, priority, filters, retries, TTL and the DLQ is exact.
//! [`Broker::settle`](crate::Broker::settle) also jumps a `ManualClock` to each next
//! wake-up until nothing is scheduled.
//!
//! The broker's services (durable feeders, the retention and scheduler timers) run there
//! too: `run_until_idle` steps each through [`ServiceHandle::run_here`] until it has
//! nothing more to do now.
//!
//! # Re-entrant calls from handlers (R-EXE-5)
//! A handler that `run_until_idle` is running may call back into the broker:
//!
//! * **publish** offers as usual, except that a full `Overflow::Block` queue does not wait
//!   (only this thread could make room, and it is busy in the handler): the offer is
//!   refused at once as `Overflow` and dead-lettered, exactly like `Reject`. The same holds
//!   for due delayed messages released by `run_until_idle`. A `Block` publish from another
//!   thread (outside `run_until_idle`) still waits, for room or for its timeout on the
//!   broker's clock.
//! * **run_until_idle** nests: it delivers everything deliverable now, except on the
//!   dispatcher slots whose handlers are running up the stack (one dispatcher per
//!   subscription, R-CORE-3), then returns to the handler. Nesting is capped at 16 levels.
//! * **request** publishes, then runs the nested `run_until_idle`, so a reply from any
//!   other subscription arrives before it returns; a request only its own (busy)
//!   subscription could answer returns `Timeout` at once.
//! * **subscribe** / **unsubscribe** take effect at once; a new subscription is delivered
//!   to by the same `run_until_idle` call.
//! * **close** closes the broker from inside the handler and returns its report (the
//!   handler's own message completes after it, outside the report). A close called from a
//!   handler that an outer `close` is draining returns an empty report at once (it cannot
//!   wait for itself); the outer close returns the full one.

use std::sync::{Arc, Weak};
use std::time::Instant;

use crate::error::SubscribeError;
use crate::subscription::shell::SubscriptionShell;

use super::{Executor, Service, ServiceHandle, ServiceStep, Wake};

pub(crate) struct ManualExecutor;

/// A service stepped only in the caller's thread ([`ServiceHandle::run_here`]).
struct CallerRuns(Weak<dyn Service>);

impl ServiceHandle for CallerRuns {
    fn wake(&self) {
        // Nothing runs until the caller drives it.
    }
    fn wakes_on_time(&self) -> bool {
        false
    }
    fn run_here(&self) -> usize {
        let Some(service) = self.0.upgrade() else {
            return 0;
        };
        let mut progress = 0;
        while service.step(service.clock().now()) == ServiceStep::Again {
            progress += 1;
        }
        progress
    }
}

struct NoWake;

impl Wake for NoWake {
    fn wake(&self, _sub: &SubscriptionShell, _worker: usize) {}
    fn wake_all(&self, _sub: &SubscriptionShell) {}
}

impl Executor for ManualExecutor {
    fn start(&self, sub: &Arc<SubscriptionShell>) -> Result<(), SubscribeError> {
        sub.set_waker(Arc::new(NoWake));
        Ok(())
    }
    fn start_service(
        &self,
        service: Arc<dyn Service>,
    ) -> Result<Box<dyn ServiceHandle>, SubscribeError> {
        // `run_until_idle` steps it in the caller's thread; its owner keeps it alive.
        Ok(Box::new(CallerRuns(Arc::downgrade(&service))))
    }
    fn wait_stopped(&self, _deadline: Option<Instant>) -> bool {
        true
    }
    fn join(&self, _deadline: Instant, _subs: &[Arc<SubscriptionShell>]) -> Vec<String> {
        Vec::new()
    }
    fn run_on_caller(&self, work: &mut dyn FnMut() -> usize) -> Option<usize> {
        Some(work())
    }
}
