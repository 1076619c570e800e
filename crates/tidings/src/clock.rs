//! One source of time for the whole broker (R-TIME-3).
//!
//! Every deadline in tidings — TTL, delayed delivery, retry backoff, `Block` timeouts,
//! request timeouts, close deadlines — is computed from a [`Clock`]. Production code uses
//! [`SystemClock`]; tests use [`ManualClock`], which only moves when the test calls
//! [`ManualClock::advance`], so schedules are asserted exactly and nothing sleeps.
//!
//! Waiting is the driver's job, never the clock's: a dispatcher that must wait until `t`
//! asks [`Clock::wait_hint`] how long a real thread should block. A manual clock answers
//! "until woken", and wakes every registered waiter when it is advanced.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

/// When a message entered a subscription's queue, in 8 bytes: nanoseconds of the clock's wall
/// time since the Unix epoch, signed (a clock may be set before 1970), saturating ±292 years
/// from it.
///
/// Every queued message carries one, for the oldest-age gauge (R-BP-3). It is read from the
/// wall clock, which every publish reads anyway to stamp the message, so enqueueing costs no
/// clock read of its own (a monotonic read per publish is a measurable part of a
/// one-subscriber publish). Like every use of `wall()`, it is a stamp, never a deadline: a wall clock
/// stepped back makes the gauge read low (never negative) until the queue turns over. An
/// `Instant` would also take 16 bytes, and with up to a queue's capacity of them per
/// subscription the difference is cache lines the dispatcher walks through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct EnqueueStamp(i64);

impl EnqueueStamp {
    /// The UNIX epoch: for an entry whose stamp is never read (a batch's started message).
    pub(crate) const EPOCH: Self = Self(0);

    pub(crate) fn of(t: SystemTime) -> Self {
        let nanos = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        match t.duration_since(SystemTime::UNIX_EPOCH) {
            Ok(after) => Self(nanos(after)),
            Err(before) => Self(-nanos(before.duration())),
        }
    }

    /// Whole milliseconds since the UNIX epoch, 0 before it: what the message id's
    /// `millis_since_epoch` gives for the same time (up to 2262, where the stamp
    /// saturates), so a publish converts its one wall reading once for both its message
    /// id and its queue stamps.
    pub(crate) fn epoch_millis(self) -> u64 {
        u64::try_from(self.0 / 1_000_000).unwrap_or(0)
    }

    /// How long before `now` this stamp was taken; zero if after it (a clock stepped back).
    pub(crate) fn age_at(self, now: SystemTime) -> Duration {
        let now = Self::of(now).0;
        Duration::from_nanos(u64::try_from(now.saturating_sub(self.0)).unwrap_or(0))
    }
}

/// A source of monotonic and wall-clock time.
///
/// # Contract
/// `now()` never goes backwards. `wall()` is used only to stamp messages and to judge
/// expiry against message timestamps; scheduling uses `now()`.
pub trait Clock: Send + Sync + 'static {
    /// Monotonic time: deadlines, backoff, timeouts.
    fn now(&self) -> Instant;
    /// Wall-clock time: message timestamps and expiry.
    fn wall(&self) -> SystemTime;
    /// How long a real thread should block to reach `deadline`.
    ///
    /// `None` means "block until woken": the clock wakes waiters itself when time moves
    /// (see [`Clock::register_waiter`]). The default computes the real remaining time.
    fn wait_hint(&self, deadline: Instant) -> Option<Duration> {
        Some(deadline.saturating_duration_since(self.now()))
    }
    /// Register something to wake whenever this clock jumps. Real clocks ignore it.
    fn register_waiter(&self, _waiter: Weak<dyn ClockWaiter>) {}
}

/// Woken by a [`ManualClock`] when it is advanced.
pub trait ClockWaiter: Send + Sync {
    /// Time moved: re-check deadlines.
    fn time_moved(&self);
}

/// The real clock: [`Instant::now`] and [`SystemTime::now`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to (R-TIME-3, R-EXE-2).
///
/// Clones share the same time. Its wall clock starts at 2026-01-01T00:00:00Z so message
/// timestamps in tests are reproducible.
#[derive(Clone)]
pub struct ManualClock {
    inner: Arc<ManualInner>,
}

struct ManualInner {
    base: Instant,
    wall_base: SystemTime,
    state: Mutex<ManualState>,
}

struct ManualState {
    offset: Duration,
    waiters: Vec<Weak<dyn ClockWaiter>>,
}

/// 2026-01-01T00:00:00Z in seconds since the UNIX epoch.
const MANUAL_WALL_START_SECS: u64 = 1_767_225_600;

impl ManualClock {
    /// A new manual clock at offset zero.
    #[must_use]
    pub fn new() -> Self {
        Self {
            inner: Arc::new(ManualInner {
                base: Instant::now(),
                wall_base: SystemTime::UNIX_EPOCH + Duration::from_secs(MANUAL_WALL_START_SECS),
                state: Mutex::new(ManualState {
                    offset: Duration::ZERO,
                    waiters: Vec::new(),
                }),
            }),
        }
    }

    /// Move time forward by `by` and wake every registered waiter.
    pub fn advance(&self, by: Duration) {
        let waiters: Vec<_> = {
            let mut state = self.inner.state.lock();
            state.offset += by;
            state.waiters.retain(|w| w.strong_count() > 0);
            state.waiters.iter().filter_map(Weak::upgrade).collect()
        };
        for waiter in waiters {
            waiter.time_moved();
        }
    }

    /// Move time forward to `deadline` if it lies in the future.
    pub fn advance_to(&self, deadline: Instant) {
        let now = self.now();
        if deadline > now {
            self.advance(deadline - now);
        }
    }

