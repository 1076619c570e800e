//! The rate-limiting decorator (the Decorator of R-PAT-2): at most so many handler starts
//! per period for the subscription it wraps, waiting without holding anyone up.
//!
//! The contract is on [`RateLimited`].
//!
//! # How it waits
//! A message that finds no token is not slept on: the decorator answers
//! [`HandlerError::defer_until`] with the time the next token is due, and the subscription
//! parks the message at the head of its lane or key until then — no dispatcher thread or
//! task waits, no other subscription (and, with per-key concurrency, no other key) is held
//! up, the message's order is kept, and the call counts as neither an attempt nor a
//! failure. Because the due time is read from the broker's [`Clock`], the schedule is
//! exact on a [`ManualClock`](crate::ManualClock).
//!
//! # Why there is no `CircuitBreaker`
//! With keyed lanes or per-key concurrency one poison key would open a breaker for every
//! key, and whether the half-open trial is one start across lanes is undecided; a user can
//! write one on [`HandlerError::defer_until`]. The full reasoning is on [`RateLimited`], where
//! users read it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::clock::Clock;
use crate::error::ConfigError;
use crate::handler::{Handler, HandlerError};
use crate::message::Message;

/// The longest period [`RateLimited::new`] accepts: 365 days. Longer ones are almost
/// certainly a unit mistake, and the bucket's arithmetic stays far from overflow.
pub const MAX_RATE_PERIOD: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Lets at most `limit` handler starts through per `per` of the broker's clock, for the
/// subscription it wraps (R-PAT-2).
///
/// # Contract
/// * **A token per start.** Each handler call — a first attempt or a retry — takes a
///   token before the inner handler runs. A message that finds none is
///   [deferred](HandlerError::defer_until) to the time the next token is due and delivered
///   again then (see the module docs): it is not an attempt, not a failure, and keeps its
///   place — the messages behind it in its lane (or its key, under per-key concurrency)
///   wait behind it, other lanes and keys are not held up.
/// * **The bucket** (GCRA, a token bucket kept as one timestamp): full at the start, it
///   holds `limit` tokens and one comes back every `per / limit` (rounded **up** to whole
///   nanoseconds, so the rate never exceeds the limit). So a burst of up to `limit` starts
///   at once, then one start per `per / limit`: over any span `d`, at most
///   `limit + d / (per / limit)` starts. On a [`ManualClock`](crate::ManualClock) the
///   schedule is exact to the nanosecond: 3 per second starts 3 at once, then one at
///   exactly 333,333,334 ns, 666,666,668 ns, …
/// * **Its clock is the broker's**: pass [`Broker::clock`](crate::Broker::clock)
///   (`broker.clock().clone()`). Token times and the subscription's wake-ups must be read
///   from the same clock; another one makes the waits wrong (though never unsafe).
/// * **The bucket belongs to the value.** Wrap each subscription's handler in its own
///   `RateLimited`. One value shared through an `Arc` by several subscriptions limits them
///   together; its deferred messages then compete for the tokens, first come first served.
/// * Closing: a message waiting for its token is delivered during a drain when its token
///   comes before the drain's deadline, and abandoned (`Shutdown`) at close otherwise, as
///   [`HandlerError::defer_until`] describes.
///
/// # Composition
/// It wraps any [`Handler`], and any [`AsyncHandler`](crate::AsyncHandler) with the
/// `tokio` feature (the token is taken when the future is created, which is when the
/// attempt starts). Put [`Deduplicating`](crate::Deduplicating) **outside** it, so a
/// duplicate is skipped without spending a token; put [`Timeout`](crate::Timeout) inside
/// it, so the limit bounds each attempt that was let through:
/// `Deduplicating::new(RateLimited::new(Timeout::new(h, limit), n, per, clock)?)`.
///
/// # Why there is no `CircuitBreaker`
/// A breaker would fit on the same outcome — an open breaker defers each message to the
/// end of its cool-down — but two questions have no good answer yet:
/// * **Whose failures open it.** With keyed lanes or per-key concurrency one subscription
///   runs many keys, and a breaker wrapping its handler sees their failures interleaved:
///   one poison key (failing on every attempt while the retry policy works through it)
///   would open the breaker for every key, although the others are healthy. A breaker per
///   key is likely the right shape, and needs a bound on how many keys it remembers.
/// * **The half-open trial.** After the cool-down a breaker lets one trial through. With
///   several lanes or keys in flight, "one" is either one start across all of them (the
///   others deferred again meanwhile) or one per lane — a choice with visible effects on
///   ordering and throughput that should be made deliberately, not by accident.
///
/// Until those are decided, a breaker fitted to one application's keys is a short handler
/// decorator over the public [`HandlerError::defer_until`]: count failures, and while open
/// return `Err(HandlerError::defer_until(reopen_at))` before calling the inner handler.
///
/// # Example
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use std::time::Duration;
/// use tidings::{Broker, Driver, ManualClock, Message, RateLimited, SubscribeOptions};
///
/// let clock = ManualClock::new();
/// let broker = Broker::builder().driver(Driver::Manual).clock(clock.clone()).build()?;
/// let started = Arc::new(AtomicU32::new(0));
/// let count = started.clone();
/// let limited = RateLimited::new(
///     move |_m: &Message| { count.fetch_add(1, Ordering::Relaxed); },
///     2,                                  // two starts…
///     Duration::from_secs(1),             // …per second
///     broker.clock().clone(),
/// )?;
/// let _sub = broker.subscribe("emails.*", SubscribeOptions::default(), limited)?;
/// for _ in 0..4 {
///     broker.publish(Message::to("emails.welcome"))?;
/// }
/// broker.run_until_idle();
/// assert_eq!(started.load(Ordering::Relaxed), 2); // the burst; the third waits
/// clock.advance(Duration::from_millis(500));      // one token back
/// broker.run_until_idle();
/// assert_eq!(started.load(Ordering::Relaxed), 3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RateLimited<H> {
    inner: H,
    limit: u32,
    per: Duration,
    /// How often a token comes back: `per / limit`, rounded up.
    interval: Duration,
    /// How far ahead of now the bucket may run: `(limit - 1) * interval`, the burst.
    tolerance: Duration,
    clock: Arc<dyn Clock>,
    /// GCRA's theoretical arrival time: when the bucket would be full again if nothing
    /// more started. `None` until the first start.
    full_at: Mutex<Option<Instant>>,
    deferred: AtomicU64,
}

