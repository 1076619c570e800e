//! [`NatsTransport`]: NATS core behind tidings' transport seam
//! ([`tidings::transport::Transport`]), so buffered subscriptions of brokers in different
//! processes receive each other's publishes (R-DIST-1).
//!
//! | seam | NATS core |
//! |---|---|
//! | publish | `PUB` on the subject = topic (with the reply-to topic as reply subject), every other field in `tidings-*` headers (the same mapping as the JetStream backend's records) |
//! | a buffered subscription | one `SUB` per subject of [`filter_subjects`] (the tightest superset of its pattern), re-checked by the broker |
//! | delivery | into the subscription's own bounded queue, never waiting |
//! | request | `PUB` with reply subject `_inbox.<broker nonce>.<correlation id>`, received by the broker's one inbox subscription `_inbox.<nonce>.*`; the server's no-responders status (sent when no subscription exists on the subject) fails the request at once |
//!
//! # Delivery
//! **At-most-once**, as NATS core is: a message published while a subscriber is
//! disconnected, or dropped by the server because the subscriber is a slow consumer, is
//! lost and nobody is told. Use a durable subscription (JetStream) for at-least-once.
//!
//! # Ordering
//! A subscription receives one publishing broker's messages in publish order (one
//! connection per transport; the server keeps per-connection order).
//!
//! # Backpressure
//! Received messages are offered without waiting: a full queue applies its overflow policy
//! at once, and `Overflow::Block` refuses (dead-letters) as `Overflow`, since a remote
//! publisher cannot be made to wait. Refusals are counted by the subscription.
//!
//! # Durable streams on the same broker
//! A JetStream append is published on the stream's own subject namespace
//! (`$TIDINGS.s.<stream>.<topic>`, see [`record_subject`](crate::record_subject)), which no
//! core subscription covers: the backend reports no connection its appends reach
//! ([`DurableBackend::appends_published_on`] is `None`), so a broker with both appends a
//! message its streams capture *and* sends it with a core publish, and every message reaches
//! core subscribers exactly once. Nothing published on a topic is ever stored in a stream.
//! Build the transport and the [`JetStreamBackend`](crate::JetStreamBackend) from one
//! [`NatsConnection`] to share one connection and runtime thread.
//!
//! [`DurableBackend::appends_published_on`]: tidings::durable::DurableBackend::appends_published_on
//!
//! # Failure (R-DIST-5)
//! Publishing while the connection is down fails at once with
//! [`TransportError::Unavailable`]; a publish that makes no progress within the
//! connection's request timeout ([`ConnectOptions::request_timeout`]) plus 200 ms fails
//! with it too. "Down" is as the client knows it: a message handed over after the server
//! died and before the client noticed (usually milliseconds: the socket closes; at worst
//! the client's ping interval) is lost without an error, as NATS core loses it. Subscribing
//! is bounded the same way and fails with the same error. The client reconnects by itself
//! and subscriptions resume when the server returns (what was published meanwhile is
//! lost).
//!
//! # Threads
//! async-nats runs on the current-thread runtime of the [`NatsConnection`]'s thread (the
//! one a JetStream backend built from it uses). Publish hands the message to the client's command channel on
//! the caller's thread when it has room (it never waits there); otherwise, and for
//! subscribe, the work runs on the runtime while the caller waits on a channel, bounded,
//! never nesting `block_on`. Received messages are handed to the broker on that thread.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, ThreadId};
use std::time::{Duration, SystemTime};

use futures_util::{FutureExt, StreamExt};
use tidings::transport::{Deliver, Delivered, Received, Transport, TransportSubscription};
use tidings::{Limits, Message, Pattern, Topic, TransportError};

use tidings::transport::ConnectionId;

use crate::codec::{self, Stored};
use crate::connection::NatsConnection;
use crate::connection::connect::{ConnectOptions, JetStream};
use crate::connection::runtime::Runtime;
use crate::error::ConnectError;
use crate::subject::filter_subjects;

/// Replies to NATS requests arrive on subjects with this prefix: never a tidings message,
/// even for a `#` subscription (tidings' own reply inbox is `_inbox.`, lower case).
const NATS_INBOX_PREFIX: &str = "_INBOX.";

/// The name this transport reports in errors.
pub const TRANSPORT_NAME: &str = "nats";

/// Builds a [`NatsTransport`].
#[derive(Debug, Clone)]
#[must_use]
pub struct NatsTransportBuilder {
    limits: Limits,
}

