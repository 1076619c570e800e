//! The retention service: applies each stream's retention on a timer (R-LOG-1), so a stream
//! that stopped receiving messages still sheds its old segments — the log itself applies
//! retention only after a segment roll, which an idle stream never has.
//!
//! One service per broker (`driver::Service`), created with its first stream that has a
//! retention policy, and run by the driver (R-EXE-4): a thread of its own under the thread
//! driver, the pool's timer and a worker under the pool driver, a task (its passes on the
//! blocking pool) under tokio, and [`Broker::run_until_idle`](crate::Broker::run_until_idle)
//! in the caller's thread under the manual driver. It waits on the broker's clock (a
//! [`ManualClock`](crate::ManualClock) wakes it when advanced). Age is judged against the
//! broker clock's wall time.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

use super::stream::OpenStream;
use crate::clock::{Clock, ClockWaiter, deadline_after};
use crate::driver::{Executor, Service, ServiceHandle, ServiceStep};
use crate::error::SubscribeError;
use crate::sync::Mutex;

struct State {
    /// Each stream with a retention policy, and when it is next due (`None` = never).
    streams: Vec<(Arc<OpenStream>, Option<Instant>)>,
    stop: bool,
}

pub(crate) struct RetentionService {
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    /// The driver's handle on this service (set once, at start).
    handle: OnceLock<Box<dyn ServiceHandle>>,
}

impl RetentionService {
    /// A service on `clock`, started by `executor`.
    pub(crate) fn start(
        clock: Arc<dyn Clock>,
        executor: &dyn Executor,
    ) -> Result<Arc<Self>, SubscribeError> {
        let svc = Arc::new(Self {
            clock,
            state: Mutex::new(State {
                streams: Vec::new(),
                stop: false,
            }),
            handle: OnceLock::new(),
        });
        let waiter: Weak<dyn ClockWaiter> = Arc::downgrade(&svc) as Weak<dyn ClockWaiter>;
        svc.clock.register_waiter(waiter);
        let handle = executor.start_service(svc.clone())?;
        let _ = svc.handle.set(handle); // a new service: not set before
        svc.wake();
        Ok(svc)
    }

    /// Step again: a stream was added, the clock jumped, or stop (the change made first).
    fn wake(&self) {
        if let Some(h) = self.handle.get() {
            h.wake();
        }
    }

    /// Apply `stream`'s retention every `retention_interval` from now on.
    pub(crate) fn add(&self, stream: Arc<OpenStream>) {
        let every = stream.retention_interval();
        let next = deadline_after(self.clock.now(), every);
        self.state.lock().streams.push((stream, next));
        self.wake();
    }

    /// Take the streams due at `now` and move their next due time on.
    fn take_due(st: &mut State, now: Instant) -> Vec<Arc<OpenStream>> {
        let mut due = Vec::new();
        for (s, next) in &mut st.streams {
            if next.is_some_and(|n| n <= now) {
                *next = deadline_after(now, s.retention_interval());
                due.push(s.clone());
            }
        }
        due
    }

    fn apply(&self, due: &[Arc<OpenStream>]) {
        let now = self.clock.wall();
        for s in due {
            if let Err(e) = s.backend.apply_retention(now) {
                tracing::warn!("tidings: retention of stream {}: {e}", s.name());
            }
        }
    }

    /// Manual driver: apply what is due now, in the caller's thread (see
    /// [`ServiceHandle::run_here`]). Returns the steps that applied something.
    pub(crate) fn run_here(&self) -> usize {
        self.handle.get().map_or(0, |h| h.run_here())
    }

    /// Stop, and join the thread under the thread driver (broker close). Idempotent.
    pub(crate) fn stop(&self) {
        {
            let mut st = self.state.lock();
            st.stop = true;
            st.streams.clear();
        }
        self.wake();
        if let Some(h) = self.handle.get() {
            h.join();
        }
    }
}

impl Service for RetentionService {
    fn name(&self) -> String {
        "tidings-retention".into()
    }
    fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }
    /// Apply what is due at `now`; then run again at the next due time.
    fn step(&self, now: Instant) -> ServiceStep {
        let (due, next) = {
            let mut st = self.state.lock();
            if st.stop {
                return ServiceStep::Stopped;
            }
            let due = Self::take_due(&mut st, now);
            let next = st.streams.iter().filter_map(|(_, n)| *n).min();
            (due, next)
        };
        if !due.is_empty() {
            self.apply(&due);
            return ServiceStep::Again;
        }
        next.map_or(ServiceStep::Idle, ServiceStep::WakeAt)
    }
}

impl ClockWaiter for RetentionService {
    fn time_moved(&self) {
        self.wake();
    }
}
