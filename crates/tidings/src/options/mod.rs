//! Subscription options: plain data with defaults (R-BP-1, R-DEL-2, R-ORD-3, R-ORD-4, R-RT-3).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::ConfigError;
use crate::filter::HeaderFilter;
use crate::message::Message;
use crate::rate_limit::RateLimit;
use crate::retry::Retry;
use crate::topic::Topic;

/// What `offer` does when the queue is full (R-BP-1). There is no unbounded queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Overflow {
    /// Refuse the new message; it goes to the DLQ as `Overflow` and the publish report
    /// lists the refusal. The publisher never stalls. The default.
    #[default]
    Reject,
    /// Evict the oldest queued message of the lowest priority to make room; the eviction is
    /// counted (`dead_lettered.dropped_oldest`) and, with `keep`, dead-lettered as
    /// `DroppedOldest`. The new message is always accepted.
    DropOldest {
        /// Keep evicted messages in the DLQ.
        keep: bool,
    },
    /// The publisher waits up to `timeout` for room, then the message is refused as
    /// `Overflow` (and dead-lettered like `Reject`). A blocked publisher holds no broker
    /// lock: other publishers and other subscriptions are unaffected. Closing the
    /// subscription or broker wakes it with a `Closed` refusal. `Duration::MAX` waits
    /// without a deadline. Two offers never wait, and refuse at once as `Overflow`: a
    /// delayed message released by the broker's scheduler (R-TIME-2), and a publish made
    /// while the manual driver delivers on that thread (R-EXE-5).
    Block {
        /// Longest wait for room.
        timeout: Duration,
    },
}

/// Delivery semantics with respect to handler failure (R-DEL-1, R-DEL-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum DeliveryMode {
    /// Acknowledge only after the handler succeeds; retry by policy, then dead-letter.
    #[default]
    AtLeastOnce,
    /// The message is removed before the handler runs and never redelivered. A failed call
    /// is dead-lettered as `RetriesExhausted { attempts: 1 }` so it is still counted.
    AtMostOnce,
}

/// How many handler calls of one subscription may run at once (R-CORE-3, R-ORD-3, R-ORD-4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Concurrency {
    /// One dispatcher: max active == 1, priority-then-FIFO order. The default.
    #[default]
    Serial,
    /// `n` dispatchers, each owning the keys that hash to it (stable FNV-1a hash). Order
    /// holds per key — publish order, even when the key's messages differ in priority
    /// (R-ORD-5); priority orders different keys and unkeyed messages within a lane. Lanes
    /// run in parallel; messages without a key go to lane 0.
    Lanes(usize),
    /// Up to `max_in_flight` handler calls at once, never two of the same key: the next
    /// message whose key is not in flight (or waiting to retry) is dispatched, so a
    /// retrying key blocks only itself. Messages without a key form one ordered key.
    PerKey {
        /// Most handler calls in flight at once (≥ 1).
        max_in_flight: usize,
    },
}

impl Concurrency {
    /// Number of dispatchers (worker slots) this mode needs.
    pub(crate) fn workers(self) -> usize {
        match self {
            Concurrency::Serial => 1,
            Concurrency::Lanes(n) => n,
            Concurrency::PerKey { max_in_flight } => max_in_flight,
        }
    }
}

/// A predicate over the message, evaluated on offer (R-RT-3). Must be quick; it runs on
/// the publisher's thread with no broker lock held.
///
/// A panic inside it is contained (R-DEL-1): the publisher does not unwind; the message
/// counts as accepted and is dead-lettered at once as `Rejected` with error
/// `"predicate panicked: …"`.
#[derive(Clone)]
pub struct Predicate(Arc<dyn Fn(&Message) -> bool + Send + Sync>);

impl Predicate {
    /// Wrap a closure.
    pub fn new(f: impl Fn(&Message) -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }
    pub(crate) fn test(&self, message: &Message) -> bool {
        (self.0)(message)
    }
}

impl fmt::Debug for Predicate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Predicate(..)")
    }
}

