//! What the library records while it works, below everything that reads it: the `tracing`
//! spans and W3C trace context of publish and delivery ([`trace`], public as
//! `tidings::ops::trace`), and the handler-duration histogram (feature `metrics`).
//! Snapshots and the metrics export, which read the broker, live in `ops`.

pub mod trace;

/// Run one handler call; with the `metrics` feature, record its duration in seconds in the
/// `messaging.process.duration` histogram labelled by subscription (R-OPS-2).
#[inline]
pub(crate) fn timed<T>(subscription: &str, call: impl FnOnce() -> T) -> T {
    let started = Started::now();
    let out = call();
    started.record(subscription);
    out
}

/// When a handler call started; records its duration in `messaging.process.duration`
/// (feature `metrics`), a no-op without the feature.
pub(crate) struct Started {
    #[cfg(feature = "metrics")]
    at: std::time::Instant,
}

impl Started {
    #[inline]
    pub(crate) fn now() -> Self {
        Self {
            #[cfg(feature = "metrics")]
            at: std::time::Instant::now(),
        }
    }

    #[inline]
    pub(crate) fn record(self, subscription: &str) {
        #[cfg(feature = "metrics")]
        record_process_duration(subscription, self.at.elapsed());
        #[cfg(not(feature = "metrics"))]
        let _ = subscription;
    }
}

/// `messaging.process.duration` (seconds).
#[cfg(feature = "metrics")]
pub const PROCESS_DURATION: &str = "messaging.process.duration";

/// Record one handler call's duration, labelled by subscription (R-OPS-2).
#[cfg(feature = "metrics")]
pub(crate) fn record_process_duration(subscription: &str, elapsed: std::time::Duration) {
    metrics::histogram!(
        PROCESS_DURATION,
        "messaging.system" => "tidings",
        "subscription" => subscription.to_owned(),
    )
    .record(elapsed.as_secs_f64());
}
