//! Rate limiting a subscription (R-PAT-2): at most `limit` handler starts in **any** window
//! of one period, on the broker's own clock.
//!
//! The contract is on [`RateLimit`]; a subscription gets one with
//! [`SubscribeOptions::rate_limit`](crate::SubscribeOptions::rate_limit), or from a handler
//! wrapped in [`RateLimited`].
//!
//! # Where the limit lives: the subscription, also when a decorator sets it
//! A limit is a schedule, and a schedule is only right on the clock the subscription wakes
//! by. A decorator that kept the limit itself had to be handed a clock, and a clock other
//! than the broker's silently missed the schedule. The subscription already holds the
//! broker's clock and decides when each start happens, so it keeps the limit: there is no
//! clock to pass, and the same limit serves sync and async handlers, every driver, and
//! durable subscriptions alike. It is set either way:
//! [`SubscribeOptions::rate_limit`](crate::SubscribeOptions::rate_limit), or the [`RateLimited`] decorator, which wraps a
//! handler like the other decorators and hands its limit to the subscription it is
//! subscribed with (R-PAT-2: the decorator shape, the subscription's guarantee).
//!
//! # Why a log of start instants, not a token bucket
//! A token bucket (full at the start, refilled one token per `per / limit`) admits its
//! burst *and* the refills of the same period: at 3 per second, 5 starts in the first
//! second. A downstream that allows `limit` per window refuses that. [`StartLog`] keeps
//! the instants of the last `limit` starts; the next start is allowed once the oldest of
//! them is one period old. That is exact: no window `[t, t + per)` — aligned to a start or
//! not — ever holds more than `limit` starts, and no start waits longer than that needs.
//!
//! # Why there is no `CircuitBreaker`
//! With keyed lanes or per-key concurrency one poison key would open a breaker for every
//! key, and whether the half-open trial is one start across lanes is undecided; a user can
//! write one on [`HandlerError::defer_until`](crate::HandlerError::defer_until) or
//! [`HandlerError::defer_for`](crate::HandlerError::defer_for) (see
//! [`RateLimit`]'s docs).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::error::ConfigError;

/// The longest period [`RateLimit::new`] accepts: 365 days. Longer ones are almost
/// certainly a unit mistake, and `Instant + period` stays far from overflow.
pub const MAX_RATE_PERIOD: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// The most starts per period [`RateLimit::new`] accepts: 1,000,000. The subscription
/// remembers the instant of each start within the last period (16 bytes each, so at most
/// 16 MB); a higher rate is the same rate over a shorter period (1,000 per millisecond
/// rather than 1,000,000 per second).
pub const MAX_RATE_LIMIT: u32 = 1_000_000;

