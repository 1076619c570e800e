//! Durable pull consumers: the cursor of a durable subscription on JetStream.
//!
//! # Filtering
//! The consumer's `filter_subjects` are the [superset](crate::subject::filter_subjects) of
//! its tidings pattern; [`Durable::fetch`] re-checks every delivered topic with
//! [`Pattern::matches`] (RabbitMQ-exact semantics, R-RT-1), acknowledges what does not match
//! (it is not this subscription's) and counts it as skipped.
//!
//! # Acknowledgement
//! Explicit ack: a [`Delivery`] is finished by [`ack`](Delivery::ack) (handled or
//! dead-lettered), [`nak`](Delivery::nak) (redeliver, optionally after a delay),
//! [`in_progress`](Delivery::in_progress) (extend the ack wait) or [`term`](Delivery::term)
//! (never redeliver). One not finished within the ack wait is redelivered, at most
//! `max_deliver` times in all.
//!
//! # Honest configuration (R-DIST-4)
//! After creating the consumer the server's answer is read back and compared with what was
//! asked ([`ConsumerSettings::verify`]): a server that silently dropped a setting it does not
//! know (2.9 drops `filter_subjects` and then delivers every subject) is refused with
//! [`ConsumerError::ConfigDropped`] naming the field.
//!
//! # Cleanup
//! A consumer nobody fetches from for its inactivity threshold
//! ([`ConsumerSpec::inactive_threshold`], default [`DEFAULT_INACTIVE_THRESHOLD`]) is deleted
//! by the server, so renamed or abandoned durable subscriptions do not leak.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use async_nats::jetstream::consumer::{self, AckPolicy, DeliverPolicy, pull};
use async_nats::jetstream::{AckKind, ErrorCode};
use futures_util::StreamExt;
use tidings::{Headers, MessageId, Pattern, StartAt, StreamErrorKind, Topic};

use crate::classify::Classify;
use crate::connect::JetStream;
use crate::error::{AckError, ConsumerError, FetchError, InfoError};
use crate::stream::check_nats_name;
use crate::subject::filter_subjects;

/// Default time a delivery may stay unacknowledged before it is redelivered.
pub const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);

/// Default time after which the server deletes a consumer nobody fetches from.
pub const DEFAULT_INACTIVE_THRESHOLD: Duration = Duration::from_secs(24 * 60 * 60);

/// How a durable consumer is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct ConsumerSpec {
    stream: String,
    durable: String,
    pattern: Pattern,
    start: StartAt,
    max_deliver: Option<u32>,
    ack_wait: Duration,
    backoff: Vec<Duration>,
    inactive_threshold: Duration,
}

impl ConsumerSpec {
    /// A durable consumer `durable` on `stream` for the topics `pattern` matches, starting
    /// at the earliest record, unlimited deliveries, [`DEFAULT_ACK_WAIT`], no backoff,
    /// [`DEFAULT_INACTIVE_THRESHOLD`].
    pub fn new(stream: impl Into<String>, durable: impl Into<String>, pattern: Pattern) -> Self {
        Self {
            stream: stream.into(),
            durable: durable.into(),
            pattern,
            start: StartAt::Earliest,
            max_deliver: None,
            ack_wait: DEFAULT_ACK_WAIT,
            backoff: Vec::new(),
            inactive_threshold: DEFAULT_INACTIVE_THRESHOLD,
        }
    }

    /// Where a *new* consumer starts; an existing durable resumes where it was (use
    /// [`Durable::seek`] to move it). Offsets are stream sequences (the first is 1;
    /// `Offset(0)` means the earliest); `Time` is the server's store time.
    pub fn start(mut self, start: StartAt) -> Self {
        self.start = start;
        self
    }

    /// Delivers a message at most `attempts` times in all (at least 1).
    pub fn max_deliver(mut self, attempts: u32) -> Self {
        self.max_deliver = Some(attempts);
        self
    }

    /// How long a delivery may stay unacknowledged before it is redelivered.
    pub fn ack_wait(mut self, wait: Duration) -> Self {
        self.ack_wait = wait;
        self
    }

    /// Redelivery delays after each unacknowledged attempt (server-side backoff); needs
    /// `max_deliver` greater than the number of delays.
    pub fn backoff(mut self, delays: impl IntoIterator<Item = Duration>) -> Self {
        self.backoff = delays.into_iter().collect();
        self
    }

