//! What the library records while it works, below everything that reads it: the `tracing`
//! spans and W3C trace context of publish and delivery ([`trace`], public as
//! `tidings::ops::trace`), and the handler-duration histogram (feature `metrics`).
//! Snapshots and the metrics export, which read the broker, live in `ops`.

pub mod trace;

/// Run one handler call; with the `metrics` feature, record its duration in seconds in the
/// `messaging.process.duration` histogram labelled by subscription (R-OPS-2).
#[inline]
pub(crate) fn timed<T>(metric: &ProcessMetric, call: impl FnOnce() -> T) -> T {
    let started = Started::now();
    let out = call();
    started.record(metric);
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
    pub(crate) fn record(self, metric: &ProcessMetric) {
        #[cfg(feature = "metrics")]
        metric.record(self.at.elapsed());
        #[cfg(not(feature = "metrics"))]
        let _ = metric;
    }
}

/// `messaging.process.duration` (seconds).
#[cfg(feature = "metrics")]
pub const PROCESS_DURATION: &str = "messaging.process.duration";

/// One subscription's `messaging.process.duration` series (R-OPS-2): its key, labels
/// included, is built once at subscribe, so recording a handler call allocates nothing (the
/// `histogram!` macro would build the label set, the subscription's name copied, per call).
/// The recorder is looked up at each record, as the macro does, so a recorder installed
/// after subscribe still sees every call. Empty without the `metrics` feature.
pub(crate) struct ProcessMetric {
    #[cfg(feature = "metrics")]
    key: metrics::Key,
}

impl ProcessMetric {
    pub(crate) fn new(subscription: &str) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = subscription;
        Self {
            #[cfg(feature = "metrics")]
            key: metrics::Key::from_parts(
                PROCESS_DURATION,
                vec![
                    metrics::Label::new("messaging.system", "tidings"),
                    metrics::Label::new("subscription", subscription.to_owned()),
                ],
            ),
        }
    }

    /// Record one handler call's duration.
    #[cfg(feature = "metrics")]
    fn record(&self, elapsed: std::time::Duration) {
        static METADATA: metrics::Metadata<'static> =
            metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));
        metrics::with_recorder(|r| r.register_histogram(&self.key, &METADATA))
            .record(elapsed.as_secs_f64());
    }
}

impl std::fmt::Debug for ProcessMetric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProcessMetric")
    }
}
