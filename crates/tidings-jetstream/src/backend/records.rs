//! Record-level requests on a JetStream stream that streams, cursors, DLQs and dedup
//! stores all make: its bounds, a publish with ack, creating or finding a stream.

use async_nats::HeaderMap;
use async_nats::jetstream::context::CreateStreamErrorKind;
use async_nats::jetstream::{ErrorCode, stream as js_stream};
use tidings::durable::Appended;
use tidings::{Message, StreamError};

use crate::classify::seam;
use crate::codec;
use crate::connection::connect::JetStream;

/// First retained and one-past-last sequence of a stream, from the server.
pub(crate) async fn bounds(js: &JetStream, nats: &str) -> Result<(u64, u64), StreamError> {
    // No info in the lookup: the one below is the only round trip.
    let stream = js
        .context
        .get_stream_no_info(nats)
        .await
        .map_err(|e| seam(format_args!("stream {nats}"), e))?;
    let info = stream
        .get_info()
        .await
        .map_err(|e| seam(format_args!("stream {nats}"), e))?;
    Ok(state_bounds(
        info.state.messages,
        info.state.first_sequence,
        info.state.last_sequence,
    ))
}

pub(crate) fn state_bounds(messages: u64, first: u64, last: u64) -> (u64, u64) {
    let end = last + 1;
    if messages == 0 {
        (end, end)
    } else {
        (first.max(1), end)
    }
}

/// Publishes `headers` + `payload` to `subject` and waits for the server's ack; the
/// stored sequence.
pub(crate) async fn publish(
    js: &JetStream,
    subject: String,
    headers: HeaderMap,
    payload: bytes::Bytes,
) -> Result<u64, StreamError> {
    publish_acked(js, subject, headers, payload)
        .await
        .map(|a| a.offset)
}

/// [`publish`], saying whether the server found the `Nats-Msg-Id` within the stream's
/// duplicate window (R-DEL-7: then nothing was stored and the sequence is the first copy's).
pub(crate) async fn publish_acked(
    js: &JetStream,
    subject: String,
    headers: HeaderMap,
    payload: bytes::Bytes,
) -> Result<Appended, StreamError> {
    let map = |e: async_nats::jetstream::context::PublishError| {
        seam(format_args!("appending to subject {subject:?}"), e)
    };
    let ack = js
        .context
        .publish_with_headers(subject.clone(), headers, payload)
        .await
        .map_err(map)?
        .await
        .map_err(map)?;
    Ok(if ack.duplicate {
        Appended::duplicate_of(ack.sequence)
    } else {
        Appended::stored(ack.sequence)
    })
}

/// Creates the JetStream stream `config` describes, or finds it: create first, because on a
/// cluster the server may leave a lookup unanswered (until the request times out) while
/// another client creates the same stream, whereas it answers a create at once: with the
/// stream when it exists with these settings, `STREAM_NAME_EXIST` when with others (then
/// the existing one is read and returned as it is; the caller compares what it needs).
pub(crate) async fn create_or_find(
    js: &JetStream,
    config: js_stream::Config,
) -> Result<js_stream::Info, StreamError> {
    let name = config.name.clone();
    match js.context.create_stream(config).await {
        Ok(created) => Ok(created.cached_info().clone()),
        Err(e)
            if matches!(e.kind(), CreateStreamErrorKind::JetStream(err)
                if err.error_code() == ErrorCode::STREAM_NAME_EXIST) =>
        {
            let mut existing = js
                .context
                .get_stream(&name)
                .await
                .map_err(|e| seam(format_args!("stream {name}"), e))?;
            let info = existing
                .info()
                .await
                .map_err(|e| seam(format_args!("stream {name}"), e))?;
            Ok(info.clone())
        }
        Err(e) => Err(seam(format_args!("creating stream {name}"), e)),
    }
}

/// The headers of `m` plus its `Nats-Msg-Id`.
pub(crate) fn headers_with_id(m: &Message, msg_id: &str) -> HeaderMap {
    let mut h = codec::encode(m);
    h.insert(async_nats::header::NATS_MESSAGE_ID, msg_id);
    h
}

/// An offset a cursor may start at: retained, and at most the end.
pub(crate) fn check_offset(n: u64, start: u64, end: u64) -> Result<(), StreamError> {
    if n > end {
        return Err(StreamError::BeyondEnd { requested: n, end });
    }
    if n < start {
        return Err(StreamError::OutOfRetention {
            requested: n,
            earliest: start,
        });
    }
    Ok(())
}

/// Whether a raw-message error means "no message at that sequence" (deleted or purged).
pub(crate) fn is_no_message(e: &async_nats::jetstream::stream::RawMessageError) -> bool {
    use async_nats::jetstream::stream::RawMessageErrorKind as K;
    match e.kind() {
        K::NoMessageFound => true,
        K::JetStream(err) => err.error_code() == async_nats::jetstream::ErrorCode::NO_MESSAGE_FOUND,
        _ => false,
    }
}
