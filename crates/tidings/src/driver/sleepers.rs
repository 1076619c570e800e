//! Slot tasks asleep until a wake-up: the tokio driver's wait for a retry's due time.
//!
//! A wake that finds a slot's task alive (its `scheduled` flag already set) has nothing to
//! do unless that task sleeps: a task that runs polls the subscription again anyway. So the
//! waker's side is one read-modify-write of the slot's sleep flags
//! ([`RunFlags::leave_wakeup`]), and only when it finds the task asleep does it take the
//! task's waker from the [`Sleepers`] map, whose size follows the sleeping tasks: a publisher
//! offering into a busy slot takes no driver-wide lock.
//!
//! # The handshake
//! The task registers its waker first, then sets `SLEEPING` ([`RunFlags::fall_asleep`]);
//! the waker makes its change, then sets `WOKEN`. Both are read-modify-writes of one
//! atomic, so one comes first: either the task finds `WOKEN` (it takes it and polls again,
//! seeing the change), or the waker finds `SLEEPING` and the registered waker (and wakes
//! it). No wake-up is lost (model-checked: `a_sleeping_slot_task_loses_no_wakeup`).
//!
//! A waker may take a registration the task no longer needs, or `WOKEN` may stay set after
//! the task stopped sleeping; both cost the task one more poll, never a lost wake-up.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::subscription::run_flags::RunFlags;
use crate::sync::Mutex;

/// A slot: its subscription's address (stable while the slot's task holds the
/// subscription) and the slot's index.
pub(crate) type SlotKey = (usize, usize);

// Only the tokio driver names its slots by this key.
#[cfg(feature = "tokio")]
pub(crate) fn key_of(
    sub: &crate::subscription::shell::SubscriptionShell,
    worker: usize,
) -> SlotKey {
    (std::ptr::from_ref(sub) as usize, worker)
}

/// The wakers of the slot tasks that sleep now, by slot.
#[derive(Default)]
pub(crate) struct Sleepers {
    wakers: Mutex<HashMap<SlotKey, Waker>>,
}

impl Sleepers {
    /// A waker's side, after its change is made: the slot's task, if it sleeps, is woken.
    pub(crate) fn wake(&self, flags: &RunFlags, key: SlotKey) {
        if flags.leave_wakeup() {
            let waker = self.wakers.lock().remove(&key);
            if let Some(w) = waker {
                w.wake();
            }
        }
    }

    /// The task's side: a future ready at the next wake-up (at once when one was left
    /// since the task last took one).
    ///
    /// # Cancel safety
    /// Dropping it (a timer won the race) takes the task's registration back.
    pub(crate) fn woken<'a>(&'a self, flags: &'a RunFlags, key: SlotKey) -> Woken<'a> {
        Woken {
            sleepers: self,
            flags,
            key,
            registered: false,
        }
    }

    fn forget(&self, key: SlotKey) {
        let mut wakers = self.wakers.lock();
        wakers.remove(&key);
        // Give back the room a burst of sleepers took (once it is mostly unused, so steady
        // churn does not reallocate).
        let (len, cap) = (wakers.len(), wakers.capacity());
        if cap > 64 && len * 4 < cap {
            wakers.shrink_to(len * 2);
        }
    }
}

/// See [`Sleepers::woken`].
pub(crate) struct Woken<'a> {
    sleepers: &'a Sleepers,
    flags: &'a RunFlags,
    key: SlotKey,
    registered: bool,
}

impl Woken<'_> {
    fn finish(&mut self) {
        if std::mem::take(&mut self.registered) {
            self.flags.stop_sleeping();
            self.sleepers.forget(self.key);
        }
    }
}

impl Future for Woken<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        // Register (again: a waker that woke us took the registration) before going to
        // sleep, so a waker that finds us asleep finds the waker.
        this.sleepers
            .wakers
            .lock()
            .insert(this.key, cx.waker().clone());
        this.registered = true;
        if this.flags.fall_asleep() {
            this.finish();
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl Drop for Woken<'_> {
    fn drop(&mut self) {
        self.finish();
    }
}
