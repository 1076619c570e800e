//! Drivers: who runs the dispatchers and how they wait (R-EXE-1).
//!
//! A driver owns threads (or tasks) and real waiting; the subscription core owns every
//! rule. Adding a driver means implementing `Executor` (start a subscription's dispatcher
//! slots, stop them; start the broker's services, see `service.rs`) and `Wake` (how a
//! publisher wakes an idle slot).

use std::sync::Arc;
use std::time::Instant;

use crate::error::SubscribeError;
use crate::subscription::shell::{SubscriptionShell, Wake};

pub(crate) use service::{Service, ServiceHandle, ServiceStep};

mod handles;
mod live;
#[cfg(all(test, tidings_loom))]
mod loom_models;
pub(crate) mod manual;
pub(crate) mod pool;
mod service;
#[cfg(any(feature = "tokio", all(test, tidings_loom)))]
mod sleepers;
pub(crate) mod thread;
#[cfg(feature = "tokio")]
pub(crate) mod tokio;

/// Which driver runs the subscriptions' dispatchers (R-EXE-1).
// Not `PartialEq`: a tokio `Handle` has no stable identity to compare.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub enum Driver {
    /// A dedicated OS thread per dispatcher slot (one per subscription, or one per lane /
    /// per-key slot). Simple and isolating; right for tens to hundreds of subscriptions.
    #[default]
    Thread,
    /// Nothing runs until the caller calls [`Broker::run_until_idle`](crate::Broker::run_until_idle),
    /// which delivers everything deliverable in the caller's thread (R-EXE-2). For tests,
    /// with a [`ManualClock`](crate::ManualClock). Handlers may publish, request,
    /// subscribe and close re-entrantly: `Block` does not wait there and `run_until_idle`
    /// nests (see [`Broker::run_until_idle`](crate::Broker::run_until_idle), R-EXE-5).
    Manual,
    /// A fixed set of worker threads shared by all subscriptions; a subscription is
    /// scheduled only when it has work and is not already running (an actor mailbox), runs
    /// at most a batch of 64 deliveries, then yields. For thousands of subscriptions.
    /// [`Driver::pool`] sizes it to the machine's available parallelism; `workers: 0` is
    /// refused at build with `ConfigError::Invalid { setting: "driver.pool.workers", .. }`.
    Pool {
        /// Number of worker threads (≥ 1).
        workers: usize,
    },
    /// Dispatcher slots run as tokio tasks on this runtime, a slot's task existing only
    /// while the slot has work (so an idle subscription holds no task) (R-EXE-1). The only
    /// driver that runs async handlers ([`Broker::subscribe`](crate::Broker::subscribe) with
    /// an [`AsyncHandler`](crate::AsyncHandler), R-EXE-3). Sync handlers run inline on the runtime's worker threads and must not
    /// block. From inside the runtime, close with
    /// [`Broker::close_async`](crate::Broker::close_async) (the sync `close` cannot wait
    /// for the tasks there and reports them as unjoined).
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    Tokio(::tokio::runtime::Handle),
}

impl Driver {
    /// A worker pool with one worker per available CPU (2 when that cannot be read).
    ///
    /// ```
    /// # use tidings::*;
    /// let broker = Broker::builder().driver(Driver::pool()).build()?;
    /// # broker.close(std::time::Duration::from_secs(5));
    /// # Ok::<(), ConfigError>(())
    /// ```
    #[must_use]
    pub fn pool() -> Self {
        Driver::Pool {
            workers: std::thread::available_parallelism().map_or(2, usize::from),
        }
    }
}

/// Runs subscriptions' dispatchers.
pub(crate) trait Executor: Send + Sync {
    /// Start the dispatcher slots of a new subscription.
    fn start(&self, sub: &Arc<SubscriptionShell>) -> Result<(), SubscribeError>;
    /// Start running `service` (see [`Service`]). The handle keeps no strong reference to
    /// it except under the thread driver, whose thread holds one until it stops.
    fn start_service(
        &self,
        service: Arc<dyn Service>,
    ) -> Result<Box<dyn ServiceHandle>, SubscribeError>;
    /// Wait until every dispatcher has stopped, or `deadline` (real time; `None`: no
    /// deadline). True if all stopped. A dispatcher that is the calling thread is not
    /// waited for.
    fn wait_stopped(&self, deadline: Option<Instant>) -> bool;
    /// Join stopped dispatchers; names of those still running at `deadline` (detached).
    /// `subs` are the broker's subscriptions, for a driver that names what is left by
    /// subscription.
    fn join(&self, deadline: Instant, subs: &[Arc<SubscriptionShell>]) -> Vec<String>;
    /// Deliver on the caller's thread, for a driver whose deliveries happen only there (the
    /// manual driver): run `work` now and return what it returned. The other drivers
    /// return `None` at once: their own threads or tasks deliver, and a caller that needs
    /// something delivered waits for them instead.
    fn run_on_caller(&self, work: &mut dyn FnMut() -> usize) -> Option<usize> {
        let _ = work;
        None
    }
    /// Let the dispatchers drain their queues before close, until `deadline` (real time;
    /// `None`: no deadline): wait for them to stop, or, where the caller's thread delivers,
    /// run `work` (deliver until idle) here.
    fn drain(&self, deadline: Option<Instant>, work: &mut dyn FnMut() -> usize) {
        if self.run_on_caller(work).is_none() {
            self.wait_stopped(deadline);
        }
    }
    /// The tokio driver's runtime: async handlers are accepted only when this is `Some`.
    #[cfg(feature = "tokio")]
    fn tokio_handle(&self) -> Option<::tokio::runtime::Handle> {
        None
    }
}

pub(crate) fn executor_for(
    driver: &Driver,
    clock: &Arc<dyn crate::clock::Clock>,
) -> Result<Box<dyn Executor>, crate::error::ConfigError> {
    Ok(match driver {
        Driver::Thread => Box::new(thread::ThreadExecutor::new()),
        Driver::Manual => Box::new(manual::ManualExecutor),
        #[cfg(feature = "tokio")]
        Driver::Tokio(handle) => Box::new(tokio::TokioExecutor::new(handle.clone())),
        Driver::Pool { workers } => {
            let n = match *workers {
                0 => {
                    return Err(crate::error::ConfigError::invalid(
                        "driver.pool.workers",
                        "0".into(),
                        "at least 1 (Driver::pool() uses the available parallelism)",
                    ));
                }
                n => n,
            };
            let pool = pool::PoolExecutor::new(n, clock.clone()).map_err(|e| {
                crate::error::ConfigError::invalid(
                    "driver.pool",
                    e.to_string(),
                    "spawnable worker threads",
                )
            })?;
            Box::new(pool)
        }
    })
}

/// The driver's name in snapshots: `thread`, `manual`, `pool`, `tokio`.
pub(crate) fn driver_name(d: &Driver) -> &'static str {
    match d {
        Driver::Thread => "thread",
        Driver::Manual => "manual",
        Driver::Pool { .. } => "pool",
        #[cfg(feature = "tokio")]
        Driver::Tokio(_) => "tokio",
    }
}
