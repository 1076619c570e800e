//! A one-waiter wake-up with a stored permit, for tasks (the tokio driver's dispatcher
//! slots): what `tokio::sync::Notify::notify_one` does for a single waiter, in 24 bytes,
//! awaited through a future of one reference instead of a 64-byte `Notified` that every
//! idle task would carry (issue 12: the dispatcher future's size decides whether a task is
//! 256 or 384 bytes).
//!
//! No wake-up is lost: [`WakeSlot::wake`] sets the permit, then takes the waker under the
//! lock; [`WakeSlot::poll_woken`] stores its waker under the lock, then takes the permit.
//! If the wake's lock comes second it finds the stored waker; if it comes first, the
//! waiter's lock synchronizes with it and the waiter's second look sees the permit.
//! Model-checked in `loom_models.rs` (`wake_slot_loses_no_wakeup`).

use std::task::{Context, Poll, Waker};

use crate::sync::{AtomicBool, Mutex, Ordering};

pub(crate) struct WakeSlot {
    woken: AtomicBool,
    /// Set when the waiting task's body ended ([`retire`](Self::retire)); beside the
    /// permit, where it costs no byte. (Read by the tokio driver, which the loom models do not
    /// build.)
    #[cfg_attr(tidings_loom, allow(dead_code))]
    retired: AtomicBool,
    /// The waiting task's waker, if it waits.
    waker: Mutex<Option<Waker>>,
}

impl WakeSlot {
    pub(crate) fn new() -> Self {
        Self {
            woken: AtomicBool::new(false),
            retired: AtomicBool::new(false),
            waker: Mutex::new(None),
        }
    }

    /// Leave a permit and wake the task if it waits. A wake that finds a permit already
    /// there does nothing more (a wake storm costs one swap each): whoever left it did so
    /// after the task's last look, and takes the waker.
    ///
    /// The permit is set by a read-modify-write, like every other change to it: loom
    /// mis-models a plain store racing a swap (see the pool's mailbox), and one kind of
    /// access keeps the model exact.
    pub(crate) fn wake(&self) {
        if self.woken.swap(true, Ordering::AcqRel) {
            return;
        }
        let waker = self.waker.lock().take();
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Ready once a permit is there (taking it); otherwise the task's waker is stored and
    /// the next [`wake`](Self::wake) wakes it.
    pub(crate) fn poll_woken(&self, cx: &Context<'_>) -> Poll<()> {
        if self.woken.swap(false, Ordering::AcqRel) {
            return Poll::Ready(());
        }
        {
            let mut waker = self.waker.lock();
            match &mut *waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                w => *w = Some(cx.waker().clone()),
            }
        }
        if self.woken.swap(false, Ordering::AcqRel) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Wait for a permit. The future is one reference.
    #[cfg(feature = "tokio")]
    pub(crate) fn woken(&self) -> impl std::future::Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| self.poll_woken(cx))
    }

    /// The task's body ended: forget its stored waker (so it does not keep the task's
    /// memory) and mark the slot retired.
    #[cfg(feature = "tokio")]
    pub(crate) fn retire(&self) {
        drop(self.waker.lock().take());
        self.retired.store(true, Ordering::Release);
    }

    /// True once [`retire`](Self::retire) was called.
    #[cfg(feature = "tokio")]
    pub(crate) fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }
}

#[cfg(all(test, feature = "tokio", not(tidings_loom)))]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use super::*;

    // R-EXE-1: a permit left before the task waits is not lost; many wakes leave one permit.
    #[test]
    fn a_wake_before_the_wait_is_kept_and_wakes_collapse() {
        let rt = ::tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let slot = WakeSlot::new();
            for _ in 0..3 {
                slot.wake();
            }
            ::tokio::time::timeout(Duration::from_secs(20), slot.woken())
                .await
                .expect("the stored permit completes the wait");
            // The three wakes were one permit: a second wait stays pending.
            assert!(
                ::tokio::time::timeout(Duration::from_millis(20), slot.woken())
                    .await
                    .is_err()
            );
        });
    }

    // R-EXE-1: two threads keep waking one waiting task, each waiting for the task to see
    // its wake before the next: every wake is acknowledged (a lost wake-up leaves a waker
    // waiting for an acknowledgement that never comes, until the bound).
    #[test]
    fn a_task_sees_every_wake_from_racing_threads() {
        use std::sync::atomic::Ordering::SeqCst;
        use std::time::Instant;
        const PER_THREAD: usize = 10_000;
        const THREADS: usize = 2;
        let rt = ::tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        let slot = Arc::new(WakeSlot::new());
        let sent = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(AtomicUsize::new(0));
        let waiter = {
            let (slot, sent, seen) = (slot.clone(), sent.clone(), seen.clone());
            rt.spawn(async move {
                loop {
                    seen.fetch_max(sent.load(SeqCst), SeqCst);
                    if seen.load(SeqCst) >= PER_THREAD * THREADS {
                        return;
                    }
                    slot.woken().await;
                }
            })
        };
        let wakers: Vec<_> = (0..THREADS)
            .map(|_| {
                let (slot, sent, seen) = (slot.clone(), sent.clone(), seen.clone());
                std::thread::spawn(move || {
                    let deadline = Instant::now() + Duration::from_secs(60);
                    for _ in 0..PER_THREAD {
                        let mine = sent.fetch_add(1, SeqCst) + 1;
                        slot.wake();
                        while seen.load(SeqCst) < mine {
                            assert!(Instant::now() < deadline, "wake {mine} was never seen");
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        for w in wakers {
            w.join().expect("every wake was seen");
        }
        rt.block_on(waiter).unwrap();
    }
}
