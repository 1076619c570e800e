//! One small error enum per operation; no `async-nats` type appears in them (details of the
//! underlying failure travel as text).

use std::path::PathBuf;
use std::time::Duration;

use crate::connect::ServerVersion;

/// Why [`ConnectOptions::connect`](crate::ConnectOptions::connect) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The address could not be parsed or resolved.
    #[error("invalid server address {url:?}: {detail}")]
    InvalidUrl {
        /// The address given.
        url: String,
        /// What was wrong.
        detail: String,
    },
    /// Nothing accepted the connection (refused, reset, unreachable).
    #[error("could not reach the NATS server at {url}: {detail}")]
    Unreachable {
        /// The address given.
        url: String,
        /// The underlying failure.
        detail: String,
    },
    /// The connection was not established within the connect timeout.
    #[error("no connection to {url} within {after:?}")]
    TimedOut {
        /// The address given.
        url: String,
        /// The connect timeout.
        after: Duration,
    },
    /// The server refused the credentials (wrong or missing token, password, nkey, JWT).
    #[error("the NATS server refused the credentials: {detail}")]
    AuthenticationFailed {
        /// The server's or client's message.
        detail: String,
    },
    /// The TLS handshake or TLS configuration failed.
    #[error("TLS failed: {detail}")]
    Tls {
        /// The underlying failure.
        detail: String,
    },
    /// The `.creds` file could not be read or parsed.
    #[error("could not read the credentials file {path}: {detail}")]
    Credentials {
        /// The file.
        path: PathBuf,
        /// The underlying failure.
        detail: String,
    },
    /// The server is older than the features this crate uses (R-DIST-4).
    #[error("nats-server {version} is too old: {feature} needs {required} or newer")]
    ServerTooOld {
        /// The version the server reported.
        version: String,
        /// The oldest accepted version.
        required: ServerVersion,
        /// The feature that needs it.
        feature: &'static str,
    },
    /// The backend's runtime thread could not be started or stopped early.
    #[error("the JetStream backend's runtime failed: {detail}")]
    Runtime {
        /// The underlying failure.
        detail: String,
    },
    /// JetStream is not enabled on the server or for this account.
    #[error("JetStream is not available: {detail}")]
    JetStreamUnavailable {
        /// The underlying failure.
        detail: String,
    },
}

/// Why [`JetStream::ensure_stream`](crate::JetStream::ensure_stream) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The stream name is not usable on NATS.
    #[error("invalid stream name {name:?}: {reason}")]
    InvalidName {
        /// The name given.
        name: String,
        /// The rule broken.
        reason: &'static str,
    },
    /// A stream must capture at least one pattern.
    #[error("stream {name:?} captures no pattern")]
    NoPatterns {
        /// The stream.
        name: String,
    },
    /// The patterns include one that needs every subject (`#`, `#.x`, ...): JetStream
    /// refuses a stream capturing `>` (it would capture its own API subjects).
    #[error(
        "stream {name:?} would capture every subject (pattern {pattern}); JetStream refuses \
         that: capture patterns that start with a word"
    )]
    CapturesEverything {
        /// The stream.
        name: String,
        /// The pattern that needs it.
        pattern: String,
    },
    /// The server refused the configuration (overlap with another stream, limits, ...).
    #[error("the server refused stream {name:?}: {detail}")]
    Refused {
        /// The stream.
        name: String,
        /// The server's message.
        detail: String,
    },
    /// The server answered with a configuration lacking a field that was set (R-DIST-4).
    #[error("the server dropped the stream setting {field} (server too old?)")]
    ConfigDropped {
        /// The setting.
        field: &'static str,
    },
    /// No answer within the request timeout (server away or slow).
    #[error("no answer from JetStream within {after:?}")]
    TimedOut {
        /// The request timeout.
        after: Duration,
    },
}

