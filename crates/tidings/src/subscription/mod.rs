//! Subscriptions: the sans-IO core, its dispatch flavors, and the shared handle drivers run.

pub(crate) mod core;
pub(crate) mod handle;
mod lanes;
mod ledger;
#[cfg(all(test, tidings_loom))]
pub(crate) mod loom_models;
mod per_key;
pub(crate) mod shared;

pub use self::core::Refusal;
pub use handle::{Subscription, SubscriptionId};
