//! Retry policies: the Strategy of R-DEL-3.
//!
//! A policy answers one question after a failed attempt: retry after how long, or give up?
//! Retries happen in place (R-ORD-1): the failing message stays at the head of its
//! subscription (or its lane, or its key) until it succeeds or is dead-lettered. The wait is
//! a deadline handed to the driver, never a sleep, so `close()` interrupts it at once and
//! the manual clock makes schedules exact in tests.
//!
//! # Long waits
//! No wait overflows: an exponential wait that grows past what a [`Duration`] holds is
//! capped at the policy's `max`, and a wait whose deadline cannot be represented (for
//! example `Retry::fixed(Duration::MAX, 3)`) means the retry would never happen, so the
//! message is dead-lettered at once as `RetriesExhausted` with the attempts made (R-LIM-1).
//!
//! # Failure
//! A custom [`RetryPolicy`] that panics is contained: the message is dead-lettered as
//! `RetriesExhausted` whose `last_error` names the handler's error and the panic, and the
//! subscription keeps working (R-DEL-1).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::ConfigError;
use crate::handler::HandlerError;
use crate::message::Message;

/// A user-supplied retry strategy.
///
/// Called by the dispatcher after every failed attempt with the number of attempts made so
/// far (starting at 1). Must be quick and must not call into the broker: it runs while the
/// subscription's state is locked.
pub trait RetryPolicy: Send + Sync + 'static {
    /// `Some(delay)` to try again after `delay`, `None` to dead-letter the message.
    fn retry_after(
        &self,
        attempts: u32,
        error: &HandlerError,
        message: &Message,
    ) -> Option<Duration>;
}

/// How a subscription retries failed deliveries. See the module docs.
#[derive(Clone)]
#[non_exhaustive]
pub enum Retry {
    /// One attempt; a failure is dead-lettered as `RetriesExhausted { attempts: 1 }`.
    None,
    /// Up to `max_attempts` attempts, `delay` apart.
    Fixed {
        /// Wait between attempts.
        delay: Duration,
        /// Total attempts including the first (≥ 1).
        max_attempts: u32,
    },
    /// `initial`, then × `multiplier` each time, capped at `max`, up to `max_attempts`.
    Exponential {
        /// First wait.
        initial: Duration,
        /// Growth factor (≥ 1.0).
        multiplier: f64,
        /// Largest wait.
        max: Duration,
        /// Total attempts including the first (≥ 1).
        max_attempts: u32,
        /// Fraction (0.0–1.0) of each wait removed at random, derived deterministically
        /// from the message id and attempt so runs are reproducible.
        jitter: f64,
    },
    /// A user-supplied strategy.
    Custom(Arc<dyn RetryPolicy>),
    /// A builder method was applied to a policy it does not fit ([`Retry::max_attempts`]
    /// on `None` or `Custom`, [`Retry::max_delay`] or [`Retry::jitter`] on anything but
    /// `Exponential`). The first misfit is kept. `subscribe` refuses it with
    /// [`ConfigError::Invalid`] naming the setting (R-LIM-1); it never reaches a dispatcher.
    Inconsistent(InconsistentRetry),
}

/// What made a [`Retry`] inconsistent; see [`Retry::Inconsistent`]. Only the builder
/// methods create it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InconsistentRetry {
    setting: &'static str,
    policy: &'static str,
}

impl InconsistentRetry {
    /// The setting that does not fit, e.g. `retry.max_attempts`.
    #[must_use]
    pub fn setting(&self) -> &'static str {
        self.setting
    }
}

