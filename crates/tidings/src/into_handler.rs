//! Every kind of handler as one value (R-EXE-3, R-PAT-2): what the one
//! [`Broker::subscribe`](crate::Broker::subscribe) takes.
//!
//! A handler is sync ([`Handler`]) or async ([`AsyncHandler`](crate::AsyncHandler), feature
//! `tokio`); typed handlers ([`Typed`](crate::Typed), [`json_handler`](crate::json_handler))
//! and decorated ones ([`Deduplicating`](crate::Deduplicating),
//! [`RateLimited`](crate::RateLimited), [`Timeout`](crate::Timeout)) are one or the other by
//! what they wrap. [`IntoHandler`] turns any of them into an [`AnyHandler`], so one
//! `subscribe` serves every kind, on every kind of subscription.

use std::fmt;
use std::sync::Arc;

use crate::error::ConfigError;
use crate::handler::Handler;
use crate::options::SubscribeOptions;
use crate::rate_limit::{RateLimit, RateLimited};
use crate::subscription::shell::HandlerKind;

/// A sync or async handler, its concrete type erased: what every handler becomes when it
/// is subscribed ([`IntoHandler`]).
///
/// Useful on its own where the kind is chosen at run time — a test suite running the same
/// cases with sync and async handlers, say — since both kinds are this one type:
///
/// ```
/// use tidings::{AnyHandler, Broker, Driver, IntoHandler, Message, SubscribeOptions};
///
/// let broker = Broker::builder().driver(Driver::Manual).build()?;
/// let handler: AnyHandler = (|m: &Message| println!("{:?}", m.payload())).into_handler();
/// assert!(!handler.is_async());
/// let _sub = broker.subscribe("orders.*", SubscribeOptions::default(), handler)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Contract
/// The handler's own ([`Handler`], [`AsyncHandler`](crate::AsyncHandler)): converting it
/// changes nothing about how it is called. An async one needs the tokio driver:
/// subscribing it under another driver is refused with
/// [`SubscribeError::AsyncHandlerNeedsTokio`](crate::SubscribeError::AsyncHandlerNeedsTokio)
/// (for a durable target, a [`StreamError`](crate::StreamError) of kind `Unsupported`
/// wrapping it).
pub struct AnyHandler {
    pub(crate) kind: HandlerKind,
    /// What [`RateLimited`] decorators carry, for the subscription to keep (R-PAT-2).
    rate_limits: Vec<RateLimit>,
}

impl AnyHandler {
    fn of(kind: HandlerKind) -> Self {
        Self {
            kind,
            rate_limits: Vec::new(),
        }
    }

    /// `handler` as a sync handler: for a type that is both a [`Handler`] and an
    /// [`AsyncHandler`](crate::AsyncHandler) (tidings-sql's blocking `Transactional`, say),
    /// whose kind [`IntoHandler`] cannot infer.
    pub fn from_sync(handler: impl Handler) -> Self {
        Self::of(HandlerKind::Sync(Arc::new(handler)))
    }

    /// `handler` as an async handler (feature `tokio`): for a type that is both a
    /// [`Handler`] and an [`AsyncHandler`](crate::AsyncHandler), whose kind [`IntoHandler`]
    /// cannot infer.
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn from_async(handler: impl crate::async_handler::AsyncHandler) -> Self {
        Self::of(HandlerKind::Async(Arc::new(handler)))
    }

    /// True when the handler is async (awaited by the tokio driver).
    #[must_use]
    pub fn is_async(&self) -> bool {
        match self.kind {
            HandlerKind::Sync(_) => false,
            #[cfg(feature = "tokio")]
            HandlerKind::Async(_) => true,
        }
    }
}

impl AnyHandler {
    /// The options the subscription runs with: `options`, and the rate limit a
    /// [`RateLimited`] decorator carries. One limit per subscription: a second — from the
    /// options and a decorator, or two decorators — is refused, naming both.
    pub(crate) fn options(
        &self,
        options: SubscribeOptions,
    ) -> Result<SubscribeOptions, ConfigError> {
        if self.rate_limits.is_empty() {
            return Ok(options);
        }
        match (options.rate_limit, self.rate_limits.as_slice()) {
            (None, [one]) => Ok(options.rate_limit(*one)),
            (from_options, decorators) => Err(ConfigError::invalid(
                "rate_limit",
                from_options
                    .iter()
                    .chain(decorators)
                    .map(|l| format!("{} per {:?}", l.limit(), l.per()))
                    .collect::<Vec<_>>()
                    .join(" and "),
                "one rate limit per subscription (SubscribeOptions::rate_limit or one \
                 RateLimited decorator)",
            )),
        }
    }
}

impl fmt::Debug for AnyHandler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_async() {
            "AnyHandler(async)"
        } else {
            "AnyHandler(sync)"
        })
    }
}

/// Anything [`Broker::subscribe`](crate::Broker::subscribe) accepts as a handler: a
/// [`Handler`] (closures `Fn(&Message) -> R`), an [`AsyncHandler`](crate::AsyncHandler)
/// (closures `Fn(Arc<Message>) -> impl Future`, feature `tokio`), or an [`AnyHandler`].
///
/// `Kind` tells the three apart — `dyn Handler`, `dyn AsyncHandler` or `AnyHandler` — and
/// is inferred: a closure implements only one of the two handler traits, so its kind
/// follows from its argument type (`&Message` or `Arc<Message>`), which the closure must
/// annotate. Typed and decorated handlers have the kind of what they wrap.
///
/// A type that implements **both** traits (tidings-sql's blocking `Transactional` with its
/// `tokio` feature, which can also run on tokio's blocking pool) has no one kind to infer:
/// the compiler asks for annotations, and the caller says which with
/// [`AnyHandler::from_sync`] or [`AnyHandler::from_async`].
///
/// Sealed: implement [`Handler`] or [`AsyncHandler`](crate::AsyncHandler) instead.
pub trait IntoHandler<Kind: ?Sized>: sealed::Sealed<Kind> {
    /// The handler, type-erased.
    fn into_handler(self) -> AnyHandler;
}

mod sealed {
    /// Only the conversions below exist.
    pub trait Sealed<Kind: ?Sized> {}
    impl<H: super::Handler> Sealed<dyn super::Handler> for H {}
    #[cfg(feature = "tokio")]
    impl<H: crate::async_handler::AsyncHandler> Sealed<dyn crate::async_handler::AsyncHandler> for H {}
    impl Sealed<super::AnyHandler> for super::AnyHandler {}
    impl<K: ?Sized, H: super::IntoHandler<K>> Sealed<crate::RateLimited<K>> for crate::RateLimited<H> {}
}

impl<H: Handler> IntoHandler<dyn Handler> for H {
    fn into_handler(self) -> AnyHandler {
        AnyHandler::from_sync(self)
    }
}

#[cfg(feature = "tokio")]
impl<H: crate::async_handler::AsyncHandler> IntoHandler<dyn crate::async_handler::AsyncHandler>
    for H
{
    fn into_handler(self) -> AnyHandler {
        AnyHandler::from_async(self)
    }
}

impl IntoHandler<AnyHandler> for AnyHandler {
    fn into_handler(self) -> AnyHandler {
        self
    }
}

impl<K: ?Sized, H: IntoHandler<K>> IntoHandler<RateLimited<K>> for RateLimited<H> {
    fn into_handler(self) -> AnyHandler {
        let (handler, limit) = self.into_parts();
        let mut any = handler.into_handler();
        any.rate_limits.push(limit);
        any
    }
}
