//! The durable DLQ of one durable subscription: a JetStream stream of its own (R-DEL-4).
//!
//! An entry is the dead message (the same `tidings-*` headers as in its stream) plus
//! `tidings-dlq-reason`, `-attempts`, `-error` (the last handler error) and `-offset` (its
//! offset in the stream), published to `$TIDINGS.dlq.<stream>.<durable>`. Its
//! `Nats-Msg-Id` is derived from the message offset, so storing the same dead letter twice
//! (a retry after a lost ack) keeps one entry.
//!
//! # A dead letter larger than the server accepts
//! An entry whose copy (message plus DLQ headers) would exceed the server's
//! `max_payload` is stored as a *reference* instead: the DLQ headers (the error cut to
//! [`REF_ERROR_BYTES`]), the message's id and topic and `tidings-dlq-ref`, no payload. It
//! reads back as the original record, fetched from its stream by offset (a terminated
//! record stays until the stream's retention removes it); once retention removed it, as
//! the message's id and topic with an empty payload. So recording a dead letter never
//! fails for its size, and a subscription never stops on one.
//!
//! # Handler starts
//! A second stream next to the DLQ, `<dlq>_s`, counts the *handler starts* of messages
//! that came back unfinished (see the cursor's docs): the last entry on
//! `$TIDINGS.start.<stream>.<durable>.<offset>` holds the count (one entry kept per
//! subject, a week at most).
//!
//! # Loss safety
//! A dead letter is acknowledged by the DLQ stream *before* the original is terminated; a
//! redrive copy is acknowledged by the original stream *before* its entry is deleted.

use std::time::SystemTime;

use async_nats::HeaderMap;
use futures_util::StreamExt;
use tidings::{DeadLetterReason, DurableDeadLetter, Limits, Message, StreamError, StreamErrorKind};

use super::records::{bounds, create_or_find, headers_with_id, is_no_message, publish};
use super::shared::backend_error;
use crate::classify::seam;
use crate::codec::{self, DLQ_ATTEMPTS, DLQ_ERROR, DLQ_OFFSET, DLQ_REASON, Stored, TARGET};
use crate::connection::connect::JetStream;
use crate::names::DurableNames;

/// The header carrying a dead letter's topic (the DLQ subject is the DLQ's own).
const DLQ_TOPIC: &str = "tidings-dlq-topic";
/// Marks an entry that refers to the original record instead of copying it.
const DLQ_REF: &str = "tidings-dlq-ref";
/// The longest handler error a reference entry keeps (escaped bytes).
pub(crate) const REF_ERROR_BYTES: usize = 1024;

/// Bytes a header block takes on the wire (`NATS/1.0\r\n`, `name: value\r\n` each, `\r\n`).
fn header_bytes(h: &HeaderMap) -> usize {
    let mut n = 12;
    for (name, values) in h.iter() {
        let name: &str = name.as_ref();
        for v in values {
            n += name.len() + 2 + v.as_str().len() + 2;
        }
    }
    n
}

/// Whether a last-by-subject lookup found no message.
fn is_no_last_message(e: &async_nats::jetstream::stream::LastRawMessageError) -> bool {
    use async_nats::jetstream::stream::LastRawMessageErrorKind as K;
    match e.kind() {
        K::NoMessageFound => true,
        K::JetStream(err) => err.error_code() == async_nats::jetstream::ErrorCode::NO_MESSAGE_FOUND,
        _ => false,
    }
}

/// The DLQ streams of the durable subscriptions of the JetStream stream `nats`.
pub(crate) async fn dlq_streams_of(js: &JetStream, nats: &str) -> Result<Vec<String>, StreamError> {
    let prefix = crate::names::dlq_prefix(nats);
    let mut names = js.context.stream_names();
    let mut out = Vec::new();
    while let Some(name) = names.next().await {
        let name = name.map_err(|e| seam("listing streams", e))?;
        if name.starts_with(&prefix) {
            out.push(name);
        }
    }
    Ok(out)
}

