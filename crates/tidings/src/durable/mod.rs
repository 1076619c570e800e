//! The durable-source seam, for durable backend implementors: what durable streams and
//! durable subscriptions need from the place messages are kept (SPEC §8, R-BP-2).
//! Applications use the types at the crate root ([`Stream`], [`DurableSubscription`],
//! [`DurableSpec`], [`StreamConfig`], [`StartAt`], [`StreamError`], …); a backend implements
//! the traits here and uses those root types too.
//!
//! A **stream** captures every published message whose topic matches one of its patterns:
//! `publish` appends the message once to each matching stream *before* offering it to
//! buffered subscriptions. A **durable subscription** is an ordinary subscription (same
//! core, dispatcher, driver, retry, DLQ, TTL, lanes, counters) that is not in the topic
//! router: a feeder moves messages from its cursor into its queue.
//!
//! # Who owns what
//! - The seam is what a backend implements: [`DurableBackend`] opens streams (and,
//!   optionally, durable dedup stores), [`BackendStream`] appends what the broker publishes
//!   and opens cursors, [`BackendCursor`] is one durable subscription's position (it hands
//!   out messages, records the ones that [`Finished`], moves on seek, reports lag and keeps
//!   the durable DLQ). A backend owns what must outlive the process: stored messages,
//!   committed positions, the durable DLQ, durable dedup stores. Two exist: the embedded
//!   log ([`crate::embedded`], built by
//!   [`BrokerBuilder::data_dir`](crate::BrokerBuilder::data_dir)) and NATS JetStream
//!   (crate `tidings-jetstream`), plugged in with
//!   [`BrokerBuilder::durable_backend`](crate::BrokerBuilder::durable_backend). The
//!   conformance suite in `tidings-testkit` runs the same durable cases against each.
//! - The broker owns what it needs around any backend: the registry of open streams and
//!   durable subscriptions, the feeder that moves messages from a cursor to a subscription
//!   and finished messages back (run by the driver), the user's handles ([`Stream`],
//!   [`DurableSubscription`]), the retention timer, configuration ([`StreamConfig`],
//!   [`StartAt`], [`DurableSpec`]) and errors ([`StreamError`], [`CommitFailed`]). It talks
//!   to the backend only through the seam's traits, and to the subscription and the broker
//!   only through a narrow sink the broker injects.
//!
//! # Threads
//! Every method of the seam may block on file or network I/O. The broker never calls them
//! on an async runtime's worker thread: under the tokio driver the feeder runs on the
//! blocking pool and completions reached on a runtime worker are handed to the feeder's
//! next step. A cursor signals "there may be more to fetch" through the [`CursorWaker`] it
//! was opened with; waking is cheap and never blocks, so it may be called from any thread,
//! under any lock.
//!
//! # Capabilities
//! An option a backend cannot honour ([`Capabilities`]) is refused when it is asked for,
//! with [`StreamError::Unsupported`] naming the option and the backend. The neutral
//! [`StreamConfig`] holds only what every backend honours or refuses; a backend's own
//! settings live with it.
//!
//! # Errors
//! Every [`StreamError`] has a [`StreamErrorKind`], the same on every backend, and keeps
//! the backend's own error as its source.
//!
//! # Durable DLQ (R-DEL-4)
//! Each durable subscription has a durable dead-letter store kept by its cursor; it can be
//! listed, drained and redriven; a redrive appends copies reserved for the subscription to
//! the stream before the entries leave the DLQ (loss-safe).
//!
//! # Retention
//! Applied by the backend (the embedded log: after every segment roll; JetStream: by the
//! server) and, for a backend that asks for it
//! ([`BackendStream::retention_interval`]), on a timer by the broker's retention service,
//! so idle streams shed old segments too.

pub(crate) mod config;
pub(crate) mod feeder;
#[cfg(all(test, tidings_loom))]
mod loom_models;
pub(crate) mod registry;
mod retention;
pub(crate) mod source;
pub(crate) mod spec;
pub(crate) mod stream;
pub(crate) mod subscription;

// What applications name is re-exported at the crate root (and only there); these
// imports are the crate's own shorthand.
pub(crate) use crate::error::{CommitFailed, StreamError, StreamErrorKind};
pub(crate) use config::{StartAt, StreamConfig};
pub(crate) use registry::Durables;
pub(crate) use source::{CursorState, DurableDeadLetter, StorageInfo};
pub(crate) use spec::DurableSpec;
pub(crate) use stream::Stream;
pub(crate) use subscription::DurableSubscription;

// The seam a backend implements: reachable here only.
pub use registry::check_name;

/// Marks `message` as handed out under `fence` (a keyed group's partition and lease term,
/// R-DIST-8): a backend that splits keys across processes sets it on every delivery it
/// hands out, so [`Message::fence`](crate::Message::fence) lets an effect refuse a stale owner.
pub fn set_fence(message: &mut crate::Message, fence: crate::Fence) {
    message.fence = Some(Box::new(fence));
}
pub use source::{
    AppendFuture, Appended, BackendCursor, BackendStream, Capabilities, CursorSpec, CursorWaker,
    DurableBackend, Finished, Outcome, StartGate,
};
