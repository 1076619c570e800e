//! [`JetStreamBackend`]: NATS JetStream behind tidings' durable-source seam
//! ([`tidings::durable::DurableBackend`]), so the same broker, handlers and durable
//! subscriptions run with their streams on a NATS server (R-DIST-1).
//!
//! | seam | JetStream |
//! |---|---|
//! | [`BackendStream`] | a stream, file storage, on subjects of its own; append = publish with ack, `Nats-Msg-Id` = message id |
//! | [`BackendCursor`] | a durable pull consumer, explicit ack, filter superset + client re-check; a standing no-wait pull keeps a buffer filled within the window |
//! | finished: delivered / filtered | plain ack, in order, by the cursor's acknowledgement task, one confirmed answer per batch |
//! | finished: dead-lettered | publish to the subscription's DLQ stream (a reference when too large), await its ack, *then* term |
//! | message outstanding | in-progress acks every third of the ack wait (retry in place never hits it) |
//! | message returned unfinished | handed out alone after its handler start is counted durably |
//! | seek | the consumer is deleted and created again at the new start; sharers rebind |
//! | close | what was fetched and not finished is nak'ed: redelivered at once, to this name |
//! | dedup store | a key-value bucket per store, bounded by capacity and age ([`JetStreamDedupStore`](crate::JetStreamDedupStore)) |
//!
//! # Subjects
//! A stream holds exactly what its patterns match (R-RT-1, R-LOG-5), whatever else travels
//! on the server: its records live on subjects of its own, the topic `t` of stream `s` on
//! `$TIDINGS.s.<s>.t` ([`record_subject`]; `s` escaped as below), which no core publish
//! uses (a topic cannot begin with `$`). So a [`NatsTransport`](crate::NatsTransport) on the
//! same server, or any client publishing on a topic, never adds to a stream. A producer
//! that is not tidings publishes to [`record_subject`] to append; what it writes there is
//! still re-checked against the stream's patterns by every cursor (skipped, counted, when
//! none matches), and a record that does not decode as a tidings message is dead-lettered
//! `Rejected` with the reason naming the header (counted as skipped), never stopping the
//! subscription. A stream made by a build that stored records on the topics themselves is
//! refused with [`StreamError::ConfigMismatch`] (setting `subjects`).
//!
//! # Threads
//! The seam is synchronous; async-nats runs on a current-thread runtime on a thread this
//! backend owns. A call spawns its work there and waits on a channel, except an append:
//! its publish runs on the calling thread inside that runtime's context (its own small
//! park/unpark loop, not tokio's `block_on`), so that concurrent appends from many threads
//! leave the runtime thread only the connection's I/O. Either way, calling from inside
//! another tokio runtime never nests `block_on` (it blocks the calling thread, as every
//! seam call may), and a call made on the runtime thread itself is refused as `Closed`.
//! Dropping the backend stops that thread.
//!
//! # Failure
//! Every seam call is bounded: one request timeout ([`ConnectOptions::request_timeout`])
//! per round trip it makes plus 0.5 s (an append, a fetch that finds the cursor's buffer
//! empty: one; a commit: two, confirming the queued acknowledgements, then the ack floor;
//! a finish of delivered messages: none, it only queues plain acknowledgements; a dead
//! letter: two; a seek: up to seven; opening a cursor: up to five; a DLQ listing: one per
//! entry, 64 request timeouts in all). `state` and `outstanding` make none: they answer
//! from what the cursor holds, its positions from a snapshot its own work refreshes
//! (within 200 ms of a change this process made or saw published, every second otherwise;
//! see [`BackendCursor::state`]), so no accessor of a durable subscription waits on the
//! network. Nothing waits on the disk. A server that is away yields
//! [`StreamError::Backend`] naming `jetstream` within that bound, never a hang: of kind `Unavailable` (not connected, no JetStream
//! answering) or `TimedOut` (no answer in time), a refusal by the server `Refused` with its
//! API error code kept in the [`JetStreamError`](crate::JetStreamError) source, a record
//! that does not decode `Corrupt`. The client reconnects by itself; a cursor's background
//! fetch retries until then.
//!
//! # Settings
//! [`StreamConfig`]'s patterns and retention are honoured: the stream's subjects, and its
//! `max_bytes`/`max_age` (the server removes old messages itself). Opening a stream that
//! exists with other patterns or limits is refused with
//! [`StreamError::ConfigMismatch`]; it is never updated (R-LOG-5). The patterns are kept in
//! the stream's metadata (`tidings.patterns`); a stream without it (made by an older build
//! or by hand) is compared by its subjects.
//!
//! # Names
//! tidings names allow `.`, NATS names do not: `_` is written `__` and `.` is written `_d`
//! in stream and consumer names. The DLQ of durable `d` on stream `s` is the stream
//! `<s>_x<d>` capturing the subject `$TIDINGS.dlq.<s>.<d>`; the count of handler starts of
//! its returned messages is the stream `<s>_x<d>_s`; a keyed group's leases are the bucket
//! `TIDINGS_g_<s>_x<d>`. Names are at most [`MAX_NAME_BYTES`] long. One module composes
//! every such name and proves them unique per (stream, durable) pair (`src/names.rs`).
//!
//! # What differs from the embedded log
//! - Offsets are stream sequences: the first is 1 ([`Capabilities::first_offset`]).
//! - No priority ([`Capabilities`]): the broker refuses a durable message with a priority.
//! - `StartAt::Time` uses the server's store time, not the message timestamp.
//! - Retention is the server's: no broker timer runs for it.
//! - Only a handler start counts toward [`JetStreamBackendBuilder::max_deliveries`], not a
//!   fetch: a message that comes back unfinished (its process died or closed) is handed
//!   out alone, its start counted durably first, and a clean close takes the count back. A
//!   message whose handler started `max(max_deliveries, 2)` times without finishing is
//!   dead-lettered `RetriesExhausted` by the next process; messages fetched behind it
//!   never are. The server itself never stops redelivering, so no message can sit
//!   unacknowledged forever.
//! - A dead letter whose copy would exceed the server's `max_payload` is stored as a
//!   reference to the original record (read back from the stream while it is retained):
//!   recording a dead letter never fails for its size.
//! - A seek deletes and recreates the consumer: other processes sharing the name rebind
//!   to the new one (within 10 s); only a consumer gone
//!   for longer (inactivity threshold, an administrator) stops them with an error.
//!
//! [`Capabilities`]: tidings::durable::Capabilities
//! [`Capabilities::first_offset`]: tidings::durable::Capabilities
//! [`BackendCursor`]: tidings::durable::BackendCursor
//! [`BackendCursor::state`]: tidings::durable::BackendCursor::state

