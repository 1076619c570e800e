//! A subscription's options in words, for snapshots and the dashboard (R-OPS-1).

use serde::{Deserialize, Serialize};

use crate::options::{Concurrency, DeliveryMode, Overflow, SubscribeOptions};
use crate::retry::Retry;

/// A subscription's options, summarised (R-OPS-1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct OptionsSummary {
    /// Queue capacity (a durable subscription's window).
    pub capacity: usize,
    /// Overflow policy, e.g. `reject`, `drop_oldest(keep)`, `block(250ms)`.
    pub overflow: String,
    /// Retry policy, e.g. `none`, `fixed(3 × 100ms)`, `exponential(5 × 100ms ×2 ≤30s)`.
    pub retry: String,
    /// Concurrency, e.g. `serial`, `lanes(4)`, `per_key(8)`.
    pub concurrency: String,
    /// `at_least_once` or `at_most_once`.
    pub delivery: String,
    /// Time-to-live applied to every message, in ms.
    pub ttl_ms: Option<u64>,
    /// Dead-letter queue capacity.
    pub dlq_capacity: usize,
    /// Topic dead letters are forwarded to, if any.
    pub dlq_topic: Option<String>,
    /// True when a predicate or header filter is set.
    pub filtered: bool,
    /// The rate limit, e.g. `3 per 1s` (R-PAT-2); `None` without one.
    #[serde(default)]
    pub rate_limit: Option<String>,
}

impl OptionsSummary {
    pub(crate) fn of(o: &SubscribeOptions) -> Self {
        let overflow = match o.overflow {
            Overflow::Reject => "reject".to_owned(),
            Overflow::DropOldest { keep: true } => "drop_oldest(keep)".to_owned(),
            Overflow::DropOldest { keep: false } => "drop_oldest".to_owned(),
            Overflow::Block { timeout } => format!("block({timeout:?})"),
        };
        let retry = match &o.retry {
            Retry::None => "none".to_owned(),
            Retry::Fixed {
                delay,
                max_attempts,
            } => format!("fixed({max_attempts} × {delay:?})"),
            Retry::Exponential {
                initial,
                multiplier,
                max,
                max_attempts,
                ..
            } => format!("exponential({max_attempts} × {initial:?} ×{multiplier} ≤{max:?})"),
            Retry::Custom(_) => "custom".to_owned(),
            // Refused at subscribe; never seen on a live subscription.
            Retry::Inconsistent(_) => "inconsistent".to_owned(),
        };
        let concurrency = match o.concurrency {
            Concurrency::Serial => "serial".to_owned(),
            Concurrency::Lanes(n) => format!("lanes({n})"),
            Concurrency::PerKey { max_in_flight } => format!("per_key({max_in_flight})"),
        };
        let delivery = match o.delivery {
            DeliveryMode::AtLeastOnce => "at_least_once",
            DeliveryMode::AtMostOnce => "at_most_once",
        };
        Self {
            capacity: o.capacity,
            overflow,
            retry,
            concurrency,
            delivery: delivery.to_owned(),
            ttl_ms: o.ttl.map(|t| t.as_millis() as u64),
            dlq_capacity: o.dead_letter.capacity,
            dlq_topic: o.dead_letter.topic.clone(),
            filtered: o.predicate.is_some() || o.header_filter.is_some(),
            rate_limit: o
                .rate_limit
                .map(|r| format!("{} per {:?}", r.limit(), r.per())),
        }
    }
}
