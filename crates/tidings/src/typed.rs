//! The typed handler adaptor (R-PAT-3, the Decorator of R-PAT-2): a handler of the user's
//! own type `T` instead of bytes.
//!
//! [`Typed`] wraps a function of `(T, message)` and a [`Decode<T>`] codec. It is one adaptor
//! for every subscription form: it is a [`Handler`] when the function is sync
//! (`Fn(T, &Message)`) and an [`AsyncHandler`](crate::AsyncHandler) when it is async
//! (`Fn(T, Arc<Message>) -> impl Future`), so [`Broker::subscribe`](crate::Broker::subscribe)
//! takes it for every target, a pattern or a durable stream;
//! [`json_handler`](crate::json_handler) is it with the JSON codec. The contract is on
//! [`Typed`].

use std::fmt;
use std::marker::PhantomData;

use crate::codec::Decode;
use crate::handler::{Handler, HandlerError, IntoHandlerResult};
use crate::message::Message;

/// A handler of decoded values: decodes each message's payload with a codec, then calls a
/// function with the value and the message (R-PAT-3).
///
/// One adaptor for every subscription form: a [`Handler`] when the function is sync
/// (`Fn(T, &Message)`), an [`AsyncHandler`](crate::AsyncHandler) when it is async
/// (`Fn(T, Arc<Message>) -> impl Future`); so [`Broker::subscribe`](crate::Broker::subscribe)
/// takes it on every target, and [`json_handler`](crate::json_handler) is it with the JSON
/// codec (feature `serde`).
///
/// # Failure
/// A payload that does not decode (including a `content-type` of another format, see
/// [`Message::decode`]) never reaches the function: the attempt fails with
/// [`HandlerError::reject`] carrying the [`DecodeError`](crate::DecodeError)'s text, so the
/// message is dead-lettered `Rejected` at once — never retried, never a panic (on a durable
/// subscription into its durable dead-letter store, and its offset is committed, so it is
/// not seen again after a restart). Whatever the function returns is then the outcome,
/// exactly as for an untyped handler (an `Err` is retried by the policy unless rejected; a
/// panic is caught and retried).
///
/// # Ordering
/// Decoding happens on the dispatcher, just before the function, for every attempt
/// (a retry decodes again: a decoded value is not kept between attempts).
///
/// Composes with the other decorators:
/// [`Deduplicating::new(Typed::new(..))`](crate::Deduplicating) skips redelivered ids before
/// decoding, and [`Timeout::new(Typed::new(..), limit)`](crate::Timeout) bounds an async
/// function's attempt.
///
/// ```
/// # #[cfg(feature = "serde")]
/// # {
/// use tidings::{Broker, DeadLetterReason, Driver, HandlerError, Json, Message, Retry,
///               SubscribeOptions, Typed};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Order { id: u64 }
///
/// let broker = Broker::builder().driver(Driver::Manual).build()?;
/// let orders = broker.subscribe(
///     "orders.*",
///     SubscribeOptions::new().retry(Retry::fixed(std::time::Duration::from_secs(1), 5)),
///     Typed::new(Json, |order: Order, _msg: &Message| -> Result<(), HandlerError> {
///         assert_eq!(order.id, 7);
///         Ok(())
///     }),
/// )?;
/// broker.publish(Message::to("orders.created").json(&Order { id: 7 })?)?;
/// broker.publish(Message::to("orders.created").payload("{\"id\": -1}"))?;
/// broker.run_until_idle();
/// assert_eq!(orders.stats().delivered, 1);
/// let dead = orders.dead_letters();
/// assert!(matches!(dead[0].reason, DeadLetterReason::Rejected { .. })); // not retried
/// assert_eq!(dead[0].attempts, 1);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Typed<C, T, F> {
    codec: C,
    f: F,
    /// `fn() -> T`: the adaptor produces `T`s, owns none, and is `Send + Sync` whatever `T`.
    _produces: PhantomData<fn() -> T>,
}

impl<C, T, F> Typed<C, T, F> {
    /// A handler that decodes each payload with `codec` into a `T` and calls `f` with it.
    ///
    /// `f` is `Fn(T, &Message) -> R` (`R`: `()` or `Result<(), HandlerError>`): a sync
    /// handler; or `Fn(T, Arc<Message>) -> impl Future<Output = Result<(), HandlerError>>`:
    /// an async one (the tokio driver). Either is subscribed with
    /// [`Broker::subscribe`](crate::Broker::subscribe), to a pattern or a durable stream.
    /// The closure's arguments need type annotations (`|order: Order, msg: &Message|`):
    /// their types are what tell the two kinds apart and name `T`.
    pub fn new(codec: C, f: F) -> Self {
        Self {
            codec,
            f,
            _produces: PhantomData,
        }
    }

    /// The codec.
    pub fn codec(&self) -> &C {
        &self.codec
    }

