//! How many dispatchers (threads, tasks or pool slots) are still running, so close can wait
//! for them with a deadline instead of polling.

use std::time::Instant;

use crate::sync::{Condvar, Mutex};

#[derive(Default)]
pub(crate) struct LiveCount {
    running: Mutex<usize>,
    changed: Condvar,
}

impl LiveCount {
    /// `n` more are running.
    pub(crate) fn enter(&self, n: usize) {
        *self.running.lock() += n;
    }

    /// One stopped. Each one stops once: a second report is a driver bug, caught in debug
    /// and model-checking builds; a release build does not let the count wrap (which would
    /// make close wait for ever).
    pub(crate) fn exit(&self) {
        let mut running = self.running.lock();
        let left = running.checked_sub(1);
        if cfg!(any(debug_assertions, tidings_loom)) {
            assert!(left.is_some(), "a dispatcher reported stopping twice");
        }
        *running = left.unwrap_or(0);
        drop(running);
        self.changed.notify_all();
    }

    /// Wait until at most `allowed` are running (`allowed` > 0 when the caller is one of
    /// them), or until `deadline` (`None`: no deadline). True when the count got there.
    pub(crate) fn wait_at_most(&self, allowed: usize, deadline: Option<Instant>) -> bool {
        let mut running = self.running.lock();
        while *running > allowed {
            match deadline {
                Some(d) => {
                    if self.changed.wait_until(&mut running, d).timed_out() {
                        return *running <= allowed;
                    }
                }
                None => self.changed.wait(&mut running),
            }
        }
        true
    }
}
