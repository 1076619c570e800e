//! The publishers' fast path into a single-dispatcher subscription.
//!
//! A publisher offering to a subscription would otherwise take the core's lock for every
//! message, while the dispatcher takes the same lock for every delivery: two threads
//! trading one lock per message, and the hand-off (and the futex waits it provokes when
//! they collide) costs more than the work. The ingress is a second, small buffer in front
//! of the core: when the core has *room reserved* for it, a publisher appends to the
//! ingress under the ingress's own lock and never touches the core's; the dispatcher moves
//! the whole ingress into the core in one swap.
//!
//! # Why this changes nothing observable
//! * **Room.** [`Ingress::room`] is set only while the core's lock is held, to the room
//!   the core has left minus what the ingress already holds, and a fast offer takes one
//!   unit of it. So the core plus the ingress never hold more than the capacity, and the
//!   fast path never accepts a message the core would have refused: a full ingress sends
//!   the publisher down the slow path, where the overflow policy (`Reject`, `DropOldest`,
//!   `Block`) decides exactly as before.
//! * **Counters and order.** Every operation that reads or changes the core (poll, offer
//!   on the slow path, stats, close, drain) moves the ingress into the core first, so it
//!   sees every message offered so far, in offer order. The counters of a fast offer
//!   (offered, accepted, queued) are booked when it is moved; nothing can read them
//!   before.
//! * **Priority.** Only default-priority messages take the fast path, and the dispatcher
//!   moves the ingress in before a poll whenever the core is empty or holds a message of a
//!   lower priority than the default: the next message it picks is the one it would have
//!   picked had every offer gone to the core directly.
//! * **Wake-ups.** [`Ingress::idle`] is set by the dispatcher, under the ingress lock, only
//!   when it found both the core and the ingress empty; a fast offer that clears it wakes
//!   the dispatcher (taking the core's lock first, see the shell, so the wake cannot fall
//!   between the dispatcher's last look and its wait).
//! * **Close and drain.** They clear [`Ingress::open`] under the core's lock, after moving
//!   the ingress in: later offers take the slow path and are refused as before.

use crate::queue::Queued;
use crate::sync::Mutex;

/// The fast path's state; see the module docs. Locked only briefly, never while waiting.
#[derive(Debug, Default)]
pub(crate) struct IngressState {
    /// Offered and accepted, not yet in the core, in offer order.
    pub(crate) items: Vec<Queued>,
    /// How many more messages the fast path may take before the core must be consulted
    /// (32 bits keep the state in half a cache line; see [`room_for`]).
    pub(crate) room: u32,
    /// The subscription takes fast offers at all (open, one dispatcher slot).
    pub(crate) open: bool,
    /// The dispatcher found nothing to do and waits for a wake.
    pub(crate) idle: bool,
}

/// The room to reserve when the core has `free` places left: all of it, up to `u32::MAX`.
/// Reserving less than the core could take is always safe: an offer that finds no room
/// goes through the core, which decides it and reserves again.
pub(crate) fn room_for(free: usize) -> u32 {
    u32::try_from(free).unwrap_or(u32::MAX)
}

/// The buffer itself (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Ingress {
    state: Mutex<IngressState>,
}

impl Ingress {
    /// Append `item` if room is reserved for it: `Some(wake)` when taken (`wake`: the
    /// dispatcher was idle and must be woken), `None` when the offer must go through the
    /// core (no room reserved, closed, or a subscription without a fast path).
    pub(crate) fn offer(&self, item: Queued) -> Option<bool> {
        let mut s = self.state.lock();
        if !s.open || s.room == 0 {
            return None;
        }
        s.room -= 1;
        s.items.push(item);
        Some(std::mem::take(&mut s.idle))
    }

    /// Lock the state (the shell, with the core's lock held).
    pub(crate) fn lock(&self) -> crate::sync::MutexGuard<'_, IngressState> {
        self.state.lock()
    }
}