    /// Time elapsed on this clock since it was created.
    #[must_use]
    pub fn elapsed(&self) -> Duration {
        self.inner.state.lock().offset
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManualClock")
            .field("elapsed", &self.elapsed())
            .finish()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.inner.base + self.inner.state.lock().offset
    }
    fn wall(&self) -> SystemTime {
        self.inner.wall_base + self.inner.state.lock().offset
    }
    fn wait_hint(&self, deadline: Instant) -> Option<Duration> {
        (deadline <= self.now()).then_some(Duration::ZERO)
    }
    fn register_waiter(&self, waiter: Weak<dyn ClockWaiter>) {
        self.inner.state.lock().waiters.push(waiter);
    }
}

/// `now + wait`, or `None` when that instant is not representable: a deadline so far away
/// means "never" (R-LIM-1). Every deadline the crate computes from a user's duration goes
/// through this (or [`wall_after`]) instead of `+`, which panics on overflow.
#[must_use]
pub(crate) fn deadline_after(now: Instant, wait: Duration) -> Option<Instant> {
    now.checked_add(wait)
}

/// `now + wait` on the wall clock, or `None` when not representable ("never").
#[must_use]
pub(crate) fn wall_after(now: SystemTime, wait: Duration) -> Option<SystemTime> {
    now.checked_add(wait)
}

/// The time of one step of the sans-IO core, read from the clock at most once per kind
/// and only when a decision needs it (most deliveries need no clock read at all).
///
/// # Failure
/// A user's clock that panics is contained here (R-DEL-1): the step uses the system time
/// instead and logs the panic, so a subscription's ledger is never left half-updated by
/// an unwind in the middle of a decision.
pub(crate) struct Now<'a> {
    clock: &'a dyn Clock,
    mono: Cell<Option<Instant>>,
    wall: Cell<Option<SystemTime>>,
    /// `wall` as a queue stamp: converted once for all the subscriptions a publish reaches.
    stamp: Cell<Option<EnqueueStamp>>,
}

impl<'a> Now<'a> {
    pub(crate) fn new(clock: &'a dyn Clock) -> Self {
        Self {
            clock,
            mono: Cell::new(None),
            wall: Cell::new(None),
            stamp: Cell::new(None),
        }
    }

    /// [`wall`](Self::wall) as an [`EnqueueStamp`], converted on first use.
    pub(crate) fn stamp(&self) -> EnqueueStamp {
        if let Some(s) = self.stamp.get() {
            return s;
        }
        let s = EnqueueStamp::of(self.wall());
        self.stamp.set(Some(s));
        s
    }

    pub(crate) fn mono(&self) -> Instant {
        if let Some(t) = self.mono.get() {
            return t;
        }
        let t = catch_unwind(AssertUnwindSafe(|| self.clock.now())).unwrap_or_else(|_| {
            tracing::error!("tidings: the clock panicked in now(); using the system time");
            Instant::now()
        });
        self.mono.set(Some(t));
        t
    }

    pub(crate) fn wall(&self) -> SystemTime {
        if let Some(t) = self.wall.get() {
            return t;
        }
        let t = catch_unwind(AssertUnwindSafe(|| self.clock.wall())).unwrap_or_else(|_| {
            tracing::error!("tidings: the clock panicked in wall(); using the system time");
            SystemTime::now()
        });
        self.wall.set(Some(t));
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // R-BP-3: a queued message's stamp measures its age exactly on either side of the
    // epoch, never negative, and saturates (no panic) far from it.
    #[test]
    fn enqueue_stamps_measure_age_and_saturate() {
        let epoch = SystemTime::UNIX_EPOCH;
        for d in [0, 1, 999, 1_000_000_007, 86_400 * 1_000_000_000 * 365] {
            let d = Duration::from_nanos(d);
            for t in [epoch.checked_add(d), epoch.checked_sub(d)]
                .into_iter()
                .flatten()
            {
                let later = t + Duration::from_millis(1_500);
                assert_eq!(
                    EnqueueStamp::of(t).age_at(later),
                    Duration::from_millis(1_500)
                );
                assert_eq!(EnqueueStamp::of(later).age_at(t), Duration::ZERO);
                assert!(EnqueueStamp::of(t) < EnqueueStamp::of(later));
                // The id's milliseconds come from the stamp: the same as from the time.
                for u in [t, later] {
                    let millis = u
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64);
                    assert_eq!(EnqueueStamp::of(u).epoch_millis(), millis);
                }
            }
        }
        let far = Duration::from_secs(400 * 365 * 86_400);
        for t in [epoch.checked_add(far), epoch.checked_sub(far)]
            .into_iter()
            .flatten()
        {
            let _ = EnqueueStamp::of(t).age_at(SystemTime::now()); // saturates, does not panic
        }
    }

    #[test]
    fn deadlines_saturate_to_never() {
        let now = Instant::now();
        assert_eq!(deadline_after(now, Duration::MAX), None);
        assert_eq!(wall_after(SystemTime::now(), Duration::MAX), None);
        assert_eq!(
            deadline_after(now, Duration::from_secs(1)),
            Some(now + Duration::from_secs(1))
        );
    }

    // R-TIME-3
    #[test]
    fn manual_clock_moves_only_when_advanced() {
        let clock = ManualClock::new();
        let t0 = clock.now();
        let w0 = clock.wall();
        assert_eq!(clock.now(), t0);
        clock.advance(Duration::from_millis(250));
        assert_eq!(clock.now() - t0, Duration::from_millis(250));
        assert_eq!(
            clock.wall().duration_since(w0).unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(
            clock.wait_hint(t0 + Duration::from_millis(100)),
            Some(Duration::ZERO)
        );
        assert_eq!(clock.wait_hint(t0 + Duration::from_secs(1)), None);
    }
}