impl NatsTransportBuilder {
    /// The limits a received message must meet (default [`Limits::default`]): use the
    /// broker's own limits when they are larger. A message over them is dropped and counted
    /// in [`TransportStats::undecodable`].
    ///
    /// **Waits:** never.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The transport on `connection` (share it with a
    /// [`JetStreamBackend`](crate::JetStreamBackend) built from the same one).
    ///
    /// **Waits:** never (it shares the connection's runtime).
    pub fn build(self, connection: &NatsConnection) -> NatsTransport {
        let rt = connection.runtime().clone();
        NatsTransport {
            inner: Arc::new(Inner {
                runtime_thread: rt.thread_id(),
                rt,
                js: connection.jetstream().clone(),
                connection: connection.id(),
                limits: self.limits,
                closed: AtomicBool::new(false),
                counters: Counters::default(),
            }),
        }
    }

    /// Connects with `options` on a connection of the transport's own (no backend can
    /// share it: a broker refuses a JetStream backend alongside).
    ///
    /// **Waits:** on the network: at most the connect timeout plus one request timeout (the
    /// JetStream check).
    ///
    /// # Errors
    /// As [`NatsConnection::connect`] (the server must have JetStream enabled, as for the
    /// backend).
    pub fn connect(self, options: ConnectOptions) -> Result<NatsTransport, ConnectError> {
        Ok(self.build(&NatsConnection::connect(options)?))
    }
}

#[derive(Default)]
struct Counters {
    sent: AtomicU64,
    received: AtomicU64,
    offered: AtomicU64,
    not_matching: AtomicU64,
    undecodable: AtomicU64,
    /// Also a per-transport sequence for the ids of messages from other NATS clients.
    foreign: AtomicU64,
}

struct Inner {
    rt: Runtime,
    runtime_thread: ThreadId,
    js: JetStream,
    connection: ConnectionId,
    limits: Limits,
    closed: AtomicBool,
    counters: Counters,
}

/// What a transport sent and received, as of now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransportStats {
    /// Messages published.
    pub sent: u64,
    /// Messages received, over every subscription (a message matching two subscriptions
    /// counts twice).
    pub received: u64,
    /// Received messages offered to their subscription (accepted or refused by it).
    pub offered: u64,
    /// Received messages whose topic the subscription's pattern does not match (the NATS
    /// filter is a superset for patterns with `#` in the middle), skipped.
    pub not_matching: u64,
    /// Received messages that are not tidings messages (a subject that is not a topic, a
    /// NATS request's reply on `_INBOX.…`, a status, a malformed `tidings-*` header, over
    /// the limits, a redrive copy meant for one durable subscription), skipped.
    pub undecodable: u64,
}

/// NATS core as the way a broker's buffered publishes reach buffered subscriptions in
/// other processes (see the [module docs](self)).
///
/// ```no_run
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use tidings::Broker;
/// use tidings_jetstream::{ConnectOptions, NatsConnection, NatsTransport};
/// let conn = NatsConnection::connect(ConnectOptions::new("nats://127.0.0.1:4222"))?;
/// let transport = NatsTransport::new(&conn);
/// let broker = Broker::builder().transport(Arc::new(transport)).build()?;
/// # let _ = broker; Ok(()) }
/// ```
#[derive(Clone)]
pub struct NatsTransport {
    inner: Arc<Inner>,
}

