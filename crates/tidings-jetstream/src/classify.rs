//! Kinds of `async-nats` errors, from its typed error kinds and the server's JetStream API
//! error codes — never from the text (DESIGN.md: "errors keep a kind and a source chain
//! across the seam").
//!
//! A JetStream request that failed before the server answered (its `Request` kinds) is
//! classified by the cause `async-nats` attaches: a timed-out request is
//! [`StreamErrorKind::TimedOut`], no responders (no JetStream answering) or a broken
//! connection [`StreamErrorKind::Unavailable`]. An API error the server answered with is
//! [`StreamErrorKind::NotFound`] for the "not found" codes, `Unavailable` for status 503,
//! and [`StreamErrorKind::Refused`] otherwise, its code kept.

use std::error::Error as StdError;
use std::fmt;

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::{
    ConsumerInfoErrorKind, CreateStreamErrorKind, GetStreamErrorKind, PublishErrorKind,
    RequestErrorKind,
};
use async_nats::jetstream::stream::{
    ConsumerErrorKind, DeleteMessageErrorKind, PurgeErrorKind, RawMessageErrorKind,
};
use tidings::StreamErrorKind as K;

use crate::error::{
    AckError, AppendError, ConsumerError, FetchError, InfoError, JetStreamError, StreamSpecError,
};

/// An error whose kind (and JetStream API error code) is known from its type.
pub(crate) trait Classify: StdError + Send + Sync + 'static {
    /// Its kind and, when the server answered with one, its API error code.
    fn class(&self) -> (K, Option<u64>);
}

/// The error at tidings' seam: `e` while doing `context`, with its kind and code.
pub(crate) fn seam(context: impl fmt::Display, e: impl Classify) -> tidings::StreamError {
    js_error(context, e).into()
}

/// `e` while doing `context`, with its kind and code, as this crate's [`JetStreamError`].
pub(crate) fn js_error(context: impl fmt::Display, e: impl Classify) -> JetStreamError {
    let (kind, code) = e.class();
    JetStreamError::new(kind, context).code(code).caused_by(e)
}

/// An API error the server answered with.
pub(crate) fn api(err: &async_nats::jetstream::Error) -> (K, Option<u64>) {
    let code = err.error_code();
    let kind = if code == ErrorCode::STREAM_NOT_FOUND
        || code == ErrorCode::CONSUMER_NOT_FOUND
        || code == ErrorCode::NO_MESSAGE_FOUND
    {
        K::NotFound
    } else if code == ErrorCode::JETSTREAM_NOT_ENABLED
        || code == ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT
        || err.code() == 503
    {
        K::Unavailable
    } else {
        K::Refused
    };
    (kind, Some(code.0))
}

/// A request that failed before an answer: the kind of the cause `async-nats` attached
/// (a JetStream or core request error), else the connection (`Unavailable`).
fn request_cause(e: &(dyn StdError + 'static)) -> (K, Option<u64>) {
    let mut cur = e.source();
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<async_nats::jetstream::context::RequestError>() {
            return r.class();
        }
        if let Some(r) = err.downcast_ref::<async_nats::RequestError>() {
            return r.class();
        }
        cur = err.source();
    }
    (K::Unavailable, None)
}

impl Classify for async_nats::jetstream::context::RequestError {
    fn class(&self) -> (K, Option<u64>) {
        match self.kind() {
            RequestErrorKind::TimedOut => (K::TimedOut, None),
            RequestErrorKind::NoResponders => (K::Unavailable, None),
            RequestErrorKind::InvalidSubject => (K::InvalidInput, None),
            RequestErrorKind::Other => request_cause(self),
        }
    }
}

impl Classify for async_nats::RequestError {
    fn class(&self) -> (K, Option<u64>) {
        use async_nats::RequestErrorKind as R;
        match self.kind() {
            R::TimedOut => (K::TimedOut, None),
            R::NoResponders | R::Other => (K::Unavailable, None),
            R::InvalidSubject | R::MaxPayloadExceeded => (K::InvalidInput, None),
        }
    }
}

