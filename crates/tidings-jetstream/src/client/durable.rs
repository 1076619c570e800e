//! [`Durable`]: a durable pull consumer, the cursor of one durable subscription.

#[cfg(test)]
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(test)]
use std::time::Duration;

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::consumer::{self, DeliverPolicy, pull};
use async_nats::jetstream::stream::ConsumerCreateStrictErrorKind;
#[cfg(test)]
use futures_util::StreamExt;
use tidings::StreamErrorKind;
#[cfg(test)]
use tidings::Topic;

use super::consumer::{ConsumerSpec, deliver_policy, map_consumer_error, map_create_error};
use super::consumer_settings::ConsumerSettings;
#[cfg(test)]
use super::delivery::Delivery;
use crate::classify::Classify;
use crate::connection::connect::JetStream;
use crate::error::{ConsumerError, FetchError, InfoError};

/// What one [`Durable::fetch`] returned.
#[cfg(test)]
#[derive(Debug)]
#[non_exhaustive]
pub struct Fetched {
    /// Deliveries whose topic matches the pattern, in stream order.
    pub deliveries: Vec<Delivery>,
    /// Deliveries the server's superset filter let through that the pattern does not
    /// match: acknowledged and skipped (counted as filtered).
    pub skipped: u64,
}

/// A durable pull consumer, the cursor of one durable subscription.
///
/// Several processes may open the same durable name: they share it, each delivery going to
/// one of them (competing consumers).
pub struct Durable {
    pub(crate) js: JetStream,
    pub(crate) spec: ConsumerSpec,
    pub(crate) consumer: consumer::PullConsumer,
    pub(crate) settings: ConsumerSettings,
    /// Deliveries the pattern re-check of [`Durable::fetch`] skipped.
    #[cfg(test)]
    pub(crate) skipped: AtomicU64,
}

impl Durable {
    /// Where the consumer stood when this handle was opened, as the server answered: no
    /// round trip.
    pub(crate) fn when_opened(&self) -> WhenOpened {
        let info = self.consumer.cached_info();
        WhenOpened {
            unfinished: info.num_ack_pending as u64,
            floor: info.ack_floor.stream_sequence,
            through: info.delivered.stream_sequence,
            deliveries: info.delivered.consumer_sequence,
        }
    }
}

/// Where a consumer stood when a handle to it was opened ([`Durable::when_opened`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WhenOpened {
    /// Deliveries not finished (acknowledgements pending).
    pub(crate) unfinished: u64,
    /// The acknowledgement floor: every stream sequence up to it is finished.
    pub(crate) floor: u64,
    /// The last stream sequence delivered.
    pub(crate) through: u64,
    /// Deliveries made, to anyone (the last delivery sequence).
    pub(crate) deliveries: u64,
}

