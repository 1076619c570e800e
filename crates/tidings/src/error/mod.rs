//! Errors: one small enum per operation, each naming the limit or setting at fault (R-LIM-1).

use std::sync::Arc;

use crate::topic::TopicError;

// The stream errors live in this concept (not in `durable`) so that `PublishError::Stream`
// can carry one without an import cycle; `tidings::durable` re-exports them.
mod stream;
pub use stream::{CommitFailed, StreamError, StreamErrorKind};

/// A configuration value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `setting` was `value`, which is not `expected`.
    #[error("invalid {setting} = {value}: expected {expected}")]
    Invalid {
        /// The setting, e.g. `capacity` or `retry.multiplier`.
        setting: &'static str,
        /// The value given.
        value: String,
        /// What would have been accepted.
        expected: &'static str,
    },
}

impl ConfigError {
    pub(crate) fn invalid(setting: &'static str, value: String, expected: &'static str) -> Self {
        ConfigError::Invalid {
            setting,
            value,
            expected,
        }
    }
}

/// Why `publish` refused a message. Nothing was offered to any subscription.
///
/// Cheap to clone. Match on the variant, and on
/// [`StreamError::kind`](crate::StreamError::kind) for [`PublishError::Stream`]. Equality
/// compares the fields, except that two [`PublishError::Stream`] are equal only when their
/// `error` is the same one (one is a clone of the other): a stream's error carries its
/// cause (an I/O or a remote engine's error), which has no equality of its own.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The topic is not a valid publish topic (R-RT-2).
    #[error("invalid topic: {0}")]
    InvalidTopic(TopicError),
    /// The reply-to topic is not valid.
    #[error("invalid reply-to topic: {0}")]
    InvalidReplyTo(TopicError),
    /// A header name starts with `tidings-`, the prefix reserved for tidings' own metadata
    /// (the dead-letter headers, R-DEL-4), which a publisher may not set.
    #[error("header name {name:?} uses the reserved prefix \"tidings-\"")]
    ReservedHeader {
        /// The offending header name.
        name: String,
    },
    /// Payload over `Limits::max_payload_bytes` (R-LIM-1).
    #[error("payload of {size} bytes exceeds the limit of {limit} bytes")]
    PayloadTooLarge {
        /// Bytes given.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// More headers than `Limits::max_headers`.
    #[error("{count} headers exceed the limit of {limit}")]
    TooManyHeaders {
        /// Headers given.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// Header names and values over `Limits::max_header_bytes`.
    #[error("headers of {size} bytes exceed the limit of {limit} bytes")]
    HeadersTooLarge {
        /// Bytes given.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Key over `Limits::max_key_bytes`.
    #[error("key of {size} bytes exceeds the limit of {limit} bytes")]
    KeyTooLarge {
        /// Bytes given.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Correlation id over `Limits::max_correlation_id_bytes` (R-LIM-1).
    #[error("correlation id of {size} bytes exceeds the limit of {limit} bytes")]
    CorrelationIdTooLarge {
        /// Bytes given.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A delay so long that the delivery time is not representable: the message could
    /// never be delivered (R-LIM-1).
    #[error("delay of {delay:?} is too long: its delivery time is not representable")]
    DelayTooLong {
        /// The delay given.
        delay: std::time::Duration,
    },
    /// The broker is closed.
    #[error("the broker is closed")]
    Closed,
    /// [`Broker::publish_async`](crate::Broker::publish_async) only: the tokio runtime it
    /// ran on shut down before the publish finished. The message may have been appended
    /// and offered, or not; a publisher that must know publishes it again (with an id, a
    /// deduplicating stream drops the copy).
    #[error("the async runtime shut down before the publish finished")]
    RuntimeShutDown,
    /// Appending to a durable stream failed, or the stream's backend cannot keep the
    /// message (a priority, R-DIST-4); the message was not offered to any subscription.
    /// Streams earlier in name order may already hold it: `appended_to` names them.
    #[error("append to stream {stream:?} failed: {error}{}", held_by(appended_to))]
    Stream {
        /// The stream whose append failed.
        stream: String,
        /// What the stream's backend reported; match on
        /// [`kind`](crate::StreamError::kind) (shared, so the error stays cheap to clone).
        #[source]
        error: Arc<StreamError>,
        /// The streams that already hold the message (appended before this one failed),
        /// in name order; empty when nothing was stored.
        appended_to: Vec<String>,
    },
    /// The broker's transport could not send the message (R-DIST-5); nothing was sent to
    /// any subscriber (durable streams earlier in name order may already hold it).
    #[error(transparent)]
    Transport(TransportError),
}

impl PartialEq for PublishError {
    fn eq(&self, other: &Self) -> bool {
        use PublishError as P;
        match (self, other) {
            (P::InvalidTopic(a), P::InvalidTopic(b))
            | (P::InvalidReplyTo(a), P::InvalidReplyTo(b)) => a == b,
            (P::ReservedHeader { name: a }, P::ReservedHeader { name: b }) => a == b,
            (
                P::PayloadTooLarge { size: a, limit: x },
                P::PayloadTooLarge { size: b, limit: y },
            )
            | (
                P::HeadersTooLarge { size: a, limit: x },
                P::HeadersTooLarge { size: b, limit: y },
            )
            | (P::KeyTooLarge { size: a, limit: x }, P::KeyTooLarge { size: b, limit: y })
            | (
                P::CorrelationIdTooLarge { size: a, limit: x },
                P::CorrelationIdTooLarge { size: b, limit: y },
            )
            | (
                P::TooManyHeaders { count: a, limit: x },
                P::TooManyHeaders { count: b, limit: y },
            ) => a == b && x == y,
            (P::DelayTooLong { delay: a }, P::DelayTooLong { delay: b }) => a == b,
            (P::Closed, P::Closed) | (P::RuntimeShutDown, P::RuntimeShutDown) => true,
            (
                P::Stream {
                    stream: a,
                    error: e,
                    appended_to: x,
                },
                P::Stream {
                    stream: b,
                    error: f,
                    appended_to: y,
                },
            ) => a == b && x == y && Arc::ptr_eq(e, f),
            (P::Transport(a), P::Transport(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for PublishError {}

impl PublishError {
    /// The stream's error, for [`PublishError::Stream`].
    #[must_use]
    pub fn stream_error(&self) -> Option<&StreamError> {
        match self {
            PublishError::Stream { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// The tail of [`PublishError::Stream`]'s message: which streams already hold the message.
fn held_by(streams: &[String]) -> String {
    if streams.is_empty() {
        String::new()
    } else {
        format!(" (streams already holding the message: {streams:?})")
    }
}

/// Why `subscribe` failed. No subscription was created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubscribeError {
    /// The pattern is not valid (R-RT-2).
    #[error("invalid pattern: {0}")]
    InvalidPattern(TopicError),
    /// An option is out of range or inconsistent (R-LIM-1).
    #[error(transparent)]
    InvalidOptions(#[from] ConfigError),
    /// `Limits::max_subscriptions` reached.
    #[error("subscription limit of {limit} reached")]
    TooManySubscriptions {
        /// The limit.
        limit: usize,
    },
    /// The broker is closed.
    #[error("the broker is closed")]
    Closed,
    /// The driver could not start a dispatcher (e.g. thread spawn failed).
    #[error("could not start the dispatcher: {0}")]
    Spawn(String),
    /// The broker's transport could not open the subscription's receiving end.
    #[error(transparent)]
    Transport(TransportError),
    /// An async handler was given to a broker whose driver is not
    /// [`Driver::Tokio`](crate::Driver): only the tokio driver can await it (R-EXE-3).
    #[error("async handlers need the tokio driver")]
    AsyncHandlerNeedsTokio,
}

/// Why a broker's [`Transport`](crate::transport::Transport) could not send a message or
/// open a subscription.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// Not connected, or no progress within the transport's stated timeout; nothing was
    /// sent (R-DIST-5).
    #[error("transport {transport} unavailable: {reason}")]
    Unavailable {
        /// The transport's name (`"nats"`).
        transport: &'static str,
        /// What happened, with the timeout when one passed.
        reason: String,
    },
    /// The transport will not carry it (too large, not permitted).
    #[error("transport {transport} refused it: {reason}")]
    Refused {
        /// The transport's name.
        transport: &'static str,
        /// Why.
        reason: String,
    },
    /// The transport was closed.
    #[error("transport {transport} is closed")]
    Closed {
        /// The transport's name.
        transport: &'static str,
    },
}
