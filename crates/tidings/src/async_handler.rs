//! Async handlers, run by the tokio driver (R-EXE-3).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::handler::HandlerError;
use crate::message::Message;

/// The future an [`AsyncHandler`] returns.
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub type HandlerFuture<'a> = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send + 'a>>;

/// Handles messages for one subscription, asynchronously. Requires
/// [`Driver::Tokio`](crate::Driver); subscribe it with
/// [`Broker::subscribe`](crate::Broker::subscribe), to a pattern or a durable stream.
///
/// # Contract
/// The same guarantees as a sync [`Handler`](crate::Handler) (R-EXE-3):
/// * The returned future is awaited to completion by the subscription's dispatcher task
///   before the next message of that dispatcher slot is delivered: never concurrently for
///   one subscription unless it asked for keyed lanes or per-key concurrency (R-CORE-3).
/// * `Ok(())` acknowledges; an error is retried by the subscription's retry policy unless
///   it is [`HandlerError::reject`]ed (R-DEL-1). A panic — while creating the future or
///   while it is polled — is caught and treated as a retryable error whose text is the
///   panic message. [`HandlerError::defer_until`] takes the call back: the message is
///   delivered again when due, as the same attempt.
/// * No broker lock is held while the future runs (R-CORE-2). Use the async broker methods
///   ([`Broker::publish_async`](crate::Broker::publish_async),
///   [`Broker::request_async`](crate::Broker::request_async)) from inside it; the sync ones
///   may block the runtime.
/// * While the broker closes, a future still pending after the drain deadline and the 5 s
///   grace is left running and its dispatcher reported as unjoined.
///
/// Closures `Fn(Arc<Message>) -> impl Future<Output = Result<(), HandlerError>>` implement
/// it:
///
/// ```
/// # #[cfg(feature = "tokio")]
/// # {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tidings::{Broker, Driver, HandlerError, Message, SubscribeOptions};
///
/// let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
/// let broker = Broker::builder().driver(Driver::Tokio(rt.handle().clone())).build()?;
/// let _sub = broker.subscribe("orders.created", SubscribeOptions::default(),
///     |m: Arc<Message>| async move {
///         tokio::time::sleep(Duration::from_millis(1)).await;
///         println!("order {:?}", m.payload());
///         Ok::<(), HandlerError>(())
///     })?;
/// broker.publish(Message::to("orders.created").payload("42"))?;
/// assert!(broker.close(Duration::from_secs(5)).is_clean());
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub trait AsyncHandler: Send + Sync + 'static {
    /// Process one message.
    fn handle<'a>(&'a self, message: Arc<Message>) -> HandlerFuture<'a>;
}

impl<F, Fut> AsyncHandler for F
where
    F: Fn(Arc<Message>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    fn handle<'a>(&'a self, message: Arc<Message>) -> HandlerFuture<'a> {
        Box::pin(self(message))
    }
}

/// A shared async handler: keep an `Arc` to read a decorator's counters
/// ([`Timeout::timed_out`](crate::Timeout::timed_out), say) while it is subscribed.
impl<H: AsyncHandler> AsyncHandler for Arc<H> {
    fn handle<'a>(&'a self, message: Arc<Message>) -> HandlerFuture<'a> {
        (**self).handle(message)
    }
}
