//! The broker's async methods (feature `tokio`, R-EXE-1, R-EXE-3).
//!
//! Async versions of calls that can block — `publish` under `Overflow::Block`,
//! `request`, `close` — for use inside a tokio runtime, where blocking a worker thread can
//! stall (with a current-thread runtime: deadlock) the very dispatchers being waited for.
//!
//! None of them blocks a runtime worker thread. `request_async` and `close_async` run the
//! sync call on tokio's blocking thread pool (`spawn_blocking`; a plain thread when not
//! called inside a runtime) and await its result. `publish_async` runs the publish's steps
//! as a task and sends to the blocking pool only the steps that may wait there: an append
//! to a backend without an async path (the embedded log's write and fsync), and offers to a
//! subscription that makes publishers wait or to a transport; an append to JetStream is
//! awaited without a thread. See each method's `# Cancel safety`.

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::clock::Now;
use crate::driver::tokio::allow_blocking;
use crate::error::PublishError;
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
    /// subscription matches takes no blocking-pool thread. Outside a runtime the whole
    /// publish runs on a plain thread.
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
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn publish_async(
        &self,
        message: impl Into<MessageBuilder>,
    ) -> Result<PublishReport, PublishError> {
        let (inner, message) = (self.inner.clone(), message.into());
        let Ok(handle) = ::tokio::runtime::Handle::try_current() else {
            let mut message = message;
            return off_runtime(move || inner.publish_builder(&mut message)).await;
        };
        // A task, not this future: dropping the future must not cancel a publish halfway.
        match handle
            .spawn(async move { inner.publish_builder_async(message).await })
            .await
        {
            Ok(r) => r,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Cancelled: the runtime is shutting down and will drop this future too.
            Err(_) => std::future::pending().await,
        }
    }

    /// [`Broker::request`] without blocking the async runtime: the request is published and
    /// the reply awaited on a blocking-pool thread while this future is pending (R-PAT-1).
    ///
    /// Same result and contract as `request` (the timeout runs on the broker's clock).
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
        off_runtime(move || broker.request(message, timeout)).await
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
    ///
    /// # Cancel safety
    /// Not cancel safe. Dropping the future does not stop the close: it has begun (new
    /// publishes are already refused) and completes in the background; the report is lost.
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn close_async(&self, drain: Duration) -> CloseReport {
        let broker = self.clone();
        off_runtime(move || allow_blocking(|| broker.close(drain))).await
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
                Box::pin(off_runtime(move || stream.append(&message)))
            })
            .instrument(span.clone())
            .await?;
        if self.finish_may_wait(&mut prepared, !appends.0.is_empty()) {
            let inner = self.clone();
            return off_runtime(move || {
                let _entered = span.enter();
                inner.finish(prepared, appends, &Now::new(inner.clock.as_ref()))
            })
            .await;
        }
        let _entered = span.enter();
        self.finish(prepared, appends, &Now::new(self.clock.as_ref()))
    }
}

/// Run blocking `f` off the async runtime's worker threads and await its result: on the
/// current runtime's blocking pool, or on a new thread outside any runtime.
async fn off_runtime<R, F>(f: F) -> R
where
    R: Send + 'static,
    F: FnOnce() -> R + Send + 'static,
{
    if let Ok(handle) = ::tokio::runtime::Handle::try_current() {
        return match handle.spawn_blocking(f).await {
            Ok(r) => r,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Cancelled: the runtime is shutting down and will drop this future too.
            Err(_) => std::future::pending().await,
        };
    }
    // Outside a runtime: a plain thread. The closure is shared so that it can still run
    // inline if no thread can be spawned.
    let job = Arc::new(parking_lot::Mutex::new(Some(f)));
    let (tx, rx) = ::tokio::sync::oneshot::channel();
    let thread_job = job.clone();
    let spawned = std::thread::Builder::new()
        .name("tidings-async-call".into())
        .spawn(move || {
            if let Some(f) = thread_job.lock().take() {
                let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
            }
        });
    if spawned.is_err()
        && let Some(f) = job.lock().take()
    {
        return f();
    }
    match rx.await {
        Ok(Ok(r)) => r,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        // Unreachable: the thread always sends (panics are caught).
        Err(_) => std::future::pending().await,
    }
}
