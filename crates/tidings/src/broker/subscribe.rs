//! The one subscribe verb (R-PAT-2, R-EXE-3): [`Broker::subscribe`] takes a target — a
//! topic pattern, or a [`DurableSpec`] on any backend — options, and any handler
//! ([`IntoHandler`]: sync, async, typed, decorated).
//!
//! The target decides what comes back: a pattern gives a [`Subscription`] (or a
//! [`SubscribeError`]), a durable spec a [`DurableSubscription`] (or a [`StreamError`]).
//! The handler's kind decides who runs it: a sync handler runs under every driver, an async
//! one under the tokio driver; on every target each gets the same guarantees, because both
//! run in the one subscription core.
//!
//! One name per verb: there is no per-target or per-kind variant. A typed handler is
//! `subscribe(target, options, json_handler(|order: Order, msg: &Message| ..))` (or
//! [`Typed`](crate::Typed) with any codec); an async one is an async closure or an
//! [`AsyncHandler`](crate::AsyncHandler).

use crate::durable::{DurableSpec, DurableSubscription, StreamError};
use crate::error::SubscribeError;
use crate::into_handler::{AnyHandler, IntoHandler};
use crate::options::SubscribeOptions;
use crate::subscription::Subscription;
use crate::topic::Pattern;

use super::{Broker, BrokerInner};

/// What [`Broker::subscribe`] can subscribe to, and what subscribing to it returns.
///
/// | target | `Subscription` | `Error` |
/// |---|---|---|
/// | a topic pattern: `&str`, `String`, `&String`, [`Pattern`], `&Pattern` | [`Subscription`] | [`SubscribeError`] |
/// | a [`DurableSpec`] (a stream of the broker's durable backend: embedded log, JetStream, …) | [`DurableSubscription`] | [`StreamError`] |
///
/// Sealed: the broker defines its targets.
pub trait SubscribeTarget: private::Sealed {
    /// The handle subscribing to this target returns; dropping it unsubscribes.
    type Subscription;
    /// Why subscribing to this target was refused.
    type Error;
    /// Subscribe `handler` to this target (called by [`Broker::subscribe`] only).
    #[doc(hidden)]
    fn subscribe_to(
        self,
        broker: &Broker,
        options: SubscribeOptions,
        handler: AnyHandler,
        token: private::Token,
    ) -> Result<Self::Subscription, Self::Error>;
}

mod private {
    /// Only the targets below exist.
    pub trait Sealed {}
    impl Sealed for &str {}
    impl Sealed for String {}
    impl Sealed for &String {}
    impl Sealed for super::Pattern {}
    impl Sealed for &super::Pattern {}
    impl Sealed for super::DurableSpec {}

    /// Only `Broker::subscribe` can call `SubscribeTarget::subscribe_to`.
    #[derive(Debug)]
    pub struct Token(pub(super) ());
}

