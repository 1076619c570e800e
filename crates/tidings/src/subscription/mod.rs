//! Subscriptions: the sans-IO core, its dispatch flavors, the shell drivers run, and the
//! user's handle.

pub(crate) mod core;
mod effects;
pub(crate) mod handle;
mod lanes;
mod ledger;
#[cfg(all(test, tidings_loom))]
pub(crate) mod loom_models;
mod per_key;
pub(crate) mod shell;

pub use self::core::Refusal;
pub use handle::{Subscription, SubscriptionId};

/// The shell's former path and name, for the concepts that still import them (the durable
/// streams, the broker, operations, the route cache): they move to [`shell`] and
/// `SubscriptionShell` with the streams' move to the durable seam.
pub(crate) mod shared {
    pub(crate) use super::shell::{
        DLQ_REASON_HEADER, FeedOffer, HandlerKind, RESERVED_HEADER_PREFIX,
        SubscriptionShell as SubShared, without_waiting,
    };
}
