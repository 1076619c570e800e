//! [`NatsConnection`]: the one connection to a NATS server that the JetStream backend and the
//! NATS transport are built from.
//!
//! A broker with both sends a message captured by a durable stream once: the JetStream
//! append, a NATS publish that the transport's subscribers receive. That holds only when
//! both talk to the same server, so both are built from one connection
//! ([`JetStreamBackend::new`](crate::JetStreamBackend::new),
//! [`NatsTransport::new`](crate::NatsTransport::new)), and each reports the connection's
//! [`ConnectionId`]: the broker compares the two and refuses to build when they differ.
//!
//! # Two connections
//! What others wrote reaches the backend over a second connection with the same options
//! (durable consumers' deliveries, the cursors' wake-up subscriptions), opened on first
//! use: a record whose header block the client library cannot parse costs that one a
//! reconnect, never the publishes and requests of the first (see [`connect`]'s docs). A
//! server counting connections sees two per `NatsConnection` that has durable
//! subscriptions.
//!
//! # Threads
//! async-nats runs on a current-thread tokio runtime on a thread the connection owns
//! ([`runtime`]); the backend and the transport hand their work to it. The thread stops,
//! and the connection closes, when the last clone of the connection and the last backend
//! and transport built from it are dropped.

pub(crate) mod connect;
pub(crate) mod runtime;
pub(crate) mod version;

use std::fmt;
use std::sync::Arc;

use tidings::transport::ConnectionId;

use crate::error::ConnectError;
use connect::{ConnectOptions, JetStream, ServerVersion};
use runtime::Runtime;

struct Shared {
    rt: Runtime,
    js: JetStream,
    id: ConnectionId,
}

/// One connection to a NATS server with JetStream, on a runtime thread of its own: build a
/// [`JetStreamBackend`](crate::JetStreamBackend) and a [`NatsTransport`](crate::NatsTransport)
/// from it, and a broker with both sends each message once: both report this connection's
/// [`ConnectionId`], and a broker refuses a backend and a transport whose ids differ.
///
/// Cheap to clone: clones share the connection.
///
/// ```no_run
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use tidings::Broker;
/// use tidings_jetstream::{ConnectOptions, JetStreamBackend, NatsConnection, NatsTransport};
/// let conn = NatsConnection::connect(ConnectOptions::new("nats://127.0.0.1:4222"))?;
/// let broker = Broker::builder()
///     .durable_backend(Arc::new(JetStreamBackend::new(&conn)))
///     .transport(Arc::new(NatsTransport::new(&conn)))
///     .build()?;
/// # let _ = broker; Ok(()) }
/// ```
#[derive(Clone)]
pub struct NatsConnection {
    shared: Arc<Shared>,
}

impl fmt::Debug for NatsConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsConnection")
            .field("id", &self.shared.id)
            .field("server_version", &self.shared.js.server_version())
            .finish_non_exhaustive()
    }
}

impl NatsConnection {
    /// Starts the connection's runtime thread and connects on it with `options`: checks
    /// the server's version and that JetStream is available to this account.
    ///
    /// Returns within the connect timeout plus one request timeout.
    ///
    /// **Waits:** on the network: at most the connect timeout plus one request timeout (the
    /// JetStream check).
    ///
    /// # Errors
    /// What [`ConnectOptions::connect`] reports, or [`ConnectError::Runtime`] when the
    /// runtime thread could not be started.
    pub fn connect(options: ConnectOptions) -> Result<Self, ConnectError> {
        let (rt, js) = Runtime::start_connected("tidings-nats", options)?;
        Ok(Self {
            shared: Arc::new(Shared {
                rt,
                js,
                id: ConnectionId::new(),
            }),
        })
    }

    /// This connection's identity, which the backend and the transport built from it
    /// report to the broker.
    ///
    /// **Waits:** never.
    #[must_use]
    pub fn id(&self) -> ConnectionId {
        self.shared.id
    }

    /// The version the server reported at connect.
    ///
    /// **Waits:** never.
    #[must_use]
    pub fn server_version(&self) -> ServerVersion {
        self.shared.js.server_version()
    }

    /// Whether the client is connected right now (it reconnects by itself after a loss).
    /// A connection that went silent (half-open) counts as connected until the client's
    /// pings notice it: at most three [ping intervals](ConnectOptions::ping_interval) after
    /// the last byte the server sent (15 s by default).
    ///
    /// **Waits:** never.
    #[must_use]
    pub fn is_connected(&self) -> bool {
        self.shared.js.is_connected()
    }

    /// The runtime thread async-nats runs on.
    pub(crate) fn runtime(&self) -> &Runtime {
        &self.shared.rt
    }

    /// The async client handle.
    pub(crate) fn jetstream(&self) -> &JetStream {
        &self.shared.js
    }
}
