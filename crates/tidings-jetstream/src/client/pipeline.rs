//! Pipelined appends: many records sent while earlier acknowledgements are still on their way.
//!
//! [`JetStream::append`] waits for each acknowledgement before the next record leaves, so a
//! publisher gets one record per round trip and, with the server's `sync_interval: always`,
//! one fsync per record. A [`Pipeline`] keeps up to a window of records sent and not yet
//! acknowledged, which lets the server store (and fsync) them in groups.
//!
//! # Ordering
//! Records are sent in call order, so the stream stores them in that order, and their
//! acknowledgements are handed back in the same order: [`Pipeline::append`] returns the
//! oldest one once more than the window is in flight, [`Pipeline::next_acknowledged`] drains
//! the rest. Every record sent gets exactly one outcome: an [`Acknowledged`] or a
//! [`PipelineError`] carrying its message id.
//!
//! # Backpressure
//! After `append` returns, at most `window` records are unacknowledged. Sending waits (at
//! most the request timeout) for room in the client's outgoing queue.
//!
//! # Failure
//! A record whose acknowledgement fails or does not come within the request timeout may or
//! may not be stored ([`PipelineError::Unacknowledged`]); appending it again is safe within
//! the stream's duplicate window, where its message id deduplicates it. Records sent after
//! it keep their own outcomes. Dropping a pipeline with records in flight does not unsend
//! them: they may still be stored, and nobody learns whether.

use std::collections::VecDeque;
use std::future::Future;
use std::num::NonZeroUsize;
use std::pin::Pin;

use tidings::MessageId;

use crate::connect::JetStream;
use crate::error::AppendError;
use crate::stream_spec::{Appended, Record};

type PendingAck = Pin<Box<dyn Future<Output = Result<Appended, AppendError>> + Send>>;

struct InFlight {
    id: MessageId,
    ack: PendingAck,
}

/// One record the server acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Acknowledged {
    /// The record's message id.
    pub id: MessageId,
    /// What the server said (sequence, duplicate).
    pub appended: Appended,
}

/// Why one record of a [`Pipeline`] has no acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// The record was not sent (a header that cannot travel, too large, or no room in the
    /// client's outgoing queue within the request timeout): nothing of it is stored.
    #[error("record {id} was not sent: {source}")]
    NotSent {
        /// The record's message id.
        id: MessageId,
        /// Why.
        source: AppendError,
    },
    /// The record was sent but its acknowledgement failed or did not come in time: it may
    /// or may not be stored (not stored for [`AppendError::NoStream`] and
    /// [`AppendError::Refused`]).
    #[error("record {id} was not acknowledged: {source}")]
    Unacknowledged {
        /// The record's message id.
        id: MessageId,
        /// Why.
        source: AppendError,
    },
}

impl PipelineError {
    /// The message id of the record this error is about.
    #[must_use]
    pub fn id(&self) -> MessageId {
        match self {
            Self::NotSent { id, .. } | Self::Unacknowledged { id, .. } => *id,
        }
    }

    /// What kind of failure it is: its [`AppendError`]'s kind.
    #[must_use]
    pub fn kind(&self) -> tidings::StreamErrorKind {
        match self {
            Self::NotSent { source, .. } | Self::Unacknowledged { source, .. } => source.kind(),
        }
    }
}

/// Appends with up to a window of acknowledgements in flight. See the [module docs](self).
///
/// Built by [`JetStream::pipeline`]. Not shared: one publisher task owns it (`&mut self`).
pub struct Pipeline {
    js: JetStream,
    window: NonZeroUsize,
    in_flight: VecDeque<InFlight>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("window", &self.window)
            .field("in_flight", &self.in_flight.len())
            .finish_non_exhaustive()
    }
}

impl JetStream {
    /// A pipeline appending through this connection with at most `window` records
    /// unacknowledged between calls.
    #[must_use]
    pub fn pipeline(&self, window: NonZeroUsize) -> Pipeline {
        Pipeline {
            js: self.clone(),
            window,
            in_flight: VecDeque::with_capacity(window.get().min(4096) + 1),
        }
    }
}

impl Pipeline {
    /// The most records left unacknowledged when [`append`](Self::append) returns.
    #[must_use]
    pub fn window(&self) -> NonZeroUsize {
        self.window
    }

    /// Records sent whose outcome has not been handed back yet.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Sends `record`; when that makes more than the window in flight, waits for the oldest
    /// record's acknowledgement and returns it (`None` otherwise).
    ///
    /// # Errors
    ///
    /// [`PipelineError::NotSent`] for `record` itself (nothing else changes), or
    /// [`PipelineError::Unacknowledged`] for the oldest record (then `record` was sent and
    /// is in flight).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in the sense that no outcome is lost: cancelled while sending, `record`
    /// was not sent; cancelled while waiting for the oldest acknowledgement, `record` is in
    /// flight and the oldest one is still awaited by the next call.
    pub async fn append(&mut self, record: &Record) -> Result<Option<Acknowledged>, PipelineError> {
        let id = record.id();
        let ack = self
            .js
            .send(record)
            .await
            .map_err(|source| PipelineError::NotSent { id, source })?;
        self.in_flight.push_back(InFlight {
            id,
            ack: Box::pin(ack),
        });
        if self.in_flight.len() > self.window.get() {
            return self.next_acknowledged().await.transpose();
        }
        Ok(None)
    }