    /// The server deletes the consumer after this long without a fetch.
    pub fn inactive_threshold(mut self, threshold: Duration) -> Self {
        self.inactive_threshold = threshold;
        self
    }

    /// The durable name.
    #[must_use]
    pub fn durable(&self) -> &str {
        &self.durable
    }

    /// The settings the server must report back for this spec.
    #[must_use]
    pub fn settings(&self) -> ConsumerSettings {
        let mut filter_subjects = filter_subjects(&self.pattern);
        filter_subjects.sort();
        ConsumerSettings {
            filter_subjects,
            explicit_ack: true,
            max_deliver: self.max_deliver.map_or(-1, i64::from),
            ack_wait: self.ack_wait,
            backoff: self.backoff.clone(),
            inactive_threshold: self.inactive_threshold,
        }
    }

    fn validate(&self) -> Result<(), ConsumerError> {
        for name in [&self.stream, &self.durable] {
            check_nats_name(name).map_err(|reason| ConsumerError::InvalidName {
                name: name.clone(),
                reason,
            })?;
        }
        let invalid = |option, value: String, reason| ConsumerError::InvalidOption {
            option,
            value,
            reason,
        };
        if self.max_deliver == Some(0) {
            return Err(invalid("max_deliver", "0".into(), "at least one delivery"));
        }
        if self.ack_wait.is_zero() {
            return Err(invalid("ack_wait", "0".into(), "must be positive"));
        }
        if self.inactive_threshold.is_zero() {
            return Err(invalid(
                "inactive_threshold",
                "0".into(),
                "must be positive",
            ));
        }
        if !self.backoff.is_empty() {
            let enough = self
                .max_deliver
                .is_some_and(|m| u64::from(m) > self.backoff.len() as u64);
            if !enough {
                return Err(invalid(
                    "backoff",
                    format!("{:?}", self.backoff),
                    "needs max_deliver greater than the number of delays",
                ));
            }
        }
        // Durations are sent as i64 nanoseconds.
        let too_long = |d: &Duration| d.as_nanos() > i64::MAX as u128;
        if too_long(&self.ack_wait) || too_long(&self.inactive_threshold) {
            return Err(invalid(
                "ack_wait/inactive_threshold",
                "over 292 years".into(),
                "must fit in i64 nanoseconds",
            ));
        }
        if self.backoff.iter().any(too_long) {
            return Err(invalid(
                "backoff",
                "over 292 years".into(),
                "must fit in i64 nanoseconds",
            ));
        }
        Ok(())
    }

    fn to_config(&self, deliver_policy: DeliverPolicy) -> pull::Config {
        let settings = self.settings();
        let (filter_subject, filter_subjects) = match settings.filter_subjects.as_slice() {
            [one] => (one.clone(), Vec::new()),
            _ => (String::new(), settings.filter_subjects.clone()),
        };
        pull::Config {
            durable_name: Some(self.durable.clone()),
            deliver_policy,
            ack_policy: AckPolicy::Explicit,
            ack_wait: self.ack_wait,
            max_deliver: settings.max_deliver,
            filter_subject,
            filter_subjects,
            backoff: self.backoff.clone(),
            inactive_threshold: self.inactive_threshold,
            ..Default::default()
        }
    }
}

fn deliver_policy(start: &StartAt) -> Result<DeliverPolicy, ConsumerError> {
    Ok(match start {
        StartAt::Earliest | StartAt::Offset(0) => DeliverPolicy::All,
        StartAt::Latest => DeliverPolicy::New,
        StartAt::Offset(seq) => DeliverPolicy::ByStartSequence {
            start_sequence: *seq,
        },
        StartAt::Time(t) => DeliverPolicy::ByStartTime {
            start_time: time::OffsetDateTime::from(*t),
        },
        other => {
            return Err(ConsumerError::InvalidOption {
                option: "start",
                value: format!("{other:?}"),
                reason: "not supported by the JetStream backend",
            });
        }
    })
}