impl Retry {
    /// Exponential backoff from `initial` growing by `multiplier`; 5 attempts, 30 s cap,
    /// no jitter until changed with the builder methods.
    #[must_use]
    pub fn exponential(initial: Duration, multiplier: f64) -> Self {
        Retry::Exponential {
            initial,
            multiplier,
            max: Duration::from_secs(30),
            max_attempts: 5,
            jitter: 0.0,
        }
    }
    /// `max_attempts` attempts, `delay` apart.
    #[must_use]
    pub fn fixed(delay: Duration, max_attempts: u32) -> Self {
        Retry::Fixed {
            delay,
            max_attempts,
        }
    }
    /// A custom strategy.
    #[must_use]
    pub fn custom(policy: impl RetryPolicy) -> Self {
        Retry::Custom(Arc::new(policy))
    }
    /// Set the total number of attempts (fixed and exponential).
    ///
    /// `Retry::None` always makes one attempt and a `Custom` policy decides for itself, so
    /// on those this returns [`Retry::Inconsistent`], which `subscribe` refuses with
    /// `ConfigError::Invalid { setting: "retry.max_attempts", .. }` instead of silently
    /// ignoring the call.
    ///
    /// ```
    /// # use tidings::*;
    /// let broker = Broker::builder().driver(Driver::Manual).build()?;
    /// let opts = SubscribeOptions { retry: Retry::None.max_attempts(3), ..Default::default() };
    /// let err = broker.subscribe("t", opts, |_m: &Message| ()).unwrap_err();
    /// assert!(matches!(
    ///     err,
    ///     SubscribeError::InvalidOptions(ConfigError::Invalid { setting: "retry.max_attempts", .. })
    /// ));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        match &mut self {
            Retry::Fixed { max_attempts, .. } | Retry::Exponential { max_attempts, .. } => {
                *max_attempts = attempts;
            }
            Retry::Inconsistent(_) => {}
            other => return Self::inconsistent("retry.max_attempts", other.policy_name()),
        }
        self
    }

    fn inconsistent(setting: &'static str, policy: &'static str) -> Self {
        Retry::Inconsistent(InconsistentRetry { setting, policy })
    }
    /// Cap the exponential wait. On any other policy this returns
    /// [`Retry::Inconsistent`] (refused at subscribe, setting `retry.max_delay`).
    #[must_use]
    pub fn max_delay(mut self, cap: Duration) -> Self {
        match &mut self {
            Retry::Exponential { max, .. } => *max = cap,
            Retry::Inconsistent(_) => {}
            other => return Self::inconsistent("retry.max_delay", other.policy_name()),
        }
        self
    }
    /// Remove up to `fraction` of each exponential wait, pseudo-randomly. On any other
    /// policy this returns [`Retry::Inconsistent`] (refused at subscribe, setting
    /// `retry.jitter`).
    #[must_use]
    pub fn jitter(mut self, fraction: f64) -> Self {
        match &mut self {
            Retry::Exponential { jitter, .. } => *jitter = fraction,
            Retry::Inconsistent(_) => {}
            other => return Self::inconsistent("retry.jitter", other.policy_name()),
        }
        self
    }

    fn policy_name(&self) -> &'static str {
        match self {
            Retry::None => "Retry::None",
            Retry::Fixed { .. } => "Retry::Fixed",
            Retry::Exponential { .. } => "Retry::Exponential",
            Retry::Custom(_) => "Retry::Custom",
            Retry::Inconsistent(_) => "Retry::Inconsistent",
        }
    }

    /// Refuse inconsistent settings (R-LIM-1).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        match *self {
            Retry::None | Retry::Custom(_) => Ok(()),
            Retry::Inconsistent(InconsistentRetry { setting, policy }) => {
                Err(ConfigError::invalid(
                    setting,
                    policy.to_owned(),
                    "a policy it applies to (fixed or exponential)",
                ))
            }
            Retry::Fixed { max_attempts, .. } => check_attempts(max_attempts),
            Retry::Exponential {
                initial,
                multiplier,
                max,
                max_attempts,
                jitter,
            } => {
                check_attempts(max_attempts)?;
                if !(multiplier.is_finite() && multiplier >= 1.0) {
                    return Err(ConfigError::invalid(
                        "retry.multiplier",
                        format!("{multiplier}"),
                        "a finite number >= 1.0",
                    ));
                }
                if !(0.0..=1.0).contains(&jitter) {
                    return Err(ConfigError::invalid(
                        "retry.jitter",
                        format!("{jitter}"),
                        "a fraction between 0.0 and 1.0",
                    ));
                }
                if max < initial {
                    return Err(ConfigError::invalid(
                        "retry.max_delay",
                        format!("{max:?}"),
                        "at least the initial delay",
                    ));
                }
                Ok(())
            }
        }
    }

    /// The decision after `attempts` failed attempts. Never panics on the built-in
    /// policies (waits saturate at `max`); a custom policy is called as is: the caller
    /// contains its panics.
    pub(crate) fn decide(
        &self,
        attempts: u32,
        error: &HandlerError,
        message: &Message,
    ) -> Option<Duration> {
        match self {
            Retry::None => None,
            Retry::Fixed {
                delay,
                max_attempts,
            } => (attempts < *max_attempts).then_some(*delay),
            Retry::Exponential {
                initial,
                multiplier,
                max,
                max_attempts,
                jitter,
            } => {
                if attempts >= *max_attempts {
                    return None;
                }
                let exp = i32::try_from(attempts - 1).unwrap_or(i32::MAX);
                let raw = initial.as_secs_f64() * multiplier.powi(exp);
                let capped = raw.min(max.as_secs_f64());
                let cut = if *jitter > 0.0 {
                    jitter * unit_hash(message.id().as_u128(), attempts)
                } else {
                    0.0
                };
                // `as_secs_f64` rounds, so a `max` near `Duration::MAX` converts back to a
                // float just past the range: saturate at `max` instead of panicking.
                let wait = Duration::try_from_secs_f64(capped * (1.0 - cut)).unwrap_or(*max);
                Some(wait.min(*max))
            }
            Retry::Custom(policy) => policy.retry_after(attempts, error, message),
            // Refused at subscribe; dead-letter rather than guess.
            Retry::Inconsistent(_) => None,
        }
    }
}

