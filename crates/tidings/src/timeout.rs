//! The timeout decorator (feature `tokio`, the Decorator of R-PAT-2): an async handler's
//! attempt that takes longer than a limit is cancelled and counts as a retryable failure.
//!
//! The contract is on [`Timeout`].

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use crate::async_handler::{AsyncHandler, HandlerFuture};
use crate::handler::HandlerError;
use crate::message::Message;

/// Bounds each attempt of an async handler to `limit` of tokio time (R-PAT-2).
///
/// # Contract
/// * An attempt is the inner handler's future. [`Timeout`] polls it; if it has not
///   completed when `limit` has passed since the attempt's first poll, the future is
///   **dropped** (cancelled at its current `.await`; its destructors run) and the attempt
///   fails with [`HandlerError::retry`]`("handler timed out after {limit:?}")`. The
///   subscription's retry policy then applies as to any other failure (R-DEL-1): retried
///   with backoff, dead-lettered `RetriesExhausted` with that text when the policy gives up.
///   An attempt that completes in time returns the inner handler's result unchanged.
/// * Cancellation is cooperative, as everywhere in async Rust: a future that blocks its
///   thread without reaching an `.await` (a long computation, blocking I/O) cannot be
///   interrupted, and is cancelled at its next `.await` after the limit.
/// * **Async handlers only.** A sync [`Handler`](crate::Handler) runs to completion on its
///   thread and nothing can stop it, so `Timeout` does not implement `Handler`: wrapping one
///   and passing it to `subscribe` does not compile, rather than promising a limit it
///   cannot keep. Make such a handler async (with `tokio::task::spawn_blocking` for its
///   blocking part, which the timeout then abandons — it runs on — rather than stops).
///
/// # Time
/// The limit is measured on **tokio's clock** (`tokio::time`), not the broker's
/// [`Clock`](crate::Clock): a [`ManualClock`](crate::ManualClock) cannot drive a tokio
/// timer (it moves only when told, and tokio's timer cannot be told). Tests make it
/// deterministic with tokio's paused time (`#[tokio::test(start_paused = true)]` or
/// `tokio::time::pause()`, tokio feature `test-util`), under which a timed-out attempt
/// fails at exactly `limit` of tokio time. To have retry backoff on the same paused time
/// line, give the broker a [`Clock`](crate::Clock) that reads `tokio::time::Instant::now()`
/// (tidings' own tests do: `tests/timeout.rs`).
///
/// # Limits
/// * `Duration::MAX`, or any limit too large to be a deadline from now: never times out
///   (the inner future is awaited as is; no overflow, no panic — R-LIM-1).
/// * `Duration::ZERO`: the attempt must complete at its first poll. A handler that is ready
///   at once (one that does not wait on anything) succeeds; any handler that has to wait
///   times out at once. It is accepted, not refused: it is what "no time at all" means.
///
/// # Composition
/// `Timeout` wraps any [`AsyncHandler`]: a closure, a [`Typed`](crate::Typed) async
/// handler, a [`Deduplicating`](crate::Deduplicating) one, and is itself wrapped by
/// `Deduplicating`: `Deduplicating::new(Timeout::new(h, limit))` records an id only after
/// an attempt succeeded within the limit, so a timed-out attempt is retried for real.
///
/// # Example
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tidings::{Broker, DeadLetterReason, Driver, HandlerError, Message, Retry,
///               SubscribeOptions, Timeout};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build()?.block_on(async {
/// // Paused tokio time: the hour below passes at once, deterministically.
/// let broker = Broker::builder().driver(Driver::Tokio(tokio::runtime::Handle::current())).build()?;
/// let slow = broker.subscribe(
///     "reports.*",
///     SubscribeOptions::new().retry(Retry::None),
///     Timeout::new(
///         |_m: Arc<Message>| async {
///             tokio::time::sleep(Duration::from_secs(3600)).await;
///             Ok::<(), HandlerError>(())
///         },
///         Duration::from_secs(5),
///     ),
/// )?;
/// broker.publish(Message::to("reports.daily"))?;
/// while slow.dead_letters().is_empty() {
///     tokio::time::sleep(Duration::from_secs(1)).await;
/// }
/// let dead = slow.dead_letters();
/// assert!(matches!(dead[0].reason, DeadLetterReason::RetriesExhausted { .. }));
/// assert_eq!(dead[0].last_error(), Some("handler timed out after 5s"));
/// # broker.close_async(Duration::from_secs(1)).await;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A sync handler cannot be interrupted, so it cannot be wrapped:
///
/// ```compile_fail
/// use std::time::Duration;
/// use tidings::{Broker, Message, SubscribeOptions, Timeout};
/// let broker = Broker::new();
/// let _ = broker.subscribe(
///     "t",
///     SubscribeOptions::default(),
///     Timeout::new(|_m: &Message| (), Duration::from_secs(1)), // not a `Handler`
/// );
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub struct Timeout<H> {
    inner: H,
    limit: Duration,
    timed_out: AtomicU64,
}

impl<H> Timeout<H> {
    /// Wrap `inner` so each attempt is cancelled after `limit` (`Duration::MAX`: never;
    /// `Duration::ZERO`: must complete at its first poll).
    pub fn new(inner: H, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            timed_out: AtomicU64::new(0),
        }
    }

    /// The limit per attempt.
    #[must_use]
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// Attempts cancelled for taking longer than the limit, so far.
    #[must_use]
    pub fn timed_out(&self) -> u64 {
        self.timed_out.load(Ordering::Relaxed)
    }

    /// The wrapped handler.
    #[must_use]
    pub fn inner(&self) -> &H {
        &self.inner
    }
}

impl<H> fmt::Debug for Timeout<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Timeout")
            .field("limit", &self.limit)
            .field("timed_out", &self.timed_out())
            .finish_non_exhaustive()
    }
}

impl<H: AsyncHandler> AsyncHandler for Timeout<H> {
    /// The inner handler's future, cancelled (dropped) and failed with a retryable error
    /// if it has not completed within the limit of its first poll.
    ///
    /// # Cancel safety
    /// Dropping the returned future drops the inner one, as a timeout does: cancel safe
    /// exactly when the inner handler's future is.
    fn handle<'a>(&'a self, message: Arc<Message>) -> HandlerFuture<'a> {
        let mut attempt = self.inner.handle(message);
        Box::pin(async move {
            if self.limit.is_zero() {
                // Exactly one poll, not "a timer of zero" (which would be rounded to the
                // timer's millisecond).
                let first = std::future::poll_fn(|cx| Poll::Ready(attempt.as_mut().poll(cx)));
                return match first.await {
                    Poll::Ready(outcome) => outcome,
                    Poll::Pending => {
                        drop(attempt);
                        Err(self.expired())
                    }
                };
            }
            // From the first poll; a limit past what an instant can hold never fires.
            let Some(deadline) = ::tokio::time::Instant::now().checked_add(self.limit) else {
                return attempt.await;
            };
            match ::tokio::time::timeout_at(deadline, attempt).await {
                Ok(outcome) => outcome,
                Err(_elapsed) => Err(self.expired()),
            }
        })
    }
}

impl<H> Timeout<H> {
    /// Count a timed-out attempt; its error.
    fn expired(&self) -> HandlerError {
        self.timed_out.fetch_add(1, Ordering::Relaxed);
        HandlerError::retry(format!("handler timed out after {:?}", self.limit))
    }
}
