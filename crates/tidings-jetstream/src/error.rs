//! One small error enum per operation; no `async-nats` type appears in them.
//!
//! # Kinds
//! Every error here has a [`kind`](ConnectError::kind): the backend-neutral
//! [`StreamErrorKind`] tidings uses on every backend, decided from `async-nats`'s typed
//! error kinds (and, where the server answered with one, its JetStream API error code,
//! kept as `code`), never from text. At tidings' durable seam a failure of this crate is a
//! [`tidings::StreamError::Backend`] with that kind whose source is a [`JetStreamError`]:
//! what the backend was doing, the API error code, and the underlying error (an
//! `async-nats` error, boxed) as its own source.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tidings::StreamErrorKind;

use crate::connection::version::ServerVersion;

/// The JetStream backend's error at tidings' durable seam: the source of a
/// [`tidings::StreamError::Backend`] raised by [`JetStreamBackend`](crate::JetStreamBackend).
///
/// ```
/// # use tidings::{StreamError, StreamErrorKind};
/// # use tidings_jetstream::JetStreamError;
/// fn server_code(e: &StreamError) -> Option<u64> {
///     match e {
///         StreamError::Backend { source, .. } => {
///             source.downcast_ref::<JetStreamError>()?.api_code()
///         }
///         _ => None,
///     }
/// }
/// # let _ = server_code;
/// ```
#[derive(Debug, Clone)]
pub struct JetStreamError {
    kind: StreamErrorKind,
    context: String,
    code: Option<u64>,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl JetStreamError {
    /// An error of `kind` while doing `context`, without a cause.
    pub(crate) fn new(kind: StreamErrorKind, context: impl fmt::Display) -> Self {
        Self {
            kind,
            context: context.to_string(),
            code: None,
            source: None,
        }
    }

    /// This error, caused by `source`.
    pub(crate) fn caused_by(
        mut self,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// This error, with the server's JetStream API error code.
    pub(crate) fn code(mut self, code: Option<u64>) -> Self {
        self.code = code;
        self
    }

    /// What kind of failure it is.
    #[must_use]
    pub fn kind(&self) -> StreamErrorKind {
        self.kind
    }

    /// The JetStream API error code the server answered with (`err_code`, e.g. 10058 for
    /// "stream name already in use with a different configuration"), if it answered with
    /// one.
    #[must_use]
    pub fn api_code(&self) -> Option<u64> {
        self.code
    }

    /// What the backend was doing.
    #[must_use]
    pub fn context(&self) -> &str {
        &self.context
    }
}

impl fmt::Display for JetStreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.context)?;
        if let Some(s) = &self.source {
            write!(f, ": {s}")?;
        }
        Ok(())
    }
}

impl std::error::Error for JetStreamError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

impl From<JetStreamError> for tidings::StreamError {
    fn from(e: JetStreamError) -> Self {
        tidings::StreamError::backend(crate::names::BACKEND_NAME, e.kind, e)
    }
}

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

impl ConnectError {
    /// What kind of failure it is (R-SEC-1: authentication, TLS and an unreachable server
    /// are told apart).
    #[must_use]
    pub fn kind(&self) -> StreamErrorKind {
        match self {
            ConnectError::InvalidUrl { .. } | ConnectError::Credentials { .. } => {
                StreamErrorKind::InvalidInput
            }
            ConnectError::Unreachable { .. } | ConnectError::JetStreamUnavailable { .. } => {
                StreamErrorKind::Unavailable
            }
            ConnectError::TimedOut { .. } => StreamErrorKind::TimedOut,
            ConnectError::AuthenticationFailed { .. } => StreamErrorKind::Auth,
            ConnectError::Tls { .. } => StreamErrorKind::Tls,
            ConnectError::ServerTooOld { .. } => StreamErrorKind::Unsupported,
            ConnectError::Runtime { .. } => StreamErrorKind::Other,
        }
    }
}

