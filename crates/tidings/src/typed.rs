//! The typed handler adaptor (R-PAT-3, the Decorator of R-PAT-2): a handler of the user's
//! own type `T` instead of bytes.
//!
//! [`Typed`] wraps a function of `(T, message)` and a [`Decode<T>`] codec. It is one adaptor
//! for every subscription form: it is a [`Handler`] when the function is sync
//! (`Fn(T, &Message)`) and an [`AsyncHandler`](crate::AsyncHandler) when it is async
//! (`Fn(T, Arc<Message>) -> impl Future`), so [`Broker::subscribe`](crate::Broker::subscribe),
//! [`Broker::subscribe_durable`](crate::Broker::subscribe_durable) and
//! [`Broker::subscribe_async`](crate::Broker::subscribe_async) all take it, and
//! [`Broker::subscribe_json`](crate::Broker::subscribe_json) and its durable and async forms
//! are those three with [`json_handler`](crate::json_handler). The contract is on [`Typed`].

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
/// (`Fn(T, Arc<Message>) -> impl Future`); so `subscribe`, `subscribe_durable` and
/// `subscribe_async` all take it, and the `subscribe_json*` methods are those three with
/// [`json_handler`](crate::json_handler) (feature `serde`).
///
/// # Failure
/// A payload that does not decode (including a `content-type` of another format, see
/// [`Message::decode`]) never reaches the function: the attempt fails with
/// [`HandlerError::reject`] carrying the [`DecodeError`](crate::DecodeError)'s text, so the
/// message is dead-lettered `Rejected` at once — never retried, never a panic. Whatever the
/// function returns is then the outcome, exactly as for an untyped handler (an `Err` is
/// retried by the policy unless rejected; a panic is caught and retried).
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
    /// `f` is `Fn(T, &Message) -> R` (`R`: `()` or `Result<(), HandlerError>`) for
    /// [`Broker::subscribe`](crate::Broker::subscribe) and
    /// [`subscribe_durable`](crate::Broker::subscribe_durable), or
    /// `Fn(T, Arc<Message>) -> impl Future<Output = Result<(), HandlerError>>` for
    /// [`subscribe_async`](crate::Broker::subscribe_async). Its arguments need type
    /// annotations here (nothing tells the closure its signature); the
    /// `subscribe_json*` methods infer them.
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
/// Future`), like [`Typed::new`]; the closure's arguments need annotations.
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
