//! The broker's async methods (feature `tokio`, R-EXE-1, R-EXE-3).
//!
//! `subscribe_async` registers an [`AsyncHandler`] with the tokio driver. The other methods
//! are async versions of calls that can block — `publish` under `Overflow::Block`,
//! `request`, `close` — for use inside a tokio runtime, where blocking a worker thread can
//! stall (with a current-thread runtime: deadlock) the very dispatchers being waited for.
//!
//! They are honest wrappers: each runs the sync call on tokio's blocking thread pool
//! (`spawn_blocking`; a plain thread when not called inside a runtime) and awaits its
//! result. They therefore never block a runtime worker thread, at the cost of one
//! blocking-pool hand-off per call. See each method's `# Cancel safety`.

use std::sync::Arc;
use std::time::Duration;

use crate::async_handler::AsyncHandler;
use crate::driver::tokio::allow_blocking;
use crate::error::{PublishError, SubscribeError};
use crate::message::{Message, MessageBuilder};
use crate::options::SubscribeOptions;
use crate::report::{CloseReport, PublishReport};
use crate::request::RequestError;
use crate::subscription::Subscription;
use crate::subscription::shell::HandlerKind;

use super::Broker;

impl Broker {
    /// Subscribe an async `handler` to every topic matching `pattern` (R-CORE-1, R-EXE-3).
    ///
    /// Same contract as [`Broker::subscribe`]; the handler's future is awaited by the
    /// subscription's dispatcher task(s) on the tokio driver's runtime, with the same
    /// ordering, retry, dead-letter and panic guarantees as a sync handler.
    ///
    /// # Errors
    /// [`SubscribeError::AsyncHandlerNeedsTokio`] when the broker's driver is not
    /// [`Driver::Tokio`](crate::Driver) (nothing else can await the handler), and every
    /// error of [`Broker::subscribe`].
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn subscribe_async(
        &self,
        pattern: &str,
        options: SubscribeOptions,
        handler: impl AsyncHandler,
    ) -> Result<Subscription, SubscribeError> {
        if self.inner.executor.tokio_handle().is_none() {
            return Err(SubscribeError::AsyncHandlerNeedsTokio);
        }
        self.inner
            .subscribe(pattern, options, HandlerKind::Async(Arc::new(handler)))
    }

    /// [`Broker::publish`] without blocking the async runtime: under `Overflow::Block` the
    /// wait for room happens on a blocking-pool thread while this future is pending.
    ///
    /// Same result and contract as `publish`. Sequential `publish_async(..).await` calls
    /// from one task keep that task's publish order (R-ORD-2).
    ///
    /// # Cancel safety
    /// Not cancel safe. The publish runs on tokio's blocking pool as soon as this future is
    /// first polled; dropping the future does **not** cancel it: the message is still
    /// offered (possibly after a `Block` wait of up to the subscription's timeout), and its
    /// [`PublishReport`] or error is lost. Because it completes in the background, a later
    /// publish by the same task may then be offered before it — publish order is kept only
    /// between publishes whose futures were awaited to completion.
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn publish_async(
        &self,
        message: impl Into<MessageBuilder>,
    ) -> Result<PublishReport, PublishError> {
        let (broker, message) = (self.clone(), message.into());
        off_runtime(move || broker.publish(message)).await
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
