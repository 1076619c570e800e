//! # tidings
//!
//! An in-process publish-subscribe broker for Rust services, built around the
//! **subscription**: each one has its own filter, bounded queue, dispatcher, dead-letter
//! queue and counters, so a slow or failing subscriber hurts only itself.
//!
//! ```
//! use std::time::Duration;
//! use tidings::{Broker, HandlerError, Message, Overflow, Retry, SubscribeOptions};
//!
//! let broker = Broker::new(); // thread driver, system clock
//! let billing = broker.subscribe(
//!     "orders.*",
//!     SubscribeOptions::new()
//!         .capacity(1024)
//!         .overflow(Overflow::Reject)
//!         .retry(Retry::exponential(Duration::from_millis(100), 2.0).max_attempts(5)),
//!     |msg: &Message| -> Result<(), HandlerError> {
//!         assert_eq!(msg.payload().as_ref(), b"42");
//!         Ok(())
//!     },
//! )?;
//! let report = broker.publish(Message::to("orders.created").key("order-42").payload("42"))?;
//! assert_eq!(report.accepted, 1);
//! let left = broker.close(Duration::from_secs(5)); // drains, joins, reports what was left
//! assert!(left.is_clean());
//! assert_eq!(billing.stats().delivered, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Features
//! None is on by default; each item that needs one says so on its page.
//! - `tokio`: the [`Driver::Tokio`] driver, async handlers ([`AsyncHandler`],
//!   [`Broker::subscribe`] with one, [`Broker::publish_async`], [`Broker::close_async`]), the
//!   [`Timeout`] decorator, and the async forms of [`Deduplicating`] and [`Typed`];
//!   pulls in `tokio` (features rt, sync, time, macros).
//! - `metrics`: [`Broker::export_metrics`] and [`ops::metrics`] (names, labels) through
//!   the `metrics` facade, plus the processing-time histogram; pulls in `metrics`.
//! - `otel`: a W3C `traceparent` header carried from publisher to handler (see
//!   [`ops::trace`]); no dependency.
//! - `serde`: typed payloads with the [`Json`] codec — [`MessageBuilder::json`],
//!   [`Message::json`], [`json_handler`] (for [`Broker::subscribe`], on every target, sync
//!   or async); pulls in `serde_json` (`serde` itself is always a dependency). The
//!   format-agnostic [`Codec`] traits and the [`Typed`] adaptor need no feature.
//!
//! # Typed payloads
//! A payload is bytes on every backend; a [`Codec`] carries your own types in it and names
//! the format in the [`CONTENT_TYPE_HEADER`] header (R-PAT-3). A payload that does not
//! decode is dead-lettered `Rejected` with the decoder's error — never retried, never a
//! panic.
//!
//! ```
//! # #[cfg(feature = "serde")]
//! # {
//! use tidings::{Broker, Driver, Message, SubscribeOptions, json_handler};
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Order { id: u64 }
//!
//! let broker = Broker::builder().driver(Driver::Manual).build()?;
//! let billing = broker.subscribe("orders.*", SubscribeOptions::default(),
//!     json_handler(|order: Order, _msg: &Message| {
//!         assert_eq!(order.id, 42);
//!         Ok(())
//!     }))?;
//! broker.publish(Message::to("orders.created").json(&Order { id: 42 })?)?;
//! broker.publish(Message::to("orders.created").payload("not json"))?;
//! broker.run_until_idle();
//! assert_eq!(billing.stats().delivered, 1);
//! assert_eq!(billing.dead_letters()[0].attempts, 1); // Rejected at once
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Decorators
//! Handlers wrap: [`Deduplicating`] skips ids already processed (R-DEL-5), [`Timeout`]
//! (feature `tokio`) cancels an async attempt that takes too long and retries it,
//! [`Typed`] decodes the payload first; they compose (R-PAT-2). A rate limit is the
//! subscription's own ([`SubscribeOptions::rate_limit`] with a [`RateLimit`]): at most N
//! handler starts in any window of one period, on the broker's clock, without holding a
//! thread — a message without room waits at the head of its lane, as
//! [`HandlerError::defer_until`] and [`HandlerError::defer_for`] do.
//! There is no circuit breaker yet: [`RateLimit`]'s docs say why, and how to write one on
//! [`HandlerError::defer_for`].
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
//!
//! # Topics and patterns
//! R-RT-1, R-RT-2, R-LIM-1.
//!
//! A **topic** names what a message is about: one or more *words* separated by `.`, for example
//! `orders.eu.created`. A **pattern** is what a subscription listens to: the same syntax, where a
//! word may also be one of two wildcards, with AMQP 0-9-1 topic-exchange semantics:
//!
//! * `*` matches exactly one word;
//! * `#` matches zero or more words, and may appear anywhere (`#`, `a.#`, `#.b`, `a.#.b`, ...).
//!
//! Wildcards are only recognised as whole words: `a*` or `#b` are refused, not treated literally.
//!
//! ## Syntax and limits
//!
//! Both [`Topic`] and [`Pattern`] obey the same rules (checked in this order; the first violation
//! found, scanning left to right, is reported):
//!
//! 1. total length is at most [`MAX_TOPIC_LEN`] bytes (255, the AMQP routing-key limit, so every
//!    topic is also a valid AMQP routing key);
//! 2. not empty, and no empty word: no leading or trailing `.`, no `..`;
//! 3. every word consists of the characters `A-Z a-z 0-9 - _ :` (see [`is_word_char`]); a pattern
//!    word may instead be exactly `*` or `#`; a topic may contain no wildcard at all;
//! 4. every word is at most [`MAX_WORD_LEN`] bytes (64: fits a hex SHA-256 or a UUID);
//! 5. at most [`MAX_WORDS`] words (32).
//!
//! The character set is deliberately small: ASCII only (no Unicode normalisation or confusable
//! look-alikes), case-sensitive, and free of the separators and wildcards of other brokers
//! (`/`, `+`, `>`, whitespace), so a topic maps one-to-one onto MQTT, NATS or AMQP subjects
//! when a remote backend needs it. Widening the set later is backwards compatible; narrowing
//! it would not be.
//!
//! # Where things are
//! One rule: **everything an application names is at the crate root** (`tidings::Broker`,
//! `tidings::DurableSpec`, `tidings::Pattern`, …), and only there. The public modules exist
//! for other audiences and hold only what the root does not:
//!
//! | module | for | holds |
//! |---|---|---|
//! | [`durable`] | durable backend implementors | the durable-source seam ([`durable::DurableBackend`] and the traits and values it uses) |
//! | [`transport`] | transport implementors | the transport seam ([`transport::Transport`]) |
//! | [`embedded`] | users of the embedded log's own types | [`embedded::EmbeddedBackend`], its dedup store, the [`embedded::offline`] tools |
//! | [`ops`] | operators and admin endpoints | the snapshot, dead-letter actions, metric names, trace spans |
//!
//! Every type is reachable by exactly one path: nothing at the root is also in a module, and
//! nothing in a module is also at the root. A type both an application and an implementor
//! name ([`StreamError`], [`StartAt`], [`DurableDeadLetter`], [`CursorState`],
//! [`TransportError`], [`Pattern`], …) is at the root.