impl Broker {
    /// Subscribe `handler` to `target` (R-CORE-1, R-LOG-3, R-EXE-3): the one entry point for
    /// every target and every kind of handler (R-PAT-2).
    ///
    /// * **Target** ([`SubscribeTarget`]): a topic pattern — the subscription gets its own
    ///   bounded queue, dispatcher(s), DLQ and counters, and receives messages published
    ///   after this returns; returns a [`Subscription`]. Or a [`DurableSpec`] — a cursor
    ///   over a stream of the broker's durable backend (the embedded log, JetStream, …),
    ///   which resumes at its committed position; returns a [`DurableSubscription`] (see
    ///   [Durable targets](#durable-targets) below).
    /// * **Handler** ([`IntoHandler`]): a sync [`Handler`](crate::Handler) (any driver), an
    ///   [`AsyncHandler`](crate::AsyncHandler) (the tokio driver), either of them typed
    ///   ([`Typed`](crate::Typed), [`json_handler`](crate::json_handler)) or decorated, or an
    ///   [`AnyHandler`]. Sync and async handlers get the same guarantees on every target —
    ///   order, retry in place, dead-lettering, the commit rules of a durable subscription,
    ///   the counters' conservation, a keyed group's start gate — because both run in the
    ///   one subscription core (R-EXE-3).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tidings::{Broker, DurableSpec, Driver, HandlerError, Message, StreamConfig,
    ///               SubscribeOptions};
    /// # let dir = tempfile::tempdir()?;
    /// # #[cfg(feature = "tokio")]
    /// # {
    /// let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    /// let broker = Broker::builder()
    ///     .driver(Driver::Tokio(rt.handle().clone()))
    ///     .data_dir(dir.path())
    ///     .build()?;
    /// broker.create_stream(StreamConfig::new("orders", ["orders.#"]))?;
    /// // A pattern and a sync handler: a `Subscription`.
    /// let audit = broker.subscribe("orders.*", SubscribeOptions::default(),
    ///     |m: &Message| println!("audit {:?}", m.payload()))?;
    /// // A durable spec and an async handler: a `DurableSubscription`.
    /// let billing = broker.subscribe(
    ///     DurableSpec::new("orders").name("billing"),
    ///     SubscribeOptions::default(),
    ///     |m: Arc<Message>| async move {
    ///         tokio::task::yield_now().await; // charge the card, say
    ///         println!("billing {:?}", m.payload());
    ///         Ok::<(), HandlerError>(())
    ///     },
    /// )?;
    /// broker.publish(Message::to("orders.created").payload("42"))?;
    /// assert!(broker.wait_idle(Duration::from_secs(10)));
    /// assert_eq!(audit.stats().delivered, 1);
    /// # let deadline = std::time::Instant::now() + Duration::from_secs(10);
    /// # while billing.committed() < 1 && std::time::Instant::now() < deadline {
    /// #     std::thread::sleep(Duration::from_millis(5));
    /// # }
    /// assert_eq!(billing.committed(), 1); // handled, then committed
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Durable targets
    /// With a [`DurableSpec`], `handler` is subscribed durably to the messages of the stream
    /// the spec names whose topic matches its filter (R-LOG-3, R-LOG-4); see [`DurableSpec`]
    /// for the parts and their defaults, and [`DurableSubscription`] for delivery,
    /// dead letters, backpressure and closing.
    ///
    /// * **Where it starts.** If the spec's name has a committed position on this stream
    ///   (from an earlier run, or an earlier subscription in this one), delivery resumes
    ///   there and the spec's start is ignored (use [`DurableSubscription::seek`] to move
    ///   it); otherwise it starts at the spec's start, and that position is committed at
    ///   once.
    /// * **Clamping.** A committed position beyond the stream's end is clamped to the end,
    ///   committed and logged ([`DurableSubscription::clamped_from`] reports it).
    /// * **Options.** `options` apply as for a pattern (retry, DLQ, TTL, lanes, per-key,
    ///   filters); `capacity` is the window of outstanding messages, and `overflow` never
    ///   triggers because the feeder waits for room (R-BP-2).
    /// * **Typed handlers.** A payload that does not decode is dead-lettered `Rejected` in
    ///   the durable dead-letter store and its offset committed, so it is not seen again
    ///   after a restart.
    ///
    /// ```
    /// use tidings::{Broker, DurableSpec, Message, StreamConfig, SubscribeOptions};
    /// # let dir = tempfile::tempdir()?;
    /// let broker = Broker::builder().data_dir(dir.path()).build()?;
    /// broker.create_stream(StreamConfig::new("orders", ["orders.#"]))?;
    /// let billing = broker.subscribe(
    ///     DurableSpec::new("orders").name("billing"),
    ///     SubscribeOptions::default(),
    ///     |_: &Message| Ok(()),
    /// )?;
    /// assert_eq!(billing.committed(), 0); // a new name: its start, committed at once
    /// # broker.close(std::time::Duration::from_secs(1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// A typed handler on a durable target (feature `serde`): the undecodable message is
    /// dead-lettered durably and passed by the commit.
    ///
    /// ```
    /// # #[cfg(feature = "serde")]
    /// # {
    /// use tidings::{Broker, Driver, DurableSpec, Message, StreamConfig, SubscribeOptions,
    ///               json_handler};
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct Order { id: u64 }
    /// # let dir = tempfile::tempdir()?;
    /// let broker = Broker::builder().driver(Driver::Manual).data_dir(dir.path()).build()?;
    /// broker.create_stream(StreamConfig::new("orders", ["orders.#"]))?;
    /// let billing = broker.subscribe(
    ///     DurableSpec::new("orders").name("billing"),
    ///     SubscribeOptions::default(),
    ///     json_handler(|order: Order, _msg: &Message| {
    ///         println!("order {}", order.id);
    ///         Ok(())
    ///     }),
    /// )?;
    /// broker.publish(Message::to("orders.created").json(&Order { id: 7 })?)?;
    /// broker.publish(Message::to("orders.created").payload("not json"))?;
    /// broker.run_until_idle();
    /// assert_eq!(billing.stats().delivered, 1);
    /// assert_eq!(billing.durable_dead_letters()?.len(), 1); // Rejected, stored durably
    /// assert_eq!(billing.committed(), 2); // both finished
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// The target's error type. For a pattern ([`SubscribeError`]): an invalid pattern or
    /// options, too many subscriptions, the broker closed, an async handler under a driver
    /// other than tokio ([`SubscribeError::AsyncHandlerNeedsTokio`]).
    ///
    /// For a durable spec ([`StreamError`], match on [`StreamError::kind`]): no durable
    /// backend, an unknown stream, a missing or bad name ([`StreamError::InvalidName`]), a
    /// bad filter ([`StreamError::InvalidPattern`]) or options, the name already active
    /// ([`StreamError::DurableInUse`]), a start offset out of retention
    /// ([`StreamError::OutOfRetention`]) or beyond the end ([`StreamError::BeyondEnd`]), a
    /// foreign offset file, the broker closed. An async handler under another driver is
    /// refused too, of kind `Unsupported`, before the cursor is opened (the name stays
    /// free).
    pub fn subscribe<T, K>(
        &self,
        target: T,
        options: SubscribeOptions,
        handler: impl IntoHandler<K>,
    ) -> Result<T::Subscription, T::Error>
    where
        T: SubscribeTarget,
        K: ?Sized,
    {
        target.subscribe_to(self, options, handler.into_handler(), private::Token(()))
    }
}