/// Dead-letter queue settings (R-DEL-4). Built with [`new`](Self::new) (or `default()`)
/// and its setters; the fields are readable, and new ones may be added without a break
/// (`#[non_exhaustive]`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetterOptions {
    /// Entries kept; the oldest is evicted (and counted) beyond it. Default 1024.
    pub capacity: usize,
    /// Also publish each dead letter to this topic (a valid publish topic, checked at
    /// subscribe: no wildcards, no empty words), with headers `tidings-dlq-reason`,
    /// `tidings-dlq-subscription`, `tidings-dlq-original-topic` and
    /// `tidings-dlq-original-id`, so it can be subscribed to.
    pub topic: Option<String>,
    /// Keep messages left undelivered at unsubscribe/close as `Shutdown` entries.
    pub keep_shutdown: bool,
}

impl Default for DeadLetterOptions {
    fn default() -> Self {
        Self {
            capacity: 1024,
            topic: None,
            keep_shutdown: true,
        }
    }
}

impl DeadLetterOptions {
    /// The defaults: 1024 entries, no dead-letter topic, `Shutdown` entries kept.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
    /// Entries kept; the oldest is evicted (and counted) beyond it.
    #[must_use]
    pub fn capacity(mut self, entries: usize) -> Self {
        self.capacity = entries;
        self
    }
    /// Also publish each dead letter to `topic` (see the field).
    #[must_use]
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }
    /// Keep (or not) messages left undelivered at unsubscribe/close as `Shutdown` entries.
    #[must_use]
    pub fn keep_shutdown(mut self, keep: bool) -> Self {
        self.keep_shutdown = keep;
        self
    }
}

/// Everything a subscription can be asked to do. Build with [`new`](Self::new) (or
/// `default()`) and the setters; the fields stay readable.
///
/// ```
/// # use tidings::*; use std::time::Duration;
/// let opts = SubscribeOptions::new()
///     .capacity(128)
///     .retry(Retry::fixed(Duration::from_millis(10), 3));
/// assert_eq!(opts.capacity, 128);
/// ```
///
/// A new option is not a breaking change: the type is `#[non_exhaustive]`, so code outside
/// tidings cannot build it with a struct literal (not even with `..Default::default()`),
/// only through the setters.
///
/// ```compile_fail
/// # use tidings::SubscribeOptions;
/// let opts = SubscribeOptions { capacity: 128, ..Default::default() };
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SubscribeOptions {
    /// A name for diagnostics and thread names (defaults to the id). Checked at subscribe:
    /// 1 to [`MAX_NAME_LEN`] bytes, no control characters (a NUL byte cannot be part of a
    /// thread name).
    pub name: Option<String>,
    /// Queue capacity (≥ 1). Default 1024.
    pub capacity: usize,
    /// What happens when the queue is full. Default `Reject`.
    pub overflow: Overflow,
    /// Retry policy. Default exponential from 100 ms, ×2, 5 attempts.
    pub retry: Retry,
    /// At-least-once (default) or at-most-once.
    pub delivery: DeliveryMode,
    /// Dispatcher concurrency. Default `Serial`.
    pub concurrency: Concurrency,
    /// Predicate filter, evaluated on offer.
    pub predicate: Option<Predicate>,
    /// Declarative header filter, evaluated on offer.
    pub header_filter: Option<HeaderFilter>,
    /// Default time-to-live for messages without their own (R-TIME-1). One so long that
    /// the expiry is not representable (`Duration::MAX`) means "never expires".
    pub ttl: Option<Duration>,
    /// Dead-letter queue settings.
    pub dead_letter: DeadLetterOptions,
    /// At most so many handler starts in any window of one period, on the broker's clock
    /// (R-PAT-2; see [`RateLimit`]). Default: none.
    pub rate_limit: Option<RateLimit>,
}

impl Default for SubscribeOptions {
    fn default() -> Self {
        Self {
            name: None,
            capacity: 1024,
            overflow: Overflow::Reject,
            retry: Retry::default(),
            delivery: DeliveryMode::AtLeastOnce,
            concurrency: Concurrency::Serial,
            predicate: None,
            header_filter: None,
            ttl: None,
            dead_letter: DeadLetterOptions::default(),
            rate_limit: None,
        }
    }
}

