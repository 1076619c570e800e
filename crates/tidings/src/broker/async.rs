//! The broker's async methods (feature `tokio`, R-EXE-1, R-EXE-3).
//!
//! Async versions of calls that can block — `publish` under `Overflow::Block`,
//! `request`, `close` — for use inside a tokio runtime, where blocking a worker thread can
//! stall (with a current-thread runtime: deadlock) the very dispatchers being waited for.
//!
//! None of them blocks a runtime worker thread. `request_async` and `close_async` run the
//! sync call on tokio's blocking thread pool (`spawn_blocking`) and await its result.
//! `publish_async` runs the publish's steps as a task and sends to the blocking pool only
//! the steps that may wait there: an append to a backend without an async path (the
//! embedded log's write and fsync), and offers to a subscription that makes publishers wait
//! or to a transport; an append to JetStream is awaited without a thread. See each method's
//! `# Cancel safety`.
//!
//! Outside a tokio runtime (another executor, or a plain `block_on`) there is no blocking
//! pool to move a wait to, and a thread per call would cost more than the call: each of
//! them runs its sync form on the thread that polls it, completing in the first poll. None
//! of them waits forever: when the runtime a call was moved to shuts down under it, the
//! call ends with a typed error (`RuntimeShutDown`).

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::clock::Now;
use crate::driver::tokio::allow_blocking;
use crate::error::{PublishError, StreamError};
use crate::message::{Message, MessageBuilder};
use crate::report::{CloseReport, PublishReport};
use crate::request::RequestError;

use super::{Broker, BrokerInner};

impl Broker {
    /// [`Broker::publish`] without blocking the async runtime (R-EXE-1).
    ///
    /// Inside a tokio runtime the publish runs as a task of that runtime: validating and
    /// stamping the message never waits; an append to a stream whose backend can wait
    /// without a thread ([`BackendStream::append_async`](crate::durable::BackendStream::append_async):
    /// JetStream, waiting for the server's acknowledgement) holds no thread while it waits;
    /// an append to the embedded log (a write and maybe an fsync), and the offers when one
    /// of them may wait (a subscription with `Overflow::Block`, or a transport), run on
    /// tokio's blocking pool. So a publish to a JetStream stream whose topic no blocking
    /// subscription matches takes no blocking-pool thread. Outside a tokio runtime the
    /// publish runs as [`Broker::publish`] on the thread that polls this future, waiting
    /// there as `publish` would, and the future is ready at its first poll.
    ///
    /// Same result and contract as `publish`, except that the offers' enqueue time is read
    /// after the appends (a sync publish reads the clock once, before them). Sequential
    /// `publish_async(..).await` calls from one task keep that task's publish order
    /// (R-ORD-2).
    ///
    /// # Cancel safety
    /// Not cancel safe. The publish starts as soon as this future is first polled; dropping
    /// the future does **not** cancel it: the message is still appended and offered
    /// (possibly after a `Block` wait of up to the subscription's timeout), and its
    /// [`PublishReport`] or error is lost. Because it completes in the background, a later
    /// publish by the same task may then be offered before it — publish order is kept only
    /// between publishes whose futures were awaited to completion.
    ///
    /// # Errors
    /// Those of [`Broker::publish`], and [`PublishError::RuntimeShutDown`] when the runtime
    /// shut down while the publish ran (it may or may not have taken effect).
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn publish_async(
        &self,
        message: impl Into<MessageBuilder>,
    ) -> Result<PublishReport, PublishError> {
        let (inner, message) = (self.inner.clone(), message.into());
        let Ok(handle) = ::tokio::runtime::Handle::try_current() else {
            let mut message = message;
            return inner.publish_builder(&mut message);
        };
        // A task, not this future: dropping the future must not cancel a publish halfway.
        let task = handle.spawn(async move { inner.publish_builder_async(message).await });
        joined(task.await).unwrap_or(Err(PublishError::RuntimeShutDown))
    }

