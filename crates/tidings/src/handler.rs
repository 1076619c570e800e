//! Handlers: the subscriber side of the Observer pattern (R-PAT-2, R-EXE-3).

use std::any::Any;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use crate::message::Message;

/// Handles messages for one subscription.
///
/// # Contract
/// * Called from the subscription's dispatcher: never concurrently for one subscription
///   unless it asked for keyed lanes or per-key concurrency (R-CORE-3).
/// * `Ok(())` acknowledges the message. An error is retried by the subscription's retry
///   policy unless it is [`HandlerError::reject`]ed (R-DEL-1). A panic is caught and treated
///   as a retryable error whose text is the panic message. [`HandlerError::defer_until`]
///   takes the call back: the message is delivered again when due, as the same attempt.
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
/// dead-letter queue as `Rejected`), and [`HandlerError::defer_until`] for one that is not
/// to be started yet (it waits, and no attempt or failure is counted).
///
/// # Size
/// Two words of text and one tag: 32 bytes on 64-bit targets, as is
/// `Result<(), HandlerError>` (a unit test keeps it so; every handler call returns one).
#[derive(Clone, PartialEq, Eq)]
pub struct HandlerError {
    repr: Repr,
}

/// The outcomes behind a [`HandlerError`]. A deferral carries no text, so its variant fits
/// in the failure's room and the whole stays 32 bytes.
#[derive(Clone, PartialEq, Eq)]
enum Repr {
    Failed { message: String, retryable: bool },
    Deferred(Instant),
    DeferredFor(Duration),
}

/// When a deferral asked to be delivered again: at an instant, or after a wait from when
/// the subscription reads the outcome (on the broker's clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deferral {
    Until(Instant),
    For(Duration),
}

