//! The publishers' fast path into a single-dispatcher subscription.
//!
//! A publisher offering to a subscription would otherwise take the core's lock for every
//! message, while the dispatcher takes the same lock for every delivery: two threads
//! trading one lock per message, and the hand-off (and the futex waits it provokes when
//! they collide) costs more than the work. The ingress is a second, small buffer in front
//! of the core: when the core has *room reserved* for it, a publisher appends to the
//! ingress without any lock and never touches the core's; the dispatcher moves the whole
//! ingress into the core under the core's lock.
//!
//! # How
//! One atomic word holds the reserved room, the ring's head and tail, and the `open` and
//! `idle` flags. A publisher takes one unit of room, the next slot (the tail) and the
//! `idle` flag in one compare-and-swap on it, then fills its slot. The slots are a ring of
//! [`SLOTS`], made at the subscription's first offer through the core (an idle
//! subscription has none); the room reserved never exceeds the free slots, so a full ring
//! sends publishers down the slow path, which moves the ring in.
//!
//! # Why this changes nothing observable
//! * **Room.** The room is set only while the core's lock is held, to the room the core
//!   has left minus what the ingress already holds (and at most the free slots), and a
//!   fast offer takes one unit of it. So the core plus the ingress never hold more than
//!   the capacity, and the fast path never accepts a message the core would have refused:
//!   no room sends the publisher down the slow path, where the overflow policy (`Reject`,
//!   `DropOldest`, `Block`) decides exactly as before.
//! * **Counters and order.** Every operation that reads or changes the core (poll, offer
//!   on the slow path, stats, close, drain) moves the ingress into the core first, so it
//!   sees every message offered so far, in offer order (the order of the tail). A move
//!   takes every slot up to the tail it leaves behind, waiting for a publisher that took a
//!   slot and has not filled it yet (it is between two of its own instructions, unless
//!   preempted there): no accepted message is left behind or taken twice. The counters of a
//!   fast offer (offered, accepted, queued) are booked when it is moved; nothing can read
//!   them before.
//! * **Priority.** Only default-priority messages take the fast path, and the dispatcher
//!   moves the ingress in before a poll whenever the core is empty or holds a message of a
//!   lower priority than the default: the next message it picks is the one it would have
//!   picked had every offer gone to the core directly.
//! * **Wake-ups.** `idle` is set by the dispatcher, with the core's lock held, only when it
//!   found both the core and the ingress empty — no slot taken, filled or not — and in the
//!   same compare-and-swap that checks it; a fast offer that takes the flag wakes the
//!   dispatcher (taking the core's lock first, see the shell, so the wake cannot fall
//!   between the dispatcher's last look and its wait).
//! * **Close and drain.** They move the ingress in with no room left (so no offer can take
//!   a slot after it) and clear `open`, under the core's lock: later offers take the slow
//!   path and are refused as before.

use std::sync::{Arc, OnceLock};

use crate::clock::EnqueueStamp;
use crate::message::Message;
use crate::queue::Queued;
use crate::sync::{AtomicCell, AtomicU64, Ordering, thread};

use super::slots::BoxedVec;

/// Slots in a subscription's ring: 16 bytes each, made at its first offer through the
/// core. Two under the model checker, so the models fill the ring and wrap around it.
const SLOTS: usize = if cfg!(tidings_loom) { 2 } else { 64 };

/// The room reserved for fast offers: the state's low 32 bits.
const ROOM: u64 = 0xFFFF_FFFF;
/// Head and tail count slots modulo `1 << INDEX_BITS` (a multiple of [`SLOTS`]).
const INDEX_BITS: u32 = 14;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
const TAIL_SHIFT: u32 = 32;
const HEAD_SHIFT: u32 = TAIL_SHIFT + INDEX_BITS;
/// The subscription takes fast offers at all (open, one dispatcher slot).
const OPEN: u64 = 1 << 62;
/// The dispatcher found nothing to do and waits for a wake.
const IDLE: u64 = 1 << 63;

const _: () = assert!(SLOTS.is_power_of_two() && SLOTS < 1 << INDEX_BITS);

fn tail_of(state: u64) -> u64 {
    (state >> TAIL_SHIFT) & INDEX_MASK
}

fn head_of(state: u64) -> u64 {
    (state >> HEAD_SHIFT) & INDEX_MASK
}

/// Slots taken, filled or not, and not yet moved in.
fn pending(state: u64) -> u64 {
    tail_of(state).wrapping_sub(head_of(state)) & INDEX_MASK
}

/// `state` with this head, tail and room, its flags kept.
fn with(state: u64, head: u64, tail: u64, room: u64) -> u64 {
    (state & (OPEN | IDLE)) | (head << HEAD_SHIFT) | (tail << TAIL_SHIFT) | room
}

fn slot_index(index: u64) -> usize {
    // Below SLOTS after the mask: the cast cannot truncate.
    (index & (SLOTS as u64 - 1)) as usize
}

/// One offer: empty until its publisher fills it, emptied by the move that takes it.
struct Slot {
    message: AtomicCell<Option<Arc<Message>>>,
    enqueued: AtomicCell<EnqueueStamp>,
}

impl Slot {
    fn new() -> Self {
        Self {
            message: AtomicCell::new(None),
            enqueued: AtomicCell::new(EnqueueStamp::EPOCH),
        }
    }

    /// Take the offer of a slot a publisher took, waiting until it is filled.
    fn take_filled(&self) -> Queued {
        let mut spins = 0u32;
        loop {
            // The message is written after the stamp and read before it: reading it
            // (acquire) makes the stamp written with it visible.
            if let Some(message) = self.message.take() {
                return Queued {
                    message,
                    enqueued: self.enqueued.load(),
                };
            }
            if spins < 64 && !cfg!(tidings_loom) {
                spins += 1;
                std::hint::spin_loop();
            } else {
                thread::yield_now();
            }
        }
    }
}