    /// Waits for the oldest record in flight and returns its outcome; `None` when nothing
    /// is in flight. Call it until `None` to drain the pipeline.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the oldest record stays in flight until its outcome has been returned.
    pub async fn next_acknowledged(&mut self) -> Option<Result<Acknowledged, PipelineError>> {
        let front = self.in_flight.front_mut()?;
        // Awaited in place, and removed only once finished, so a cancelled wait loses
        // nothing (the ack future has its own bound: the request timeout).
        let result = (&mut front.ack).await;
        let id = front.id;
        self.in_flight.pop_front();
        Some(match result {
            Ok(appended) => Ok(Acknowledged { id, appended }),
            Err(source) => Err(PipelineError::Unacknowledged { id, source }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ConnectOptions, StreamSpec};
    use tidings::{Pattern, Topic};
    use tidings_testkit::nats::{NatsServer, NatsServerOptions};

    fn record(id: u128, topic: &str) -> Record {
        Record::new(
            MessageId::from_u128(id),
            Topic::new(topic).expect("valid topic"),
        )
        .payload(id.to_le_bytes().to_vec())
    }

    fn window(n: usize) -> NonZeroUsize {
        NonZeroUsize::new(n).expect("non-zero")
    }

    #[test]
    fn acknowledgements_come_back_in_order_and_every_record_gets_one_outcome() {
        let Some(server) = NatsServer::for_test(NatsServerOptions::new()) else {
            return;
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let js = ConnectOptions::new(server.url())
                .connect()
                .await
                .expect("connect");
            js.ensure_stream(&StreamSpec::new(
                "pipe",
                [Pattern::new("pipe.#").expect("p")],
            ))
            .await
            .expect("stream");
            let mut pipeline = js.pipeline(window(3));
            let mut outcomes = Vec::new();
            for id in 1..=10u128 {
                if let Some(acked) = pipeline.append(&record(id, "pipe.a")).await.expect("ok") {
                    outcomes.push(acked);
                }
                assert!(
                    pipeline.in_flight() <= 3,
                    "the window bounds what is in flight"
                );
            }
            assert_eq!(
                outcomes.len(),
                7,
                "each append beyond the window returned one"
            );
            while let Some(acked) = pipeline.next_acknowledged().await {
                outcomes.push(acked.expect("acknowledged"));
            }
            let ids: Vec<u128> = outcomes.iter().map(|a| a.id.as_u128()).collect();
            assert_eq!(
                ids,
                (1..=10).collect::<Vec<_>>(),
                "handed back in send order"
            );
            let seqs: Vec<u64> = outcomes.iter().map(|a| a.appended.sequence).collect();
            assert_eq!(seqs, (1..=10).collect::<Vec<_>>(), "stored in send order");

            // The same message id again within the duplicate window is stored once.
            let dup = pipeline.append(&record(4, "pipe.a")).await.expect("sent");
            assert!(dup.is_none());
            let dup = pipeline
                .next_acknowledged()
                .await
                .expect("one")
                .expect("ok");
            assert_eq!(dup.appended.sequence, 4);
            assert!(dup.appended.duplicate);

            // A record that cannot be sent is refused for itself only.
            let bad = record(11, "pipe.a").header("Nats-Expected-Stream", "x");
            let err = pipeline.append(&bad).await.expect_err("reserved header");
            assert!(
                matches!(
                    &err,
                    PipelineError::NotSent {
                        source: AppendError::InvalidHeader { .. },
                        ..
                    }
                ),
                "{err:?}"
            );
            assert_eq!(err.id(), MessageId::from_u128(11));
            assert_eq!(pipeline.in_flight(), 0);

            // No stream captures `other.x`: that record's own outcome says so, and records
            // sent after it are still acknowledged.
            let mut pipeline = js.pipeline(window(8));
            assert!(
                pipeline
                    .append(&record(12, "other.x"))
                    .await
                    .expect("sent")
                    .is_none()
            );
            assert!(
                pipeline
                    .append(&record(13, "pipe.b"))
                    .await
                    .expect("sent")
                    .is_none()
            );
            let err = pipeline
                .next_acknowledged()
                .await
                .expect("one")
                .expect_err("no stream");
            assert!(
                matches!(
                    &err,
                    PipelineError::Unacknowledged {
                        source: AppendError::NoStream { .. },
                        ..
                    }
                ),
                "{err:?}"
            );
            assert_eq!(err.id(), MessageId::from_u128(12));
            let ok = pipeline
                .next_acknowledged()
                .await
                .expect("one")
                .expect("ok");
            assert_eq!((ok.id.as_u128(), ok.appended.sequence), (13, 11));
            assert!(pipeline.next_acknowledged().await.is_none());
        });
    }
}
