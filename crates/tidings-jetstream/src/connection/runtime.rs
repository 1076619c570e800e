//! The runtime the backend owns: one dedicated thread running a current-thread tokio
//! runtime, so the synchronous seam can be called from anywhere — a plain thread, a pool
//! worker, or inside some other tokio runtime — without nesting `block_on`.
//!
//! A call spawns its future on the backend's runtime and waits for the answer on a
//! channel ([`Runtime::call`]), or runs it on the calling thread inside the runtime's
//! context, so that only the connection's own task works on the runtime thread
//! ([`Runtime::call_here`]). Dropping the last handle stops the runtime on its own thread
//! (a runtime may not be dropped inside another one's context).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, JoinHandle, Thread, ThreadId};

use tokio::runtime::Handle;
use tokio::sync::oneshot;

use crate::connection::connect::{ConnectOptions, JetStream};
use crate::error::ConnectError;

/// The runtime is gone (the backend closed) or the call was made on its own thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RuntimeGone;

struct Owner {
    handle: Handle,
    thread: ThreadId,
    stop: std::sync::Mutex<Option<oneshot::Sender<()>>>,
    join: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        if let Ok(mut stop) = self.stop.lock()
            && let Some(tx) = stop.take()
        {
            let _ = tx.send(());
        }
        let join = self.join.lock().ok().and_then(|mut j| j.take());
        if let Some(join) = join
            && thread::current().id() != self.thread
        {
            let _ = join.join();
        }
    }
}

/// A cheap handle to the backend's runtime thread.
#[derive(Clone)]
pub(crate) struct Runtime(Arc<Owner>);

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Runtime")
    }
}

impl Runtime {
    /// Starts the thread and its runtime.
    pub(crate) fn start(name: &str) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let join = thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                // Spawned tasks run while this waits; stopping drops the runtime here, on
                // its own thread, cancelling what is left.
                let _ = runtime.block_on(stop_rx);
            })?;
        let thread = join.thread().id();
        Ok(Self(Arc::new(Owner {
            handle,
            thread,
            stop: std::sync::Mutex::new(Some(stop_tx)),
            join: std::sync::Mutex::new(Some(join)),
        })))
    }

    /// Starts a runtime thread called `name` and connects with `options` on it: what the
    /// backend and the transport both begin with.
    ///
    /// # Errors
    /// What [`ConnectOptions::connect`] reports, or [`ConnectError::Runtime`] when the
    /// thread could not be started or stopped.
    pub(crate) fn start_connected(
        name: &str,
        options: ConnectOptions,
    ) -> Result<(Self, JetStream), ConnectError> {
        let rt = Self::start(name).map_err(|e| ConnectError::Runtime {
            detail: e.to_string(),
        })?;
        let js = rt
            .call(async move { options.connect().await })
            .map_err(|_| ConnectError::Runtime {
                detail: "the runtime thread stopped".into(),
            })??;
        Ok((rt, js))
    }

    /// The runtime's own thread.
    pub(crate) fn thread_id(&self) -> ThreadId {
        self.0.thread
    }

    /// Runs `fut` on the runtime and waits for its output.
    ///
    /// # Errors
    /// [`RuntimeGone`] when the runtime stopped, or when called on the runtime's own thread
    /// (waiting there would deadlock).
    pub(crate) fn call<F, T>(&self, fut: F) -> Result<T, RuntimeGone>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        if thread::current().id() == self.0.thread {
            return Err(RuntimeGone);
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.0.handle.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv().map_err(|_| RuntimeGone)
    }

    /// Runs `fut` to completion on the calling thread, inside the runtime's context: its
    /// timers and the connection's channels are the runtime's, and the connection's task
    /// on the runtime thread does the I/O, but the future itself is polled here, so a call
    /// costs the runtime thread no task of its own. The caller's thread sleeps between
    /// polls (woken by the runtime thread), as it sleeps on [`Self::call`]'s channel.
    ///
    /// Made inside another tokio runtime, it enters this runtime's context for the call
    /// (allowed, unlike nesting `block_on`) and blocks that thread as [`Self::call`] does;
    /// the caller's cooperative budget does not apply to `fut`.
    ///
    /// `fut` must be bounded by the caller (a timeout): nothing here gives up.
    ///
    /// # Errors
    /// [`RuntimeGone`] when called on the runtime's own thread (sleeping there would stop
    /// the I/O the future waits for).
    pub(crate) fn call_here<F: Future>(&self, fut: F) -> Result<F::Output, RuntimeGone> {
        if thread::current().id() == self.0.thread {
            return Err(RuntimeGone);
        }
        // The runtime runs as long as a handle (this one) lives: its drivers are up.
        let _context = self.0.handle.enter();
        Ok(block_here(tokio::task::unconstrained(fut)))
    }

    /// `fut`, polled wherever the returned future is polled (any runtime, any thread) but
    /// inside this runtime's context at every poll: its timers and the connection's
    /// channels are this runtime's, while the work of each poll is the caller's. So an
    /// async caller costs the runtime thread nothing but the connection's I/O, as
    /// [`Self::call_here`] does for a blocking one. Dropping it drops `fut`.
    pub(crate) fn in_context<F: Future>(&self, fut: F) -> InContext<F> {
        InContext {
            handle: self.0.handle.clone(),
            fut: Box::pin(fut),
        }
    }

    /// Spawns a background task.
    pub(crate) fn spawn<F>(&self, fut: F) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.0.handle.spawn(fut)
    }
}