impl Retry {
    /// True when `other` makes exactly the same decisions: equal built-in parameters (floats
    /// compared bit for bit), or the same custom policy object. Lets subscriptions with
    /// equal options share one copy of their settings (`crate::options::Settings`).
    pub(crate) fn same_as(&self, other: &Retry) -> bool {
        match (self, other) {
            (Retry::None, Retry::None) => true,
            (
                Retry::Fixed {
                    delay: d1,
                    max_attempts: m1,
                },
                Retry::Fixed {
                    delay: d2,
                    max_attempts: m2,
                },
            ) => d1 == d2 && m1 == m2,
            (
                Retry::Exponential {
                    initial: i1,
                    multiplier: x1,
                    max: c1,
                    max_attempts: m1,
                    jitter: j1,
                },
                Retry::Exponential {
                    initial: i2,
                    multiplier: x2,
                    max: c2,
                    max_attempts: m2,
                    jitter: j2,
                },
            ) => {
                i1 == i2
                    && x1.to_bits() == x2.to_bits()
                    && c1 == c2
                    && m1 == m2
                    && j1.to_bits() == j2.to_bits()
            }
            (Retry::Custom(a), Retry::Custom(b)) => Arc::ptr_eq(a, b),
            // Refused at subscribe: never shared.
            _ => false,
        }
    }
}

fn check_attempts(max_attempts: u32) -> Result<(), ConfigError> {
    if max_attempts == 0 {
        return Err(ConfigError::invalid(
            "retry.max_attempts",
            "0".to_owned(),
            "at least 1",
        ));
    }
    Ok(())
}