mod acker;
mod cursor;
mod cursor_state;
mod dead_letters;
pub(crate) mod dedup;
mod group;
mod keep_alive;
mod keys;
mod positions;
mod puller;
mod records;
mod refresh;
mod shared;
mod strays;
mod stream;
mod unreadable;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tidings::durable::{BackendStream, Capabilities, DurableBackend};
use tidings::transport::ConnectionId;
use tidings::{Limits, Pattern, StreamConfig, StreamError};

use crate::classify::seam;
use crate::client::consumer::{DEFAULT_ACK_WAIT, DEFAULT_INACTIVE_THRESHOLD};
use crate::connection::NatsConnection;
use crate::connection::connect::ConnectOptions;
use crate::error::ConnectError;

/// What this backend can do: no priority, stored messages stamped with the server's clock
/// (no replay on a manual clock), each message acknowledged on its own (no low-watermark
/// commit), offsets from 1. Durable dedup stores are shared by every process
/// ([`JetStreamDedupStore`](crate::JetStreamDedupStore)).
pub const CAPABILITIES: Capabilities = Capabilities::all()
    .without_priority()
    .without_manual_time()
    .without_contiguous_commit()
    .first_offset(1);

/// Default number of deliveries of one message (each after a process holding it stopped)
/// before the next process dead-letters it instead of handling it.
pub const DEFAULT_MAX_DELIVERIES: u32 = 5;