    /// [`Broker::request`] without blocking the async runtime: the request is published and
    /// the reply awaited on a blocking-pool thread while this future is pending (R-PAT-1).
    ///
    /// Same result and contract as `request` (the timeout runs on the broker's clock).
    /// Outside a tokio runtime the request runs as [`Broker::request`] on the thread that
    /// polls this future.
    ///
    /// # Errors
    /// Those of [`Broker::request`], and [`RequestError::RuntimeShutDown`] when the runtime
    /// shut down before the reply came.
    ///
    /// # Cancel safety
    /// Not cancel safe. Dropping the future does **not** cancel the request: it has been (or
    /// is about to be) published, the blocking wait continues until the reply arrives or
    /// `timeout` passes, and then the reply or the error is discarded; until then it counts
    /// in [`Broker::pending_requests`].
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn request_async(
        &self,
        message: impl Into<MessageBuilder>,
        timeout: Duration,
    ) -> Result<Arc<Message>, RequestError> {
        let (broker, message) = (self.clone(), message.into());
        off_runtime(move || broker.request(message, timeout))
            .await
            .unwrap_or(Err(RequestError::RuntimeShutDown))
    }

    /// [`Broker::close`] for async code (R-CORE-6): the same steps, report and deadlines,
    /// with the waiting for dispatcher tasks done on a blocking-pool thread so the
    /// runtime's worker threads stay free to finish them.
    ///
    /// Use this inside a tokio runtime: the sync `close` called there does not wait for the
    /// tokio driver's tasks (blocking a worker could deadlock the runtime) and reports
    /// those still running as `unjoined`. Do not await it from inside an async handler of
    /// the same broker: that handler's dispatcher cannot stop before the handler returns,
    /// so close would wait out the drain and grace deadlines and report it unjoined.
    /// Outside a tokio runtime the close runs as [`Broker::close`] on the thread that polls
    /// this future.
    ///
    /// # Cancel safety
    /// Not cancel safe. Dropping the future does not stop the close: it has begun (new
    /// publishes are already refused) and completes in the background; the report is lost.
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn close_async(&self, drain: Duration) -> CloseReport {
        let broker = self.clone();
        let closing = broker.clone();
        match off_runtime(move || allow_blocking(|| closing.close(drain))).await {
            Ok(report) => report,
            // The runtime shut down before the close ran to its end; closing is idempotent
            // and this thread may wait (the runtime that could not is gone): finish here.
            Err(RuntimeShutDown) => broker.close(drain),
        }
    }
}

impl BrokerInner {
    /// The steps of `publish_builder` (src/broker/publish.rs) with the waits moved off the
    /// runtime's worker threads: see [`Broker::publish_async`].
    async fn publish_builder_async(
        self: Arc<Self>,
        b: MessageBuilder,
    ) -> Result<PublishReport, PublishError> {
        let span = crate::telemetry::trace::publish_span(&b.topic);
        let mut prepared = {
            let _entered = span.enter();
            // The builder's parts move into the message; its husk ends with this block.
            let mut b = b;
            self.prepare(&mut b, &span, &Now::new(self.clock.as_ref()))?
        };
        let appends = self
            .durables
            .append_async(prepared.message(), |stream, message| {
                Box::pin(async move {
                    // Only this task's own runtime shutting down cancels the append; the
                    // publish is being dropped with it.
                    off_runtime(move || stream.append(&message))
                        .await
                        .unwrap_or(Err(StreamError::Closed))
                })
            })
            .instrument(span.clone())
            .await?;
        if self.finish_may_wait(&mut prepared, !appends.0.is_empty()) {
            let inner = self.clone();
            return off_runtime(move || {
                let _entered = span.enter();
                inner.finish(prepared, appends, &Now::new(inner.clock.as_ref()))
            })
            .await
            .unwrap_or(Err(PublishError::RuntimeShutDown));
        }
        let _entered = span.enter();
        self.finish(prepared, appends, &Now::new(self.clock.as_ref()))
    }
}

/// The runtime a call was moved to shut down before the call finished.
struct RuntimeShutDown;

/// Run blocking `f` off the async runtime's worker threads and await its result: on the
/// current runtime's blocking pool; outside a tokio runtime, here (see the module docs).
async fn off_runtime<R, F>(f: F) -> Result<R, RuntimeShutDown>
where
    R: Send + 'static,
    F: FnOnce() -> R + Send + 'static,
{
    match ::tokio::runtime::Handle::try_current() {
        Ok(handle) => joined(handle.spawn_blocking(f).await),
        Err(_) => Ok(f()),
    }
}

/// A joined task's value; its panic resumed here; cancelled (only a runtime shutting down
/// cancels these tasks: none is ever aborted) as [`RuntimeShutDown`].
fn joined<R>(result: Result<R, ::tokio::task::JoinError>) -> Result<R, RuntimeShutDown> {
    match result {
        Ok(r) => Ok(r),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(RuntimeShutDown),
    }
}