impl fmt::Debug for NatsTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsTransport")
            .field("server_version", &self.inner.js.server_version())
            .field("closed", &self.inner.closed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

fn unavailable(reason: impl fmt::Display) -> TransportError {
    TransportError::Unavailable {
        transport: TRANSPORT_NAME,
        reason: reason.to_string(),
    }
}

fn refused(reason: impl fmt::Display) -> TransportError {
    TransportError::Refused {
        transport: TRANSPORT_NAME,
        reason: reason.to_string(),
    }
}

const CLOSED: TransportError = TransportError::Closed {
    transport: TRANSPORT_NAME,
};

impl NatsTransport {
    /// A builder with the default limits.
    ///
    /// **Waits:** never.
    pub fn builder() -> NatsTransportBuilder {
        NatsTransportBuilder {
            limits: Limits::default(),
        }
    }

    /// The transport on `connection`, with the default limits.
    ///
    /// **Waits:** never.
    pub fn new(connection: &NatsConnection) -> Self {
        Self::builder().build(connection)
    }

    /// Connects with `options` on a connection of its own, with the default limits.
    ///
    /// **Waits:** on the network: at most the connect timeout plus one request timeout (the
    /// JetStream check).
    ///
    /// # Errors
    /// As [`NatsTransportBuilder::connect`].
    pub fn connect(options: ConnectOptions) -> Result<Self, ConnectError> {
        Self::builder().connect(options)
    }

    /// Whether the connection is up right now (it reconnects by itself after a loss).
    ///
    /// **Waits:** never.
    #[must_use]
    pub fn is_connected(&self) -> bool {
        self.inner.js.is_connected()
    }

    /// Counters of what was sent and received.
    ///
    /// **Waits:** never.
    #[must_use]
    pub fn stats(&self) -> TransportStats {
        let c = &self.inner.counters;
        TransportStats {
            sent: c.sent.load(Ordering::Relaxed),
            received: c.received.load(Ordering::Relaxed),
            offered: c.offered.load(Ordering::Relaxed),
            not_matching: c.not_matching.load(Ordering::Relaxed),
            undecodable: c.undecodable.load(Ordering::Relaxed),
        }
    }

    /// A bound for one step: the request timeout, plus slack for the runtime hop.
    fn bound(&self) -> Duration {
        self.inner.js.request_timeout() + Duration::from_millis(200)
    }

    /// Runs `fut` on the transport's runtime within [`Self::bound`].
    fn call<F, T>(&self, fut: F) -> Result<T, TransportError>
    where
        F: Future<Output = Result<T, TransportError>> + Send + 'static,
        T: Send + 'static,
    {
        let bound = self.bound();
        let timed = async move {
            match tokio::time::timeout(bound, fut).await {
                Ok(r) => r,
                Err(_) => Err(unavailable(format!("no progress within {bound:?}"))),
            }
        };
        self.inner
            .rt
            .call(timed)
            .map_err(|_| unavailable("called on the transport's own thread, or it stopped"))?
    }
}

impl Transport for NatsTransport {
    fn name(&self) -> &'static str {
        TRANSPORT_NAME
    }

    fn publish(&self, message: &Message) -> Result<(), TransportError> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(CLOSED);
        }
        // Fail at once while reconnecting, rather than queueing into a client buffer that
        // may never be sent (R-DIST-5).
        if !self.inner.js.is_connected() {
            return Err(unavailable("not connected to the NATS server"));
        }
        // Handing a message to the client is a send into its bounded command channel,
        // which needs no runtime: tried once on this thread (no hop, no wait). Only when
        // the channel is full does the send wait, on the transport's runtime, bounded.
        let sent = match send(&self.inner.js.client, message).now_or_never() {
            Some(sent) => sent,
            None => self.call(send(&self.inner.js.client, message)),
        };
        sent?;
        self.inner.counters.sent.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn subscribe(
        &self,
        pattern: &Pattern,
        deliver: Deliver,
    ) -> Result<Box<dyn TransportSubscription>, TransportError> {
        self.open(pattern, deliver, Receive::Separately)
    }

    fn subscribe_replies(
        &self,
        pattern: &Pattern,
        deliver: Deliver,
    ) -> Result<Box<dyn TransportSubscription>, TransportError> {
        self.open(pattern, deliver, Receive::WherePublished)
    }

    fn connection(&self) -> Option<ConnectionId> {
        Some(self.inner.connection)
    }

    fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
    }
}

/// Which connection a subscription receives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Receive {
    /// The receiving connection: what others publish arrives there, so a header block the
    /// client cannot parse costs that one a reconnect, never the publishes and requests of
    /// the first (see `connection::connect`, issue 34).
    Separately,
    /// The publishing connection: the broker's reply inbox, where the server reports a
    /// request that reached nobody (it tells only the connection that published it).
    WherePublished,
}

