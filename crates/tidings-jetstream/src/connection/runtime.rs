//! The runtime the backend owns: one dedicated thread running a current-thread tokio
//! runtime, so the synchronous seam can be called from anywhere — a plain thread, a pool
//! worker, or inside some other tokio runtime — without nesting `block_on`.
//!
//! A call spawns its future on the backend's runtime and waits for the answer on a
//! channel. Dropping the last handle stops the runtime on its own thread (a runtime may not
//! be dropped inside another one's context).

use std::future::Future;
use std::sync::Arc;
use std::thread::{self, JoinHandle, ThreadId};

use tokio::runtime::Handle;
use tokio::sync::oneshot;

use crate::connect::{ConnectOptions, JetStream};
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

    /// Spawns a background task.
    pub(crate) fn spawn<F>(&self, fut: F) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.0.handle.spawn(fut)
    }
}
