//! The benchmark environment: the tidings drivers under test and shared runtimes.

use std::sync::Mutex;
use std::thread::JoinHandle;

use tidings::Driver;

/// A tidings driver the benchmarks run under. Each is one entry in [`DRIVERS`]; the cases
/// `fanout/n=*/<driver>`, `latency/*/<driver>` and `scale/*/<driver>` follow this list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverKind {
    /// `Driver::Thread`: one OS thread per dispatcher slot.
    Thread,
    /// `Driver::Pool { workers }`: a fixed worker pool shared by all subscriptions.
    Pool,
    /// The tokio driver (feature `tokio` of `tidings`).
    Tokio,
}

/// Every driver, in case order.
pub const DRIVERS: [DriverKind; 3] = [DriverKind::Thread, DriverKind::Pool, DriverKind::Tokio];

impl DriverKind {
    /// The name used in case names (`thread`, `pool`, `tokio`).
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            DriverKind::Thread => "thread",
            DriverKind::Pool => "pool",
            DriverKind::Tokio => "tokio",
        }
    }

    /// The `tidings::Driver` for this kind, or why it cannot be built.
    pub(crate) fn build(self, env: &Env) -> Result<Driver, String> {
        match self {
            DriverKind::Thread => Ok(Driver::Thread),
            DriverKind::Pool => Ok(Driver::Pool { workers: env.cores }),
            DriverKind::Tokio => Ok(Driver::Tokio(env.tokio.handle().clone())),
        }
    }
}

/// Shared across cases.
pub(crate) struct Env {
    /// Logical CPUs.
    pub cores: usize,
    /// A multi-threaded tokio runtime with one worker per core: runs the tokio-broadcast
    /// baseline's receivers and is what the tidings tokio driver should be given.
    pub tokio: tokio::runtime::Runtime,
    /// Slow teardowns (qubit-event-bus shutdown sleeps ~25 ms per subscription) run in the
    /// background and are joined at the end.
    background: Mutex<Vec<JoinHandle<()>>>,
}

impl Env {
    pub(crate) fn new() -> Result<Self, String> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cores)
            .thread_name("bench-tokio")
            .enable_time()
            .build()
            .map_err(|e| format!("tokio runtime: {e}"))?;
        Ok(Self {
            cores,
            tokio,
            background: Mutex::new(Vec::new()),
        })
    }

    /// Run a teardown in the background (it must not burn CPU).
    pub(crate) fn in_background(&self, f: impl FnOnce() + Send + 'static) {
        if let Ok(h) = std::thread::Builder::new()
            .name("bench-teardown".into())
            .spawn(f)
        {
            self.background
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(h);
        }
    }

    /// Join background teardowns.
    pub(crate) fn finish(self) {
        let handles = std::mem::take(
            &mut *self
                .background
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for h in handles {
            let _ = h.join();
        }
        self.tokio
            .shutdown_timeout(std::time::Duration::from_secs(5));
    }
}