impl std::fmt::Debug for Durable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Durable")
            .field("spec", &self.spec)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Durable {
    /// The spec this consumer was opened with.
    pub fn spec(&self) -> &ConsumerSpec {
        &self.spec
    }

    /// The settings the server reported (verified against the spec).
    #[must_use]
    pub fn settings(&self) -> &ConsumerSettings {
        &self.settings
    }

    /// Total deliveries skipped by the client-side pattern re-check since opening.
    #[must_use]
    #[cfg(test)]
    pub(crate) fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// Fetches up to `max` deliveries (at least 1): what is available at once, else waits
    /// up to `wait` for the first one and then takes what else is available. Returns an
    /// empty batch when nothing came within `wait`.
    ///
    /// # Cancel safety
    /// Dropping the future may lose deliveries already pulled; they are redelivered after
    /// the ack wait.
    ///
    /// # Errors
    ///
    /// [`FetchError::ConsumerGone`] when the consumer was deleted (by its inactivity
    /// threshold, say), [`FetchError::Unavailable`] when the pull failed.
    #[cfg(test)]
    pub(crate) async fn fetch(&self, max: usize, wait: Duration) -> Result<Fetched, FetchError> {
        let max = max.max(1);
        let mut raw = self.pull(max, None).await?;
        if raw.is_empty() && !wait.is_zero() {
            raw = self.pull(1, Some(wait)).await?;
            if !raw.is_empty() && max > 1 {
                raw.extend(self.pull(max - 1, None).await?);
            }
        }
        let mut deliveries = Vec::with_capacity(raw.len());
        let mut skipped = 0;
        for message in raw {
            let delivery = Delivery::new(message, self.js.request_timeout, self.spec.namespaces())?;
            let matches = Topic::new(&delivery.topic).is_ok_and(|t| self.spec.pattern.matches(&t));
            if matches {
                deliveries.push(delivery);
            } else {
                // Not this subscription's: finish it so it is not redelivered.
                delivery.ack().await.map_err(|e| FetchError::Unavailable {
                    detail: format!("acknowledging a skipped delivery: {e}"),
                })?;
                skipped += 1;
            }
        }
        self.skipped.fetch_add(skipped, Ordering::Relaxed);
        Ok(Fetched {
            deliveries,
            skipped,
        })
    }

    #[cfg(test)]
    async fn pull(
        &self,
        n: usize,
        wait: Option<Duration>,
    ) -> Result<Vec<async_nats::jetstream::Message>, FetchError> {
        let unavailable = |detail: String| FetchError::Unavailable { detail };
        let mut batch = match wait {
            None => self.consumer.fetch().max_messages(n).messages().await,
            Some(wait) => {
                self.consumer
                    .batch()
                    .max_messages(n)
                    .expires(wait.max(Duration::from_millis(10)))
                    .messages()
                    .await
            }
        }
        .map_err(|e| unavailable(e.to_string()))?;
        // The server ends the batch itself (no_wait, or at `expires`); the bound only guards
        // against a connection that went silent.
        let bound = wait.unwrap_or(Duration::ZERO) + self.js.request_timeout;
        let mut out = Vec::new();
        let collect = async {
            while let Some(item) = batch.next().await {
                match item {
                    Ok(m) => out.push(m),
                    Err(e) => return Err(self.pull_failed(e.to_string()).await),
                }
            }
            Ok(())
        };
        match tokio::time::timeout(bound, collect).await {
            Ok(result) => result?,
            Err(_) => {
                if out.is_empty() {
                    return Err(unavailable(format!(
                        "no answer to the pull within {bound:?}"
                    )));
                }
            }
        }
        Ok(out)
    }

    /// Why a pull ended with an error status (`detail`). async-nats reports a pull's
    /// status only as text (a 409 "Consumer Deleted", a 503 "no responders"), so the
    /// consumer is looked up, and the lookup's typed kind decides: not found (the consumer
    /// or its stream) is [`FetchError::ConsumerGone`], anything else
    /// [`FetchError::Unavailable`] with `detail`.
    pub(crate) async fn pull_failed(&self, detail: String) -> FetchError {
        use async_nats::jetstream::stream::ConsumerErrorKind as K;
        let looked_up = self
            .js
            .context
            .get_consumer_from_stream::<consumer::Config, _, _>(
                &self.spec.durable,
                &self.spec.stream,
            )
            .await;
        match looked_up {
            Err(e)
                if matches!(e.kind(), K::JetStream(err)
                if err.error_code() == ErrorCode::CONSUMER_NOT_FOUND
                    || err.error_code() == ErrorCode::STREAM_NOT_FOUND) =>
            {
                FetchError::ConsumerGone {
                    durable: self.spec.durable.clone(),
                }
            }
            _ => FetchError::Unavailable { detail },
        }
    }

    /// A failed info request as an [`InfoError`], by its kind.
    fn info_error(&self, e: &async_nats::jetstream::context::ConsumerInfoError) -> InfoError {
        use async_nats::jetstream::context::ConsumerInfoErrorKind as K;
        // A timeout or an election under way (in a cluster) is not an answer: only the
        // server saying the consumer or its stream does not exist is (R-DIST-7).
        if matches!(e.kind(), K::NotFound | K::StreamNotFound) {
            return InfoError::ConsumerGone {
                durable: self.spec.durable.clone(),
            };
        }
        match e.class().0 {
            StreamErrorKind::TimedOut => InfoError::TimedOut {
                after: self.js.request_timeout,
            },
            _ => InfoError::Unavailable {
                detail: e.to_string(),
            },
        }
    }

    /// The consumer's info as the server reports it now (positions, ack floor, backlog).
    pub(crate) async fn info(&self) -> Result<consumer::Info, InfoError> {
        let mut consumer = self.consumer.clone();
        consumer
            .info()
            .await
            .cloned()
            .map_err(|e| self.info_error(&e))
    }
}