/// Default number of key partitions of a new stream ([`JetStreamBackendBuilder::key_partitions`]).
pub const DEFAULT_KEY_PARTITIONS: u32 = 16;

/// Most key partitions a stream may have.
pub const MAX_KEY_PARTITIONS: u32 = 1024;

pub use crate::names::{BACKEND_NAME, MAX_NAME_BYTES};
pub(crate) use crate::names::{check_name, escape as nats_name};
pub use keys::key_partition;
use shared::{Settings, Shared};

use crate::names::subject_prefix;

/// The NATS subject a record of topic `topic` is stored on in the tidings stream `stream`
/// on this backend: what a producer that is not tidings publishes to when it wants its
/// records in that stream (see the [module docs](self#subjects)). A plain publish on the
/// topic itself is never stored.
///
/// ```
/// assert_eq!(
///     tidings_jetstream::record_subject("orders.v2", "orders.eu"),
///     "$TIDINGS.s.orders_dv2.orders.eu"
/// );
/// ```
///
/// **Waits:** never.
#[must_use]
pub fn record_subject(stream: &str, topic: &str) -> String {
    format!("{}{topic}", subject_prefix(&nats_name(stream)))
}
/// Builds a [`JetStreamBackend`]: consumer settings, then the connection it runs on.
#[derive(Debug, Clone)]
#[must_use]
pub struct JetStreamBackendBuilder {
    settings: Settings,
}

impl JetStreamBackendBuilder {
    /// How long a fetched message may go without an acknowledgement or keep-alive before
    /// the server hands it out again (default [`DEFAULT_ACK_WAIT`]). Keep-alives are sent
    /// every third of it while the message is outstanding, so handlers and in-place
    /// retries may take longer.
    ///
    /// **Waits:** never.
    pub fn ack_wait(mut self, wait: Duration) -> Self {
        self.settings.ack_wait = wait.max(Duration::from_millis(100));
        self.settings.keep_alive = self.settings.ack_wait / 3;
        self
    }

    /// Deliveries of one message (the first, then one after each process that held it
    /// stopped) before the process receiving it dead-letters it with
    /// [`DeadLetterReason::RetriesExhausted`](tidings::DeadLetterReason) instead of
    /// handling it (default [`DEFAULT_MAX_DELIVERIES`], at least 1).
    ///
    /// **Waits:** never.
    pub fn max_deliveries(mut self, deliveries: u32) -> Self {
        self.settings.max_deliveries = deliveries.max(1);
        self
    }

    /// The server deletes a durable consumer no process fetched from for this long
    /// (default [`DEFAULT_INACTIVE_THRESHOLD`]): renamed and abandoned durable
    /// subscriptions do not leak.
    ///
    /// **Waits:** never.
    pub fn inactive_threshold(mut self, threshold: Duration) -> Self {
        self.settings.inactive_threshold = threshold;
        self
    }

    /// How many partitions the keys of a stream this backend *creates* are spread over
    /// (default [`DEFAULT_KEY_PARTITIONS`], clamped to 1..=[`MAX_KEY_PARTITIONS`]). A
    /// keyed record is stored under its partition, `FNV-1a-64(key) mod partitions`; a
    /// keyed consumer group (several processes sharing one durable subscription with
    /// per-key order, R-DIST-6) hands whole partitions to its members, so this is the most
    /// processes that can share such a subscription's keyed records. Fixed when the stream
    /// is created and kept in its metadata: an existing stream keeps its own count.
    ///
    /// **Waits:** never.
    pub fn key_partitions(mut self, partitions: u32) -> Self {
        self.settings.key_partitions = partitions.clamp(1, MAX_KEY_PARTITIONS);
        self
    }