/// One durable subscription's DLQ.
#[derive(Clone)]
pub(crate) struct DeadLetters {
    js: JetStream,
    /// The JetStream name of the DLQ stream.
    stream: String,
    /// The JetStream name of the stream whose dead letters it keeps.
    parent: String,
    subject: String,
    durable: String,
    limits: Limits,
    /// The JetStream name of the stream the dead letters come from.
    source: String,
    /// Its subject namespace (`<prefix><topic>`), where a redrive copy is appended.
    prefix: String,
    /// The stream counting handler starts, and its subjects' prefix.
    starts: String,
    starts_subject: String,
}

impl DeadLetters {
    /// The DLQ of durable `durable` on the JetStream stream `nats`.
    pub(crate) fn new(js: JetStream, nats: &str, durable: &str, limits: Limits) -> Self {
        let names = DurableNames::new(nats, durable);
        Self {
            js,
            stream: names.dlq_stream(),
            parent: nats.to_owned(),
            subject: names.dlq_subject(),
            durable: durable.to_owned(),
            limits,
            source: nats.to_owned(),
            prefix: crate::names::subject_prefix(nats),
            starts: names.starts_stream(),
            starts_subject: names.starts_subject(),
        }
    }

    /// The handler starts counted for the record at `offset` (0 when none were).
    pub(crate) async fn starts(&self, offset: u64) -> Result<u32, StreamError> {
        let stream = self
            .js
            .context
            .get_stream_no_info(&self.starts)
            .await
            .map_err(|e| seam(format_args!("stream {}", self.starts), e))?;
        let subject = format!("{}{offset}", self.starts_subject);
        match stream.get_last_raw_message_by_subject(&subject).await {
            Ok(raw) => Ok(std::str::from_utf8(&raw.payload)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0)),
            Err(e) if is_no_last_message(&e) => Ok(0),
            Err(e) => {
                let e = seam(format_args!("handler starts of {offset}"), e);
                if e.kind() == StreamErrorKind::Corrupt {
                    // A record tidings did not write (a foreign producer on the subject)
                    // whose header block the client refuses: as an unreadable count, none
                    // counted; the next count written replaces it (one kept per subject).
                    // Refusing would hold the returned message, and everything behind it,
                    // forever.
                    return Ok(0);
                }
                Err(e)
            }
        }
    }

    /// Records `count` handler starts for the record at `offset`, durably.
    pub(crate) async fn set_starts(&self, offset: u64, count: u32) -> Result<(), StreamError> {
        let subject = format!("{}{offset}", self.starts_subject);
        publish(
            &self.js,
            subject,
            HeaderMap::new(),
            count.to_string().into_bytes().into(),
        )
        .await?;
        Ok(())
    }

    /// The replica count of the stream the dead letters come from. That stream was just
    /// opened by this process, so "not found" is a cluster node that has not applied its
    /// creation yet (seen with three processes opening a new stream at once): asked again
    /// for at most a request timeout.
    async fn parent_replicas(&self) -> Result<usize, StreamError> {
        let deadline = tokio::time::Instant::now() + self.js.request_timeout();
        loop {
            match self.js.context.get_stream(&self.parent).await {
                Ok(stream) => return Ok(stream.cached_info().config.num_replicas.max(1)),
                Err(e) => {
                    let e = seam(format_args!("stream {}", self.parent), e);
                    if e.kind() != StreamErrorKind::NotFound
                        || tokio::time::Instant::now() >= deadline
                    {
                        return Err(e);
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Creates the DLQ stream and the handler-start stream (or finds them), with as many
    /// replicas as their stream: a dead letter is as safe as the message it was (R-DIST-7).
    pub(crate) async fn ensure(&self) -> Result<(), StreamError> {
        let replicas = self.parent_replicas().await?;
        let config = async_nats::jetstream::stream::Config {
            name: self.stream.clone(),
            subjects: vec![self.subject.clone()],
            storage: async_nats::jetstream::stream::StorageType::File,
            num_replicas: replicas,
            ..Default::default()
        };
        create_or_find(&self.js, config).await?;
        let starts = async_nats::jetstream::stream::Config {
            name: self.starts.clone(),
            subjects: vec![format!("{}*", self.starts_subject)],
            storage: async_nats::jetstream::stream::StorageType::File,
            max_messages_per_subject: 1,
            max_age: std::time::Duration::from_secs(7 * 24 * 3600),
            // As many copies as the stream: a returned message's handler start must be
            // recorded before it runs, so with one copy on a dead node its subscription
            // would wait for that node (R-DIST-7).
            num_replicas: replicas,
            ..Default::default()
        };
        create_or_find(&self.js, starts).await?;
        Ok(())
    }

    /// Stores `m` as a dead letter and waits for the server's ack.
    pub(crate) async fn put(
        &self,
        m: &Message,
        reason: &DeadLetterReason,
        attempts: u32,
    ) -> Result<(), StreamError> {
        let offset = m.offset().unwrap_or(0);
        let mut headers: HeaderMap = headers_with_id(m, &format!("dlq:{offset}:{}", m.id()));
        let error = match reason {
            DeadLetterReason::RetriesExhausted { last_error, .. } => Some(last_error.as_str()),
            DeadLetterReason::Rejected { error } => Some(error.as_str()),
            _ => None,
        };
        headers.insert(DLQ_REASON, reason.name());
        headers.insert(DLQ_ATTEMPTS, attempts.to_string().as_str());
        headers.insert(DLQ_OFFSET, offset.to_string().as_str());
        headers.insert(DLQ_TOPIC, m.topic().as_str());
        if let Some(e) = error {
            headers.insert(DLQ_ERROR, codec::escape(e).as_str());
        }
        let max = self.js.client.server_info().max_payload;
        if header_bytes(&headers) + m.payload().len() <= max {
            publish(&self.js, self.subject.clone(), headers, m.payload().clone()).await?;
            return Ok(());
        }
        // Too large to copy: a reference to the original record.
        let mut r = HeaderMap::new();
        r.insert(
            async_nats::header::NATS_MESSAGE_ID,
            format!("dlq:{offset}:{}", m.id()).as_str(),
        );
        r.insert("tidings-id", m.id().to_string().as_str());
        r.insert(DLQ_REF, "1");
        r.insert(DLQ_REASON, reason.name());
        r.insert(DLQ_ATTEMPTS, attempts.to_string().as_str());
        r.insert(DLQ_OFFSET, offset.to_string().as_str());
        r.insert(DLQ_TOPIC, m.topic().as_str());
        if let Some(e) = error {
            let mut e = codec::escape(e);
            if e.len() > REF_ERROR_BYTES {
                let mut cut = REF_ERROR_BYTES;
                // Never inside a `%XX` (escaped text is ASCII).
                while cut > 0 && e.as_bytes()[cut.saturating_sub(2)..cut].contains(&b'%') {
                    cut -= 1;
                }
                e.truncate(cut);
            }
            r.insert(DLQ_ERROR, e.as_str());
        }
        publish(&self.js, self.subject.clone(), r, bytes::Bytes::new()).await?;
        Ok(())
    }

    /// Every entry with its DLQ sequence, oldest first.
    pub(crate) async fn list(&self) -> Result<Vec<(u64, DurableDeadLetter)>, StreamError> {
        let (first, end) = bounds(&self.js, &self.stream).await?;
        let stream = self.dlq_stream().await?;
        let mut out = Vec::new();
        for seq in first..end {
            let raw = match stream.get_raw_message(seq).await {
                Ok(raw) => raw,
                Err(e) if is_no_message(&e) => continue,
                Err(e) => return Err(seam(format_args!("DLQ {} at {seq}", self.stream), e)),
            };
            out.push((seq, self.decode(&raw).await?));
        }
        Ok(out)
    }

    async fn decode(
        &self,
        raw: &async_nats::jetstream::message::StreamMessage,
    ) -> Result<DurableDeadLetter, StreamError> {
        let reference = codec::lookup(&raw.headers, DLQ_REF).is_some();
        let offset_header = codec::lookup(&raw.headers, DLQ_OFFSET).and_then(|o| o.parse().ok());
        let original = match offset_header {
            Some(offset) if reference => self.original(offset).await?,
            _ => None,
        };
        let header = |n: &str| codec::lookup(&raw.headers, n);
        let bad = |why: &str| {
            backend_error(
                StreamErrorKind::Corrupt,
                format_args!("DLQ entry {} of {}: {why}", raw.sequence, self.stream),
            )
        };
        let topic = header(DLQ_TOPIC).ok_or_else(|| bad("no topic"))?;
        let offset: u64 = header(DLQ_OFFSET)
            .and_then(|o| o.parse().ok())
            .ok_or_else(|| bad("no offset"))?;
        let stored = Stored {
            subject: topic,
            payload: raw.payload.clone(),
            sequence: offset,
            published: SystemTime::from(raw.time),
            header: &header,
        };
        let message = match original {
            Some(m) => m,
            None => codec::decode(&stored, &self.limits)
                .map_err(|e| seam(format_args!("DLQ {}", self.stream), e))?,
        };
        let attempts: u32 = header(DLQ_ATTEMPTS)
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| bad("no attempts"))?;
        let error = header(DLQ_ERROR)
            .map(|e| codec::unescape(e).map_err(bad))
            .transpose()?
            .unwrap_or_default();
        let reason = match header(DLQ_REASON) {
            Some("retries_exhausted") => DeadLetterReason::RetriesExhausted {
                attempts,
                last_error: error,
            },
            Some("rejected") => DeadLetterReason::Rejected { error },
            Some("expired") => DeadLetterReason::Expired,
            Some("overflow") => DeadLetterReason::Overflow,
            Some("dropped_oldest") => DeadLetterReason::DroppedOldest,
            Some("shutdown") => DeadLetterReason::Shutdown,
            other => return Err(bad(&format!("unknown reason {other:?}"))),
        };
        Ok(DurableDeadLetter::new(message, reason, attempts))
    }

    /// The record at `offset` of the source stream, when it is still there and decodes.
    async fn original(&self, offset: u64) -> Result<Option<Message>, StreamError> {
        let stream = self
            .js
            .context
            .get_stream_no_info(&self.source)
            .await
            .map_err(|e| seam(format_args!("stream {}", self.source), e))?;
        let raw = match stream.get_raw_message(offset).await {
            Ok(raw) => raw,
            Err(e) if is_no_message(&e) => return Ok(None),
            Err(e) => return Err(seam(format_args!("{} at {offset}", self.source), e)),
        };
        let header = |n: &str| codec::lookup(&raw.headers, n);
        let stored = Stored {
            subject: crate::names::record_topic(raw.subject.as_str(), &self.source),
            payload: raw.payload.clone(),
            sequence: offset,
            published: SystemTime::from(raw.time),
            header: &header,
        };
        Ok(codec::decode(&stored, &self.limits).ok())
    }

    /// The DLQ stream's handle (no info round trip beyond the lookup).
    async fn dlq_stream(&self) -> Result<async_nats::jetstream::stream::Stream<()>, StreamError> {
        self.js
            .context
            .get_stream_no_info(&self.stream)
            .await
            .map_err(|e| seam(format_args!("DLQ stream {}", self.stream), e))
    }

    /// Removes every entry up to `last` (inclusive) at once.
    pub(crate) async fn purge_through(&self, last: u64) -> Result<(), StreamError> {
        let stream = self.dlq_stream().await?;
        stream
            .purge()
            .sequence(last + 1)
            .await
            .map_err(|e| seam(format_args!("purging DLQ {}", self.stream), e))?;
        Ok(())
    }

    /// Appends `entry`'s message to its stream again, for this durable subscription only,
    /// and once that is acknowledged deletes DLQ entry `seq`.
    pub(crate) async fn redrive(
        &self,
        seq: u64,
        entry: &DurableDeadLetter,
    ) -> Result<(), StreamError> {
        let m = &entry.message;
        let mut headers = headers_with_id(m, &format!("redrive:{}:{seq}", self.durable));
        headers.insert(TARGET, self.durable.as_str());
        publish(
            &self.js,
            format!("{}{}", self.prefix, m.topic().as_str()),
            headers,
            m.payload().clone(),
        )
        .await?;
        let stream = self.dlq_stream().await?;
        stream.delete_message(seq).await.map_err(|e| {
            seam(
                format_args!("deleting DLQ entry {seq} of {}", self.stream),
                e,
            )
        })?;
        Ok(())
    }
}