    /// Decode `message` for the function, or the rejection that dead-letters it.
    fn decode(&self, message: &Message) -> Result<T, HandlerError>
    where
        C: Decode<T>,
    {
        message
            .decode(&self.codec)
            .map_err(|e| HandlerError::reject(e.to_string()))
    }
}

impl<C: fmt::Debug, T, F> fmt::Debug for Typed<C, T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Typed")
            .field("codec", &self.codec)
            .field("type", &std::any::type_name::<T>())
            .finish_non_exhaustive()
    }
}

/// A sync function of `(T, &Message)`: a [`Handler`].
impl<C, T, F, R> Handler for Typed<C, T, F>
where
    C: Decode<T>,
    T: 'static,
    F: Fn(T, &Message) -> R + Send + Sync + 'static,
    R: IntoHandlerResult,
{
    fn handle(&self, message: &Message) -> Result<(), HandlerError> {
        let value = self.decode(message)?;
        (self.f)(value, message).into_handler_result()
    }
}

#[cfg(feature = "tokio")]
mod async_impl {
    use std::future::Future;
    use std::sync::Arc;

    use super::Typed;
    use crate::async_handler::{AsyncHandler, HandlerFuture};
    use crate::codec::Decode;
    use crate::handler::HandlerError;
    use crate::message::Message;

    /// An async function of `(T, Arc<Message>)`: an [`AsyncHandler`]. The payload is
    /// decoded when the future is created, before the function is called.
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    impl<C, T, F, Fut> AsyncHandler for Typed<C, T, F>
    where
        C: Decode<T>,
        T: 'static,
        F: Fn(T, Arc<Message>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        fn handle<'a>(&'a self, message: Arc<Message>) -> HandlerFuture<'a> {
            match self.decode(&message) {
                Ok(value) => Box::pin((self.f)(value, message)),
                Err(rejected) => Box::pin(std::future::ready(Err(rejected))),
            }
        }
    }
}

/// A [`Typed`] handler with the [`Json`](crate::Json) codec: `f` gets each payload decoded
/// from JSON (R-PAT-3). Sync (`Fn(T, &Message)`) or async (`Fn(T, Arc<Message>) -> impl
/// Future`), like [`Typed::new`]; the closure's arguments need annotations, which name `T`.
/// Subscribe it with [`Broker::subscribe`](crate::Broker::subscribe) to a pattern or a
/// durable stream.
///
/// A payload that does not decode — empty, truncated, not JSON, not UTF-8, the wrong shape,
/// a number out of range, nested too deep, or a `content-type` header of another format —
/// is dead-lettered `Rejected` with the decoder's error as its last error, at once, without
/// calling `f` and without retries (see [`Typed`]).
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use tidings::{Broker, Driver, HandlerError, Message, SubscribeOptions, json_handler};
///
/// #[derive(Serialize, Deserialize)]
/// struct Order { id: u64, cents: u64 }
///
/// let broker = Broker::builder().driver(Driver::Manual).build()?;
/// let billing = broker.subscribe("orders.*", SubscribeOptions::default(),
///     json_handler(|order: Order, msg: &Message| {
///         assert_eq!((order.id, order.cents), (7, 1250));
///         assert_eq!(msg.topic().as_str(), "orders.created");
///         Ok::<(), HandlerError>(())
///     }))?;
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
/// Async, under the tokio driver: the payload is decoded before `f` is called.
///
/// ```
/// # #[cfg(feature = "tokio")]
/// # {
/// use std::sync::Arc;
/// use tidings::{Broker, Driver, HandlerError, Message, SubscribeOptions, json_handler};
/// # #[derive(serde::Serialize, serde::Deserialize)] struct Order { id: u64 }
/// let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
/// let broker = Broker::builder().driver(Driver::Tokio(rt.handle().clone())).build()?;
/// let billing = broker.subscribe("orders.*", SubscribeOptions::default(),
///     json_handler(|order: Order, _msg: Arc<Message>| async move {
///         assert_eq!(order.id, 7);
///         Ok::<(), HandlerError>(())
///     }))?;
/// broker.publish(Message::to("orders.created").json(&Order { id: 7 })?)?;
/// assert!(broker.wait_idle(std::time::Duration::from_secs(10)));
/// assert_eq!(billing.stats().delivered, 1);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Decorated, like any handler:
///
/// ```
/// use tidings::{Broker, Deduplicating, Driver, HandlerError, Message, SubscribeOptions,
///               json_handler};
/// # #[derive(serde::Serialize, serde::Deserialize)] struct Order { id: u64 }
/// let broker = Broker::builder().driver(Driver::Manual).build()?;
/// let _orders = broker.subscribe(
///     "orders.*",
///     SubscribeOptions::default(),
///     Deduplicating::new(json_handler(|order: Order, _: &Message| {
///         println!("order {}", order.id);
///     })),
/// )?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub fn json_handler<T, F>(f: F) -> Typed<crate::json::Json, T, F> {
    Typed::new(crate::json::Json, f)
}
