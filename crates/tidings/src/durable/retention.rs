//! The retention service: applies each stream's retention on a timer (R-LOG-1), so a stream
//! that stopped receiving messages still sheds its old segments — the log itself applies
//! retention only after a segment roll, which an idle stream never has.
//!
//! One service per broker, created with its first stream that has a retention policy, and
//! run by the driver (R-EXE-4): a thread of its own under the thread driver, the pool's
//! timer and a worker under the pool driver, a task (its passes on the blocking pool) under
//! tokio, and [`Broker::run_until_idle`](crate::Broker::run_until_idle) in the caller's
//! thread under the manual driver. It waits on the broker's clock (a
//! [`ManualClock`](crate::ManualClock) wakes it when advanced). Age is judged against the
//! broker clock's wall time.

use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use super::stream::OpenStream;
use crate::clock::{Clock, ClockWaiter, deadline_after};
use crate::driver::{Executor, FeedStep, Feeder, FeederHandle};
use crate::error::SubscribeError;
use crate::sync::{Condvar, Mutex, MutexGuard, wait_until};

struct State {
    /// Each stream with a retention policy, and when it is next due (`None` = never).
    streams: Vec<(Arc<OpenStream>, Option<Instant>)>,
    stop: bool,
}

pub(crate) struct RetentionService {
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
    cv: Condvar,
    /// The driver's handle on this service.
    handle: OnceLock<Box<dyn FeederHandle>>,
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
            cv: Condvar::new(),
            handle: OnceLock::new(),
        });
        let waiter: Weak<dyn ClockWaiter> = Arc::downgrade(&svc) as Weak<dyn ClockWaiter>;
        svc.clock.register_waiter(waiter);
        let handle = executor.start_feeder(svc.clone())?;
        let _ = svc.handle.set(handle); // a new service: not set before
        svc.wake();
        Ok(svc)
    }

    fn wake(&self) {
        drop(self.state.lock());
        self.cv.notify_all();
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

    /// Take the streams due now and move their next due time on.
    fn take_due(&self, st: &mut State) -> Vec<Arc<OpenStream>> {
        let now = self.clock.now();
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

    /// Manual driver: apply what is due now, in the caller's thread. Returns how many
    /// streams were checked.
    pub(crate) fn run_due(&self) -> usize {
        let due = {
            let mut st = self.state.lock();
            if st.stop {
                return 0;
            }
            self.take_due(&mut st)
        };
        self.apply(&due);
        due.len()
    }

    fn run(&self) {
        let mut st = self.state.lock();
        loop {
            if st.stop {
                return;
            }
            let due = self.take_due(&mut st);
            if !due.is_empty() {
                MutexGuard::unlocked(&mut st, || self.apply(&due));
                continue;
            }
            let next = st.streams.iter().filter_map(|(_, n)| *n).min();
            wait_until(self.clock.as_ref(), &self.cv, &mut st, next);
        }
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

impl Feeder for RetentionService {
    fn name(&self) -> String {
        "tidings-retention".into()
    }
    /// Apply what is due now; then wait for the next due time (pool timer, tokio sleep).
    fn step(&self) -> FeedStep {
        let due = {
            let mut st = self.state.lock();
            if st.stop {
                return FeedStep::Stopped;
            }
            self.take_due(&mut st)
        };
        if !due.is_empty() {
            self.apply(&due);
            return FeedStep::Again;
        }
        let next = self
            .state
            .lock()
            .streams
            .iter()
            .filter_map(|(_, n)| *n)
            .min();
        next.map_or(FeedStep::Idle, FeedStep::WakeAt)
    }
    fn run(&self) {
        RetentionService::run(self);
    }
    fn wait_hint(&self, at: Instant) -> Option<Duration> {
        self.clock.wait_hint(at)
    }
}

impl ClockWaiter for RetentionService {
    fn time_moved(&self) {
        self.wake();
    }
}
