//! Subscriptions: the sans-IO core, its dispatch flavors, the shell drivers run, and the
//! user's handle.

pub(crate) mod core;
#[cfg(test)]
mod core_tests;
mod effects;
pub(crate) mod handle;
mod ingress;
mod lanes;
mod ledger;
#[cfg(all(test, tidings_loom))]
pub(crate) mod loom_models;
mod per_key;
pub(crate) mod run_flags;
pub(crate) mod shell;
pub(crate) mod slots;

pub use self::core::Refusal;
// The durable seam's report of a finished message (re-exported by `crate::durable`).
pub use effects::{Finished, Outcome, StartGate};
pub use handle::{Subscription, SubscriptionId};