impl HandlerError {
    /// A failure worth retrying.
    #[must_use]
    pub fn retry(message: impl Into<String>) -> Self {
        Self {
            repr: Repr::Failed {
                message: message.into(),
                retryable: true,
            },
        }
    }
    /// A failure that will never succeed: dead-lettered at once with reason `Rejected`.
    #[must_use]
    pub fn reject(message: impl Into<String>) -> Self {
        Self {
            repr: Repr::Failed {
                message: message.into(),
                retryable: false,
            },
        }
    }
    /// Not now: deliver this message again at `due`, on the **broker's clock**
    /// ([`Broker::clock`](crate::Broker::clock); a [`ManualClock`](crate::ManualClock) in
    /// tests). This is how a handler waits without holding a dispatcher slot —
    /// [`RateLimit`](crate::RateLimit) waits the same way.
    ///
    /// # Contract
    /// * **Not an attempt, not a failure.** The handler call is taken back: the
    ///   subscription's `attempts` and `failures` do not count it, the retry policy is not
    ///   asked, and the message is delivered again with the **same attempt number**.
    ///   Expiry (R-TIME-1) is checked again before that delivery, as before every attempt.
    /// * **Order holds (R-ORD-1).** The message waits at the head of its lane (serial,
    ///   keyed lanes) or of its key (per-key concurrency), as a waiting retry does: the
    ///   messages behind it in that lane or key wait too, other lanes and keys go on, and a
    ///   deferred message under per-key concurrency holds no dispatcher slot while it waits.
    /// * **Closing.** A drain keeps delivering it when it comes due, until the drain's
    ///   deadline (it was never started, like a queued message); at close a message still
    ///   waiting is abandoned as `Shutdown` and listed in the close report, like a waiting
    ///   retry. A deferral returned after close has begun is abandoned at once.
    /// * `due` at or before now: delivered again at the next poll (after the other lanes' or
    ///   keys' ready work under per-key concurrency). Nothing bounds how often a handler
    ///   defers: a handler that always defers never finishes its message.
    #[must_use]
    pub fn defer_until(due: Instant) -> Self {
        Self {
            repr: Repr::Deferred(due),
        }
    }
    /// Not now: deliver this message again `wait` from now on the **broker's clock** —
    /// the [`defer_until`](HandlerError::defer_until) of a handler that has no clock at
    /// hand, with the same contract. "Now" is when the subscription reads the outcome,
    /// just after the call returns.
    ///
    /// A `wait` whose deadline the clock cannot represent (`Duration::MAX`, or anything
    /// past the platform's `Instant` range) would park the message — and its lane or key —
    /// for good; it is refused instead: the message is dead-lettered as `Rejected` with the
    /// error `"deferred for …, past the clock's range"`. Never panics.
    #[must_use]
    pub fn defer_for(wait: Duration) -> Self {
        Self {
            repr: Repr::DeferredFor(wait),
        }
    }
    /// The error text (`"deferred"` for a [deferral](HandlerError::defer_until)).
    #[must_use]
    pub fn message(&self) -> &str {
        match &self.repr {
            Repr::Failed { message, .. } => message,
            Repr::Deferred(_) | Repr::DeferredFor(_) => "deferred",
        }
    }
    /// Whether this is a deferral ([`defer_until`](HandlerError::defer_until) or
    /// [`defer_for`](HandlerError::defer_for)) rather than a failure.
    #[must_use]
    pub fn is_deferral(&self) -> bool {
        self.deferral().is_some()
    }
    /// How long a [`defer_for`](HandlerError::defer_for) asked to wait; `None` for a
    /// failure and for a [`defer_until`](HandlerError::defer_until).
    #[must_use]
    pub fn deferred_for(&self) -> Option<Duration> {
        match self.repr {
            Repr::DeferredFor(wait) => Some(wait),
            _ => None,
        }
    }
    pub(crate) fn deferral(&self) -> Option<Deferral> {
        match self.repr {
            Repr::Deferred(due) => Some(Deferral::Until(due)),
            Repr::DeferredFor(wait) => Some(Deferral::For(wait)),
            Repr::Failed { .. } => None,
        }
    }
    /// Whether the retry policy applies: true for [`retry`](HandlerError::retry) and
    /// converted errors, false for a rejection and a deferral.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.repr,
            Repr::Failed {
                retryable: true,
                ..
            }
        )
    }
    /// When a [`defer_until`](HandlerError::defer_until) asked to be delivered again;
    /// `None` for a failure and for a [`defer_for`](HandlerError::defer_for) (see
    /// [`deferred_for`](HandlerError::deferred_for)).
    #[must_use]
    pub fn deferred_until(&self) -> Option<Instant> {
        match self.repr {
            Repr::Deferred(due) => Some(due),
            _ => None,
        }
    }
    pub(crate) fn from_panic(payload: &(dyn Any + Send)) -> Self {
        Self::retry(format!("handler panicked: {}", panic_text(payload)))
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.repr {
            Repr::Failed { message, retryable } => {
                let kind = if *retryable { "retry" } else { "reject" };
                write!(f, "HandlerError::{kind}({message:?})")
            }
            Repr::Deferred(due) => write!(f, "HandlerError::defer_until({due:?})"),
            Repr::DeferredFor(wait) => write!(f, "HandlerError::defer_for({wait:?})"),
        }
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
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

#[cfg(all(test, target_pointer_width = "64"))]
mod tests {
    use super::HandlerError;

    // Every handler call returns a `Result<(), HandlerError>`; the deferral must not make
    // it bigger than the failure it shares the type with.
    #[test]
    fn a_handler_error_stays_small() {
        assert_eq!(std::mem::size_of::<HandlerError>(), 32);
        assert_eq!(std::mem::size_of::<Result<(), HandlerError>>(), 32);
    }

    #[test]
    fn a_deferral_is_neither_retryable_nor_a_rejection_and_says_when() {
        let due = std::time::Instant::now();
        let e = HandlerError::defer_until(due);
        assert_eq!(e.deferred_until(), Some(due));
        assert!(!e.is_retryable());
        assert_eq!(e.message(), "deferred");
        assert_eq!(HandlerError::retry("x").deferred_until(), None);
        assert!(format!("{e:?}").starts_with("HandlerError::defer_until("));
        let wait = std::time::Duration::MAX;
        let e = HandlerError::defer_for(wait);
        assert!(e.is_deferral() && !e.is_retryable());
        assert_eq!((e.deferred_for(), e.deferred_until()), (Some(wait), None));
        assert_eq!(e.message(), "deferred");
        assert!(!HandlerError::reject("x").is_deferral());
    }
}