    /// The limits a message read back must meet (default [`Limits::default`]): use the
    /// broker's own limits when they are larger.
    ///
    /// **Waits:** never.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.settings.limits = limits;
        self
    }

    /// How long a dedup store opened through this backend remembers an id (default
    /// [`DEFAULT_DEDUP_MAX_AGE`](crate::DEFAULT_DEDUP_MAX_AGE); zero means "no age limit":
    /// only the capacity bounds it). Reopening a store with another age is
    /// [`StreamError::ConfigMismatch`].
    ///
    /// **Waits:** never.
    pub fn dedup_max_age(mut self, age: Duration) -> Self {
        self.settings.dedup_max_age = age;
        self
    }

    /// How many copies of each dedup store a cluster keeps (default 1, 0 counts as 1, at
    /// most 5: the server's limit; a count the cluster cannot place is refused when the
    /// store is opened). Reopening a store with another count is
    /// [`StreamError::ConfigMismatch`].
    ///
    /// **Waits:** never.
    pub fn dedup_replicas(mut self, replicas: usize) -> Self {
        self.settings.dedup_replicas = replicas.max(1);
        self
    }

    /// The backend on `connection` (share it with a [`NatsTransport`](crate::NatsTransport)
    /// built from the same one).
    ///
    /// **Waits:** never (it shares the connection's runtime).
    pub fn build(self, connection: &NatsConnection) -> JetStreamBackend {
        JetStreamBackend {
            shared: Arc::new(Shared {
                rt: connection.runtime().clone(),
                js: connection.jetstream().clone(),
                settings: self.settings,
            }),
        }
    }

    /// Connects with `options` on a connection of the backend's own (no transport can
    /// share it: a broker refuses a NATS transport alongside).
    ///
    /// **Waits:** on the network: at most the connect timeout plus one request timeout (the
    /// JetStream check).
    ///
    /// # Errors
    /// As [`NatsConnection::connect`].
    pub fn connect(self, options: ConnectOptions) -> Result<JetStreamBackend, ConnectError> {
        Ok(self.build(&NatsConnection::connect(options)?))
    }
}

/// NATS JetStream as the place a broker's durable streams live (see the [module
/// docs](self)).
///
/// ```no_run
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use tidings_jetstream::{ConnectOptions, JetStreamBackend, NatsConnection};
/// let conn = NatsConnection::connect(ConnectOptions::new("nats://127.0.0.1:4222"))?;
/// let backend = JetStreamBackend::builder()
///     .ack_wait(std::time::Duration::from_secs(30))
///     .build(&conn);
/// # let _ = backend; Ok(()) }
/// ```
#[derive(Clone)]
pub struct JetStreamBackend {
    shared: Arc<Shared>,
}

impl fmt::Debug for JetStreamBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamBackend")
            .field("server_version", &self.shared.js.server_version())
            .field("ack_wait", &self.shared.settings.ack_wait)
            .field("max_deliveries", &self.shared.settings.max_deliveries)
            .finish_non_exhaustive()
    }
}

impl JetStreamBackend {
    /// A builder with the default consumer settings.
    ///
    /// **Waits:** never.
    pub fn builder() -> JetStreamBackendBuilder {
        JetStreamBackendBuilder {
            settings: Settings {
                ack_wait: DEFAULT_ACK_WAIT,
                keep_alive: DEFAULT_ACK_WAIT / 3,
                max_deliveries: DEFAULT_MAX_DELIVERIES,
                inactive_threshold: DEFAULT_INACTIVE_THRESHOLD,
                limits: Limits::default(),
                dedup_max_age: dedup::DEFAULT_DEDUP_MAX_AGE,
                dedup_replicas: 1,
                key_partitions: DEFAULT_KEY_PARTITIONS,
            },
        }
    }