/// At most [`limit`](Self::limit) handler starts in any window of one
/// [`per`](Self::per), on the broker's clock (R-PAT-2). Give it to a subscription with
/// [`SubscribeOptions::rate_limit`](crate::SubscribeOptions::rate_limit).
///
/// # Contract
/// * **Any window.** For every instant `t`, the window `[t, t + per)` of the broker's
///   clock holds at most `limit` handler starts of the subscription — windows aligned to
///   a start and windows starting between starts alike. So a burst of up to `limit`
///   starts at once, then the next start exactly one period after the first of the burst:
///   at 3 per second on a [`ManualClock`](crate::ManualClock), 3 starts at t = 0, the
///   4th at exactly 1 s, never 5 in the first second.
/// * **A start is a handler call**: a first attempt or a retry. A message that finds the
///   window full is not started: it waits at the head of its lane (or its key, under
///   per-key concurrency) until the window has room, as a
///   [deferral](crate::HandlerError::defer_until) does — no dispatcher thread or task
///   waits, other lanes and keys are not held up, the message keeps its place, and the
///   wait counts as neither an attempt nor a failure. A message that expires
///   (R-TIME-1) or is released by a start gate before its start takes no start.
/// * **The broker's clock**, always: the subscription reads the same clock it wakes by,
///   so the schedule is exact to the nanosecond on a manual clock and there is no other
///   clock to pass.
/// * **Per subscription.** Each subscription keeps its own window. Its handler is one
///   handler call per start, whatever it wraps: with a [`Deduplicating`](crate::Deduplicating)
///   handler, a duplicate it skips was still a start.
/// * **Closing.** A message waiting for room is delivered during a drain when room comes
///   before the drain's deadline, and abandoned (`Shutdown`) at close otherwise, as a
///   deferral is.
///
/// # Why there is no `CircuitBreaker`
/// A breaker would fit on the same outcome — an open breaker defers each message to the
/// end of its cool-down — but two questions have no good answer yet:
/// * **Whose failures open it.** With keyed lanes or per-key concurrency one subscription
///   runs many keys: one poison key (failing on every attempt while the retry policy works
///   through it) would open the breaker for every key, although the others are healthy.
///   A breaker per key is likely the right shape, and needs a bound on how many keys it
///   remembers.
/// * **The half-open trial.** After the cool-down a breaker lets one trial through. With
///   several lanes or keys in flight, "one" is either one start across all of them or one
///   per lane — a choice with visible effects on ordering and throughput that should be
///   made deliberately, not by accident.
///
/// Until those are decided, a breaker fitted to one application's keys is a short handler
/// decorator: count failures, and while open return
/// `Err(HandlerError::defer_for(cool_down_left))` before calling the inner handler.
///
/// # Example
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use std::time::Duration;
/// use tidings::{Broker, Driver, ManualClock, Message, RateLimit, SubscribeOptions};
///
/// let clock = ManualClock::new();
/// let broker = Broker::builder().driver(Driver::Manual).clock(clock.clone()).build()?;
/// let started = Arc::new(AtomicU32::new(0));
/// let count = started.clone();
/// let options = SubscribeOptions::new()
///     .rate_limit(RateLimit::new(2, Duration::from_secs(1))?); // two starts per second
/// let _sub = broker.subscribe("emails.*", options, move |_m: &Message| {
///     count.fetch_add(1, Ordering::Relaxed);
/// })?;
/// for _ in 0..4 {
///     broker.publish(Message::to("emails.welcome"))?;
/// }
/// broker.run_until_idle();
/// assert_eq!(started.load(Ordering::Relaxed), 2); // the burst; the third waits…
/// clock.advance(Duration::from_millis(999));
/// broker.run_until_idle();
/// assert_eq!(started.load(Ordering::Relaxed), 2); // …a whole period after the first
/// clock.advance(Duration::from_millis(1));
/// broker.run_until_idle();
/// assert_eq!(started.load(Ordering::Relaxed), 4);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RateLimit {
    limit: u32,
    per: Duration,
}

impl RateLimit {
    /// At most `limit` handler starts in any window of `per`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for a `limit` of zero (nothing could ever start) or over
    /// [`MAX_RATE_LIMIT`], a zero `per`, or a `per` over [`MAX_RATE_PERIOD`] (a year).
    /// Never panics.
    pub fn new(limit: u32, per: Duration) -> Result<Self, ConfigError> {
        if limit == 0 || limit > MAX_RATE_LIMIT {
            return Err(ConfigError::invalid(
                "rate_limit.limit",
                limit.to_string(),
                "1 to 1,000,000 starts per period (for more, use a shorter period)",
            ));
        }
        if per.is_zero() || per > MAX_RATE_PERIOD {
            return Err(ConfigError::invalid(
                "rate_limit.per",
                format!("{per:?}"),
                "a period above zero and at most a year (365 days)",
            ));
        }
        Ok(Self { limit, per })
    }

    /// Starts allowed in any window of one [`per`](Self::per).
    #[must_use]
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The period.
    #[must_use]
    pub fn per(&self) -> Duration {
        self.per
    }
}

/// The instants of a subscription's last [`RateLimit::limit`] starts within one period:
/// the sliding log that enforces a [`RateLimit`] exactly (see the module docs). Kept in
/// the subscription's core, under its lock, on the broker's clock.
#[derive(Debug)]
pub(crate) struct StartLog {
    limit: RateLimit,
    /// Oldest first; at most `limit` entries, each less than one period old at the last
    /// [`admit`](Self::admit).
    starts: VecDeque<Instant>,
}

impl StartLog {
    pub(crate) fn new(limit: RateLimit) -> Self {
        Self {
            limit,
            starts: VecDeque::new(),
        }
    }