#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

#[cfg(feature = "tokio")]
mod async_handler;
mod broker;
mod clock;
mod codec;
mod dedup;
mod dlq;
mod driver;
pub mod durable;
pub mod embedded;
mod error;
mod fence;
mod filter;
mod handler;
mod into_handler;
#[cfg(feature = "serde")]
mod json;
mod limits;
mod message;
mod message_pool;
pub mod ops;
mod options;
mod queue;
mod rate_limit;
mod report;
mod request;
mod retry;
mod route_cache;
mod scheduler;
mod stats;
mod subscription;
mod sync;
mod telemetry;
#[cfg(feature = "tokio")]
mod timeout;
mod topic;
mod topic_name;
pub mod transport;
mod typed;

#[cfg(feature = "tokio")]
pub use async_handler::{AsyncHandler, HandlerFuture};
pub use broker::{Broker, BrokerBuilder, SubscribeTarget, WeakBroker};
pub use clock::{Clock, ClockWaiter, ManualClock, SystemClock};
pub use codec::{
    CONTENT_TYPE_HEADER, Codec, Decode, DecodeError, DecodeErrorKind, Encode, EncodeError,
};
pub use dedup::{DedupStore, Deduplicating, InMemoryDedupStore};
pub use dlq::{DeadLetter, DeadLetterReason};
pub use driver::Driver;
pub use durable::config::{DEFAULT_DUPLICATE_WINDOW, Retention, StartAt, StreamConfig};
pub use durable::source::{CursorState, DurableDeadLetter, StorageInfo};
pub use durable::spec::DurableSpec;
pub use durable::stream::Stream;
pub use durable::subscription::DurableSubscription;
pub use error::{
    CommitFailed, ConfigError, PublishError, StreamError, StreamErrorKind, SubscribeError,
    TransportError,
};
pub use fence::Fence;
pub use filter::{FilterError, HeaderFilter, HeaderLookup, MAX_FILTER_DEPTH, MAX_FILTER_TERMS};
pub use handler::{FnHandler, Handler, HandlerError, IntoHandlerResult, handler_fn};
pub use into_handler::{AnyHandler, IntoHandler};
#[cfg(feature = "serde")]
pub use json::{JSON_CONTENT_TYPE, Json};
pub use limits::Limits;
pub use message::{Headers, Message, MessageBuilder, MessageId, MessageParts, Priority};
pub use options::{
    Concurrency, DeadLetterOptions, DeliveryMode, MAX_NAME_LEN, MAX_WORKERS_PER_SUBSCRIPTION,
    Overflow, Predicate, SubscribeOptions,
};
pub use rate_limit::{MAX_RATE_LIMIT, MAX_RATE_PERIOD, RateLimit, RateLimited};
pub use report::{CloseReport, PublishReport, Undelivered};
pub use request::RequestError;
pub use retry::{InconsistentRetry, Retry, RetryPolicy};
pub use stats::{DeadLetterCounts, RefusedCounts, SubscriptionStats};
pub use subscription::handle::RedriveReport;
pub use subscription::shell::DLQ_REASON_HEADER;
pub use subscription::{Refusal, Subscription, SubscriptionId};
#[cfg(feature = "tokio")]
pub use timeout::Timeout;
pub use topic::{
    HASH, MAX_TOPIC_LEN, MAX_WORD_LEN, MAX_WORDS, Pattern, SEPARATOR, STAR, Topic, TopicError,
    TopicTrie, Words, is_word_char,
};
pub use topic_name::TopicName;
pub use typed::Typed;
#[cfg(feature = "serde")]
pub use typed::json_handler;

/// This library's version, as published (`tidings --version` prints the same).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