/// Why [`JetStream::append`](crate::JetStream::append) failed. The record may or may not be
/// stored when the error is [`TimedOut`](Self::TimedOut); appending it again is safe within
/// the stream's duplicate window (the message id deduplicates).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AppendError {
    /// A header name or value cannot travel as a NATS header, or uses a reserved prefix.
    #[error("header {name:?} cannot be sent: {reason}")]
    InvalidHeader {
        /// The header name.
        name: String,
        /// The rule broken.
        reason: &'static str,
    },
    /// No stream captures the record's topic.
    #[error("no stream captures topic {topic:?}")]
    NoStream {
        /// The topic.
        topic: String,
    },
    /// The payload and headers exceed the server's maximum payload.
    #[error("record of {len} bytes exceeds the server's maximum payload of {max} bytes")]
    TooLarge {
        /// The size of payload and headers.
        len: usize,
        /// The server's limit.
        max: usize,
    },
    /// No acknowledgement within the request timeout (server away or slow).
    #[error("no acknowledgement from JetStream within {after:?}")]
    TimedOut {
        /// The request timeout.
        after: Duration,
    },
    /// The server refused the record.
    #[error("the server refused the record: {detail}")]
    Refused {
        /// The server's message.
        detail: String,
    },
}

/// Why creating, updating or seeking a [`Durable`](crate::Durable) consumer failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// The durable or stream name is not usable on NATS.
    #[error("invalid name {name:?}: {reason}")]
    InvalidName {
        /// The name given.
        name: String,
        /// The rule broken.
        reason: &'static str,
    },
    /// An option has a value JetStream cannot take.
    #[error("consumer option {option} cannot be {value}: {reason}")]
    InvalidOption {
        /// The option.
        option: &'static str,
        /// Its value.
        value: String,
        /// Why not.
        reason: &'static str,
    },
    /// The stream does not exist.
    #[error("stream {stream:?} does not exist")]
    StreamNotFound {
        /// The stream.
        stream: String,
    },
    /// The server answered with a consumer configuration that differs from the requested
    /// one in this field: it silently ignored a setting it does not know (R-DIST-4).
    #[error(
        "the server silently dropped consumer setting {field} (asked {asked}, got {got}); \
         the server is too old for this backend"
    )]
    ConfigDropped {
        /// The setting.
        field: &'static str,
        /// What was asked for.
        asked: String,
        /// What the server reported.
        got: String,
    },
    /// The server refused the configuration.
    #[error("the server refused consumer {durable:?}: {detail}")]
    Refused {
        /// The durable name.
        durable: String,
        /// The server's message.
        detail: String,
    },
    /// No answer within the request timeout (server away or slow).
    #[error("no answer from JetStream within {after:?}")]
    TimedOut {
        /// The request timeout.
        after: Duration,
    },
}

/// Why [`Durable::fetch`](crate::Durable::fetch) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// The consumer no longer exists on the server (deleted, or removed after its inactivity
    /// threshold).
    #[error("consumer {durable:?} no longer exists")]
    ConsumerGone {
        /// The durable name.
        durable: String,
    },
    /// The pull request failed (connection lost, server away).
    #[error("fetch failed: {detail}")]
    Unavailable {
        /// The underlying failure.
        detail: String,
    },
}

/// Why acknowledging a [`Delivery`](crate::Delivery) failed. After an error the outcome is
/// unknown: the message may be redelivered after the ack wait (at-least-once).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AckError {
    /// The server did not confirm within the request timeout.
    #[error("no acknowledgement confirmation within {after:?}")]
    TimedOut {
        /// The request timeout.
        after: Duration,
    },
    /// The acknowledgement could not be sent or was refused.
    #[error("acknowledgement failed: {detail}")]
    Failed {
        /// The underlying failure.
        detail: String,
    },
}

/// Why reading a consumer's state ([`Durable::lag`](crate::Durable::lag)) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InfoError {
    /// The consumer no longer exists on the server.
    #[error("consumer {durable:?} no longer exists")]
    ConsumerGone {
        /// The durable name.
        durable: String,
    },
    /// The request failed or timed out.
    #[error("consumer info failed: {detail}")]
    Unavailable {
        /// The underlying failure.
        detail: String,
    },
}
