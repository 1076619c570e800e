//! Operating a running broker: the snapshot (R-OPS-1), dead-letter actions, metrics
//! (R-OPS-2, feature `metrics`) and trace spans (R-OPS-3).
//!
//! # Snapshot
//! [`Broker::snapshot`](crate::Broker::snapshot) returns, in one call, every live
//! subscription with its options, counters, depth by priority, in-flight count, oldest age,
//! dead-letter queue by reason and, for durable ones, its stream position, committed
//! offset and lag; and every open stream with its offsets, bytes, segments and retention.
//! Every type here is `serde`-serializable so an admin endpoint can return it as is.
//!
//! # Actions
//! [`Broker::dead_letter_page`](crate::Broker::dead_letter_page),
//! [`Broker::redrive_dead_letters`](crate::Broker::redrive_dead_letters),
//! [`Broker::purge_dead_letters`](crate::Broker::purge_dead_letters) and
//! [`Broker::seek_subscription`](crate::Broker::seek_subscription) address a subscription
//! by its numeric id, as the admin API does. Redrive is loss-safe: an entry leaves the DLQ
//! only as it is re-offered, and an entry whose re-offer was refused for any reason that
//! does not dead-letter it again goes back into the DLQ.
//!
//! # Metrics
//! With the `metrics` feature, [`Broker::export_metrics`](crate::Broker::export_metrics)
//! writes the snapshot's values to the installed `metrics` recorder; the processing-time
//! histogram is recorded per handler call. See the `metrics` module (feature `metrics`) for the names.
//!
//! # Traces
//! Publish and process run in `tracing` spans; see [`trace`].

pub(crate) mod actions;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
pub(crate) mod snapshot;
pub use crate::telemetry::trace;

pub use actions::{
    DeadLetterEntry, DeadLetterError, DeadLetterPage, MAX_PAGE_SIZE, PAYLOAD_PREVIEW_BYTES,
    PageError, RedriveOutcome, RedriveSelection, SeekError,
};
pub use snapshot::{
    BrokerSnapshot, Counters, DeadLetterSummary, DurableSnapshot, OptionsSummary, StreamSnapshot,
    SubscriptionKind, SubscriptionSnapshot,
};
