//! The run flags of one dispatcher slot, kept in the subscription itself.
//!
//! A driver that runs slots on shared workers (the pool) or in tasks spawned on demand (the
//! tokio driver) must queue or spawn a slot only once however many wakes arrive, and never
//! let two workers inside it. It needs two flags per slot for that. They live in the
//! subscription's shell — slot 0's in what was padding beside the shell's own flags, the
//! others in one thin box for a multi-slot subscription — so an idle subscription holds no
//! driver allocation of its own for them (the pool's 64-byte per-subscription mailbox, the
//! tokio driver's 64-byte slot record). The thread and manual drivers never
//! touch them.

#[cfg(any(feature = "tokio", all(test, tidings_loom)))]
use crate::sync::Ordering;
use crate::sync::{AtomicBool, AtomicU8};

use super::slots::BoxedVec;

/// One dispatcher slot's run flags; what they mean is the driver's protocol (see the pool
/// driver, which documents and model-checks it, and the tokio driver, which follows it).
#[derive(Default)]
pub(crate) struct RunFlags {
    /// Set while the slot is queued or running: only the waker that sets it queues it (or
    /// spawns its task).
    pub(crate) scheduled: AtomicBool,
    /// Set while a worker (or task) runs the slot (max active == 1 per slot).
    pub(crate) running: AtomicBool,
    /// The tokio driver's sleep handshake ([`WOKEN`], [`SLEEPING`]) between a slot task
    /// waiting for a retry's due time and the wakes that must reach it (see
    /// `driver::sleepers`). One atomic, so the two sides are ordered by its read-modify-
    /// writes alone. Also whether the slot's task is in a handler call ([`IN_HANDLER`]),
    /// in the same byte so that the flags of slot 0 still fit where they do.
    #[cfg_attr(not(any(feature = "tokio", all(test, tidings_loom))), allow(dead_code))]
    sleep: AtomicU8,
}

#[cfg(any(feature = "tokio", all(test, tidings_loom)))]
/// A wake-up came since the slot's task last took one: it must poll again before it sleeps.
const WOKEN: u8 = 1;
#[cfg(any(feature = "tokio", all(test, tidings_loom)))]
/// The slot's task sleeps with its waker registered: a wake-up must also wake it.
const SLEEPING: u8 = 2;
#[cfg(feature = "tokio")]
/// The slot's task is in a handler call: from the poll that handed the delivery out (under
/// the subscription's lock) to its completion.
const IN_HANDLER: u8 = 4;

/// The run flags of every slot but the first (see the module docs): `None` for a
/// single-slot subscription, so it pays one pointer.
pub(crate) struct OtherRunFlags(Option<BoxedVec<RunFlags>>);

impl OtherRunFlags {
    /// Flags for slots `1..workers`.
    pub(crate) fn new(workers: usize) -> Self {
        Self((workers > 1).then(|| Box::new((1..workers).map(|_| RunFlags::default()).collect())))
    }

    /// Slot `worker ≥ 1`'s flags, `None` past the last slot.
    pub(crate) fn get(&self, worker: usize) -> Option<&RunFlags> {
        self.0.as_ref()?.get(worker.checked_sub(1)?)
    }
}

impl RunFlags {
    /// The tokio driver's slot task goes idle and ends: called with the subscription's lock
    /// held, right after a poll that announced the slot idle, so an offer after it finds the
    /// slot idle and schedules it again (a new task) — no wake-up is lost. `running` is
    /// cleared first, so the task the cleared `scheduled` lets in finds it clear. A
    /// read-modify-write clears `scheduled`, like every other change to it (see the pool's
    /// `Mailbox::leave`: loom mis-models a plain store racing a swap).
    #[cfg(any(feature = "tokio", all(test, tidings_loom)))]
    pub(crate) fn leave(&self) {
        self.running.store(false, Ordering::Release);
        let was = self.scheduled.swap(false, Ordering::AcqRel);
        debug_assert!(was, "a running slot is scheduled");
    }
}

/// The sleep handshake (the tokio driver's, see `driver::sleepers`).
#[cfg(any(feature = "tokio", all(test, tidings_loom)))]
impl RunFlags {
    /// A waker's side, after its change is made: leave a wake-up; true when the slot's task
    /// sleeps, so its registered waker must be woken too.
    pub(crate) fn leave_wakeup(&self) -> bool {
        self.sleep.fetch_or(WOKEN, Ordering::AcqRel) & SLEEPING != 0
    }

    /// The task's side, its waker registered: go to sleep, unless a wake-up was left — then
    /// take it and return true (the task polls again, and sees the waker's change).
    pub(crate) fn fall_asleep(&self) -> bool {
        if self.sleep.fetch_or(SLEEPING, Ordering::AcqRel) & WOKEN == 0 {
            return false;
        }
        self.sleep.fetch_and(!(WOKEN | SLEEPING), Ordering::AcqRel);
        true
    }

    /// The task stops sleeping (woken, or its timer fired).
    pub(crate) fn stop_sleeping(&self) {
        self.sleep.fetch_and(!SLEEPING, Ordering::AcqRel);
    }
}

/// Whether the slot's task is in a handler call (the tokio driver's: what a close that
/// cannot wait for the tasks reports as left running). Read-modify-writes, like every other
/// change to the byte the sleep handshake shares.
#[cfg(feature = "tokio")]
impl RunFlags {
    /// A delivery was handed out to the slot's task: called under the subscription's lock,
    /// so a close that took the lock after the poll sees it.
    pub(crate) fn enter_handler(&self) {
        self.sleep.fetch_or(IN_HANDLER, Ordering::AcqRel);
    }

    /// The delivery's outcome was reported.
    pub(crate) fn leave_handler(&self) {
        self.sleep.fetch_and(!IN_HANDLER, Ordering::AcqRel);
    }

    /// True while the slot's task is in a handler call.
    pub(crate) fn in_handler(&self) -> bool {
        self.sleep.load(Ordering::Acquire) & IN_HANDLER != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_others_are_slots_one_to_n() {
        let none = OtherRunFlags::new(1);
        assert!(none.get(1).is_none() && none.get(0).is_none());
        let three = OtherRunFlags::new(3);
        assert!(three.get(0).is_none(), "slot 0 is not among the others");
        assert!(three.get(1).is_some() && three.get(2).is_some());
        assert!(three.get(3).is_none());
        assert_eq!(std::mem::size_of::<OtherRunFlags>(), 8);
    }
}