impl Classify for async_nats::jetstream::context::PublishError {
    fn class(&self) -> (K, Option<u64>) {
        match self.kind() {
            // async-nats reports a publish nobody answered (503 no responders) as "stream
            // not found"; on a cluster that is also a stream between leaders (R-DIST-7), so
            // it is a server away for now, worth a retry, not a missing stream.
            PublishErrorKind::StreamNotFound => (K::Unavailable, None),
            PublishErrorKind::TimedOut => (K::TimedOut, None),
            PublishErrorKind::BrokenPipe => (K::Unavailable, None),
            PublishErrorKind::MaxPayloadExceeded => (K::InvalidInput, None),
            PublishErrorKind::WrongLastMessageId
            | PublishErrorKind::WrongLastSequence
            | PublishErrorKind::MaxAckPending => (K::Refused, None),
            PublishErrorKind::Other => request_cause(self),
        }
    }
}

impl Classify for async_nats::jetstream::context::GetStreamError {
    fn class(&self) -> (K, Option<u64>) {
        match self.kind() {
            GetStreamErrorKind::EmptyName | GetStreamErrorKind::InvalidStreamName => {
                (K::InvalidInput, None)
            }
            GetStreamErrorKind::JetStream(err) => api(&err),
            GetStreamErrorKind::Request => request_cause(self),
        }
    }
}

impl Classify for async_nats::jetstream::context::CreateStreamError {
    fn class(&self) -> (K, Option<u64>) {
        match self.kind() {
            CreateStreamErrorKind::EmptyStreamName
            | CreateStreamErrorKind::InvalidStreamName
            | CreateStreamErrorKind::DomainAndExternalSet => (K::InvalidInput, None),
            CreateStreamErrorKind::JetStreamUnavailable => (K::Unavailable, None),
            CreateStreamErrorKind::JetStream(err) => api(&err),
            CreateStreamErrorKind::TimedOut => (K::TimedOut, None),
            CreateStreamErrorKind::NotFound => (K::NotFound, None),
            CreateStreamErrorKind::Response | CreateStreamErrorKind::ResponseParse => {
                request_cause(self)
            }
        }
    }
}

impl Classify for async_nats::jetstream::stream::RawMessageError {
    fn class(&self) -> (K, Option<u64>) {
        match self.kind() {
            RawMessageErrorKind::NoMessageFound => (K::NotFound, None),
            RawMessageErrorKind::InvalidSubject => (K::InvalidInput, None),
            RawMessageErrorKind::JetStream(err) => api(&err),
            // The request failed (a request error in the chain), or the server answered
            // with a record the client cannot decode: a header block it refuses (written
            // by a foreign producer, issue 34) or base64 that does not decode. The latter
            // is the record, not the connection: `Corrupt`, so nobody retries it as a
            // server away.
            RawMessageErrorKind::Other if has_request_cause(self) => request_cause(self),
            RawMessageErrorKind::Other => (K::Corrupt, None),
        }
    }
}