impl SubscribeOptions {
    /// The defaults (see each field).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
    /// A name for diagnostics and thread names (checked at subscribe, see the field).
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
    /// Queue capacity (≥ 1, checked at subscribe).
    #[must_use]
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity;
        self
    }
    /// What happens when the queue is full.
    #[must_use]
    pub fn overflow(mut self, overflow: Overflow) -> Self {
        self.overflow = overflow;
        self
    }
    /// The retry policy.
    #[must_use]
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }
    /// At-least-once or at-most-once.
    #[must_use]
    pub fn delivery(mut self, delivery: DeliveryMode) -> Self {
        self.delivery = delivery;
        self
    }
    /// Dispatcher concurrency.
    #[must_use]
    pub fn concurrency(mut self, concurrency: Concurrency) -> Self {
        self.concurrency = concurrency;
        self
    }
    /// A predicate filter, evaluated on offer.
    #[must_use]
    pub fn predicate(mut self, predicate: Predicate) -> Self {
        self.predicate = Some(predicate);
        self
    }
    /// A declarative header filter, evaluated on offer.
    #[must_use]
    pub fn header_filter(mut self, filter: HeaderFilter) -> Self {
        self.header_filter = Some(filter);
        self
    }
    /// Default time-to-live for messages without their own (see the field).
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }
    /// Dead-letter queue settings.
    #[must_use]
    pub fn dead_letter(mut self, dead_letter: DeadLetterOptions) -> Self {
        self.dead_letter = dead_letter;
        self
    }
    /// At most `limit.limit()` handler starts in any window of `limit.per()`, on the
    /// broker's clock (R-PAT-2; see [`RateLimit`]).
    #[must_use]
    pub fn rate_limit(mut self, limit: RateLimit) -> Self {
        self.rate_limit = Some(limit);
        self
    }
}

/// Largest number of lanes or per-key slots one subscription may ask for.
pub const MAX_WORKERS_PER_SUBSCRIPTION: usize = 1024;

/// Longest name in bytes: of a subscription ([`SubscribeOptions::name`]), and of a stream,
/// durable subscription or dedup store ([`durable::check_name`](crate::durable::check_name)).
pub const MAX_NAME_LEN: usize = 200;

fn check_subscription_name(name: &str) -> Result<(), ConfigError> {
    // The expected text is a `&'static str`: it spells the constant out.
    const _: () = assert!(MAX_NAME_LEN == 200, "update the text below");
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(ConfigError::invalid(
            "name",
            format!("{} bytes", name.len()),
            "1 to 200 bytes",
        ));
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(ConfigError::invalid(
            "name",
            format!("{name:?} (contains {c:?})"),
            "no control characters (NUL, newline, ...)",
        ));
    }
    Ok(())
}

impl SubscribeOptions {
    /// Refuse out-of-range or inconsistent options (R-LIM-1).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(name) = &self.name {
            check_subscription_name(name)?;
        }
        if let Some(topic) = &self.dead_letter.topic {
            Topic::new(topic).map_err(|e| {
                ConfigError::invalid(
                    "dead_letter.topic",
                    format!("{topic:?} ({e})"),
                    "a valid publish topic (no wildcards)",
                )
            })?;
        }
        if self.capacity == 0 {
            return Err(ConfigError::invalid("capacity", "0".into(), "at least 1"));
        }
        let (setting, n) = match self.concurrency {
            Concurrency::Serial => ("concurrency", 1),
            Concurrency::Lanes(n) => ("concurrency.lanes", n),
            Concurrency::PerKey { max_in_flight } => ("concurrency.max_in_flight", max_in_flight),
        };
        if n == 0 || n > MAX_WORKERS_PER_SUBSCRIPTION {
            return Err(ConfigError::invalid(
                setting,
                n.to_string(),
                "between 1 and 1024",
            ));
        }
        if let Overflow::Block { timeout } = self.overflow
            && timeout.is_zero()
        {
            return Err(ConfigError::invalid(
                "overflow.block.timeout",
                "0s".into(),
                "a non-zero timeout (use Reject to never wait)",
            ));
        }
        if self.ttl.is_some_and(|t| t.is_zero()) {
            return Err(ConfigError::invalid(
                "ttl",
                "0s".into(),
                "a non-zero duration",
            ));
        }
        if let Some(f) = &self.header_filter {
            f.validate().map_err(|e| {
                ConfigError::invalid("header_filter", e.to_string(), "a valid header filter")
            })?;
        }
        self.retry.validate()
    }
}

mod settings;
mod summary;
pub(crate) use settings::Settings;
pub use summary::OptionsSummary;
