//! The broker's typed subscriptions (feature `serde`, R-PAT-3): `subscribe`,
//! `subscribe_durable` and `subscribe_async` with a [`json_handler`], so the handler gets
//! the user's own type. One adaptor ([`Typed`](crate::Typed)) under all three.

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
    /// [`subscribe`](Broker::subscribe) a handler of `T`s decoded from JSON (R-PAT-3):
    /// `handler(order, &message)` for each message whose payload decodes as a `T`. The
    /// closure's arguments and its `Ok(())` are inferred (name `T` with
    /// `subscribe_json::<Order, _>` or by annotating the first argument).
    ///
    /// A payload that does not decode — empty, truncated, not JSON, not UTF-8, the wrong
    /// shape, a number out of range, nested too deep, or a `content-type` header of another
    /// format — is dead-lettered `Rejected` with the decoder's error as its last error, at
    /// once, without calling `handler` and without retries (see [`Typed`](crate::Typed)).
    /// Everything else is as for [`subscribe`](Broker::subscribe).
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
    /// Every error of [`subscribe`](Broker::subscribe).
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

    /// [`subscribe_durable`](Broker::subscribe_durable) a handler of `T`s decoded from JSON
    /// (R-PAT-3, R-LOG-3): the same contract as [`subscribe_json`](Broker::subscribe_json)
    /// over a durable stream. A payload that does not decode is dead-lettered `Rejected`
    /// (in the durable dead-letter queue) and its offset committed, so it is not seen
    /// again after a restart.
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
        self.subscribe_durable(spec, options, json_handler(handler))
    }

    /// [`subscribe_async`](Broker::subscribe_async) an async handler of `T`s decoded from
    /// JSON (R-PAT-3, R-EXE-3): the same contract as
    /// [`subscribe_json`](Broker::subscribe_json), the handler's future awaited by the tokio
    /// driver. The payload is decoded before `handler` is called; one that does not decode
    /// is dead-lettered `Rejected` and `handler` is not called.
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
        self.subscribe_async(pattern, options, json_handler(handler))
    }
}