/// Whether a request error (JetStream or core) is in `e`'s source chain.
fn has_request_cause(e: &(dyn StdError + 'static)) -> bool {
    let mut cur = e.source();
    while let Some(err) = cur {
        if err.is::<async_nats::jetstream::context::RequestError>()
            || err.is::<async_nats::RequestError>()
        {
            return true;
        }
        cur = err.source();
    }
    false
}

impl Classify for async_nats::jetstream::stream::DeleteMessageError {
    fn class(&self) -> (K, Option<u64>) {
        match self.kind() {
            DeleteMessageErrorKind::TimedOut => (K::TimedOut, None),
            DeleteMessageErrorKind::JetStream(err) => api(&err),
            DeleteMessageErrorKind::Request => request_cause(self),
        }
    }
}

impl Classify for async_nats::jetstream::stream::PurgeError {
    fn class(&self) -> (K, Option<u64>) {
        match self.kind() {
            PurgeErrorKind::TimedOut => (K::TimedOut, None),
            PurgeErrorKind::JetStream(err) => api(&err),
            PurgeErrorKind::Request => request_cause(self),
        }
    }
}

impl Classify for async_nats::jetstream::stream::ConsumerError {
    fn class(&self) -> (K, Option<u64>) {
        match self.kind() {
            ConsumerErrorKind::TimedOut => (K::TimedOut, None),
            ConsumerErrorKind::InvalidConsumerType | ConsumerErrorKind::InvalidName => {
                (K::InvalidInput, None)
            }
            ConsumerErrorKind::JetStream(err) => api(&err),
            ConsumerErrorKind::Request | ConsumerErrorKind::Other => request_cause(self),
        }
    }
}

impl Classify for async_nats::jetstream::stream::ConsumerCreateStrictError {
    fn class(&self) -> (K, Option<u64>) {
        use async_nats::jetstream::stream::ConsumerCreateStrictErrorKind as C;
        match self.kind() {
            C::TimedOut => (K::TimedOut, None),
            C::InvalidConsumerType | C::InvalidName => (K::InvalidInput, None),
            C::AlreadyExists => (K::Refused, Some(ErrorCode::CONSUMER_ALREADY_EXISTS.0)),
            C::JetStream(err) => api(&err),
            C::Request | C::Other => request_cause(self),
        }
    }
}

impl Classify for async_nats::jetstream::context::ConsumerInfoError {
    fn class(&self) -> (K, Option<u64>) {
        match self.kind() {
            ConsumerInfoErrorKind::InvalidName => (K::InvalidInput, None),
            ConsumerInfoErrorKind::NotFound | ConsumerInfoErrorKind::StreamNotFound => {
                (K::NotFound, None)
            }
            ConsumerInfoErrorKind::Offline | ConsumerInfoErrorKind::NoResponders => {
                (K::Unavailable, None)
            }
            ConsumerInfoErrorKind::TimedOut => (K::TimedOut, None),
            ConsumerInfoErrorKind::JetStream(err) => api(&err),
            ConsumerInfoErrorKind::Request => request_cause(self),
        }
    }
}

macro_rules! classify_own {
    ($($t:ty),*) => {$(
        impl Classify for $t {
            fn class(&self) -> (K, Option<u64>) {
                (self.kind(), None)
            }
        }
    )*};
}
classify_own!(FetchError, AckError, InfoError);

impl Classify for StreamSpecError {
    fn class(&self) -> (K, Option<u64>) {
        (self.kind(), self.api_code())
    }
}

impl Classify for AppendError {
    fn class(&self) -> (K, Option<u64>) {
        (self.kind(), self.api_code())
    }
}

impl Classify for ConsumerError {
    fn class(&self) -> (K, Option<u64>) {
        (self.kind(), self.api_code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_kinds_map_to_seam_kinds() {
        use async_nats::jetstream::context::RequestError;
        // R-DIST-5: a timed-out request and a server that is away are told apart.
        assert_eq!(
            RequestError::new(RequestErrorKind::TimedOut).class().0,
            K::TimedOut
        );
        assert_eq!(
            RequestError::new(RequestErrorKind::NoResponders).class().0,
            K::Unavailable
        );
        // A publish that failed on a timed-out request underneath.
        let publish = async_nats::jetstream::context::PublishError::with_source(
            PublishErrorKind::Other,
            RequestError::new(RequestErrorKind::TimedOut),
        );
        assert_eq!(publish.class().0, K::TimedOut);
        assert_eq!(
            async_nats::jetstream::context::PublishError::new(PublishErrorKind::BrokenPipe)
                .class()
                .0,
            K::Unavailable
        );
    }

    #[test]
    fn a_publish_nobody_answered_is_unavailable_not_a_missing_stream() {
        // R-DIST-7: async-nats reports a publish answered "no responders" as
        // StreamNotFound; mid leader election a replicated stream that exists has no
        // responder for a moment, and a caller must see a retryable kind.
        let unanswered =
            async_nats::jetstream::context::PublishError::new(PublishErrorKind::StreamNotFound);
        assert_eq!(unanswered.class().0, K::Unavailable);
    }

    #[test]
    fn a_refused_strict_create_keeps_its_kind_and_code() {
        use async_nats::jetstream::stream::{
            ConsumerCreateStrictError, ConsumerCreateStrictErrorKind as C,
        };
        let exists = ConsumerCreateStrictError::new(C::AlreadyExists);
        assert_eq!(
            exists.class(),
            (K::Refused, Some(ErrorCode::CONSUMER_ALREADY_EXISTS.0))
        );
        assert_eq!(
            ConsumerCreateStrictError::new(C::TimedOut).class().0,
            K::TimedOut
        );
    }
}
