//! Streams and appends: a JetStream stream captures the subjects of some tidings patterns;
//! a record is appended with its tidings message id as `Nats-Msg-Id`.
//!
//! # Durability
//! Streams use file storage. An append returns only after the server acknowledged it; with
//! the server's `sync_interval: always` (what the testkit launcher configures and production
//! servers should), acknowledged means fsynced.
//!
//! # Deduplication
//! Within the stream's duplicate window ([`StreamSpec::duplicate_window`], default
//! [`DEFAULT_DUPLICATE_WINDOW`]) appending a record whose message id was already appended
//! stores nothing and returns the original sequence with [`Appended::duplicate`] set.
//!
//! # Offsets
//! Offsets on this backend are JetStream stream sequences: the first record is 1, not 0.

use std::str::FromStr;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::header::{HeaderName, HeaderValue};
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::stream;
use tidings::{Headers, MessageId, Pattern, StreamErrorKind as K, Topic};

use crate::classify::Classify;
use crate::connection::connect::JetStream;
use crate::error::{AppendError, StreamSpecError};
use crate::subject::{filter_subjects, stream_subjects};

/// Default duplicate window of a stream: appends of the same message id within it are stored
/// once (the NATS default).
pub const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// The header prefix NATS reserves for itself; record headers may not use it.
pub const RESERVED_HEADER_PREFIX: &str = "Nats-";

pub(crate) use crate::names::check_server_name as check_nats_name;

/// What a stream captures and keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct StreamSpec {
    name: String,
    patterns: Vec<Pattern>,
    duplicate_window: Duration,
    max_age: Option<Duration>,
    max_bytes: Option<u64>,
    replicas: usize,
}

impl StreamSpec {
    /// A stream named `name` capturing every topic any of `patterns` matches (as the
    /// non-overlapping superset of [`stream_subjects`]; consumers re-check their own
    /// pattern), file storage, no age limit.
    pub fn new(name: impl Into<String>, patterns: impl IntoIterator<Item = Pattern>) -> Self {
        Self {
            name: name.into(),
            patterns: patterns.into_iter().collect(),
            duplicate_window: DEFAULT_DUPLICATE_WINDOW,
            max_age: None,
            max_bytes: None,
            replicas: 1,
        }
    }

