//! The synchronisation primitives of tidings' concurrency protocols, in one place.
//!
//! Every lock, condition variable, atomic flag and model-visible thread that takes part in
//! a protocol between threads — the subscription shell (offer, wake/park, `Block` waits,
//! close, redrive, the finished hook), the drivers (the pool's mailbox flags and run queue,
//! the thread driver's parking, the live counts close waits on), the broker's services and
//! their wake/step protocol (a durable feeder's step lock, stop flag and hand-over of
//! finished messages; the service threads' wake-up; the scheduler and retention state) and
//! the request inbox — comes from here, so a model checker can swap them in:
//!
//! * normal builds: `parking_lot`'s `Mutex`/`Condvar`, `std`'s atomics and threads;
//! * model-checking builds (`RUSTFLAGS="--cfg tidings_loom"`): `loom`'s, behind the same
//!   `parking_lot`-shaped API, so the models (`*/loom_models.rs`) run the production code
//!   under every interleaving loom explores.
//!
//! The cfg is `tidings_loom`, not `loom`: dependencies such as tokio read `cfg(loom)`
//! themselves and do not build as ordinary dependencies with it.
//!
//! # What is not swapped
//! * `Arc`/`Weak` are `std`'s in both builds: loom's `Arc` cannot hold a trait object
//!   (`Arc<dyn Wake>`), and no protocol here is carried by a reference count.
//! * Id counters in `static`s stay `std` atomics: they only hand out unique numbers.
//! * Spawning named OS threads and joining them with a deadline (the thread and pool
//!   drivers' dispatcher and worker lifecycle) stays `std::thread`; the models start loom
//!   threads that run the drivers' loops directly. The thread driver's service threads
//!   (`driver::thread::service_loop`) are spawned and joined through [`thread`], so the
//!   models run the driver's own `start_service` and `join`.
//! * A service's driver handle is published once, through a `std::sync::OnceLock`, before
//!   the wake that lets the service use it (a step that finds it unset is idle): a
//!   one-time publication, not a protocol a model needs to interleave.
//!
//! # Time under the model checker
//! loom has no time: a timed wait ([`Condvar::wait_for`], [`Condvar::wait_until`],
//! [`wait_until`]) waits until notified. A model whose progress depends on a timeout is a
//! deadlock to loom, so the models use untimed waits (no retries, `Duration::MAX` `Block`
//! timeouts).

#[cfg(not(tidings_loom))]
pub(crate) use parking_lot::{Condvar, Mutex, MutexGuard};
#[cfg(not(tidings_loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize};
#[cfg(not(tidings_loom))]
pub(crate) use std::thread;

#[cfg(tidings_loom)]
pub(crate) use model::thread;
#[cfg(tidings_loom)]
pub(crate) use model::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Condvar, Mutex, MutexGuard};

pub(crate) use std::sync::atomic::Ordering;

use std::time::Instant;

use crate::clock::Clock;

/// A thread-local `Cell`-like value that is per *model* thread under the model checker
/// (`std::thread_local!` with a `const` initialiser otherwise).
macro_rules! protocol_thread_local {
    ($(#[$attr:meta])* static $name:ident: $t:ty = $init:expr;) => {
        #[cfg(not(tidings_loom))]
        std::thread_local! { $(#[$attr])* static $name: $t = const { $init }; }
        #[cfg(tidings_loom)]
        loom::thread_local! { $(#[$attr])* static $name: $t = $init; }
    };
}
pub(crate) use protocol_thread_local;

/// Block on `cv` (releasing `guard`) until notified or until `deadline` passes on `clock`;
/// with no deadline, until notified. Returns `true` without waiting when the deadline has
/// already passed. Under a manual clock the wait lasts until a notify: the clock's advance
/// wakes the waiters (see [`Clock::register_waiter`]), so callers re-check their state after
/// every return.
#[cfg_attr(tidings_loom, track_caller)]
pub(crate) fn wait_until<T>(
    clock: &dyn Clock,
    cv: &Condvar,
    guard: &mut MutexGuard<'_, T>,
    deadline: Option<Instant>,
) -> bool {
    match deadline.map(|d| clock.wait_hint(d)) {
        Some(Some(d)) if d.is_zero() => return true,
        Some(Some(d)) => {
            cv.wait_for(guard, d);
        }
        Some(None) | None => cv.wait(guard),
    }
    false
}

/// loom's primitives with `parking_lot`'s shape (no poisoning, `wait(&mut guard)`,
/// `MutexGuard::unlocked`).
#[cfg(tidings_loom)]
mod model {
    use std::ops::{Deref, DerefMut};
    use std::sync::PoisonError;
    use std::time::{Duration, Instant};

    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize};
    pub(crate) use loom::thread;

    /// A loom mutex.
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        #[track_caller]
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard {
                guard: Some(self.0.lock().unwrap_or_else(PoisonError::into_inner)),
                mutex: &self.0,
            }
        }
    }

    /// Held lock; `None` only inside [`MutexGuard::unlocked`] and [`Condvar::wait`].
    pub(crate) struct MutexGuard<'a, T> {
        guard: Option<loom::sync::MutexGuard<'a, T>>,
        mutex: &'a loom::sync::Mutex<T>,
    }

    impl<T> MutexGuard<'_, T> {
        /// Run `f` with the lock released, then take it again.
        pub(crate) fn unlocked<R>(this: &mut Self, f: impl FnOnce() -> R) -> R {
            this.guard = None;
            let result = f();
            this.guard = Some(this.mutex.lock().unwrap_or_else(PoisonError::into_inner));
            result
        }

        fn inner(&self) -> &loom::sync::MutexGuard<'_, T> {
            // Invariant: only `unlocked` and `wait` empty it, and both refill it before
            // handing the guard back.
            self.guard
                .as_ref()
                .expect("guard held outside unlocked/wait")
        }
    }

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.inner()
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.guard
                .as_mut()
                .expect("guard held outside unlocked/wait")
        }
    }

    /// Whether a timed wait timed out (never, under loom: see the module docs).
    pub(crate) struct WaitTimeoutResult;

    impl WaitTimeoutResult {
        pub(crate) fn timed_out(&self) -> bool {
            false
        }
    }

    /// A loom condition variable.
    #[derive(Debug, Default)]
    pub(crate) struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Self(loom::sync::Condvar::new())
        }

        #[track_caller]
        pub(crate) fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            let held = guard
                .guard
                .take()
                .expect("guard held outside unlocked/wait");
            guard.guard = Some(self.0.wait(held).unwrap_or_else(PoisonError::into_inner));
        }

        #[track_caller]
        pub(crate) fn wait_for<T>(
            &self,
            guard: &mut MutexGuard<'_, T>,
            _timeout: Duration,
        ) -> WaitTimeoutResult {
            self.wait(guard);
            WaitTimeoutResult
        }

        #[track_caller]
        pub(crate) fn wait_until<T>(
            &self,
            guard: &mut MutexGuard<'_, T>,
            _deadline: Instant,
        ) -> WaitTimeoutResult {
            self.wait(guard);
            WaitTimeoutResult
        }

        #[track_caller]
        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }

        #[track_caller]
        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}