/// The consumer settings this crate relies on, as asked for or as the server reported them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerSettings {
    /// The subject filters, sorted (one filter and `filter_subjects` of one are the same).
    pub filter_subjects: Vec<String>,
    /// Whether every message needs an explicit acknowledgement.
    pub explicit_ack: bool,
    /// Deliveries per message; `-1` (or any value ≤ 0) is unlimited.
    pub max_deliver: i64,
    /// Time before an unacknowledged delivery is redelivered.
    pub ack_wait: Duration,
    /// Redelivery delays.
    pub backoff: Vec<Duration>,
    /// Time without a fetch after which the server deletes the consumer.
    pub inactive_threshold: Duration,
}

impl ConsumerSettings {
    /// The settings a server reported in a consumer's configuration.
    fn from_config(config: &consumer::Config) -> Self {
        let mut filter_subjects = if !config.filter_subjects.is_empty() {
            config.filter_subjects.clone()
        } else if !config.filter_subject.is_empty() {
            vec![config.filter_subject.clone()]
        } else {
            Vec::new()
        };
        filter_subjects.sort();
        Self {
            filter_subjects,
            explicit_ack: matches!(config.ack_policy, AckPolicy::Explicit),
            max_deliver: config.max_deliver,
            ack_wait: config.ack_wait,
            backoff: config.backoff.clone(),
            inactive_threshold: config.inactive_threshold,
        }
    }

    /// Compares these (asked-for) settings with what the server `answered`.
    ///
    /// `ack_wait` is compared only without backoff (with backoff the server derives it from
    /// the first delay).
    ///
    /// # Errors
    ///
    /// [`ConsumerError::ConfigDropped`] naming the first field that differs (R-DIST-4).
    pub fn verify(&self, answered: &Self) -> Result<(), ConsumerError> {
        let dropped = |field, asked: &dyn std::fmt::Debug, got: &dyn std::fmt::Debug| {
            Err(ConsumerError::ConfigDropped {
                field,
                asked: format!("{asked:?}"),
                got: format!("{got:?}"),
            })
        };
        if self.filter_subjects != answered.filter_subjects {
            return dropped(
                "filter_subjects",
                &self.filter_subjects,
                &answered.filter_subjects,
            );
        }
        if self.explicit_ack != answered.explicit_ack {
            return dropped("ack_policy", &"explicit", &"not explicit");
        }
        let unlimited = |m: i64| m <= 0;
        if !(self.max_deliver == answered.max_deliver
            || unlimited(self.max_deliver) && unlimited(answered.max_deliver))
        {
            return dropped("max_deliver", &self.max_deliver, &answered.max_deliver);
        }
        if self.backoff != answered.backoff {
            return dropped("backoff", &self.backoff, &answered.backoff);
        }
        if self.backoff.is_empty() && self.ack_wait != answered.ack_wait {
            return dropped("ack_wait", &self.ack_wait, &answered.ack_wait);
        }
        if self.inactive_threshold != answered.inactive_threshold {
            return dropped(
                "inactive_threshold",
                &self.inactive_threshold,
                &answered.inactive_threshold,
            );
        }
        Ok(())
    }
}

/// A consumer's backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lag {
    /// Records matching the server-side filter not yet delivered (the filter is a superset
    /// of the pattern, so this may count records the re-check will skip).
    pub pending: u64,
    /// Records delivered and not yet acknowledged.
    pub ack_pending: u64,
}

/// What one [`Durable::fetch`] returned.
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
    js: JetStream,
    spec: ConsumerSpec,
    consumer: consumer::PullConsumer,
    settings: ConsumerSettings,
    skipped: AtomicU64,
}

impl std::fmt::Debug for Durable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Durable")
            .field("spec", &self.spec)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