impl<H> RateLimited<H> {
    /// Wrap `inner` so it starts at most `limit` times per `per` of `clock` (the broker's:
    /// `broker.clock().clone()`).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for a `limit` of zero (nothing could ever start), a zero
    /// `per`, or a `per` over [`MAX_RATE_PERIOD`] (a year). Never panics.
    pub fn new(
        inner: H,
        limit: u32,
        per: Duration,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, ConfigError> {
        if limit == 0 {
            return Err(ConfigError::invalid(
                "rate_limit.limit",
                "0".into(),
                "at least 1 start per period",
            ));
        }
        if per.is_zero() || per > MAX_RATE_PERIOD {
            return Err(ConfigError::invalid(
                "rate_limit.per",
                format!("{per:?}"),
                "a period above zero and at most a year (365 days)",
            ));
        }
        // A year is 3.2e16 ns: every figure below fits a u64 of nanoseconds.
        let nanos = per.as_nanos();
        let interval = nanos.div_ceil(u128::from(limit));
        let tolerance = interval * u128::from(limit - 1);
        let to_duration = |n: u128| Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX));
        Ok(Self {
            inner,
            limit,
            per,
            interval: to_duration(interval),
            tolerance: to_duration(tolerance),
            clock,
            full_at: Mutex::new(None),
            deferred: AtomicU64::new(0),
        })
    }

    /// Starts allowed per [`per`](RateLimited::per).
    #[must_use]
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The period.
    #[must_use]
    pub fn per(&self) -> Duration {
        self.per
    }

    /// Handler calls deferred for want of a token, so far (one message may be deferred
    /// more than once when several lanes or keys wait for the same token).
    #[must_use]
    pub fn deferred(&self) -> u64 {
        self.deferred.load(Ordering::Relaxed)
    }

    /// The wrapped handler.
    #[must_use]
    pub fn inner(&self) -> &H {
        &self.inner
    }

    /// Take a token now, or say when the next one is due.
    fn admit(&self) -> Result<(), HandlerError> {
        let now = self.clock.now();
        let mut full_at = self.full_at.lock();
        let at = full_at.filter(|t| *t > now).unwrap_or(now);
        if at - now > self.tolerance {
            drop(full_at);
            self.deferred.fetch_add(1, Ordering::Relaxed);
            // `at - tolerance` is after now, since `at - now > tolerance`.
            return Err(HandlerError::defer_until(at - self.tolerance));
        }
        // At most now + a year: an `Instant` holds that on every platform tidings runs
        // on; were it not to, starting unlimited is the one outcome that cannot panic.
        *full_at = Some(at.checked_add(self.interval).unwrap_or(at));
        Ok(())
    }
}

