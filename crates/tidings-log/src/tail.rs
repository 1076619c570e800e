//! Waking readers when records become visible: a condition variable for blocking waiters
//! ([`Log::wait_for_append`](crate::Log::wait_for_append)) and callbacks for embedders
//! ([`Log::add_append_listener`](crate::Log::add_append_listener)). No polling anywhere.
//!
//! The publisher raises the visible end first and then checks for waiters; a waiter registers
//! first and then checks the visible end under the lock, so a wake-up is never lost. The two
//! sides are ordered by `SeqCst` where a group commit raises the end, and by the log's writer
//! lock where the writer does (it raises the end with a release store under that lock, and a
//! waiter registers under it too: see `Log::wait_for_append`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};

/// A callback run after records become visible, with a lower bound of the new end offset.
pub type AppendListener = Arc<dyn Fn(u64) + Send + Sync>;

#[derive(Default)]
pub(crate) struct Tail {
    lock: Mutex<()>,
    cv: Condvar,
    waiters: AtomicUsize,
    notified: AtomicU64,
    listeners: RwLock<Arc<Vec<AppendListener>>>,
    has_listeners: AtomicBool,
}

impl std::fmt::Debug for Tail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tail")
            .field("waiters", &self.waiters)
            .field("notified", &self.notified)
            .finish_non_exhaustive()
    }
}

impl Tail {
    /// Called (outside every other lock) after the visible end was raised to `visible`.
    pub(crate) fn publish(&self, visible: u64) {
        if self.waiters.load(Ordering::SeqCst) == 0 && !self.has_listeners.load(Ordering::Acquire) {
            return;
        }
        if self.notified.fetch_max(visible, Ordering::SeqCst) >= visible {
            return;
        }
        self.wake_all();
        if self.has_listeners.load(Ordering::Acquire) {
            let listeners = self.listeners.read().clone();
            for l in listeners.iter() {
                l(visible);
            }
        }
    }

    /// Wakes every blocked waiter so it re-checks its condition.
    pub(crate) fn wake_all(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let _g = self.lock.lock();
            self.cv.notify_all();
        }
    }

    /// Counts a waiter in (called by the `register` of [`Tail::wait`]).
    pub(crate) fn register_waiter(&self) {
        self.waiters.fetch_add(1, Ordering::SeqCst);
    }

    /// Blocks until `ready()` or `stop()` holds or `timeout` passes; returns `ready()`.
    /// `register` must call [`Tail::register_waiter`], under whatever lock orders it with
    /// the raising of the visible end (see the module docs).
    pub(crate) fn wait(
        &self,
        timeout: Duration,
        ready: impl Fn() -> bool,
        stop: impl Fn() -> bool,
        register: impl FnOnce(),
    ) -> bool {
        if ready() {
            return true;
        }
        let deadline = Instant::now().checked_add(timeout);
        register();
        let mut g = self.lock.lock();
        let result = loop {
            if ready() {
                break true;
            }
            if stop() {
                break false;
            }
            let timed_out = match deadline {
                Some(d) => self.cv.wait_until(&mut g, d).timed_out(),
                None => {
                    self.cv.wait(&mut g);
                    false
                }
            };
            if timed_out {
                break ready();
            }
        };
        drop(g);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        result
    }

    pub(crate) fn add_listener(&self, f: AppendListener) {
        let mut l = self.listeners.write();
        let mut v = Vec::clone(&l);
        v.push(f);
        *l = Arc::new(v);
        self.has_listeners.store(true, Ordering::Release);
    }
}