    /// Keeps `n` copies of the stream, each on another server of the cluster (default 1;
    /// 0 counts as 1). Durable consumers created on it without a count of their own get as
    /// many. A server or cluster that cannot place them refuses the stream
    /// ([`StreamSpecError::Refused`], or [`StreamSpecError::Unavailable`] while the cluster has no
    /// meta leader).
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n.max(1);
        self
    }

    /// How long a message id is remembered for deduplication.
    pub fn duplicate_window(mut self, window: Duration) -> Self {
        self.duplicate_window = window;
        self
    }

    /// Drops records older than `age` (retention).
    pub fn max_age(mut self, age: Duration) -> Self {
        self.max_age = Some(age);
        self
    }

    /// The stream's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The NATS subjects the stream captures.
    #[must_use]
    pub fn subjects(&self) -> Vec<String> {
        stream_subjects(&self.patterns)
    }

    /// Keeps at most `bytes` of records, dropping the oldest (retention).
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = Some(bytes);
        self
    }

    fn to_config(&self) -> stream::Config {
        stream::Config {
            name: self.name.clone(),
            subjects: self.subjects(),
            storage: stream::StorageType::File,
            duplicate_window: self.duplicate_window,
            max_age: self.max_age.unwrap_or(Duration::ZERO),
            max_bytes: self
                .max_bytes
                .map_or(-1, |b| i64::try_from(b).unwrap_or(i64::MAX)),
            num_replicas: self.replicas,
            ..Default::default()
        }
    }

    /// The stream configuration to send, after checking the name and patterns.
    pub(crate) fn prepare(&self) -> Result<stream::Config, StreamSpecError> {
        check_nats_name(&self.name).map_err(|reason| StreamSpecError::InvalidName {
            name: self.name.clone(),
            reason,
        })?;
        if self.patterns.is_empty() {
            return Err(StreamSpecError::NoPatterns {
                name: self.name.clone(),
            });
        }
        if let Some(p) = self
            .patterns
            .iter()
            .find(|p| filter_subjects(p).iter().any(|s| s == ">"))
        {
            return Err(StreamSpecError::CapturesEverything {
                name: self.name.clone(),
                pattern: p.to_string(),
            });
        }
        let config = self.to_config();
        if config.subjects.iter().any(|s| s == ">") {
            return Err(StreamSpecError::CapturesEverything {
                name: self.name.clone(),
                pattern: self
                    .patterns
                    .iter()
                    .map(Pattern::as_str)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        Ok(config)
    }
}

/// Checks the configuration the server answered with against the one sent: a setting it
/// dropped silently is [`StreamSpecError::ConfigDropped`] (R-DIST-4).
pub(crate) fn verify_answer(
    sent: &stream::Config,
    got: &stream::Config,
) -> Result<(), StreamSpecError> {
    let mut subjects = got.subjects.clone();
    subjects.sort();
    let mut asked = sent.subjects.clone();
    asked.sort();
    if subjects != asked {
        return Err(StreamSpecError::ConfigDropped { field: "subjects" });
    }
    if got.duplicate_window != sent.duplicate_window {
        return Err(StreamSpecError::ConfigDropped {
            field: "duplicate_window",
        });
    }
    if got.storage != stream::StorageType::File {
        return Err(StreamSpecError::ConfigDropped { field: "storage" });
    }
    if got.max_age != sent.max_age {
        return Err(StreamSpecError::ConfigDropped { field: "max_age" });
    }
    if got.max_bytes != sent.max_bytes {
        return Err(StreamSpecError::ConfigDropped { field: "max_bytes" });
    }
    if got.num_replicas.max(1) != sent.num_replicas.max(1) {
        return Err(StreamSpecError::ConfigDropped {
            field: "num_replicas",
        });
    }
    Ok(())
}

impl StreamState {
    pub(crate) fn of(info: &stream::Info) -> Self {
        Self {
            name: info.config.name.clone(),
            subjects: info.config.subjects.clone(),
            messages: info.state.messages,
            first_sequence: info.state.first_sequence,
            last_sequence: info.state.last_sequence,
            metadata: info.config.metadata.clone(),
        }
    }
}

/// The state of a stream after [`JetStream::ensure_stream`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamState {
    /// The stream's name.
    pub name: String,
    /// The subjects it captures, as the server reports them.
    pub subjects: Vec<String>,
    /// Number of records stored.
    pub messages: u64,
    /// Sequence of the first stored record (0 when empty).
    pub first_sequence: u64,
    /// Sequence of the last stored record (0 when empty).
    pub last_sequence: u64,
    /// The stream's metadata.
    pub metadata: std::collections::HashMap<String, String>,
}

/// One record to append: a tidings message as the durable source stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct Record {
    id: MessageId,
    topic: Topic,
    // Shared, so an append hands the client a reference count, not a copy.
    payload: bytes::Bytes,
    headers: Headers,
}

impl Record {
    /// A record with an empty payload and no headers.
    pub fn new(id: MessageId, topic: Topic) -> Self {
        Self {
            id,
            topic,
            payload: bytes::Bytes::new(),
            headers: Headers::new(),
        }
    }

    /// Sets the payload.
    pub fn payload(mut self, payload: impl Into<Vec<u8>>) -> Self {
        self.payload = bytes::Bytes::from(payload.into());
        self
    }