impl<H> fmt::Debug for RateLimited<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimited")
            .field("limit", &self.limit)
            .field("per", &self.per)
            .field("deferred", &self.deferred())
            .finish_non_exhaustive()
    }
}

impl<H: Handler> Handler for RateLimited<H> {
    /// Take a token and call the inner handler, or defer the message to the next token.
    fn handle(&self, message: &Message) -> Result<(), HandlerError> {
        self.admit()?;
        self.inner.handle(message)
    }
}

/// An async handler is limited the same way (feature `tokio`): the token is taken when the
/// attempt starts — when the dispatcher asks for its future — not when it completes.
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
impl<H: crate::AsyncHandler> crate::AsyncHandler for RateLimited<H> {
    /// The inner handler's future if a token was free, else a future that is ready at once
    /// with the deferral.
    ///
    /// # Cancel safety
    /// The token is taken before the future exists; dropping the future does not give it
    /// back. Otherwise exactly as cancel safe as the inner handler's future.
    fn handle<'a>(&'a self, message: Arc<Message>) -> crate::HandlerFuture<'a> {
        match self.admit() {
            Ok(()) => self.inner.handle(message),
            Err(deferral) => Box::pin(std::future::ready(Err(deferral))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn limited(limit: u32, per: Duration) -> Result<RateLimited<fn(&Message)>, ConfigError> {
        RateLimited::new(|_| {}, limit, per, Arc::new(ManualClock::new()))
    }

    #[test]
    fn impossible_limits_are_refused_with_a_typed_error() {
        let refused = |r: Result<_, ConfigError>| match r {
            Err(ConfigError::Invalid { setting, .. }) => setting,
            Ok(_) => panic!("accepted"),
        };
        assert_eq!(
            refused(limited(0, Duration::from_secs(1))),
            "rate_limit.limit"
        );
        assert_eq!(refused(limited(1, Duration::ZERO)), "rate_limit.per");
        assert_eq!(
            refused(limited(1, MAX_RATE_PERIOD + Duration::from_nanos(1))),
            "rate_limit.per"
        );
        assert_eq!(refused(limited(1, Duration::MAX)), "rate_limit.per");
        // The extremes that are accepted stay exact and never overflow.
        let widest = limited(u32::MAX, MAX_RATE_PERIOD).expect("a year is accepted");
        assert!(widest.interval >= Duration::from_nanos(1));
        let finest = limited(u32::MAX, Duration::from_nanos(1)).expect("1 ns is accepted");
        assert_eq!(finest.interval, Duration::from_nanos(1));
        let slowest = limited(1, MAX_RATE_PERIOD).expect("accepted");
        assert_eq!(
            (slowest.interval, slowest.tolerance),
            (MAX_RATE_PERIOD, Duration::ZERO)
        );
    }
}