impl NatsTransport {
    fn open(
        &self,
        pattern: &Pattern,
        deliver: Deliver,
        on: Receive,
    ) -> Result<Box<dyn TransportSubscription>, TransportError> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(CLOSED);
        }
        if !self.inner.js.is_connected() {
            return Err(unavailable("not connected to the NATS server"));
        }
        let gate = Arc::new(Gate::default());
        let js = self.inner.js.clone();
        let subjects = filter_subjects(pattern);
        let inner = Arc::clone(&self.inner);
        let task_gate = Arc::clone(&gate);
        let tasks = self.call(async move {
            let receiving = match on {
                Receive::Separately => js.receiving().await.map_err(unavailable)?,
                Receive::WherePublished => js,
            };
            let (client, context) = (receiving.client, receiving.context);
            let mut subscribers = Vec::with_capacity(subjects.len());
            for s in subjects {
                subscribers.push(client.subscribe(s).await.map_err(unavailable)?);
            }
            // One round trip: the server has processed the SUBs when it answers, so a
            // message published afterwards by anyone reaches them. (A JetStream API
            // request, not a request into the void: a `>` subscription would make it
            // wait for a reply nobody sends.)
            context
                .query_account()
                .await
                .map_err(|e| unavailable(format!("subscription not confirmed: {e}")))?;
            Ok(subscribers
                .into_iter()
                .map(|s| {
                    let (inner, gate, deliver) =
                        (Arc::clone(&inner), Arc::clone(&task_gate), deliver.clone());
                    tokio::spawn(receive(s, inner, gate, deliver))
                })
                .collect::<Vec<_>>())
        })?;
        Ok(Box::new(NatsSubscription {
            gate,
            tasks,
            runtime_thread: self.inner.runtime_thread,
        }))
    }
}

/// Hands `message` to the client: subject = topic, reply subject = reply-to topic, every
/// field in the codec's headers.
fn send(
    client: &async_nats::Client,
    message: &Message,
) -> impl Future<Output = Result<(), TransportError>> + Send + 'static {
    let client = client.clone();
    let subject = message.topic().as_str().to_owned();
    let reply = message.reply_to().map(|t| t.as_str().to_owned());
    let headers = codec::encode_for_transport(message);
    let payload = message.payload().clone();
    async move {
        let sent = match reply {
            Some(reply) => {
                client
                    .publish_with_reply_and_headers(subject, reply, headers, payload)
                    .await
            }
            None => client.publish_with_headers(subject, headers, payload).await,
        };
        sent.map_err(|e| match e.kind() {
            async_nats::client::PublishErrorKind::Send => unavailable(e),
            _ => refused(e),
        })
    }
}

/// Closing a subscription shuts its gate: a delivery in progress finishes first, none
/// starts after.
#[derive(Default)]
struct Gate {
    closed: AtomicBool,
    /// Held by the receive loop while it delivers one message.
    delivering: Mutex<()>,
}

struct NatsSubscription {
    gate: Arc<Gate>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The transport's runtime thread, where every delivery runs.
    runtime_thread: ThreadId,
}

