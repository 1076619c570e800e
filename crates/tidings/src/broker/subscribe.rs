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
//! The older per-cell methods (`subscribe_async`, `subscribe_json`, `subscribe_json_async`,
//! `subscribe_durable`, `subscribe_durable_json`) are here too, each a thin wrapper over
//! `subscribe`, kept so that existing code compiles; the typed ones still infer a
//! closure's argument types, which `subscribe(.., json_handler(..))` asks the closure to
//! annotate.

use crate::durable::{DurableSpec, DurableSubscription, StreamError};
use crate::error::SubscribeError;
use crate::handler::Handler;
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
    ///   [`subscribe_durable`](Broker::subscribe_durable) for its contract).
    /// * **Handler** ([`IntoHandler`]): a sync [`Handler`] (any driver), an
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
    /// # Errors
    /// The target's error type. For a pattern ([`SubscribeError`]): an invalid pattern or
    /// options, too many subscriptions, the broker closed, an async handler under a driver
    /// other than tokio ([`SubscribeError::AsyncHandlerNeedsTokio`]). For a durable spec
    /// ([`StreamError`]): see [`subscribe_durable`](Broker::subscribe_durable); an async
    /// handler under another driver is refused there too, of kind `Unsupported`, before
    /// the cursor is opened.
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

    /// A thin wrapper: `subscribe(spec, options, handler)` (see
    /// [`subscribe`](Broker::subscribe)), kept for existing callers. The contract of a
    /// durable subscription is documented here.
    ///
    /// Subscribe `handler` durably to the messages of the stream `spec` names, whose topic
    /// matches its filter (R-LOG-3, R-LOG-4); see [`DurableSpec`] for the parts and their
    /// defaults.
    ///
    /// If the spec's name has a committed position on this stream (from an earlier run),
    /// delivery resumes there and the spec's start is ignored (use
    /// [`DurableSubscription::seek`] to move it); otherwise it starts there, and that
    /// position is committed at once. A committed position beyond the stream's end is
    /// clamped to the end, committed and logged ([`DurableSubscription::clamped_from`]
    /// reports it). `options` apply as for a pattern (retry, DLQ, TTL, lanes, per-key,
    /// filters); `capacity` is the window of outstanding messages, and `overflow` never
    /// triggers because the feeder waits for room.
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
    /// assert_eq!(billing.committed(), 0);
    /// # broker.close(std::time::Duration::from_secs(1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// Unknown stream, a missing or bad name ([`StreamError::InvalidName`]), a bad filter or
    /// options, the name already active, an offset out of retention
    /// ([`StreamError::OutOfRetention`]) or beyond the end, a foreign offset file.
    pub fn subscribe_durable(
        &self,
        spec: DurableSpec,
        options: SubscribeOptions,
        handler: impl Handler,
    ) -> Result<DurableSubscription, StreamError> {
        self.subscribe(spec, options, handler)
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
        self.subscribe(pattern, options, handler.0)
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

#[cfg(feature = "tokio")]
impl Broker {
    /// A thin wrapper: `subscribe(pattern, options, handler)` with an async handler (see
    /// [`subscribe`](Broker::subscribe)), kept for existing callers.
    ///
    /// The handler's future is awaited by the subscription's dispatcher task(s) on the
    /// tokio driver's runtime, with the same ordering, retry, dead-letter and panic
    /// guarantees as a sync handler (R-EXE-3).
    ///
    /// # Errors
    /// [`SubscribeError::AsyncHandlerNeedsTokio`] when the broker's driver is not
    /// [`Driver::Tokio`](crate::Driver) (nothing else can await the handler), and every
    /// error of [`subscribe`](Broker::subscribe) for a pattern.
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn subscribe_async(
        &self,
        pattern: &str,
        options: SubscribeOptions,
        handler: impl crate::async_handler::AsyncHandler,
    ) -> Result<Subscription, SubscribeError> {
        self.subscribe(pattern, options, handler)
    }
}

#[cfg(feature = "serde")]
mod typed {
    use serde::de::DeserializeOwned;

    use crate::durable::{DurableSpec, DurableSubscription, StreamError};
    use crate::error::SubscribeError;
    use crate::handler::HandlerError;
    use crate::message::Message;
    use crate::options::SubscribeOptions;
    use crate::subscription::Subscription;
    use crate::typed::json_handler;

    use super::Broker;

    impl Broker {
        /// A thin wrapper: `subscribe(pattern, options, json_handler(handler))` (R-PAT-3),
        /// kept for existing callers; unlike it, the closure's arguments and its `Ok(())`
        /// are inferred (name `T` with `subscribe_json::<Order, _>` or by annotating the
        /// first argument).
        ///
        /// `handler(order, &message)` runs for each message whose payload decodes as a `T`.
        /// A payload that does not decode — empty, truncated, not JSON, not UTF-8, the
        /// wrong shape, a number out of range, nested too deep, or a `content-type` header
        /// of another format — is dead-lettered `Rejected` with the decoder's error as its
        /// last error, at once, without calling `handler` and without retries (see
        /// [`Typed`](crate::Typed)).
        ///
        /// ```
        /// use serde::{Deserialize, Serialize};
        /// use tidings::{Broker, Driver, Message, SubscribeOptions};
        ///
        /// #[derive(Serialize, Deserialize)]
        /// struct Order { id: u64, cents: u64 }
        ///
        /// let broker = Broker::builder().driver(Driver::Manual).build()?;
        /// let billing = broker.subscribe_json::<Order, _>("orders.*", SubscribeOptions::default(),
        ///     |order, msg| {
        ///         assert_eq!((order.id, order.cents), (7, 1250));
        ///         assert_eq!(msg.topic().as_str(), "orders.created");
        ///         Ok(())
        ///     })?;
        /// broker.publish(Message::to("orders.created").json(&Order { id: 7, cents: 1250 })?)?;
        /// broker.publish(Message::to("orders.created").payload("{\"id\": 7"))?; // truncated
        /// broker.run_until_idle();
        /// assert_eq!(billing.stats().delivered, 1);
        /// let dead = billing.dead_letters();
        /// assert_eq!(dead[0].last_error(), Some(
        ///     "cannot decode the application/json payload: EOF while parsing an object at line 1 column 8"));
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        ///
        /// # Errors
        /// Every error of [`subscribe`](Broker::subscribe) for a pattern.
        #[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
        pub fn subscribe_json<T, F>(
            &self,
            pattern: &str,
            options: SubscribeOptions,
            handler: F,
        ) -> Result<Subscription, SubscribeError>
        where
            T: DeserializeOwned + 'static,
            F: Fn(T, &Message) -> Result<(), HandlerError> + Send + Sync + 'static,
        {
            self.subscribe(pattern, options, json_handler(handler))
        }

        /// A thin wrapper: `subscribe(spec, options, json_handler(handler))` (R-PAT-3,
        /// R-LOG-3), kept for existing callers; the closure's arguments are inferred. A
        /// payload that does not decode is dead-lettered `Rejected` (in the durable
        /// dead-letter queue) and its offset committed, so it is not seen again after a
        /// restart.
        ///
        /// ```
        /// use tidings::{Broker, DurableSpec, Message, StreamConfig, SubscribeOptions};
        /// # #[derive(serde::Serialize, serde::Deserialize)] struct Order { id: u64 }
        /// # let dir = tempfile::tempdir()?;
        /// let broker = Broker::builder().data_dir(dir.path()).build()?;
        /// broker.create_stream(StreamConfig::new("orders", ["orders.#"]))?;
        /// let billing = broker.subscribe_durable_json(
        ///     DurableSpec::new("orders").name("billing"),
        ///     SubscribeOptions::default(),
        ///     |order: Order, _msg: &Message| {
        ///         println!("order {}", order.id);
        ///         Ok(())
        ///     },
        /// )?;
        /// # broker.close(std::time::Duration::from_secs(1));
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        ///
        /// # Errors
        /// Every error of [`subscribe_durable`](Broker::subscribe_durable).
        #[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
        pub fn subscribe_durable_json<T, F>(
            &self,
            spec: DurableSpec,
            options: SubscribeOptions,
            handler: F,
        ) -> Result<DurableSubscription, StreamError>
        where
            T: DeserializeOwned + 'static,
            F: Fn(T, &Message) -> Result<(), HandlerError> + Send + Sync + 'static,
        {
            self.subscribe(spec, options, json_handler(handler))
        }

        /// A thin wrapper: `subscribe(pattern, options, json_handler(handler))` with an
        /// async function (R-PAT-3, R-EXE-3), kept for existing callers; the closure's
        /// arguments are inferred. The payload is decoded before `handler` is called; one
        /// that does not decode is dead-lettered `Rejected` and `handler` is not called.
        ///
        /// ```
        /// use std::sync::Arc;
        /// use tidings::{Broker, Driver, HandlerError, Message, SubscribeOptions};
        /// # #[derive(serde::Serialize, serde::Deserialize)] struct Order { id: u64 }
        /// let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
        /// let broker = Broker::builder().driver(Driver::Tokio(rt.handle().clone())).build()?;
        /// let billing = broker.subscribe_json_async("orders.*", SubscribeOptions::default(),
        ///     |order: Order, _msg: Arc<Message>| async move {
        ///         assert_eq!(order.id, 7);
        ///         Ok::<(), HandlerError>(())
        ///     })?;
        /// broker.publish(Message::to("orders.created").json(&Order { id: 7 })?)?;
        /// assert!(broker.wait_idle(std::time::Duration::from_secs(10)));
        /// assert_eq!(billing.stats().delivered, 1);
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        ///
        /// # Errors
        /// Every error of [`subscribe_async`](Broker::subscribe_async).
        #[cfg(feature = "tokio")]
        #[cfg_attr(docsrs, doc(cfg(all(feature = "serde", feature = "tokio"))))]
        pub fn subscribe_json_async<T, F, Fut>(
            &self,
            pattern: &str,
            options: SubscribeOptions,
            handler: F,
        ) -> Result<Subscription, SubscribeError>
        where
            T: DeserializeOwned + 'static,
            F: Fn(T, std::sync::Arc<Message>) -> Fut + Send + Sync + 'static,
            Fut: std::future::Future<Output = Result<(), HandlerError>> + Send + 'static,
        {
            self.subscribe(pattern, options, json_handler(handler))
        }
    }
}
