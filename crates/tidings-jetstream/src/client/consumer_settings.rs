//! [`ConsumerSettings`]: the settings of a durable consumer as asked for and as the server
//! reported them, compared field by field (R-DIST-4).

use std::time::Duration;

use async_nats::jetstream::consumer::{self, AckPolicy};

use crate::error::ConsumerError;

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
    pub(crate) fn from_config(config: &consumer::Config) -> Self {
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
