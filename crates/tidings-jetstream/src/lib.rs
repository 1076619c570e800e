//! # tidings-jetstream
//!
//! The durable source of tidings on NATS JetStream (R-DIST-1): the layer a durable
//! subscription needs from a remote engine, on `async-nats`, with errors of tidings' own
//! kinds ([`tidings::StreamErrorKind`]: every error here has a `kind()`, decided from
//! `async-nats`'s typed kinds) and no `async-nats` type in the public API (an `async-nats`
//! error travels only as a boxed source).
//!
//! | tidings | JetStream |
//! |---|---|
//! | topic `a.b.c` of stream `s` | subject `$TIDINGS.s.<s>.a.b.c` ([`record_subject`]) |
//! | pattern `*` / `#` | `*` / the tightest superset of filters, re-checked client-side ([`subject`]) |
//! | durable stream ([`JetStreamBackend`]) | stream, file storage |
//! | append | publish with ack, `Nats-Msg-Id` = message id (dedup) |
//! | durable subscription cursor | durable pull consumer, explicit ack, inactivity cleanup |
//! | `StartAt::{Earliest, Latest, Offset, Time}` | deliver policy all / new / by start sequence / by start time |
//! | finished (handled or dead-lettered) | ack; redeliver: nak; still working: in-progress; give up: term |
//!
//! # What is here and what is not
//! Connecting ([`ConnectOptions`], [`NatsConnection`]: credentials, TLS, bounded timeouts,
//! a server version check), [`JetStreamBackend`] behind tidings' durable-source seam
//! ([`tidings::durable::DurableBackend`]), so a broker keeps its durable streams, cursors
//! and durable dead letters on the server, and [`NatsTransport`] for the broker's
//! transport over core NATS. The async JetStream client these are written on (streams,
//! appends, durable consumers and the read-back check of their settings) is internal.
//! The dispatcher, retry loop, TTL check and scheduler stay tidings' own; nothing here
//! retries a handler.
//!
//! # Failure
//! Every operation is bounded by the connection's request timeout and returns a typed error
//! when the server is away (R-DIST-5); the client reconnects by itself. A server older than
//! [`MIN_SERVER_VERSION`], or one that silently drops a consumer setting, is refused with an
//! error naming the feature or field (R-DIST-4).
//!
//! # Offsets and time
//! Offsets are JetStream stream sequences (the first record is 1). `StartAt::Time` uses
//! the server's store time, not the tidings message timestamp.
//!
//! # Layers
//! Module imports point down (issue 33), top to bottom: a module imports only modules on
//! the lines below its own, or after a `;` that follows it on its line; nothing imports the
//! crate root. `tests/layering.rs` reads `src/` and fails on an import loop, and when
//! `client/` imports `backend/`.
//! - `lib.rs`: the public re-exports
//! - `backend/mod.rs`: [`JetStreamBackend`] and its builder, wiring what is below
//! - `backend/stream.rs`: a stream: appends, reads, opening cursors
//! - `backend/group/`: `mod`; `partition`, `lease`; `state`, `sim`; `machine`; `rendezvous`
//! - `backend/cursor.rs`: one durable subscription's cursor
//! - `backend/refresh.rs`: the task keeping the positions snapshot fresh
//! - `backend/keep_alive.rs`, `backend/puller.rs`: the cursor's other background tasks
//! - `backend/cursor_state.rs`: what a cursor and its tasks share
//! - `backend/positions.rs`, `dead_letters.rs`, `dedup.rs`: positions snapshot, DLQs, dedup
//! - `backend/records.rs`, `shared.rs`, `acker.rs`, `unreadable.rs`, `keys.rs`: the low level
//! - `transport.rs` (and the test-only `fuzz_targets.rs`)
//! - `client/`: `mod`; `tests`; `durable`; `consumer`; `stream_spec`, `delivery`,
//!   `consumer_settings`
//! - `connection/`: `mod`; `runtime`; `connect`
//! - `codec.rs`; `classify.rs`
//! - `error.rs`
//! - `connection/version.rs`, `names.rs`, `subject.rs`: leaves
#![forbid(unsafe_code)]

pub mod backend;
mod classify;
mod client;
/// The message codec: a tidings message as a NATS record (below both the backend and the
/// transport).
pub(crate) mod codec;
mod connection;
mod error;
#[cfg(test)]
mod fuzz_targets;
mod names;
pub mod subject;
pub mod transport;

use client::stream_spec;
use connection::connect;

pub use backend::dedup::{DEFAULT_DEDUP_MAX_AGE, JetStreamDedupStore};
pub use backend::{
    BACKEND_NAME, CAPABILITIES, DEFAULT_KEY_PARTITIONS, DEFAULT_MAX_DELIVERIES, JetStreamBackend,
    JetStreamBackendBuilder, MAX_KEY_PARTITIONS, MAX_NAME_BYTES, key_partition, record_subject,
};
pub use client::consumer::{DEFAULT_ACK_WAIT, DEFAULT_INACTIVE_THRESHOLD};
pub use connect::{
    ConnectOptions, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PING_INTERVAL, DEFAULT_REQUEST_TIMEOUT,
    MIN_PING_INTERVAL, MIN_SERVER_VERSION, ServerVersion, check_server_version,
};
pub use connection::NatsConnection;
pub use error::{ConnectError, JetStreamError};
pub use stream_spec::RESERVED_HEADER_PREFIX;
pub use transport::{NatsTransport, NatsTransportBuilder, TRANSPORT_NAME, TransportStats};

/// The workspace README's Rust examples, compiled (and the in-process one run) as doctests
/// here, the one crate that has both `tidings` and this crate: the README cannot drift
/// from the API.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
