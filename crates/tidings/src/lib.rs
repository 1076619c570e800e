//! # tidings
//!
//! An in-process publish-subscribe broker for Rust services, built around the
//! **subscription**: each one has its own filter, bounded queue, dispatcher, dead-letter
//! queue and counters, so a slow or failing subscriber hurts only itself.
//!
//! # Ordering
//! Per subscription: priority first, then publish order; each publisher's messages arrive
//! in that publisher's order; retries happen in place, so a failing message blocks those
//! behind it (or only its key, with per-key concurrency) until it succeeds or is
//! dead-lettered.
//!
//! # Delivery
//! At-least-once with respect to handler failure: errors and panics are retried by the
//! subscription's [`Retry`] policy, then dead-lettered with the reason. At-most-once on
//! request. Every message offered to a subscription is accounted for by its
//! [`SubscriptionStats`] (R-DEL-6).
//!
//! # Backpressure
//! Every queue is bounded with an explicit [`Overflow`] policy; the default refuses and
//! dead-letters, so a publisher never stalls.
//!
//! # Closing
//! [`Broker::close`] drains with a deadline, interrupts retry waits, joins every thread and
//! reports what was left undelivered. Dropping a [`Subscription`] unsubscribes it; dropping
//! the last [`Broker`] closes it.
//!
//! # Failure
//! Bad input — topics, patterns, sizes, options — is refused with a typed error; nothing
//! panics on user input. Handler panics are caught and treated as errors.
//!
//! # Testing
//! With [`Driver::Manual`] and a [`ManualClock`], [`Broker::run_until_idle`] delivers in the
//! caller's thread and time moves only when the test says so: retries, TTL and delays are
//! asserted exactly, without sleeps.

#![warn(missing_docs)]

#[cfg(feature = "tokio")]
mod async_handler;
mod broker;
mod clock;
mod dedup;
mod dlq;
pub mod driver;
pub mod durable;
pub mod embedded;
mod error;
pub mod filter;
mod handler;
mod limits;
mod message;
mod message_pool;
pub mod ops;
mod options;
mod queue;
mod report;
mod request;
mod retry;
mod route_cache;
mod scheduler;
mod stats;
mod subscription;
mod sync;
mod telemetry;
pub mod topic;
pub mod transport;

#[cfg(feature = "tokio")]
pub use async_handler::{AsyncHandler, HandlerFuture};
pub use broker::{Broker, BrokerBuilder, WeakBroker};
pub use clock::{Clock, ClockWaiter, ManualClock, SystemClock};
pub use dedup::{DedupStore, Deduplicating, InMemoryDedupStore};
pub use dlq::{DeadLetter, DeadLetterReason};
pub use driver::Driver;
pub use durable::{
    CommitFailed, DurableDeadLetter, DurableSubscription, StartAt, Stream, StreamConfig,
    StreamError, StreamErrorKind,
};
pub use embedded::{
    DEFAULT_COMMIT_EVERY, DEFAULT_RETENTION_INTERVAL, DurableDedupStore, EmbeddedStreamOptions,
    offline,
};
pub use error::{ConfigError, PublishError, SubscribeError, TransportError};
pub use filter::{HeaderFilter, HeaderLookup};
pub use handler::{FnHandler, Handler, HandlerError, IntoHandlerResult, handler_fn};
pub use limits::Limits;
pub use message::{Headers, Message, MessageBuilder, MessageId, MessageParts, Priority};
pub use options::{
    Concurrency, DeadLetterOptions, DeliveryMode, MAX_NAME_LEN, MAX_WORKERS_PER_SUBSCRIPTION,
    Overflow, Predicate, SubscribeOptions,
};
pub use report::{CloseReport, PublishReport, Undelivered};
pub use request::RequestError;
pub use retry::{InconsistentRetry, Retry, RetryPolicy};
pub use stats::{DeadLetterCounts, RefusedCounts, SubscriptionStats};
pub use subscription::handle::RedriveReport;
pub use subscription::shell::DLQ_REASON_HEADER;
pub use subscription::{Refusal, Subscription, SubscriptionId};
pub use tidings_log::{Fsync, LogConfig, RecoveryReport, Retention, RetentionReport};
pub use topic::{Pattern, Topic, TopicError};