/// See [`Runtime::in_context`]. The future is boxed so that this needs no pin projection
/// (one allocation per call, beside the seam's own boxed future).
pub(crate) struct InContext<F> {
    handle: Handle,
    fut: std::pin::Pin<Box<F>>,
}

impl<F: Future> Future for InContext<F> {
    type Output = F::Output;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Entering another runtime's context is allowed anywhere (unlike `block_on`), and
        // the guard ends with this poll.
        let _context = self.handle.enter();
        self.fut.as_mut().poll(cx)
    }
}

/// Wakes a thread sleeping in [`block_here`].
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `fut` on this thread until it is ready, sleeping between polls until its waker
/// is called. An unpark that comes before the sleep is kept (`park` returns at once), and
/// a spurious return only costs one more poll.
fn block_here<F: Future>(fut: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(fut);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_call_here_runs_timers_and_channels_of_the_runtime() {
        let rt = Runtime::start("test-rt").expect("runtime");
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        // The sender fires from a task on the runtime thread after a timer.
        rt.spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let _ = tx.send(7);
        });
        let got =
            rt.call_here(async move { tokio::time::timeout(Duration::from_secs(10), rx).await });
        assert_eq!(got.expect("not on the runtime thread"), Ok(Ok(7)));
    }

    #[test]
    fn a_future_in_context_uses_the_runtimes_timers_wherever_it_is_polled() {
        let rt = Runtime::start("test-rt").expect("runtime");
        // Polled by no runtime at all: a tokio timer outside any context would panic.
        let slept = block_here(rt.in_context(async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            1
        }));
        assert_eq!(slept, 1);
        // Polled by another runtime that has no timer of its own.
        let other = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime without timers");
        let timed =
            other.block_on(rt.in_context(async {
                tokio::time::timeout(Duration::from_secs(5), async { 2 }).await
            }));
        assert_eq!(timed, Ok(2));
    }

    #[test]
    fn a_call_here_on_the_runtime_thread_is_refused() {
        let rt = Runtime::start("test-rt").expect("runtime");
        let inner = rt.clone();
        let refused = rt
            .call(async move { inner.call_here(async { 1 }).is_err() })
            .expect("the runtime runs");
        assert!(refused);
    }

    #[test]
    fn a_call_here_inside_another_runtime_neither_panics_nor_starves() {
        let rt = Runtime::start("test-rt").expect("runtime");
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        // On a thread of its own, so that a starved loop (it would spin, never finishing)
        // fails the test within a bound instead of hanging it.
        thread::spawn(move || {
            let other = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            // Far more tokio operations than one task's cooperative budget (128): a budget
            // carried into the call would make every poll after it pending at once.
            let sum = other.block_on(async {
                let mut sum = 0u32;
                for i in 0..1_000u32 {
                    let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
                    let _ = tx.send(i);
                    sum += rt
                        .call_here(async move {
                            tokio::time::timeout(Duration::from_secs(5), rx)
                                .await
                                .ok()
                                .and_then(Result::ok)
                                .unwrap_or(0)
                        })
                        .expect("not on the runtime thread");
                }
                sum
            });
            let _ = done_tx.send(sum);
        });
        let sum = done_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the calls finished");
        assert_eq!(sum, (0..1_000u32).sum::<u32>());
    }
}
