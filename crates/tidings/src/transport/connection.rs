//! [`ConnectionId`]: how a broker knows that its transport and its durable backend share one
//! network connection, without comparing names.

use std::sync::atomic::{AtomicU64, Ordering};

/// The identity of one network connection that a [`Transport`](super::Transport) and a
/// [`DurableBackend`](crate::durable::DurableBackend) may both be built from (a NATS
/// connection, say: a JetStream append is a NATS publish, so the transport's subscribers
/// receive it already).
///
/// Each [`ConnectionId::new`] is different from every other one in the process; copies are
/// equal. A connection makes one when it is established and hands it to everything built
/// from it, so equal ids mean one connection, by construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectionId(u64);

impl ConnectionId {
    /// A new identity, equal to no other made before or after in this process.
    #[must_use]
    #[allow(clippy::new_without_default)] // a default would suggest a shared value
    pub fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::ConnectionId;

    #[test]
    fn every_new_id_is_different_and_copies_are_equal() {
        let (a, b) = (ConnectionId::new(), ConnectionId::new());
        assert_ne!(a, b);
        let c = a;
        assert_eq!(a, c);
    }
}
