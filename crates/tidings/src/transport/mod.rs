//! Where buffered publishes go and where buffered subscriptions receive from.
//!
//! By default a broker is in-process: `publish` offers each message to the matching
//! buffered subscriptions of this broker (the topic router). A broker built with
//! [`BrokerBuilder::transport`](crate::BrokerBuilder::transport) instead sends every
//! buffered publish through a [`Transport`] (NATS core, say: crate `tidings-jetstream`),
//! and each buffered subscription receives through its own [`TransportSubscription`] into
//! its own bounded queue and dispatcher. Everything a subscription does with a message —
//! overflow policy, filters, retry in place, TTL, DLQ, lanes, counters — is unchanged.
//!
//! # Delivery
//! At-most-once across the network when the transport is (NATS core is): a message sent
//! while a subscriber is disconnected, or dropped by the server for a slow consumer, is
//! lost, and nobody is told. Durable subscriptions are the at-least-once path.
//!
//! # Ordering
//! Each subscription receives one publisher's messages in that publisher's order when the
//! transport keeps per-connection order (NATS core does), then orders them priority-first.
//!
//! # Backpressure
//! A remote publisher cannot be made to wait: an offer from the transport never blocks, so
//! [`Overflow::Block`](crate::Overflow) refuses a message into a full queue as `Overflow`
//! (dead-lettered, counted), as the other policies do. The publish report of a broker with a
//! transport counts nobody as `accepted`: delivery happens on receipt, elsewhere.
//!
//! # Matching
//! A transport may receive a superset of the topics a pattern matches (NATS has no
//! zero-word `#`): the broker re-checks every received topic with tidings' own matcher and
//! tells the transport, through [`Delivered::NotMatching`], which it skipped.
//!
//! # Durable streams and the transport
//! A message appended to a durable stream is sent through the transport as well, unless the
//! append already reaches the transport's subscribers (a JetStream append is a NATS publish
//! on the same subject): then it is sent once, by the append. The broker decides that from
//! identities, not names: when the transport's [`Transport::connection`] and the backend's
//! [`DurableBackend::appends_published_on`](crate::durable::DurableBackend::appends_published_on)
//! are the same [`ConnectionId`], both were built from one connection. When both name a
//! connection and they differ, the broker refuses to build (an append would reach another
//! server's subscribers, or this server's twice).
//!
//! # Closing
//! [`Broker::close`](crate::Broker::close) closes every transport subscription (no more
//! offers), then drains as usual, then calls [`Transport::close`].

mod connection;
mod seam;

pub use connection::ConnectionId;
pub use seam::{Deliver, Delivered, Received, Transport, TransportSubscription};
