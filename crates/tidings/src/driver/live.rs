//! How many dispatchers (threads, tasks or pool slots) are still running, so close can wait
//! for them with a deadline instead of polling.
//!
//! The count is an atomic, so entering and leaving take no lock: the tokio driver enters
//! and leaves once per slot task, and a task starts whenever an idle slot gets work (issue
//! 12). Close waits only for "none left but possibly me", so a leaver takes the lock and
//! signals only when the count drops to 1 or 0.

use std::time::Instant;

use crate::sync::{AtomicUsize, Condvar, Mutex, Ordering};

/// The most a waiter may allow to be left running: itself.
const MAX_ALLOWED: usize = 1;

#[derive(Default)]
pub(crate) struct LiveCount {
    running: AtomicUsize,
    /// Held to check the count before waiting, and by a leaver to signal: a leave that
    /// drops the count to [`MAX_ALLOWED`] or below happens before the waiter's check, or
    /// its signal reaches the waiting waiter.
    lock: Mutex<()>,
    changed: Condvar,
}

impl LiveCount {
    /// `n` more are running.
    pub(crate) fn enter(&self, n: usize) {
        self.running.fetch_add(n, Ordering::AcqRel);
    }

    /// One stopped. Each one stops once: a second report is a driver bug, caught in debug
    /// and model-checking builds; a release build does not let the count wrap (which would
    /// make close wait for ever).
    pub(crate) fn exit(&self) {
        let before = self
            .running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        if cfg!(any(debug_assertions, tidings_loom)) {
            assert!(before.is_ok(), "a dispatcher reported stopping twice");
        }
        if before.is_ok_and(|n| n - 1 <= MAX_ALLOWED) {
            drop(self.lock.lock());
            self.changed.notify_all();
        }
    }

    /// Wait until at most `allowed` (0, or 1 when the caller is one of them) are running,
    /// or until `deadline` (`None`: no deadline). True when the count got there.
    pub(crate) fn wait_at_most(&self, allowed: usize, deadline: Option<Instant>) -> bool {
        debug_assert!(
            allowed <= MAX_ALLOWED,
            "a leaver signals only at {MAX_ALLOWED} or below"
        );
        let mut lock = self.lock.lock();
        while self.running.load(Ordering::Acquire) > allowed {
            match deadline {
                Some(d) => {
                    if self.changed.wait_until(&mut lock, d).timed_out() {
                        return self.running.load(Ordering::Acquire) <= allowed;
                    }
                }
                None => self.changed.wait(&mut lock),
            }
        }
        true
    }

    /// How many are running now.
    #[cfg(feature = "tokio")]
    pub(crate) fn running(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }
}

#[cfg(all(test, not(tidings_loom)))]
mod tests {
    use std::sync::Arc;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use super::LiveCount;

    const PATIENCE: Duration = Duration::from_secs(20);

    /// `wait_at_most(allowed, None)` on a thread of its own: true once it returned, false if
    /// it was still waiting after `PATIENCE` (a lost signal: with no deadline it would wait
    /// for ever).
    fn released(live: &Arc<LiveCount>, allowed: usize, leave: impl FnOnce()) -> bool {
        let (tx, rx) = mpsc::channel();
        let waiter = {
            let live = live.clone();
            std::thread::spawn(move || {
                let got = live.wait_at_most(allowed, None);
                let _ = tx.send(got);
            })
        };
        // Let the waiter block first: a lost signal shows only then (a correct count passes
        // either way).
        std::thread::sleep(Duration::from_millis(50));
        leave();
        let ok = rx.recv_timeout(PATIENCE) == Ok(true);
        if ok {
            waiter.join().unwrap();
        }
        ok
    }

    // A waiter is released when the last one leaves: leaves that keep the count above what
    // it allows take no lock and signal nothing, so the final one must.
    #[test]
    fn a_waiter_is_released_by_the_last_leave() {
        let live = Arc::new(LiveCount::default());
        live.enter(3);
        live.exit();
        assert!(!live.wait_at_most(0, Some(Instant::now())), "two still run");
        assert!(released(&live, 0, || {
            live.exit();
            live.exit();
        }));
        assert_eq!(live.running.load(crate::sync::Ordering::Acquire), 0);
    }

    // "At most me": a waiter counted among the running is released when it is the only one
    // left, by the leave that drops the count to 1.
    #[test]
    fn a_waiter_that_is_one_of_them_allows_itself() {
        let live = Arc::new(LiveCount::default());
        live.enter(3);
        assert!(released(&live, 1, || {
            live.exit();
            live.exit();
        }));
        assert!(
            !live.wait_at_most(0, Some(Instant::now())),
            "the caller still runs"
        );
    }

    // A second exit is a driver bug: caught in debug builds, and never wraps the count.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "a dispatcher reported stopping twice")]
    fn stopping_twice_is_caught() {
        let live = LiveCount::default();
        live.enter(1);
        live.exit();
        live.exit();
    }
}