/// Why [`JetStream::ensure_stream`](crate::JetStream::ensure_stream) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamSpecError {
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
        /// The JetStream API error code, when the server answered with one.
        code: Option<u64>,
    },
    /// The request could not be made: not connected, or no JetStream answering.
    #[error("JetStream is unavailable: {detail}")]
    Unavailable {
        /// The underlying failure.
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

impl StreamSpecError {
    /// What kind of failure it is.
    #[must_use]
    pub fn kind(&self) -> StreamErrorKind {
        match self {
            StreamSpecError::InvalidName { .. }
            | StreamSpecError::NoPatterns { .. }
            | StreamSpecError::CapturesEverything { .. } => StreamErrorKind::InvalidInput,
            StreamSpecError::Refused { .. } => StreamErrorKind::Refused,
            StreamSpecError::Unavailable { .. } => StreamErrorKind::Unavailable,
            StreamSpecError::ConfigDropped { .. } => StreamErrorKind::Unsupported,
            StreamSpecError::TimedOut { .. } => StreamErrorKind::TimedOut,
        }
    }

    /// The JetStream API error code of a refusal.
    #[must_use]
    pub fn api_code(&self) -> Option<u64> {
        match self {
            StreamSpecError::Refused { code, .. } => *code,
            _ => None,
        }
    }
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
        /// The JetStream API error code, when the server answered with one.
        code: Option<u64>,
    },
    /// The connection broke while sending; nothing is known to be stored.
    #[error("the connection to JetStream broke: {detail}")]
    Unavailable {
        /// The underlying failure.
        detail: String,
    },
}

impl AppendError {
    /// What kind of failure it is.
    #[must_use]
    pub fn kind(&self) -> StreamErrorKind {
        match self {
            AppendError::InvalidHeader { .. } | AppendError::TooLarge { .. } => {
                StreamErrorKind::InvalidInput
            }
            AppendError::NoStream { .. } => StreamErrorKind::NotFound,
            AppendError::TimedOut { .. } => StreamErrorKind::TimedOut,
            AppendError::Refused { .. } => StreamErrorKind::Refused,
            AppendError::Unavailable { .. } => StreamErrorKind::Unavailable,
        }
    }

    /// The JetStream API error code of a refusal.
    #[must_use]
    pub fn api_code(&self) -> Option<u64> {
        match self {
            AppendError::Refused { code, .. } => *code,
            _ => None,
        }
    }
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
        /// The JetStream API error code, when the server answered with one.
        code: Option<u64>,
    },
    /// No answer within the request timeout (server away or slow).
    #[error("no answer from JetStream within {after:?}")]
    TimedOut {
        /// The request timeout.
        after: Duration,
    },
    /// The request could not be made: not connected, or no JetStream answering.
    #[error("JetStream is unavailable: {detail}")]
    Unavailable {
        /// The underlying failure.
        detail: String,
    },
}

impl ConsumerError {
    /// What kind of failure it is.
    #[must_use]
    pub fn kind(&self) -> StreamErrorKind {
        match self {
            ConsumerError::InvalidName { .. } | ConsumerError::InvalidOption { .. } => {
                StreamErrorKind::InvalidInput
            }
            ConsumerError::StreamNotFound { .. } => StreamErrorKind::NotFound,
            ConsumerError::ConfigDropped { .. } => StreamErrorKind::Unsupported,
            ConsumerError::Refused { .. } => StreamErrorKind::Refused,
            ConsumerError::TimedOut { .. } => StreamErrorKind::TimedOut,
            ConsumerError::Unavailable { .. } => StreamErrorKind::Unavailable,
        }
    }

    /// The JetStream API error code of a refusal.
    #[must_use]
    pub fn api_code(&self) -> Option<u64> {
        match self {
            ConsumerError::Refused { code, .. } => *code,
            _ => None,
        }
    }
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

impl FetchError {
    /// What kind of failure it is.
    #[must_use]
    pub fn kind(&self) -> StreamErrorKind {
        match self {
            FetchError::ConsumerGone { .. } => StreamErrorKind::NotFound,
            FetchError::Unavailable { .. } => StreamErrorKind::Unavailable,
        }
    }
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

impl AckError {
    /// What kind of failure it is.
    #[must_use]
    pub fn kind(&self) -> StreamErrorKind {
        match self {
            AckError::TimedOut { .. } => StreamErrorKind::TimedOut,
            AckError::Failed { .. } => StreamErrorKind::Unavailable,
        }
    }
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
    /// The request failed: not connected, or no JetStream answering.
    #[error("consumer info failed: {detail}")]
    Unavailable {
        /// The underlying failure.
        detail: String,
    },
    /// No answer within the request timeout.
    #[error("no consumer info from JetStream within {after:?}")]
    TimedOut {
        /// The request timeout.
        after: Duration,
    },
}

impl InfoError {
    /// What kind of failure it is.
    #[must_use]
    pub fn kind(&self) -> StreamErrorKind {
        match self {
            InfoError::ConsumerGone { .. } => StreamErrorKind::NotFound,
            InfoError::Unavailable { .. } => StreamErrorKind::Unavailable,
            InfoError::TimedOut { .. } => StreamErrorKind::TimedOut,
        }
    }
}