impl BrokerInner {
    /// Refuse a handler this broker's driver cannot run: an async one needs tokio.
    pub(super) fn can_run(&self, handler: &AnyHandler) -> Result<(), SubscribeError> {
        #[cfg(feature = "tokio")]
        if handler.is_async() && self.executor.tokio_handle().is_none() {
            return Err(SubscribeError::AsyncHandlerNeedsTokio);
        }
        #[cfg(not(feature = "tokio"))]
        let _ = handler;
        Ok(())
    }

    fn subscribe_pattern(
        &self,
        pattern: &str,
        options: SubscribeOptions,
        handler: AnyHandler,
    ) -> Result<Subscription, SubscribeError> {
        self.can_run(&handler)?;
        let options = handler.options(options)?;
        self.subscribe(pattern, options, handler.kind)
    }
}

/// The pattern targets, one body.
macro_rules! pattern_target {
    ($($t:ty => |$p:ident| $as_str:expr;)*) => {$(
        impl SubscribeTarget for $t {
            type Subscription = Subscription;
            type Error = SubscribeError;
            fn subscribe_to(
                self,
                broker: &Broker,
                options: SubscribeOptions,
                handler: AnyHandler,
                _: private::Token,
            ) -> Result<Subscription, SubscribeError> {
                let $p = &self;
                broker.inner.subscribe_pattern($as_str, options, handler)
            }
        }
    )*};
}

pattern_target! {
    &str => |p| p;
    String => |p| p.as_str();
    &String => |p| p.as_str();
    Pattern => |p| p.as_str();
    &Pattern => |p| p.as_str();
}

impl SubscribeTarget for DurableSpec {
    type Subscription = DurableSubscription;
    type Error = StreamError;
    fn subscribe_to(
        self,
        broker: &Broker,
        options: SubscribeOptions,
        handler: AnyHandler,
        _: private::Token,
    ) -> Result<DurableSubscription, StreamError> {
        broker.subscribe_spec(self, options, handler)
    }
}