/// A number in [0, 1) derived from `(id, attempt)` (splitmix64).
fn unit_hash(id: u128, attempt: u32) -> f64 {
    let mut z =
        (id as u64) ^ ((id >> 64) as u64) ^ u64::from(attempt).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

impl Default for Retry {
    /// Exponential from 100 ms, ×2, 5 attempts, capped at 30 s.
    fn default() -> Self {
        Retry::exponential(Duration::from_millis(100), 2.0)
    }
}

impl fmt::Debug for Retry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Retry::None => f.write_str("Retry::None"),
            Retry::Fixed {
                delay,
                max_attempts,
            } => write!(f, "Retry::Fixed({delay:?} x{max_attempts})"),
            Retry::Exponential {
                initial,
                multiplier,
                max,
                max_attempts,
                jitter,
            } => write!(
                f,
                "Retry::Exponential({initial:?} x{multiplier} max {max:?}, {max_attempts} attempts, jitter {jitter})"
            ),
            Retry::Custom(_) => f.write_str("Retry::Custom(..)"),
            Retry::Inconsistent(i) => {
                write!(f, "Retry::Inconsistent({} on {})", i.setting, i.policy)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::IdGenerator;
    use crate::topic::Topic;

    fn msg() -> Message {
        let ids = IdGenerator::new();
        Message {
            id: ids.next(std::time::SystemTime::now()),
            topic: Topic::new("t").unwrap(),
            payload: bytes::Bytes::new(),
            headers: Default::default(),
            key: None,
            priority: Default::default(),
            timestamp: std::time::SystemTime::now(),
            expires_at: None,
            deliver_at: None,
            reply_to: None,
            correlation_id: None,
            log_offset: None,
            fence: None,
        }
    }

    // R-DEL-3
    #[test]
    fn exponential_schedule_and_cap() {
        let r = Retry::exponential(Duration::from_millis(100), 2.0)
            .max_attempts(5)
            .max_delay(Duration::from_millis(300));
        let e = HandlerError::retry("x");
        let m = msg();
        let waits: Vec<_> = (1..=5).map(|a| r.decide(a, &e, &m)).collect();
        assert_eq!(
            waits,
            vec![
                Some(Duration::from_millis(100)),
                Some(Duration::from_millis(200)),
                Some(Duration::from_millis(300)),
                Some(Duration::from_millis(300)),
                None
            ]
        );
    }

    // R-DEL-3
    #[test]
    fn jitter_is_bounded_and_reproducible() {
        let r = Retry::exponential(Duration::from_secs(1), 1.0)
            .max_attempts(100)
            .jitter(0.5);
        let e = HandlerError::retry("x");
        let m = msg();
        for a in 1..50 {
            let d = r.decide(a, &e, &m).unwrap();
            assert!(d <= Duration::from_secs(1) && d >= Duration::from_millis(500));
            assert_eq!(Some(d), r.decide(a, &e, &m));
        }
    }

    proptest::proptest! {
        // R-LIM-1: no valid built-in policy panics or waits past its cap, whatever the
        // durations (up to Duration::MAX) and multiplier.
        #[test]
        fn built_in_decisions_never_panic(
            secs in proptest::prelude::any::<u64>(),
            nanos in 0u32..1_000_000_000,
            cap_secs in proptest::prelude::any::<u64>(),
            multiplier in 1.0f64..=f64::MAX,
            jitter in 0.0f64..=1.0,
            attempts in 1u32..10_000,
        ) {
            let initial = Duration::new(secs, nanos);
            let max = Duration::new(cap_secs, 999_999_999).max(initial);
            let e = HandlerError::retry("x");
            let m = msg();
            let r = Retry::exponential(initial, multiplier)
                .max_delay(max)
                .jitter(jitter)
                .max_attempts(u32::MAX);
            proptest::prop_assert!(r.validate().is_ok());
            let d = r.decide(attempts, &e, &m);
            proptest::prop_assert!(d.is_some_and(|d| d <= max));
            let f = Retry::fixed(initial, 3);
            proptest::prop_assert_eq!(f.decide(1, &e, &m), Some(initial));
        }
    }

    // R-LIM-1
    #[test]
    fn misapplied_builder_methods_are_refused() {
        let setting = |r: Retry| match r.validate() {
            Err(ConfigError::Invalid { setting, .. }) => setting,
            other => panic!("accepted: {other:?}"),
        };
        let d = Duration::from_millis(1);
        assert_eq!(setting(Retry::None.max_attempts(2)), "retry.max_attempts");
        assert_eq!(setting(Retry::fixed(d, 2).max_delay(d)), "retry.max_delay");
        assert_eq!(setting(Retry::fixed(d, 2).jitter(0.5)), "retry.jitter");
        // The first misfit is kept through later calls.
        assert_eq!(
            setting(Retry::None.jitter(0.1).max_attempts(2)),
            "retry.jitter"
        );
    }

    // R-LIM-1
    #[test]
    fn inconsistent_policies_are_refused() {
        assert!(Retry::fixed(Duration::ZERO, 0).validate().is_err());
        assert!(
            Retry::exponential(Duration::from_millis(1), 0.5)
                .validate()
                .is_err()
        );
        assert!(
            Retry::exponential(Duration::from_millis(1), f64::NAN)
                .validate()
                .is_err()
        );
        assert!(
            Retry::exponential(Duration::from_millis(1), 2.0)
                .jitter(1.5)
                .validate()
                .is_err()
        );
        assert!(
            Retry::exponential(Duration::from_secs(10), 2.0)
                .max_delay(Duration::from_secs(1))
                .validate()
                .is_err()
        );
        assert!(Retry::default().validate().is_ok());
    }
}