impl JetStream {
    /// Opens the durable consumer `spec` describes, creating it when it does not exist
    /// (starting at [`ConsumerSpec::start`]) and updating its settings when it does (its
    /// position is kept). The server's answer is read back and verified (R-DIST-4).
    ///
    /// # Errors
    ///
    /// [`ConsumerError`]: bad name or option, no such stream, a setting the server dropped,
    /// refused, or no answer in time.
    ///
    /// The consumer is used (pulled, acknowledged) over the connection's receiving
    /// connection ([`JetStream::receiving`]): a delivery the client library cannot parse
    /// costs that one a reconnect, never this one's publishes and requests.
    pub async fn durable(&self, spec: ConsumerSpec) -> Result<Durable, ConsumerError> {
        spec.validate()?;
        let js = self
            .receiving()
            .await
            .map_err(|e| ConsumerError::Unavailable {
                detail: format!("opening the connection deliveries come over: {e}"),
            })?;
        js.durable_here(spec).await
    }

    /// [`JetStream::durable`] on this connection.
    async fn durable_here(&self, spec: ConsumerSpec) -> Result<Durable, ConsumerError> {
        // Create first: the server answers a create with the settings of an existing
        // consumer at once, while on a cluster it may leave a lookup unanswered (until the
        // request times out) as long as another client is creating the same consumer, so
        // several processes opening one new durable at the same moment all succeed.
        let created = self
            .context
            .create_consumer_strict_on_stream(
                spec.to_config(deliver_policy(&spec.start)?),
                &spec.stream,
            )
            .await;
        let refused = match created {
            Ok(consumer) => return self.bind(spec, consumer),
            Err(e) => e,
        };
        // Only the server saying no (it exists with other settings, typically) goes on to
        // the existing consumer; a timeout or a connection failure is the answer.
        if !matches!(
            refused.kind(),
            ConsumerCreateStrictErrorKind::JetStream(_)
                | ConsumerCreateStrictErrorKind::AlreadyExists
        ) {
            return Err(map_create_error(self, &spec, &refused));
        }
        let existing = match self
            .context
            .get_consumer_from_stream::<pull::Config, _, _>(&spec.durable, &spec.stream)
            .await
        {
            Ok(c) => c,
            // Not there after all: the refusal was about the settings themselves.
            Err(e)
                if matches!(e.kind(), async_nats::jetstream::stream::ConsumerErrorKind::JetStream(err)
                    if err.error_code() == ErrorCode::CONSUMER_NOT_FOUND) =>
            {
                return Err(map_create_error(self, &spec, &refused));
            }
            Err(e) => return Err(map_consumer_error(self, &spec, &e)),
        };
        // It exists: its position is kept (its start policy), its settings updated.
        let policy = existing.cached_info().config.deliver_policy;
        self.open(spec, policy).await
    }

    pub(crate) async fn open(
        &self,
        spec: ConsumerSpec,
        policy: DeliverPolicy,
    ) -> Result<Durable, ConsumerError> {
        let consumer: consumer::PullConsumer = self
            .context
            .create_consumer_on_stream(spec.to_config(policy), &spec.stream)
            .await
            .map_err(|e| map_consumer_error(self, &spec, &e))?;
        self.bind(spec, consumer)
    }

    /// The opened `consumer`, its settings as the server answered them verified (R-DIST-4).
    fn bind(
        &self,
        spec: ConsumerSpec,
        consumer: consumer::PullConsumer,
    ) -> Result<Durable, ConsumerError> {
        let answered = ConsumerSettings::from_config(&consumer.cached_info().config);
        spec.settings().verify(&answered)?;
        Ok(Durable {
            js: self.clone(),
            spec,
            consumer,
            settings: answered,
            #[cfg(test)]
            skipped: AtomicU64::new(0),
        })
    }
}