    /// Adds a header (sent as a NATS header; names starting with
    /// [`RESERVED_HEADER_PREFIX`] are refused at append).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name, value);
        self
    }

    /// The message id (sent as `Nats-Msg-Id`).
    #[must_use]
    pub fn id(&self) -> MessageId {
        self.id
    }

    /// The topic (the NATS subject).
    #[must_use]
    pub fn topic(&self) -> &Topic {
        &self.topic
    }

    fn nats_headers(&self) -> Result<HeaderMap, AppendError> {
        let mut map = HeaderMap::new();
        for (name, value) in self.headers.iter() {
            let invalid = |reason| AppendError::InvalidHeader {
                name: name.to_owned(),
                reason,
            };
            if name
                .get(..RESERVED_HEADER_PREFIX.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(RESERVED_HEADER_PREFIX))
            {
                return Err(invalid("the Nats- prefix is reserved"));
            }
            let n = HeaderName::from_str(name)
                .map_err(|_| invalid("names are printable ASCII without ':' or spaces"))?;
            let v = HeaderValue::from_str(value)
                .map_err(|_| invalid("values may not contain CR or LF"))?;
            map.append(n, v);
        }
        map.insert(
            async_nats::header::NATS_MESSAGE_ID,
            self.id.to_string().as_str(),
        );
        Ok(map)
    }
}

/// A failed stream request as a [`StreamSpecError`], by its kind.
fn stream_error(name: &str, after: Duration, e: &impl Classify) -> StreamSpecError {
    match e.class() {
        (K::TimedOut, _) => StreamSpecError::TimedOut { after },
        (K::Unavailable, _) => StreamSpecError::Unavailable {
            detail: e.to_string(),
        },
        (_, code) => StreamSpecError::Refused {
            name: name.to_owned(),
            detail: e.to_string(),
            code,
        },
    }
}

/// What the server said about an append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Appended {
    /// The record's stream sequence (its offset on this backend).
    pub sequence: u64,
    /// True when the message id was already stored within the duplicate window: nothing
    /// new was stored and `sequence` is the earlier copy's.
    pub duplicate: bool,
}

impl JetStream {
    /// Creates the stream, or updates it to `spec` when it exists, and reads its config back.
    ///
    /// # Errors
    ///
    /// [`StreamSpecError`]: bad name, no pattern, refused by the server (overlapping another
    /// stream's subjects, say), a setting the server dropped, or no answer in time.
    pub async fn ensure_stream(&self, spec: &StreamSpec) -> Result<StreamState, StreamSpecError> {
        let config = spec.prepare()?;
        let info = self
            .context
            .create_or_update_stream(config.clone())
            .await
            .map_err(|e| stream_error(&spec.name, self.request_timeout, &e))?;
        verify_answer(&config, &info.config)?;
        Ok(StreamState::of(&info))
    }

    /// Deletes a stream and everything it holds. Returns whether it existed.
    ///
    /// # Errors
    ///
    /// [`StreamSpecError::Refused`], [`StreamSpecError::Unavailable`] or [`StreamSpecError::TimedOut`].
    pub async fn delete_stream(&self, name: &str) -> Result<bool, StreamSpecError> {
        check_nats_name(name).map_err(|reason| StreamSpecError::InvalidName {
            name: name.to_owned(),
            reason,
        })?;
        match self.context.delete_stream(name).await {
            Ok(status) => Ok(status.success),
            Err(e) => {
                use async_nats::jetstream::context::DeleteStreamErrorKind as K;
                match e.kind() {
                    K::JetStream(js)
                        if js.error_code()
                            == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND =>
                    {
                        Ok(false)
                    }
                    _ => Err(stream_error(name, self.request_timeout, &e)),
                }
            }
        }
    }

    /// Appends `record` to the stream capturing its topic and waits for the server's
    /// acknowledgement (at most the request timeout).
    ///
    /// # Errors
    ///
    /// [`AppendError`]: a header that cannot travel, no stream for the topic, too large,
    /// no acknowledgement in time (the server is away: R-DIST-5), or refused.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: once sent, a cancelled append may still be stored (appending the
    /// same record again is deduplicated by its message id).
    pub async fn append(&self, record: &Record) -> Result<Appended, AppendError> {
        self.send(record).await?.await
    }

