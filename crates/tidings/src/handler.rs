//! Handlers: the subscriber side of the Observer pattern (R-PAT-2, R-EXE-3).

use std::any::Any;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::message::Message;

/// Handles messages for one subscription.
///
/// # Contract
/// * Called from the subscription's dispatcher: never concurrently for one subscription
///   unless it asked for keyed lanes or per-key concurrency (R-CORE-3).
/// * `Ok(())` acknowledges the message. An error is retried by the subscription's retry
///   policy unless it is [`HandlerError::reject`]ed (R-DEL-1). A panic is caught and treated
///   as a retryable error whose text is the panic message.
/// * A handler may call back into the broker (publish, subscribe, unsubscribe itself): no
///   broker lock is held while it runs (R-CORE-2).
pub trait Handler: Send + Sync + 'static {
    /// Process one message.
    fn handle(&self, message: &Message) -> Result<(), HandlerError>;
}

/// Closures and functions `Fn(&Message) -> R` are handlers, where `R` is `()` (always
/// acknowledges) or `Result<(), HandlerError>`. To have the closure's argument and
/// `Ok(())` inferred without annotations, wrap it in [`handler_fn`].
impl<F, R> Handler for F
where
    F: Fn(&Message) -> R + Send + Sync + 'static,
    R: IntoHandlerResult,
{
    fn handle(&self, message: &Message) -> Result<(), HandlerError> {
        self(message).into_handler_result()
    }
}

/// What a handler closure may return: `()` (acknowledge) or `Result<(), HandlerError>`.
///
/// Implemented only for those two, so `Ok(())` in a closure infers its error type.
pub trait IntoHandlerResult {
    /// The outcome the dispatcher acts on.
    fn into_handler_result(self) -> Result<(), HandlerError>;
}

impl IntoHandlerResult for () {
    fn into_handler_result(self) -> Result<(), HandlerError> {
        Ok(())
    }
}

impl IntoHandlerResult for Result<(), HandlerError> {
    fn into_handler_result(self) -> Result<(), HandlerError> {
        self
    }
}

/// A [`Handler`] made from a closure, with everything inferred: the argument is
/// `&Message`, and the closure returns `()` or `Result<(), HandlerError>` (`Ok(())` and
/// `?` on any `std::error::Error` need no annotation).
///
/// ```
/// # use tidings::*;
/// let broker = Broker::builder().driver(Driver::Manual).build()?;
/// let _quiet = broker.subscribe("a", SubscribeOptions::default(), handler_fn(|m| {
///     println!("{:?}", m.payload());
/// }))?;
/// let _parsing = broker.subscribe("b", SubscribeOptions::default(), handler_fn(|m| {
///     let n: u32 = std::str::from_utf8(m.payload())?.parse()?;
///     if n == 0 {
///         return Err(HandlerError::reject("zero"));
///     }
///     Ok(())
/// }))?;
/// broker.publish(Message::to("b").payload("7"))?;
/// assert_eq!(broker.run_until_idle(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn handler_fn<F, R>(f: F) -> FnHandler<F>
where
    F: Fn(&Message) -> R + Send + Sync + 'static,
    R: IntoHandlerResult,
{
    FnHandler(f)
}

/// The [`Handler`] returned by [`handler_fn`].
#[derive(Clone, Copy)]
pub struct FnHandler<F>(F);

impl<F> fmt::Debug for FnHandler<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FnHandler(..)")
    }
}

impl<F, R> Handler for FnHandler<F>
where
    F: Fn(&Message) -> R + Send + Sync + 'static,
    R: IntoHandlerResult,
{
    fn handle(&self, message: &Message) -> Result<(), HandlerError> {
        (self.0)(message).into_handler_result()
    }
}

/// Why a handler did not acknowledge a message.
///
/// Any `std::error::Error` converts into a retryable `HandlerError` with `?`. Use
/// [`HandlerError::reject`] for a message that can never succeed (it goes straight to the
/// dead-letter queue as `Rejected`).
#[derive(Clone, PartialEq, Eq)]
pub struct HandlerError {
    message: String,
    retryable: bool,
}

impl HandlerError {
    /// A failure worth retrying.
    #[must_use]
    pub fn retry(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: true,
        }
    }
    /// A failure that will never succeed: dead-lettered at once with reason `Rejected`.
    #[must_use]
    pub fn reject(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: false,
        }
    }
    /// The error text.
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }
    /// Whether the retry policy applies.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }
    pub(crate) fn from_panic(payload: &(dyn Any + Send)) -> Self {
        Self::retry(format!("handler panicked: {}", panic_text(payload)))
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.retryable { "retry" } else { "reject" };
        write!(f, "HandlerError::{kind}({:?})", self.message)
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    fn from(error: E) -> Self {
        Self::retry(error.to_string())
    }
}

/// The text of a caught panic.
pub(crate) fn panic_text(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

/// Run a handler, turning a panic into a retryable error (R-DEL-1).
pub(crate) fn invoke(handler: &dyn Handler, message: &Message) -> Result<(), HandlerError> {
    match catch_unwind(AssertUnwindSafe(|| handler.handle(message))) {
        Ok(result) => result,
        Err(payload) => Err(HandlerError::from_panic(payload.as_ref())),
    }
}