fn map_consumer_error(
    js: &JetStream,
    spec: &ConsumerSpec,
    e: &async_nats::jetstream::stream::ConsumerError,
) -> ConsumerError {
    use async_nats::jetstream::stream::ConsumerErrorKind as K;
    match e.kind() {
        K::JetStream(err) if err.error_code() == ErrorCode::STREAM_NOT_FOUND => {
            ConsumerError::StreamNotFound {
                stream: spec.stream.clone(),
            }
        }
        _ => match e.class() {
            (StreamErrorKind::TimedOut, _) => ConsumerError::TimedOut {
                after: js.request_timeout,
            },
            (StreamErrorKind::Unavailable, _) => ConsumerError::Unavailable {
                detail: e.to_string(),
            },
            (_, code) => ConsumerError::Refused {
                durable: spec.durable.clone(),
                detail: e.to_string(),
                code,
            },
        },
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
    pub async fn durable(&self, spec: ConsumerSpec) -> Result<Durable, ConsumerError> {
        spec.validate()?;
        let existing: Option<consumer::PullConsumer> = match self
            .context
            .get_consumer_from_stream(&spec.durable, &spec.stream)
            .await
        {
            Ok(c) => Some(c),
            Err(e) => match e.kind() {
                async_nats::jetstream::stream::ConsumerErrorKind::JetStream(err)
                    if err.error_code() == ErrorCode::CONSUMER_NOT_FOUND =>
                {
                    None
                }
                _ => return Err(map_consumer_error(self, &spec, &e)),
            },
        };
        let policy = match &existing {
            Some(c) => c.cached_info().config.deliver_policy,
            None => deliver_policy(&spec.start)?,
        };
        self.open(spec, policy).await
    }

    async fn open(
        &self,
        spec: ConsumerSpec,
        policy: DeliverPolicy,
    ) -> Result<Durable, ConsumerError> {
        let consumer: consumer::PullConsumer = self
            .context
            .create_consumer_on_stream(spec.to_config(policy), &spec.stream)
            .await
            .map_err(|e| map_consumer_error(self, &spec, &e))?;
        let answered = ConsumerSettings::from_config(&consumer.cached_info().config);
        spec.settings().verify(&answered)?;
        Ok(Durable {
            js: self.clone(),
            spec,
            consumer,
            settings: answered,
            skipped: AtomicU64::new(0),
        })
    }
}

impl JetStream {
    /// Whether the durable consumer `durable` exists on `stream`.
    pub(crate) async fn consumer_exists(
        &self,
        stream: &str,
        durable: &str,
    ) -> Result<bool, ConsumerError> {
        let spec = ConsumerSpec::new(stream, durable, Pattern::new("x").expect("a valid pattern"));
        match self
            .context
            .get_consumer_from_stream::<consumer::Config, _, _>(durable, stream)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) => match e.kind() {
                async_nats::jetstream::stream::ConsumerErrorKind::JetStream(err)
                    if err.error_code() == ErrorCode::CONSUMER_NOT_FOUND =>
                {
                    Ok(false)
                }
                _ => Err(map_consumer_error(self, &spec, &e)),
            },
        }
    }

    /// Deletes the durable consumer `durable` on `stream`; whether it existed.
    pub(crate) async fn delete_consumer(
        &self,
        stream: &str,
        durable: &str,
    ) -> Result<bool, ConsumerError> {
        let spec = ConsumerSpec::new(stream, durable, Pattern::new("x").expect("a valid pattern"));
        match self
            .context
            .delete_consumer_from_stream(durable, stream)
            .await
        {
            Ok(status) => Ok(status.success),
            Err(e) => {
                use async_nats::jetstream::stream::ConsumerErrorKind as K;
                match e.kind() {
                    K::JetStream(err) if err.error_code() == ErrorCode::CONSUMER_NOT_FOUND => {
                        Ok(false)
                    }
                    _ => Err(map_consumer_error(self, &spec, &e)),
                }
            }
        }
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
    pub fn skipped(&self) -> u64 {
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
    pub async fn fetch(&self, max: usize, wait: Duration) -> Result<Fetched, FetchError> {
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
            let delivery = Delivery::new(message, self.js.request_timeout)?;
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
                    Err(e) => {
                        // The client reports a pull's error status as text only: 409
                        // "Consumer Deleted", or 503 "no responders" on a live connection,
                        // mean nothing serves this consumer's pulls any more.
                        let detail = e.to_string();
                        let lower = detail.to_ascii_lowercase();
                        let gone = lower.contains("consumer deleted")
                            || (lower.contains(": 503") && self.js.is_connected());
                        return Err(if gone {
                            FetchError::ConsumerGone {
                                durable: self.spec.durable.clone(),
                            }
                        } else {
                            unavailable(detail)
                        });
                    }
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

    /// Moves the consumer to `start`: it is deleted and created again with the same durable
    /// name and settings (JetStream cannot change a consumer's start), so unacknowledged
    /// deliveries of every process sharing it are dropped and redelivered from `start`.
    ///
    /// # Errors
    ///
    /// As [`JetStream::durable`].
    pub async fn seek(&mut self, start: StartAt) -> Result<(), ConsumerError> {
        let policy = deliver_policy(&start)?;
        match self
            .js
            .context
            .delete_consumer_from_stream(&self.spec.durable, &self.spec.stream)
            .await
        {
            Ok(_) => {}
            Err(e) => {
                use async_nats::jetstream::stream::ConsumerErrorKind as K;
                let gone = matches!(e.kind(), K::JetStream(err)
                    if err.error_code() == ErrorCode::CONSUMER_NOT_FOUND);
                if !gone {
                    return Err(map_consumer_error(&self.js, &self.spec, &e));
                }
            }
        }
        let spec = self.spec.clone().start(start);
        let reopened = self.js.open(spec, policy).await?;
        self.spec = reopened.spec;
        self.consumer = reopened.consumer;
        self.settings = reopened.settings;
        Ok(())
    }

    /// A failed info request as an [`InfoError`], by its kind.
    fn info_error(&self, e: &async_nats::jetstream::context::ConsumerInfoError) -> InfoError {
        use async_nats::jetstream::context::ConsumerInfoErrorKind as K;
        if e.kind() == K::NotFound {
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

    /// The consumer's backlog, as the server reports it now.
    ///
    /// # Errors
    ///
    /// [`InfoError`].
    pub async fn lag(&self) -> Result<Lag, InfoError> {
        let mut consumer = self.consumer.clone();
        let info = consumer.info().await.map_err(|e| self.info_error(&e))?;
        Ok(Lag {
            pending: info.num_pending,
            ack_pending: info.num_ack_pending as u64,
        })
    }

    /// Deletes the consumer on the server (for every process sharing it). Returns whether
    /// it existed.
    ///
    /// # Errors
    ///
    /// [`ConsumerError::Refused`] or [`ConsumerError::TimedOut`].
    pub async fn delete(self) -> Result<bool, ConsumerError> {
        match self
            .js
            .context
            .delete_consumer_from_stream(&self.spec.durable, &self.spec.stream)
            .await
        {
            Ok(status) => Ok(status.success),
            Err(e) => {
                use async_nats::jetstream::stream::ConsumerErrorKind as K;
                match e.kind() {
                    K::JetStream(err) if err.error_code() == ErrorCode::CONSUMER_NOT_FOUND => {
                        Ok(false)
                    }
                    _ => Err(map_consumer_error(&self.js, &self.spec, &e)),
                }
            }
        }
    }
}

/// One delivery of a stored record to a durable consumer.
pub struct Delivery {
    message: async_nats::jetstream::Message,
    topic: String,
    headers: Headers,
    id: Option<MessageId>,
    sequence: u64,
    delivered: u64,
    published: SystemTime,
    request_timeout: Duration,
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
    fn new(
        message: async_nats::jetstream::Message,
        request_timeout: Duration,
    ) -> Result<Self, FetchError> {
        let info = message.info().map_err(|e| FetchError::Unavailable {
            detail: format!("delivery without JetStream metadata: {e}"),
        })?;
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
            topic: message.subject.to_string(),
            message,
            headers,
            id,
            sequence,
            delivered,
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

    /// The record's topic (its NATS subject).
    #[must_use]
    pub fn topic(&self) -> &str {
        &self.topic
    }

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

    /// Finishes the delivery (handled or dead-lettered) and waits for the server's
    /// confirmation: it will not be delivered again.
    ///
    /// # Errors
    ///
    /// [`AckError`]; the delivery may then come again after the ack wait.
    pub async fn ack(&self) -> Result<(), AckError> {
        self.finish(AckKind::Ack).await
    }

    /// Asks for redelivery, after `delay` when given (else at once).
    ///
    /// # Errors
    ///
    /// [`AckError`].
    pub async fn nak(&self, delay: Option<Duration>) -> Result<(), AckError> {
        self.finish(AckKind::Nak(delay)).await
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ConsumerSpec {
        ConsumerSpec::new("orders", "billing", Pattern::new("a.#").expect("valid"))
            .max_deliver(5)
            .ack_wait(Duration::from_secs(10))
            .inactive_threshold(Duration::from_secs(600))
    }

    /// A consumer config as a 2.9 server answers it: no `filter_subjects` field at all.
    const OLD_SERVER_ANSWER: &str = r#"{
        "durable_name": "billing",
        "deliver_policy": "all",
        "ack_policy": "explicit",
        "ack_wait": 10000000000,
        "max_deliver": 5,
        "replay_policy": "instant",
        "inactive_threshold": 600000000000
    }"#;

    #[test]
    fn a_server_answer_without_filter_subjects_is_refused() {
        let config: consumer::Config =
            serde_json::from_str(OLD_SERVER_ANSWER).expect("consumer config JSON");
        let answered = ConsumerSettings::from_config(&config);
        let err = spec().settings().verify(&answered).expect_err("dropped");
        // R-DIST-4: the dropped field is named in a typed error.
        assert!(
            matches!(
                &err,
                ConsumerError::ConfigDropped {
                    field: "filter_subjects",
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.kind(), tidings::StreamErrorKind::Unsupported);
    }

    #[test]
    fn every_verified_field_is_compared() {
        let asked = spec().backoff([Duration::from_secs(1)]).settings();
        assert!(asked.verify(&asked).is_ok());
        type Change = Box<dyn Fn(&mut ConsumerSettings)>;
        let cases: Vec<(&str, Change)> = vec![
            ("filter_subjects", Box::new(|s| s.filter_subjects.clear())),
            ("ack_policy", Box::new(|s| s.explicit_ack = false)),
            ("max_deliver", Box::new(|s| s.max_deliver = -1)),
            ("backoff", Box::new(|s| s.backoff.clear())),
            (
                "inactive_threshold",
                Box::new(|s| s.inactive_threshold = Duration::ZERO),
            ),
        ];
        for (field, change) in cases {
            let mut answered = asked.clone();
            change(&mut answered);
            let err = asked.verify(&answered).expect_err(field);
            // R-DIST-4
            assert!(
                matches!(&err, ConsumerError::ConfigDropped { field: f, .. } if *f == field),
                "{field}: {err:?}"
            );
        }
        let plain = spec().settings();
        let mut answered = plain.clone();
        answered.ack_wait = Duration::from_secs(30);
        // R-DIST-4
        assert!(matches!(
            plain.verify(&answered),
            Err(ConsumerError::ConfigDropped {
                field: "ack_wait",
                ..
            })
        ));
    }

    #[test]
    fn bad_options_are_refused() {
        let p = || Pattern::new("a").expect("valid");
        let bad = [
            ConsumerSpec::new("s", "d", p()).max_deliver(0),
            ConsumerSpec::new("s", "d", p()).ack_wait(Duration::ZERO),
            ConsumerSpec::new("s", "d", p()).inactive_threshold(Duration::ZERO),
            ConsumerSpec::new("s", "d", p()).backoff([Duration::from_secs(1)]),
            ConsumerSpec::new("s", "d", p())
                .max_deliver(2)
                .backoff([Duration::from_secs(1); 2]),
            ConsumerSpec::new("s", "d", p()).ack_wait(Duration::MAX),
        ];
        for spec in bad {
            assert!(
                matches!(spec.validate(), Err(ConsumerError::InvalidOption { .. })),
                "{spec:?}"
            );
        }
        assert!(matches!(
            ConsumerSpec::new("s.x", "d", p()).validate(),
            Err(ConsumerError::InvalidName { .. })
        ));
    }

    #[test]
    fn start_maps_to_deliver_policy() {
        assert!(matches!(
            deliver_policy(&StartAt::Earliest),
            Ok(DeliverPolicy::All)
        ));
        assert!(matches!(
            deliver_policy(&StartAt::Offset(0)),
            Ok(DeliverPolicy::All)
        ));
        assert!(matches!(
            deliver_policy(&StartAt::Latest),
            Ok(DeliverPolicy::New)
        ));
        assert!(matches!(
            deliver_policy(&StartAt::Offset(7)),
            Ok(DeliverPolicy::ByStartSequence { start_sequence: 7 })
        ));
        assert!(matches!(
            deliver_policy(&StartAt::Time(SystemTime::UNIX_EPOCH)),
            Ok(DeliverPolicy::ByStartTime { .. })
        ));
    }
}