    /// Sends `record` (waiting, at most the request timeout, for room in the client's
    /// outgoing queue) and returns the wait for its acknowledgement, so callers can keep
    /// several in flight ([`crate::Pipeline`]). The returned future owns everything it
    /// needs and is bounded by the request timeout from its first poll.
    pub(crate) async fn send(
        &self,
        record: &Record,
    ) -> Result<impl Future<Output = Result<Appended, AppendError>> + Send + 'static, AppendError>
    {
        let headers = record.nats_headers()?;
        let len = record.payload.len() + self.headers_len(&headers);
        let max = self.max_payload;
        if max > 0 && len > max {
            return Err(AppendError::TooLarge { len, max });
        }
        let timeout = self.request_timeout;
        let topic = record.topic.as_str().to_owned();
        let map_err =
            move |e: async_nats::jetstream::context::PublishError, topic: &str| match e.kind() {
                PublishErrorKind::StreamNotFound => AppendError::NoStream {
                    topic: topic.to_owned(),
                },
                PublishErrorKind::MaxPayloadExceeded => AppendError::TooLarge { len, max },
                _ => match e.class() {
                    (K::TimedOut, _) => AppendError::TimedOut { after: timeout },
                    (K::Unavailable, _) => AppendError::Unavailable {
                        detail: e.to_string(),
                    },
                    (_, code) => AppendError::Refused {
                        detail: e.to_string(),
                        code,
                    },
                },
            };
        let ack_future = tokio::time::timeout(
            timeout,
            self.context
                .publish_with_headers(topic.clone(), headers, record.payload.clone()),
        )
        .await
        .map_err(|_| AppendError::TimedOut { after: timeout })?
        .map_err(|e| map_err(e, &topic))?;
        Ok(async move {
            let ack = tokio::time::timeout(timeout, ack_future)
                .await
                .map_err(|_| AppendError::TimedOut { after: timeout })?
                .map_err(|e| map_err(e, &topic))?;
            Ok(Appended {
                sequence: ack.sequence,
                duplicate: ack.duplicate,
            })
        })
    }

    fn headers_len(&self, headers: &HeaderMap) -> usize {
        headers
            .iter()
            .map(|(n, vs)| {
                let name: &str = n.as_ref();
                vs.iter()
                    .map(|v| name.len() + v.as_str().len() + 4)
                    .sum::<usize>()
            })
            .sum::<usize>()
            + 12
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record::new(
            MessageId::from_u128(7),
            Topic::new("a.b").expect("valid topic"),
        )
    }

    #[test]
    fn headers_are_validated() {
        let ok = record()
            .header("x-trace", "abc")
            .nats_headers()
            .expect("valid");
        assert_eq!(
            ok.get(async_nats::header::NATS_MESSAGE_ID)
                .map(|v| v.as_str()),
            Some(MessageId::from_u128(7).to_string().as_str())
        );
        for (name, value) in [
            ("Nats-Msg-Id", "x"),
            ("nats-expected-stream", "x"),
            ("bad:name", "x"),
            ("bad name", "x"),
            ("x", "line\nbreak"),
        ] {
            let err = record().header(name, value).nats_headers().expect_err(name);
            assert!(
                matches!(&err, AppendError::InvalidHeader { name: n, .. } if n == name),
                "{err:?}"
            );
        }
    }

    #[test]
    fn names_are_validated() {
        assert!(check_nats_name("orders_v2-eu").is_ok());
        for bad in ["", "a.b", "a*", "a>", "a b", "a/b", &"x".repeat(256)] {
            assert!(check_nats_name(bad).is_err(), "{bad:?}");
        }
    }
}
