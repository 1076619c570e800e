//! The state a keyed group's gate, cursor and round task share, and its lock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tidings::Message;

use super::machine::{DeliveryId, Machine};

/// What the gate, the cursor and the round task share (see the [module
/// docs](super#locks)).
pub(crate) struct State {
    pub(crate) machine: Machine,
    /// The allocations the machine tracks, held so that their addresses (the machine's
    /// delivery ids) are not reused meanwhile.
    pub(crate) held: HashMap<DeliveryId, Arc<Message>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
