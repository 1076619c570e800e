//! The transport seam: what a broker needs from something that carries buffered publishes
//! between processes (the counterpart, for buffered subscriptions, of
//! [`DurableBackend`](crate::durable::DurableBackend) for durable ones).
//!
//! - [`Transport::publish`] sends one message to every subscriber of its topic, anywhere;
//! - [`Transport::subscribe`] starts receiving the messages whose topic may match a
//!   pattern and hands each ([`Received`]) to a [`Deliver`] callback the broker provides;
//! - [`TransportSubscription`] stops that when closed or dropped.
//!
//! # Threads
//! `publish` and `subscribe` are synchronous and may block for at most the transport's
//! stated timeout; the broker never holds a lock of its own while calling them. A
//! transport calls [`Deliver::deliver`] from a thread of its own (never the publisher's);
//! delivering never blocks (see the [module docs](super) on backpressure), so it may be
//! called on an async runtime's worker.

use std::fmt;
use std::sync::Arc;

use crate::error::TransportError;
use crate::message::Message;
use crate::topic::{Pattern, Topic};

use super::ConnectionId;

/// Carries a broker's buffered publishes to buffered subscriptions, across processes.
/// One transport serves one broker at a time.
///
/// # Closing
/// [`Broker::close`](crate::Broker::close) closes every subscription, then calls
/// [`Transport::close`].
pub trait Transport: Send + Sync + fmt::Debug + 'static {
    /// A short name used in errors: `"nats"`.
    fn name(&self) -> &'static str;

    /// Send `message` to every subscriber whose pattern matches its topic. Returns once the
    /// message is handed to the transport; it does not wait for delivery.
    ///
    /// # Errors
    /// [`TransportError::Unavailable`] when it cannot be sent now (not connected, or no
    /// progress within the transport's stated timeout), [`TransportError::Refused`] when the
    /// transport will not carry it: the publish fails and nothing was sent.
    fn publish(&self, message: &Message) -> Result<(), TransportError>;

    /// Start receiving every message whose topic matches `pattern` (a superset is fine:
    /// the broker re-checks), handing each to `deliver`, in the order received. The
    /// subscription is in place when this returns: a message published afterwards, by any
    /// process on the transport, reaches it (unless lost, as the transport may lose it).
    ///
    /// # Errors
    /// [`TransportError::Unavailable`] or [`TransportError::Refused`]; nothing is received.
    fn subscribe(
        &self,
        pattern: &Pattern,
        deliver: Deliver,
    ) -> Result<Box<dyn TransportSubscription>, TransportError>;

    /// [`subscribe`](Self::subscribe) for the broker's reply inbox: the replies to the
    /// requests this transport [publishes](Self::publish). A transport that receives
    /// other messages on a connection of its own (away from bytes others write) keeps this
    /// one on the connection it publishes on, where its engine reports a request that
    /// reached nobody (a NATS server tells only the publishing connection, and only when
    /// it holds the reply subscription). Default: `subscribe`.
    ///
    /// # Errors
    /// As [`subscribe`](Self::subscribe).
    fn subscribe_replies(
        &self,
        pattern: &Pattern,
        deliver: Deliver,
    ) -> Result<Box<dyn TransportSubscription>, TransportError> {
        self.subscribe(pattern, deliver)
    }

    /// The connection this transport sends and receives on, when a durable backend may be
    /// built from the same one and publish its appends there too (see
    /// [`DurableBackend::appends_published_on`](crate::durable::DurableBackend::appends_published_on)).
    /// Default: `None`, no such connection.
    fn connection(&self) -> Option<ConnectionId> {
        None
    }

    /// The broker closed: release connections and threads. Default: nothing.
    fn close(&self) {}
}

/// One pattern's stream of received messages. Closing (or dropping) it stops delivery:
/// after `close` returns, [`Deliver::deliver`] is not called again for it. Idempotent.
pub trait TransportSubscription: Send + Sync {
    /// Stop receiving.
    fn close(&self);
}

/// What a transport hands to a subscription.
// Nearly every value is the large variant, moved once and unwrapped at once: boxing it
// would add an allocation per received message to save none.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Received {
    /// A message published (by any broker on the transport) to a topic the subscription's
    /// pattern may match.
    Message(Message),
    /// A message published with this reply-to topic reached no subscriber at all (NATS's
    /// no-responders status). The broker fails the request waiting on that topic with
    /// [`RequestError::NoResponders`](crate::RequestError::NoResponders); elsewhere it is
    /// ignored.
    NoResponders {
        /// The reply-to topic of the message that reached nobody.
        reply_to: Topic,
    },
}

/// What became of one received message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Delivered {
    /// Offered to the subscription (accepted, or refused and counted by it).
    Offered,
    /// Its topic does not match the subscription's pattern (the transport's filter was a
    /// superset); the subscription never saw it.
    NotMatching,
    /// The subscription is gone; stop delivering.
    Closed,
}

/// The broker's side of one transport subscription: called by the transport with each
/// received message, in the order received. Cheap to clone; never blocks; callable from
/// any thread.
#[derive(Clone)]
pub struct Deliver(Arc<dyn Fn(Received) -> Delivered + Send + Sync>);

impl Deliver {
    /// A callback running `f`.
    pub fn new(f: impl Fn(Received) -> Delivered + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// Hand one received message (or status) to the subscription.
    pub fn deliver(&self, received: Received) -> Delivered {
        (self.0)(received)
    }
}

impl fmt::Debug for Deliver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Deliver")
    }
}