    /// Record a start at `now` if the window `(now - per, now]` has room; otherwise `Err`
    /// with the first instant it will have room: one period after the oldest start in it.
    /// `now` must not go back (the broker's clock is monotonic).
    pub(crate) fn admit(&mut self, now: Instant) -> Result<(), Instant> {
        let per = self.limit.per;
        // An instant a year ahead is representable on every platform tidings runs on; one
        // that were not would never leave the window (`is_none_or` keeps it), so the
        // outcome is a wait, never an extra start and never a panic.
        while self
            .starts
            .front()
            .is_some_and(|oldest| oldest.checked_add(per).is_some_and(|end| end <= now))
        {
            self.starts.pop_front();
        }
        if self.starts.len() < self.limit.limit as usize {
            self.starts.push_back(now);
            return Ok(());
        }
        let oldest = self.starts.front().copied().unwrap_or(now);
        Err(oldest.checked_add(per).unwrap_or(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impossible_limits_are_refused_with_a_typed_error() {
        let refused = |r: Result<RateLimit, ConfigError>| match r {
            Err(ConfigError::Invalid { setting, .. }) => setting,
            Ok(_) => panic!("accepted"),
        };
        let sec = Duration::from_secs(1);
        assert_eq!(refused(RateLimit::new(0, sec)), "rate_limit.limit");
        assert_eq!(
            refused(RateLimit::new(MAX_RATE_LIMIT + 1, sec)),
            "rate_limit.limit"
        );
        assert_eq!(refused(RateLimit::new(1, Duration::ZERO)), "rate_limit.per");
        assert_eq!(
            refused(RateLimit::new(1, MAX_RATE_PERIOD + Duration::from_nanos(1))),
            "rate_limit.per"
        );
        assert_eq!(refused(RateLimit::new(1, Duration::MAX)), "rate_limit.per");
        assert!(RateLimit::new(MAX_RATE_LIMIT, MAX_RATE_PERIOD).is_ok());
        assert!(RateLimit::new(1, Duration::from_nanos(1)).is_ok());
    }

    // R-PAT-2: the log's own arithmetic, exact to the nanosecond: a burst of `limit`, the
    // next start one period after the first, and a start leaves the window exactly one
    // period after it was made (the window is half-open).
    #[test]
    fn the_log_admits_one_period_after_the_oldest_start() {
        let t0 = Instant::now();
        let ns = Duration::from_nanos;
        let per = Duration::from_secs(1);
        let mut log = StartLog::new(RateLimit::new(3, per).unwrap());
        for _ in 0..3 {
            assert_eq!(log.admit(t0), Ok(()));
        }
        assert_eq!(log.admit(t0), Err(t0 + per));
        assert_eq!(log.admit(t0 + per - ns(1)), Err(t0 + per));
        assert_eq!(log.admit(t0 + per), Ok(()));
        assert_eq!(log.admit(t0 + per), Ok(()));
        assert_eq!(log.admit(t0 + per), Ok(()));
        assert_eq!(log.admit(t0 + per), Err(t0 + per * 2));
        // Spread starts: the window follows the oldest of the last three.
        let mut log = StartLog::new(RateLimit::new(2, per).unwrap());
        assert_eq!(log.admit(t0), Ok(()));
        assert_eq!(log.admit(t0 + ns(700)), Ok(()));
        assert_eq!(log.admit(t0 + ns(800)), Err(t0 + per));
        assert_eq!(log.admit(t0 + per), Ok(()));
        assert_eq!(log.admit(t0 + per), Err(t0 + per + ns(700)));
    }
}

/// A handler under a [`RateLimit`] (R-PAT-2): the decorator form of
/// [`SubscribeOptions::rate_limit`](crate::SubscribeOptions::rate_limit). Subscribed, it is
/// the handler it wraps — sync or async, typed or decorated — and the subscription keeps
/// the limit, with [`RateLimit`]'s whole contract: at most `limit` handler starts in any
/// window of one period, on the broker's own clock.
///
/// One limit per subscription: subscribing a `RateLimited` handler with options that set
/// a rate limit too, or one wrapped in two, is refused
/// ([`SubscribeError::InvalidOptions`](crate::SubscribeError::InvalidOptions); for a
/// durable target, the [`StreamError`](crate::StreamError) that wraps it), naming both.
///
/// ```
/// use std::time::Duration;
/// use tidings::{Broker, Driver, Message, RateLimit, RateLimited, SubscribeOptions};
///
/// let broker = Broker::builder().driver(Driver::Manual).build()?;
/// let three_a_second = RateLimit::new(3, Duration::from_secs(1))?;
/// let handler = RateLimited::new(|m: &Message| println!("{:?}", m.payload()), three_a_second);
/// let sub = broker.subscribe("mail.send", SubscribeOptions::default(), handler)?;
/// # drop(sub);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct RateLimited<H: ?Sized> {
    limit: RateLimit,
    handler: H,
}

impl<H> RateLimited<H> {
    /// `handler`, started at most `limit.limit()` times in any window of `limit.per()`.
    pub fn new(handler: H, limit: RateLimit) -> Self {
        Self { limit, handler }
    }

    /// The limit it carries.
    #[must_use]
    pub fn limit(&self) -> RateLimit {
        self.limit
    }

    pub(crate) fn into_parts(self) -> (H, RateLimit) {
        (self.handler, self.limit)
    }
}
