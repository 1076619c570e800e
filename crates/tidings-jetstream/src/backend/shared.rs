//! What every stream and cursor of one backend share: its runtime, its connection and its
//! settings; and the error a backend call makes of its own.

use std::fmt;
use std::time::Duration;

use tidings::{Limits, StreamError, StreamErrorKind};

use crate::connection::connect::JetStream;
use crate::connection::runtime::Runtime;
use crate::error::JetStreamError;

#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) ack_wait: Duration,
    pub(crate) keep_alive: Duration,
    pub(crate) max_deliveries: u32,
    pub(crate) inactive_threshold: Duration,
    pub(crate) limits: Limits,
    pub(crate) dedup_max_age: Duration,
    pub(crate) dedup_replicas: usize,
    /// Key partitions of a stream this backend creates (an existing one keeps its own).
    pub(crate) key_partitions: u32,
}

/// What every stream and cursor of one backend share.
pub(crate) struct Shared {
    pub(crate) rt: Runtime,
    pub(crate) js: JetStream,
    pub(crate) settings: Settings,
}

impl Shared {
    /// Runs `fut` on the backend's runtime, bounded by `bound`.
    pub(crate) fn call<F, T>(&self, bound: Duration, fut: F) -> Result<T, StreamError>
    where
        F: Future<Output = Result<T, StreamError>> + Send + 'static,
        T: Send + 'static,
    {
        self.rt.call(bounded(bound, fut)).map_err(|_| {
            StreamError::from(JetStreamError::new(
                StreamErrorKind::Closed,
                "the backend is closed (or was called on its own runtime thread)",
            ))
        })?
    }

    /// As [`Self::call`], but `fut` runs on the calling thread inside the runtime's
    /// context ([`Runtime::call_here`](crate::connection::runtime::Runtime::call_here)):
    /// no task on the runtime thread, no hop there and back. Refused on the runtime's own
    /// thread.
    pub(crate) fn call_here<F, T>(&self, bound: Duration, fut: F) -> Result<T, StreamError>
    where
        F: Future<Output = Result<T, StreamError>>,
    {
        self.rt.call_here(bounded(bound, fut)).map_err(|_| {
            StreamError::from(JetStreamError::new(
                StreamErrorKind::Closed,
                "the backend was called on its own runtime thread",
            ))
        })?
    }

    /// As [`Self::call`], for an async caller: `fut` is polled by whoever polls the
    /// returned future (any runtime), inside the backend runtime's context
    /// ([`Runtime::in_context`](crate::connection::runtime::Runtime::in_context)), so it
    /// holds no thread while it waits and costs the runtime thread only the connection's
    /// I/O. Dropping it drops `fut`.
    pub(crate) fn call_async<F, T>(
        &self,
        bound: Duration,
        fut: F,
    ) -> impl Future<Output = Result<T, StreamError>> + Send + 'static
    where
        F: Future<Output = Result<T, StreamError>> + Send + 'static,
        T: Send + 'static,
    {
        self.rt.in_context(bounded(bound, fut))
    }

    /// A bound for one step of `requests` round trips.
    pub(crate) fn bound(&self, requests: u32) -> Duration {
        self.js.request_timeout() * requests.max(1) + Duration::from_millis(500)
    }
}

/// `fut`, or [`StreamErrorKind::TimedOut`] when it has no answer within `bound`.
async fn bounded<F, T>(bound: Duration, fut: F) -> Result<T, StreamError>
where
    F: Future<Output = Result<T, StreamError>>,
{
    match tokio::time::timeout(bound, fut).await {
        Ok(r) => r,
        Err(_) => Err(JetStreamError::new(
            StreamErrorKind::TimedOut,
            format_args!("no answer within {bound:?}"),
        )
        .into()),
    }
}

/// A [`StreamError::Backend`] of this backend, of `kind`, without a cause of its own
/// (a record that does not decode, say).
pub(crate) fn backend_error(kind: StreamErrorKind, what: impl fmt::Display) -> StreamError {
    JetStreamError::new(kind, what).into()
}
