//! Driving to idle under the manual driver (R-EXE-2, R-EXE-5): deliver everything
//! deliverable now in the caller's thread — due delayed messages, durable feeders,
//! retention that fell due, every dispatcher slot — until nothing is left to do.

use std::cell::Cell;
use std::time::Instant;

use crate::clock::Clock;
use crate::subscription::shell::without_waiting;

use super::BrokerInner;

/// How deeply `run_until_idle` may nest (a handler that calls it, or `request`, or `close`,
/// from inside a handler it is running). Deeper calls return 0 at once.
const MAX_NESTING: u32 = 16;

thread_local! {
    /// How many `run_until_idle` calls are delivering on this thread (nested ones included).
    static DRIVING: Cell<u32> = const { Cell::new(0) };
}

impl BrokerInner {
    /// True when no queue holds a message, no handler call or retry is pending and no
    /// delayed message is scheduled.
    pub(super) fn is_idle(&self) -> bool {
        self.scheduler.len() == 0 && self.live().iter().all(|s| s.is_idle())
    }

    /// Under a driver that delivers on the caller's thread: deliver everything deliverable
    /// now, here (0 under the others).
    pub(super) fn run_until_idle(&self) -> usize {
        self.executor
            .run_on_caller(&mut || self.run_nested())
            .unwrap_or(0)
    }

    fn run_nested(&self) -> usize {
        struct Depth;
        impl Drop for Depth {
            fn drop(&mut self) {
                DRIVING.with(|d| d.set(d.get().saturating_sub(1)));
            }
        }
        if DRIVING.with(|d| d.get()) >= MAX_NESTING {
            return 0;
        }
        DRIVING.with(|d| d.set(d.get() + 1));
        let _depth = Depth;
        // Nothing else can make room while this thread delivers: Block offers do not wait.
        without_waiting(|| self.drive())
    }

    /// Deliver, jumping the manual clock to each next wake-up, until nothing is scheduled
    /// (see [`Broker::settle`](crate::Broker::settle)); runs on the caller's thread.
    pub(super) fn settle_here(&self) -> usize {
        let mut steps = 0;
        loop {
            let made = self.run_until_idle();
            steps += made;
            let (Some(next), Some(clock)) = (self.next_wake(), &self.manual_clock) else {
                return steps;
            };
            if next > clock.now() {
                clock.advance_to(next);
            } else if made == 0 {
                // Due but not deliverable now (its slot is busy up the stack): stop.
                return steps;
            }
        }
    }

    pub(super) fn drive(&self) -> usize {
        let mut delivered = 0;
        loop {
            let mut progress = 0;
            // The broker's services, each stepped here by the manual driver: the scheduler's
            // timer releases due delayed messages, then retention and the durable feeders.
            progress += self.scheduler.run_here();
            progress += self.durables.run_now();
            for sub in self.live() {
                for worker in 0..sub.workers() {
                    while sub.step(worker) {
                        progress += 1;
                    }
                }
            }
            if progress == 0 {
                break;
            }
            delivered += progress;
        }
        delivered
    }

    pub(super) fn next_wake(&self) -> Option<Instant> {
        self.live()
            .iter()
            .filter_map(|s| s.next_wake())
            .chain(self.scheduler.next_due())
            .min()
    }
}
