//! Durable streams and durable subscriptions, independent of where messages are kept
//! (SPEC §8, R-BP-2).
//!
//! A **stream** captures every published message whose topic matches one of its patterns:
//! `publish` appends the message once to each matching stream *before* offering it to
//! buffered subscriptions. A **durable subscription** is an ordinary subscription (same
//! core, dispatcher, driver, retry, DLQ, TTL, lanes, counters) that is not in the topic
//! router: a feeder moves messages from its cursor into its queue.
//!
//! # Who owns what
//! - [`source`] is the seam a backend implements: [`DurableBackend`], [`BackendStream`],
//!   [`BackendCursor`]. A backend owns what must outlive the process: stored messages,
//!   committed positions, the durable DLQ, durable dedup stores. Two exist: the embedded
//!   log ([`crate::embedded`], built by
//!   [`BrokerBuilder::data_dir`](crate::BrokerBuilder::data_dir)) and NATS JetStream
//!   (crate `tidings-jetstream`), plugged in with
//!   [`BrokerBuilder::durable_backend`](crate::BrokerBuilder::durable_backend).
//! - This module owns what the broker needs around any backend: the registry of open
//!   streams and durable subscriptions (`registry`), the feeder that moves messages from a
//!   cursor to a subscription and finished messages back (`feeder`, run by the driver), the
//!   user's handles ([`Stream`], [`DurableSubscription`]), the retention timer
//!   (`retention`), configuration ([`StreamConfig`], [`StartAt`]) and errors
//!   ([`StreamError`], [`CommitFailed`]). It talks to the backend only through the seam's
//!   traits, and to the subscription and the broker only through the narrow `FeedSink`
//!   the broker injects.
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

mod config;
pub(crate) mod feeder;
pub(crate) mod registry;
mod retention;
pub mod source;
mod stream;
mod subscription;

pub use crate::error::{CommitFailed, StreamError, StreamErrorKind};
pub use config::{StartAt, StreamConfig};
pub(crate) use registry::{Durables, check_name};
pub use source::{
    BackendCursor, BackendStream, Capabilities, CursorSpec, CursorState, CursorWaker,
    DurableBackend, DurableDeadLetter, Finished, Outcome, StorageInfo,
};
pub use stream::Stream;
pub use subscription::DurableSubscription;
