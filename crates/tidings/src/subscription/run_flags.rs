//! The run flags of one dispatcher slot, kept in the subscription itself.
//!
//! A driver that runs slots on shared workers (the pool) or in tasks spawned on demand (the
//! tokio driver) must queue or spawn a slot only once however many wakes arrive, and never
//! let two workers inside it. It needs two flags per slot for that. They live in the
//! subscription's shell — slot 0's in what was padding beside the shell's own flags, the
//! others in one thin box for a multi-slot subscription — so an idle subscription holds no
//! driver allocation of its own for them (issue 12: the pool's 64-byte per-subscription
//! mailbox, the tokio driver's 64-byte slot record). The thread and manual drivers never
//! touch them.

use crate::sync::AtomicBool;

use super::slots::ThinVec;

/// One dispatcher slot's run flags; what they mean is the driver's protocol (see the pool
/// driver, which documents and model-checks it, and the tokio driver, which follows it).
#[derive(Default)]
pub(crate) struct RunFlags {
    /// Set while the slot is queued or running: only the waker that sets it queues it (or
    /// spawns its task).
    pub(crate) scheduled: AtomicBool,
    /// Set while a worker (or task) runs the slot (max active == 1 per slot).
    pub(crate) running: AtomicBool,
}

/// The run flags of every slot but the first (see the module docs): `None` for a
/// single-slot subscription, so it pays one pointer.
pub(crate) struct OtherRunFlags(Option<ThinVec<RunFlags>>);

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
        use crate::sync::Ordering;
        self.running.store(false, Ordering::Release);
        let was = self.scheduled.swap(false, Ordering::AcqRel);
        debug_assert!(was, "a running slot is scheduled");
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
