//! [`Delivery`]: one delivery of a stored record to a durable consumer, and how it is
//! finished (ack, nak, in-progress, term).

use std::time::{Duration, SystemTime};

use async_nats::jetstream::AckKind;
use tidings::{Headers, MessageId};

use crate::error::{AckError, FetchError};

/// How a delivery is finished through a cursor's acknowledgement task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    /// Handled, or skipped by a filter: never delivered again.
    Ack,
    /// Handed out again at once.
    Nak,
    /// Given up (dead-lettered): never delivered again.
    Term,
}

impl Finish {
    fn kind(self) -> AckKind {
        match self {
            Self::Ack => AckKind::Ack,
            Self::Nak => AckKind::Nak(None),
            Self::Term => AckKind::Term,
        }
    }
}

/// One delivery of a stored record to a durable consumer.
pub struct Delivery {
    pub(crate) message: async_nats::jetstream::Message,
    pub(crate) topic: String,
    pub(crate) headers: Headers,
    pub(crate) id: Option<MessageId>,
    pub(crate) sequence: u64,
    pub(crate) delivered: u64,
    /// The consumer's number for this delivery: one more for every delivery, to anyone.
    pub(crate) delivery_sequence: u64,
    published: SystemTime,
    pub(crate) request_timeout: Duration,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("topic", &self.topic)
            .field("id", &self.id)
            .field("sequence", &self.sequence)
            .field("delivered", &self.delivered)
            .finish_non_exhaustive()
    }
}

impl Delivery {
    pub(crate) fn new(
        message: async_nats::jetstream::Message,
        request_timeout: Duration,
        (prefix, keyed): (&str, &str),
    ) -> Result<Self, FetchError> {
        let info = message.info().map_err(|e| FetchError::Unavailable {
            detail: format!("delivery without JetStream metadata: {e}"),
        })?;
        let delivery_sequence = info.consumer_sequence;
        let (sequence, delivered, published) = (
            info.stream_sequence,
            u64::try_from(info.delivered).unwrap_or(0),
            SystemTime::from(info.published),
        );
        let mut headers = Headers::new();
        let mut id = None;
        if let Some(map) = &message.headers {
            for (name, values) in map.iter() {
                let name: &str = name.as_ref();
                if name.eq_ignore_ascii_case(async_nats::header::NATS_MESSAGE_ID.as_ref()) {
                    id = values
                        .first()
                        .and_then(|v| u128::from_str_radix(v.as_str(), 16).ok())
                        .map(MessageId::from_u128);
                    continue;
                }
                for v in values {
                    headers.insert(name, v.as_str());
                }
            }
        }
        Ok(Self {
            topic: crate::names::strip_namespaces(message.subject.as_str(), prefix, keyed)
                .to_owned(),
            message,
            headers,
            id,
            sequence,
            delivered,
            delivery_sequence,
            published,
            request_timeout,
        })
    }

    /// The payload, shared (not copied).
    pub(crate) fn payload_bytes(&self) -> bytes::Bytes {
        self.message.payload.clone()
    }

    /// Says "still working" without waiting for the server's confirmation (a keep-alive
    /// that is lost is sent again at the next tick).
    pub(crate) async fn in_progress_unconfirmed(&self) -> Result<(), AckError> {
        self.message
            .ack_with(AckKind::Progress)
            .await
            .map_err(|e| AckError::Failed {
                detail: e.to_string(),
            })
    }

    /// Sends `finish` without asking for the server's answer (see `backend::acker`).
    pub(crate) async fn send(&self, finish: Finish) -> Result<(), AckError> {
        self.message
            .ack_with(finish.kind())
            .await
            .map_err(|e| AckError::Failed {
                detail: e.to_string(),
            })
    }

    /// Sends `finish` and waits for the server's answer (bounded by the request timeout):
    /// it, and every finish sent before it on this connection for this consumer, was
    /// applied.
    pub(crate) async fn confirm(&self, finish: Finish) -> Result<(), AckError> {
        self.finish(finish.kind()).await
    }

    /// The record's topic (its NATS subject).
    #[must_use]
    pub fn topic(&self) -> &str {
        &self.topic
    }

    #[cfg(test)]
    /// The payload.
    #[must_use]
    pub fn payload(&self) -> &[u8] {
        &self.message.payload
    }

    /// The record's headers, `Nats-Msg-Id` excepted.
    #[must_use]
    pub fn headers(&self) -> &Headers {
        &self.headers
    }

    #[cfg(test)]
    /// The tidings message id (from `Nats-Msg-Id`), when the record carries one.
    #[must_use]
    pub fn message_id(&self) -> Option<MessageId> {
        self.id
    }

    /// The stream sequence (this backend's offset).
    #[must_use]
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// Which delivery of this record this is (1 for the first).
    #[must_use]
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// When the server stored the record.
    #[must_use]
    pub fn published(&self) -> SystemTime {
        self.published
    }

    async fn finish(&self, kind: AckKind) -> Result<(), AckError> {
        match tokio::time::timeout(self.request_timeout, self.message.double_ack_with(kind)).await {
            Err(_) => Err(AckError::TimedOut {
                after: self.request_timeout,
            }),
            Ok(Err(e)) => Err(AckError::Failed {
                detail: e.to_string(),
            }),
            Ok(Ok(())) => Ok(()),
        }
    }

    #[cfg(test)]
    /// Finishes the delivery (handled or dead-lettered) and waits for the server's
    /// confirmation: it will not be delivered again.
    ///
    /// # Errors
    ///
    /// [`AckError`]; the delivery may then come again after the ack wait.
    pub async fn ack(&self) -> Result<(), AckError> {
        self.finish(AckKind::Ack).await
    }

    #[cfg(test)]
    /// Asks for redelivery, after `delay` when given (else at once).
    ///
    /// # Errors
    ///
    /// [`AckError`].
    pub async fn nak(&self, delay: Option<Duration>) -> Result<(), AckError> {
        self.finish(AckKind::Nak(delay)).await
    }

    #[cfg(test)]
    /// Says the handler is still working: the ack wait starts again.
    ///
    /// # Errors
    ///
    /// [`AckError`].
    pub async fn in_progress(&self) -> Result<(), AckError> {
        self.finish(AckKind::Progress).await
    }

    /// Finishes the delivery without success: it is never delivered again.
    ///
    /// # Errors
    ///
    /// [`AckError`].
    pub async fn term(&self) -> Result<(), AckError> {
        self.finish(AckKind::Term).await
    }
}