impl TransportSubscription for NatsSubscription {
    fn close(&self) {
        self.gate.closed.store(true, Ordering::Release);
        // Wait out a delivery in progress, unless this *is* that delivery (the broker's
        // last handle dropped inside it closes the broker): then nothing else delivers
        // meanwhile, as every delivery runs on that one thread.
        if thread::current().id() != self.runtime_thread {
            drop(
                self.gate
                    .delivering
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()),
            );
        }
        // Aborting drops the subscriber, which unsubscribes on the server.
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Drop for NatsSubscription {
    fn drop(&mut self) {
        self.close();
    }
}

/// One NATS subscriber's loop: decode, hand to the broker, until closed.
async fn receive(
    mut subscriber: async_nats::Subscriber,
    inner: Arc<Inner>,
    gate: Arc<Gate>,
    deliver: Deliver,
) {
    while let Some(m) = subscriber.next().await {
        let _delivering = gate.delivering.lock().unwrap_or_else(|e| e.into_inner());
        if gate.closed.load(Ordering::Acquire) {
            return;
        }
        let c = &inner.counters;
        c.received.fetch_add(1, Ordering::Relaxed);
        let Some(received) = decode(&m, &inner) else {
            c.undecodable.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        match deliver.deliver(received) {
            Delivered::Offered => c.offered.fetch_add(1, Ordering::Relaxed),
            Delivered::NotMatching => c.not_matching.fetch_add(1, Ordering::Relaxed),
            _ => return,
        };
    }
}

/// The tidings message a NATS message carries, or the no-responders status of a request
/// this connection published; `None` when it is neither (or is a redrive copy reserved for
/// one durable subscription).
fn decode(m: &async_nats::Message, inner: &Inner) -> Option<Received> {
    // The server sends a request that reached nobody back to its reply subject with this
    // status, on the publishing connection only.
    if let Some(status) = m.status {
        return (status == async_nats::StatusCode::NO_RESPONDERS)
            .then(|| Topic::new(m.subject.as_str()).ok())
            .flatten()
            .map(|reply_to| Received::NoResponders { reply_to });
    }
    // The replies of NATS requests (the JetStream API's, the client's own) are not
    // messages anyone published to a topic.
    if m.subject.starts_with(NATS_INBOX_PREFIX) {
        return None;
    }
    let tidings = codec::TidingsHeaders::of(m.headers.as_ref());
    let header = |name: &str| tidings.get(name);
    if header(codec::TARGET).is_some() {
        return None;
    }
    // A message from another NATS client has no `tidings-id`: its id is derived from this
    // sequence and the receive time.
    let sequence = inner.counters.foreign.fetch_add(1, Ordering::Relaxed);
    let stored = Stored {
        subject: m.subject.as_str(),
        payload: m.payload.clone(),
        sequence,
        // Read only for a foreign message (a clock reading per message otherwise).
        published: if codec::carries_own_time(&header) {
            SystemTime::UNIX_EPOCH
        } else {
            SystemTime::now()
        },
        header: &header,
    };
    codec::decode(&stored, &inner.limits)
        .ok()
        .map(Received::Message)
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpStream;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use tidings::{Broker, Message, SubscribeOptions};
    use tidings_testkit::nats::{NatsServer, NatsServerOptions};

    use super::NatsTransport;
    use crate::connection::connect::ConnectOptions;

    /// Publishes `payload` on `subject` with the header block `header`, as raw protocol
    /// bytes no client library would send, and waits until the server processed it.
    fn raw_publish(url: &str, subject: &str, header: &[u8], payload: &[u8]) {
        let addr = url.trim_start_matches("nats://");
        let mut out = TcpStream::connect(addr).expect("connects");
        let mut input = BufReader::new(out.try_clone().expect("clone the socket"));
        let mut line = String::new();
        input.read_line(&mut line).expect("INFO");
        let mut frame = b"CONNECT {\"verbose\":false,\"headers\":true}\r\n".to_vec();
        frame.extend(
            format!(
                "HPUB {subject} {} {}\r\n",
                header.len(),
                header.len() + payload.len()
            )
            .as_bytes(),
        );
        frame.extend(header);
        frame.extend(payload);
        frame.extend(b"\r\nPING\r\n");
        out.write_all(&frame).expect("writes");
        loop {
            line.clear();
            input.read_line(&mut line).expect("reads");
            if line.starts_with("PONG") {
                return;
            }
            assert!(!line.starts_with("-ERR"), "{line}");
        }
    }

    // R-SEC-2: a core-NATS message on a subscribed topic whose header block the client
    // library cannot parse (a line without a colon) costs the receiving connection a
    // reconnect — and never the connection that carries the transport's publishes and
    // requests. Before, subscriptions were on that one, and it reconnected (README,
    // "Known limitations", until this change).
    #[test]
    fn a_header_the_client_cannot_parse_never_costs_the_publishing_connection() {
        let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
            return;
        };
        let transport = NatsTransport::connect(
            ConnectOptions::new(server.url()).request_timeout(Duration::from_secs(2)),
        )
        .expect("connects");
        let broker = Broker::builder()
            .transport(std::sync::Arc::new(transport.clone()))
            .build()
            .expect("builds");
        let got: std::sync::Arc<Mutex<Vec<String>>> = std::sync::Arc::default();
        let g = std::sync::Arc::clone(&got);
        let _sub = broker
            .subscribe("t.*", SubscribeOptions::new(), move |m: &Message| {
                let text = String::from_utf8_lossy(m.payload()).into_owned();
                g.lock().unwrap_or_else(|e| e.into_inner()).push(text);
            })
            .expect("subscribes");
        let js = transport.inner.js.clone();
        let receiving = transport
            .call(async move { js.receiving().await.map_err(super::unavailable) })
            .expect("the receiving connection");
        assert_eq!(
            (transport.inner.js.connects(), receiving.connects()),
            (1, 1)
        );
        raw_publish(
            &server.url(),
            "t.x",
            b"NATS/1.0\r\nno colon here\r\n\r\n",
            b"poison",
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut n = 0;
        while !got
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|p| p.starts_with("after"))
        {
            assert!(
                Instant::now() < deadline,
                "nothing arrived after the record"
            );
            broker
                .publish(Message::to("t.y").payload(format!("after {n}")))
                .expect("publishes");
            n += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            receiving.connects() >= 2,
            "the record reached the receiving connection and cost it a reconnect"
        );
        assert_eq!(
            transport.inner.js.connects(),
            1,
            "the publishing connection never dropped"
        );
        assert!(
            !got.lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .any(|p| p == "poison")
        );
    }
}