/// The buffer itself (see the module docs).
pub(crate) struct Ingress {
    state: AtomicU64,
    /// Made under the core's lock before any room is reserved, so a publisher that took
    /// room finds it.
    slots: OnceLock<Box<[Slot; SLOTS]>>,
}

impl std::fmt::Debug for Ingress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.load(Ordering::Relaxed);
        f.debug_struct("Ingress")
            .field("room", &(s & ROOM))
            .field("pending", &pending(s))
            .field("open", &(s & OPEN != 0))
            .field("idle", &(s & IDLE != 0))
            .finish_non_exhaustive()
    }
}

impl Ingress {
    /// An ingress with no room reserved yet, taking fast offers once room is reserved if
    /// `open`.
    pub(crate) fn new(open: bool) -> Self {
        Self {
            state: AtomicU64::new(if open { OPEN } else { 0 }),
            slots: OnceLock::new(),
        }
    }

    fn slots(&self) -> &[Slot; SLOTS] {
        // Invariant: room is reserved only once the slots are made (`reserve`).
        self.slots.get().expect("slots made before any room")
    }

    /// Take `message` if room is reserved for it: `Some(wake)` when taken (`wake`: the
    /// dispatcher was idle and must be woken), `None` when the offer must go through the
    /// core (no room reserved, closed, or a subscription without a fast path).
    pub(crate) fn offer(&self, message: &Arc<Message>, enqueued: EnqueueStamp) -> Option<bool> {
        let mut s = self.state.load(Ordering::Relaxed);
        let tail = loop {
            if s & OPEN == 0 || s & ROOM == 0 {
                return None;
            }
            let tail = tail_of(s);
            let next = with(
                s & !IDLE,
                head_of(s),
                (tail + 1) & INDEX_MASK,
                (s & ROOM) - 1,
            );
            // Acquire: the slot was emptied by the move that reserved this room.
            match self
                .state
                .compare_exchange_weak(s, next, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => break tail,
                Err(now) => s = now,
            }
        };
        let slot = &self.slots()[slot_index(tail)];
        slot.enqueued.store(enqueued);
        let old = slot.message.swap(Some(message.clone()));
        debug_assert!(old.is_none(), "a taken slot is empty");
        Some(s & IDLE != 0)
    }

    /// Move every offer taken so far out, in offer order — waiting for any whose
    /// publisher has not filled its slot yet — into a buffer (the `spare` one if any; a
    /// new one otherwise), and reserve room for more: `free` (what the core has left; 0
    /// stops the fast path) less what was moved, at most the ring. `None`: nothing to
    /// move. With the core's lock held.
    pub(crate) fn move_out(
        &self,
        free: usize,
        spare: &mut Option<BoxedVec<Queued>>,
    ) -> Option<BoxedVec<Queued>> {
        let mut s = self.state.load(Ordering::Acquire);
        let mut head = head_of(s);
        let mut moved: Option<BoxedVec<Queued>> = None;
        loop {
            let tail = tail_of(s);
            if head != tail {
                let slots = self.slots();
                let items = moved.get_or_insert_with(|| spare.take().unwrap_or_default());
                while head != tail {
                    items.push(slots[slot_index(head)].take_filled());
                    head = (head + 1) & INDEX_MASK;
                }
            }
            let taken = moved.as_ref().map_or(0, |items| items.len());
            let room = if s & OPEN == 0 || self.slots.get().is_none() {
                0
            } else {
                free.saturating_sub(taken).min(SLOTS) as u64
            };
            let next = with(s, head, tail, room);
            if next == s {
                return moved;
            }
            // Fails only if a publisher took a slot meanwhile: move it too.
            match self
                .state
                .compare_exchange(s, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return moved,
                Err(now) => s = now,
            }
        }
    }

    /// After an offer through the core: make the ring if this is the subscription's first,
    /// and reserve room for fast offers — `free` (what the core has left) less what the
    /// ingress holds, at most its free slots. With the core's lock held.
    pub(crate) fn reserve(&self, free: usize) {
        let mut s = self.state.load(Ordering::Acquire);
        if s & OPEN == 0 || (free == 0 && s & ROOM == 0) {
            return;
        }
        self.slots
            .get_or_init(|| Box::new(std::array::from_fn(|_| Slot::new())));
        loop {
            let held = pending(s);
            let room = (free as u64).saturating_sub(held).min(SLOTS as u64 - held);
            let next = with(s, head_of(s), tail_of(s), room);
            if next == s {
                return;
            }
            match self
                .state
                .compare_exchange(s, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(now) => s = now,
            }
        }
    }

    /// With the core's lock held and the core idle: true when the ingress holds nothing
    /// either (no slot taken, filled or not); then, with `announce`, the next fast offer
    /// wakes the dispatcher. False: move it in and poll again.
    pub(crate) fn is_idle(&self, announce: bool) -> bool {
        let mut s = self.state.load(Ordering::Acquire);
        loop {
            if pending(s) != 0 {
                return false;
            }
            if !announce || s & IDLE != 0 {
                return true;
            }
            // Fails if a publisher took a slot meanwhile (or room changed): look again.
            match self
                .state
                .compare_exchange(s, s | IDLE, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => s = now,
            }
        }
    }

    /// Take no more fast offers (close, drain, a durable subscription); what was taken
    /// stays to be moved in. With the core's lock held.
    pub(crate) fn shut(&self) {
        self.state.fetch_and(!(OPEN | ROOM), Ordering::AcqRel);
    }
}