    /// The backend on `connection`, with the default settings.
    ///
    /// **Waits:** never.
    pub fn new(connection: &NatsConnection) -> Self {
        Self::builder().build(connection)
    }

    /// Connects with `options` on a connection of its own, with the default settings.
    ///
    /// **Waits:** on the network: at most the connect timeout plus one request timeout (the
    /// JetStream check).
    ///
    /// # Errors
    /// As [`JetStreamBackendBuilder::connect`].
    pub fn connect(options: ConnectOptions) -> Result<Self, ConnectError> {
        Self::builder().connect(options)
    }

    /// Opens (or creates) the dedup store `name`, shared by every process that opens it on
    /// this server or cluster, remembering the `capacity` most recent ids (at least 1) for
    /// at most [`JetStreamBackendBuilder::dedup_max_age`]. The same store as
    /// [`Broker::durable_dedup_store`](tidings::Broker::durable_dedup_store), with its
    /// failure counters. See [`JetStreamDedupStore`](crate::JetStreamDedupStore).
    ///
    /// **Waits:** on the network: creating or finding the bucket, at most three request
    /// timeouts plus 0.5 s.
    ///
    /// # Errors
    /// A bad name ([`StreamError::InvalidName`]), the store existing with another capacity,
    /// age or replica count ([`StreamError::ConfigMismatch`]), or the server refused or did
    /// not answer ([`StreamError::Backend`]).
    pub fn jetstream_dedup_store(
        &self,
        name: &str,
        capacity: usize,
    ) -> Result<Arc<dedup::JetStreamDedupStore>, StreamError> {
        Ok(Arc::new(dedup::JetStreamDedupStore::open(
            Arc::clone(&self.shared),
            name,
            capacity,
        )?))
    }

    /// Deletes the JetStream stream behind the tidings stream `name`, and the DLQ streams
    /// of its durable subscriptions (administration, tests). Returns whether it existed.
    ///
    /// **Waits:** on the network: at most eight request timeouts plus 0.5 s (the stream,
    /// the list of streams, its DLQ streams).
    ///
    /// # Errors
    /// [`StreamError::Backend`] when the server refused or did not answer (its
    /// [`kind`](StreamError::kind) says which).
    pub fn delete_stream(&self, name: &str) -> Result<bool, StreamError> {
        check_name("stream", name)?;
        let js = self.shared.js.clone();
        let nats = nats_name(name);
        self.shared.call(self.shared.bound(8), async move {
            let existed = js
                .delete_stream(&nats)
                .await
                .map_err(|e| seam(format_args!("deleting stream {nats}"), e))?;
            for dlq in dead_letters::dlq_streams_of(&js, &nats).await? {
                js.delete_stream(&dlq)
                    .await
                    .map_err(|e| seam(format_args!("deleting DLQ stream {dlq}"), e))?;
            }
            Ok(existed)
        })
    }
}

impl DurableBackend for JetStreamBackend {
    fn name(&self) -> &'static str {
        BACKEND_NAME
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn open_stream(
        &self,
        config: &StreamConfig,
        patterns: &[Pattern],
    ) -> Result<Arc<dyn BackendStream>, StreamError> {
        Ok(Arc::new(stream::JsStream::open(
            Arc::clone(&self.shared),
            config,
            patterns,
        )?))
    }

    fn dedup_store(
        &self,
        name: &str,
        capacity: usize,
    ) -> Result<Arc<dyn tidings::DedupStore>, StreamError> {
        Ok(self.jetstream_dedup_store(name, capacity)?)
    }

    fn appends_published_on(&self) -> Option<ConnectionId> {
        // An append is published on the stream's own subject namespace
        // (`$TIDINGS.s.<stream>.<topic>`), which no core subscription covers: it reaches
        // nobody but the stream, so a transport sends every message itself.
        None
    }
}
