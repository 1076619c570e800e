//! Durable pull consumers: the cursor of a durable subscription on JetStream.
//!
//! # Filtering
//! The consumer's `filter_subjects` are the [superset](crate::subject::filter_subjects) of
//! its tidings pattern; [`Durable::fetch`](super::durable::Durable::fetch) re-checks every
//! delivered topic with [`Pattern::matches`] (RabbitMQ-exact semantics, R-RT-1),
//! acknowledges what does not match (it is not this subscription's) and counts it as
//! skipped.
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

use std::time::Duration;

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::consumer::{self, AckPolicy, DeliverPolicy, pull};
use async_nats::jetstream::stream::{ConsumerCreateStrictError, ConsumerCreateStrictErrorKind};
use tidings::{Pattern, StartAt, StreamErrorKind};

use super::consumer_settings::ConsumerSettings;
use crate::classify::Classify;
use crate::client::stream_spec::check_nats_name;
use crate::connection::connect::JetStream;
use crate::error::ConsumerError;
use crate::subject::filter_subjects;

/// Default time a delivery may stay unacknowledged before it is redelivered.
pub const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);

/// Default time after which the server deletes a consumer nobody fetches from.
pub const DEFAULT_INACTIVE_THRESHOLD: Duration = Duration::from_secs(24 * 60 * 60);

/// How a durable consumer is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct ConsumerSpec {
    pub(crate) stream: String,
    pub(crate) durable: String,
    pub(crate) pattern: Pattern,
    pub(crate) start: StartAt,
    pub(crate) max_deliver: Option<u32>,
    pub(crate) ack_wait: Duration,
    pub(crate) backoff: Vec<Duration>,
    pub(crate) inactive_threshold: Duration,
    /// Prepended to every filter subject and stripped from every delivered subject (the
    /// durable backend's streams keep topics under a subject namespace of their own).
    pub(crate) subject_prefix: String,
    /// The keyed records' namespace (`<keyed_prefix><partition>.<topic>`): stripped from
    /// delivered subjects too.
    pub(crate) keyed_prefix: String,
    /// The prefixes filter subjects get (empty: `subject_prefix` alone).
    pub(crate) filter_prefixes: Vec<String>,
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
            subject_prefix: String::new(),
            keyed_prefix: String::new(),
            filter_prefixes: Vec::new(),
        }
    }

    /// Where a *new* consumer starts; an existing durable resumes where it was (use
    /// [`Durable::seek`](super::durable::Durable::seek) to move it). Offsets are stream sequences (the first is 1;
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

    /// Topics are stored under `prefix` (`<prefix><topic>`): filters get it, delivered
    /// subjects lose it.
    pub(crate) fn subject_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.subject_prefix = prefix.into();
        self
    }

    /// Keyed records are stored under `keyed` (`<keyed><partition>.<topic>`), and the
    /// filter subjects are the pattern's under each of `filters` (in place of
    /// `subject_prefix` alone).
    pub(crate) fn namespaces_of(
        mut self,
        keyed: impl Into<String>,
        filters: impl IntoIterator<Item = String>,
    ) -> Self {
        self.keyed_prefix = keyed.into();
        self.filter_prefixes = filters.into_iter().collect();
        self
    }

    /// The durable name, changed.
    pub(crate) fn renamed(mut self, durable: impl Into<String>) -> Self {
        self.durable = durable.into();
        self
    }

    /// What a delivered subject loses: the unkeyed and the keyed prefix.
    pub(crate) fn namespaces(&self) -> (&str, &str) {
        (&self.subject_prefix, &self.keyed_prefix)
    }

    /// The settings the server must report back for this spec.
    #[must_use]
    pub fn settings(&self) -> ConsumerSettings {
        let one = [self.subject_prefix.clone()];
        let prefixes: &[String] = if self.filter_prefixes.is_empty() {
            &one
        } else {
            &self.filter_prefixes
        };
        let mut filter_subjects: Vec<String> = filter_subjects(&self.pattern)
            .into_iter()
            .flat_map(|s| prefixes.iter().map(move |p| format!("{p}{s}")))
            .collect();
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

    pub(crate) fn validate(&self) -> Result<(), ConsumerError> {
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

    pub(crate) fn to_config(&self, deliver_policy: DeliverPolicy) -> pull::Config {
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
            // No server-side cap on unacknowledged messages (the default is 1,000): a pull
            // consumer gets only what it asks for, and tidings' feeder bounds what it holds
            // itself (its window plus the delayed messages it holds until due). A cap here
            // would let 1,000 delayed messages hold back every message due now behind them.
            max_ack_pending: -1,
            ..Default::default()
        }
    }
}

pub(crate) fn deliver_policy(start: &StartAt) -> Result<DeliverPolicy, ConsumerError> {
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

pub(crate) fn map_consumer_error(
    js: &JetStream,
    spec: &ConsumerSpec,
    e: &async_nats::jetstream::stream::ConsumerError,
) -> ConsumerError {
    use async_nats::jetstream::stream::ConsumerErrorKind as K;
    let stream_gone =
        matches!(e.kind(), K::JetStream(err) if err.error_code() == ErrorCode::STREAM_NOT_FOUND);
    consumer_error(js, spec, stream_gone, e)
}

/// A failed strict create as a [`ConsumerError`], by its kind.
pub(crate) fn map_create_error(
    js: &JetStream,
    spec: &ConsumerSpec,
    e: &ConsumerCreateStrictError,
) -> ConsumerError {
    let stream_gone = matches!(
        e.kind(),
        ConsumerCreateStrictErrorKind::JetStream(err) if err.error_code() == ErrorCode::STREAM_NOT_FOUND
    );
    consumer_error(js, spec, stream_gone, e)
}

/// One mapping for both: the stream is gone, or the error's kind decides.
fn consumer_error(
    js: &JetStream,
    spec: &ConsumerSpec,
    stream_gone: bool,
    e: &impl Classify,
) -> ConsumerError {
    if stream_gone {
        return ConsumerError::StreamNotFound {
            stream: spec.stream.clone(),
        };
    }
    match e.class() {
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

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

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
