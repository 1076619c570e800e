//! Broker services: work a driver runs besides the dispatchers (R-EXE-4).
//!
//! A **service** — a durable subscription's feeder (`durable::feeder`), the retention timer
//! (`durable::retention`), the scheduler's timer (`crate::scheduler`) — is polled, never
//! looped (quinn-proto's `handle_timeout(now)` / `poll_timeout()`): [`Service::step`] does one
//! bounded pass at `now` and returns when it next needs to run ([`ServiceStep`]). It never
//! sleeps and never waits for more work; it may do blocking file I/O. So each service has
//! one body of logic, whatever the driver, and the driver owns every loop and every wait:
//!
//! * **thread**: a thread per service runs the generic loop `thread::service_loop`: step,
//!   then wait for a wake or the next due time, bounded by `thread::SERVICE_MAX_WAIT`;
//! * **pool**: a schedulable unit with a mailbox (queued when woken, at most one worker
//!   inside), parked on the pool's timer until a due time;
//! * **tokio**: a task that runs each step on the blocking pool (no blocking I/O on a
//!   runtime worker) and awaits a wake or the due time between steps;
//! * **manual**: [`ServiceHandle::run_here`], called by `run_until_idle` in the caller's
//!   thread.
//!
//! # Call order
//! 1. The owner builds the service, then hands it to
//!    [`Executor::start_service`](super::Executor::start_service) and keeps the returned
//!    [`ServiceHandle`]. A driver may step the service before the owner has the handle (the
//!    pool queues a first step at once), so a service that needs its handle to step treats
//!    a step without it as [`ServiceStep::Idle`], and the owner wakes it once the handle is
//!    in place.
//! 2. Whatever may give the service new work (an append, room freed, a seek, a clock jump, a
//!    stop request) calls [`ServiceHandle::wake`] *after* making its change. A wake that
//!    arrives while a step runs is not lost: every driver steps the service again after
//!    that step (model-checked: `driver::loom_models`).
//! 3. To stop: make the service's next step return [`ServiceStep::Stopped`], wake it, then
//!    [`ServiceHandle::join`] (the thread driver's thread ends) and wait for a step under
//!    way (the service's own step lock: the pool and tokio drivers have no thread to
//!    join). A stopped service is never stepped again by its driver.

use std::time::Instant;

use crate::clock::Clock;

/// What one [`Service::step`] did, and when the service next needs to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ServiceStep {
    /// It made progress and may have more to do: step it again (after others had a turn).
    Again,
    /// Nothing to do until [`ServiceHandle::wake`] (an append, room freed, a seek, stop).
    Idle,
    /// Nothing to do until this time on the service's clock, or a wake.
    WakeAt(Instant),
    /// Stopped for good: never step it again.
    Stopped,
}

/// A broker service the driver runs (see the module docs).
pub(crate) trait Service: Send + Sync + 'static {
    /// A name for its thread or task.
    fn name(&self) -> String;
    /// The clock its due times are on: the driver passes its `now` to [`step`](Self::step)
    /// and asks it how long a real thread should wait for a due time
    /// ([`Clock::wait_hint`]; a manual clock answers "until woken" and wakes the services
    /// registered with it when it moves).
    fn clock(&self) -> &dyn Clock;
    /// One bounded pass at `now` (on [`clock`](Self::clock)) that never waits for more
    /// work (it may do blocking file I/O). The driver runs one step of a service at a
    /// time.
    #[must_use = "the driver must act on when the service next needs to run"]
    fn step(&self, now: Instant) -> ServiceStep;
}

/// The driver's handle on a started [`Service`].
pub(crate) trait ServiceHandle: Send + Sync {
    /// There may be new work (an append, room freed, a seek, a clock jump, a stop request).
    /// Never blocks.
    fn wake(&self);
    /// True when the thread that finishes a message must not do blocking I/O for it (a
    /// tokio runtime worker): the finished messages are handed to the service's next step
    /// instead, which runs off the runtime's workers.
    fn defers_io(&self) -> bool {
        false
    }
    /// True when the driver steps the service by itself once a [`ServiceStep::WakeAt`]
    /// falls due. False under the manual driver, which steps services only inside
    /// `run_until_idle`: work put off to a due time waits for the next call there, so a
    /// service should not put off what it can do now.
    fn wakes_on_time(&self) -> bool {
        true
    }
    /// Wait for the service's thread to end, when it has one and it is not this thread
    /// (the service was asked to stop and woken first).
    fn join(&self) {}
    /// Manual driver: step the service in the caller's thread until it has nothing more to
    /// do now; returns the steps that made progress. The other drivers return 0: their
    /// threads or tasks step it.
    fn run_here(&self) -> usize {
        0
    }
}
