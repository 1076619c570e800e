//! Model-checked wake/step protocol of the durable feeder, a broker service (see
//! `driver::service`; loom, see `crate::sync` and `subscription/loom_models.rs` to run
//! them): the drivers' own service loops — the thread driver's `start_service` and
//! `service_loop`, the pool's service mailbox and `worker_loop` — stepping a real
//! [`CursorFeeder`] over an in-memory cursor. They live here, not with the drivers' models,
//! because the arrows point from durable code to the drivers.
//!
//! The models use a manual clock: the feeder then stores its position on every idle step
//! instead of asking to run again at a due time (loom has no time; see `crate::sync`).

use std::sync::Arc;

use crate::clock::{ManualClock, SystemClock};
use crate::driver::pool::{Shared, worker_loop};
use crate::driver::thread::ThreadExecutor;
use crate::driver::{Executor, Service, ServiceHandle};
use crate::message::Message;
use crate::subscription::SubscriptionId;
use crate::subscription::loom_models::{Tally, check, message, messages, number};
use crate::subscription::shell::FeedOffer;
use crate::sync::{Mutex, thread};

use super::feeder::{CursorFeeder, FeedSink, Held, OnDue};
use super::{
    BackendCursor, CursorState, DurableDeadLetter, Finished, Outcome, StartAt, StreamError,
};

/// What the model's stream holds and what the feeder did to its cursor.
#[derive(Default)]
struct Log {
    state: Mutex<LogState>,
}

#[derive(Default)]
struct LogState {
    /// The stream: record `i` is message `i`.
    stored: usize,
    /// The next record the cursor hands out.
    position: usize,
    /// The finished messages reported, in order.
    finished: Vec<usize>,
    /// How often the cursor was closed.
    closed: usize,
}

impl Log {
    /// An append: one more record (the caller then wakes the feeder, as the cursor's waker
    /// does).
    fn append(&self) {
        self.state.lock().stored += 1;
    }

    fn finished(&self) -> Vec<usize> {
        self.state.lock().finished.clone()
    }

    fn closed(&self) -> usize {
        self.state.lock().closed
    }
}

/// A cursor over [`Log`] that fails the model when the feeder uses it after closing it.
struct ModelCursor(Arc<Log>);

impl BackendCursor for ModelCursor {
    fn fetch(&self, max: usize) -> Result<Vec<Message>, StreamError> {
        let mut st = self.0.state.lock();
        assert_eq!(st.closed, 0, "a fetch after the cursor was closed");
        let end = st.stored.min(st.position + max);
        let fetched = (st.position..end).map(|i| (*message(i)).clone()).collect();
        st.position = end;
        Ok(fetched)
    }
    fn finish(&self, done: &[Finished]) -> Result<(), StreamError> {
        let mut st = self.0.state.lock();
        assert_eq!(
            st.closed, 0,
            "finished messages reported after the cursor was closed"
        );
        st.finished.extend(done.iter().map(|f| number(&f.message)));
        Ok(())
    }
    fn seek(&self, _at: StartAt) -> Result<u64, StreamError> {
        unreachable!("no seek in these models")
    }
    fn commit(&self) -> Result<u64, StreamError> {
        Ok(0)
    }
    fn state(&self) -> CursorState {
        // Nothing is outstanding to the feeder: the window never fills in these models.
        CursorState::default()
    }
    fn dead_letters(&self) -> Result<Vec<DurableDeadLetter>, StreamError> {
        Ok(Vec::new())
    }
    fn drain_dead_letters(&self) -> Result<Vec<DurableDeadLetter>, StreamError> {
        Ok(Vec::new())
    }
    fn redrive_dead_letters(
        &self,
        _select: &mut dyn FnMut(&DurableDeadLetter) -> bool,
    ) -> Result<usize, StreamError> {
        Ok(0)
    }
    fn close(&self) {
        self.0.state.lock().closed += 1;
    }
}

/// A subscription that takes every message, counting it.
struct TallySink(Arc<Tally>);

impl FeedSink for TallySink {
    fn offer(&self, message: &Arc<Message>) -> FeedOffer {
        self.0.add(number(message));
        FeedOffer::Taken
    }
    fn hold(&self, _message: &Arc<Message>, _on_due: OnDue) -> Held {
        Held::NotDelayed
    }
}

/// A feeder of a [`TallySink`] from a [`ModelCursor`] over a new [`Log`], on a manual
/// clock; not started.
fn feeder() -> (Arc<CursorFeeder>, Arc<Log>, Arc<Tally>) {
    let log = Arc::new(Log::default());
    let offered = Arc::new(Tally::default());
    let feeder = CursorFeeder::new(
        "model",
        "stream",
        SubscriptionId(1),
        Box::new(ModelCursor(log.clone())),
        Arc::new(TallySink(offered.clone())),
        8,
        Arc::new(ManualClock::new()),
    );
    (feeder, log, offered)
}

/// A driver's handle whose finishing threads must not block (a tokio worker's), over
/// another driver's handle: finished messages are handed to the feeder's next step.
struct Deferring(Box<dyn ServiceHandle>);

impl ServiceHandle for Deferring {
    fn wake(&self) {
        self.0.wake();
    }
    fn defers_io(&self) -> bool {
        true
    }
    fn join(&self) {
        self.0.join();
    }
}

/// Message `n`, finished by its handler.
fn delivered(n: usize) -> Vec<Finished> {
    vec![Finished::new(message(n), Outcome::Delivered)]
}

/// The thread driver's service loop loses no wake-up (R-EXE-4): every record appended
/// (then the feeder woken, as the cursor's waker does) while the feeder's thread steps —
/// or finishes a step that found nothing and is about to wait — is offered; and
/// `shutdown` ends the thread and closes the cursor once.
///
/// Guards against: the loop waiting without checking for a wake-up left during its step
/// (or taking the wake-up before the step instead of at the wait) — an append in between
/// is never fetched (loom reports the deadlock).
#[test]
fn a_wake_racing_the_service_threads_step_is_not_lost() {
    check(|| {
        let n = messages();
        let (feeder, log, offered) = feeder();
        let executor = ThreadExecutor::new();
        let handle = executor
            .start_service(feeder.clone())
            .expect("a service thread");
        feeder.started(handle);
        for _ in 0..n {
            log.append();
            feeder.wake();
        }
        assert_eq!(offered.wait_for(n), (0..n).collect::<Vec<_>>());
        feeder.shutdown(); // joins the service thread
        assert_eq!(log.closed(), 1);
    });
}

/// `shutdown` racing the feeder's step on a pool worker and an append's wake (R-EXE-4,
/// R-LOG-3): once `shutdown` returns, no step touches the cursor (the model's cursor fails
/// on a fetch after close), the cursor is closed once, and the pool stops.
///
/// Guards against: `shutdown` closing the cursor without waiting for a step under way
/// (the step lock) — the pool has no thread to join; or a step that fetches without
/// checking the stop flag under that lock.
#[test]
fn stop_racing_a_pool_step_leaves_the_cursor_alone() {
    check(|| {
        let (feeder, log, _offered) = feeder();
        let pool = Shared::new(Arc::new(SystemClock));
        let service: Arc<dyn Service> = feeder.clone();
        feeder.started(Box::new(pool.attach_service(&service)));
        let worker = {
            let pool = pool.clone();
            thread::spawn(move || worker_loop(&pool))
        };
        let appender = {
            let (feeder, log) = (feeder.clone(), log.clone());
            thread::spawn(move || {
                log.append();
                feeder.wake();
            })
        };
        feeder.shutdown();
        assert_eq!(log.closed(), 1, "closed once, by shutdown");
        appender.join().expect("the appender returns");
        pool.stop();
        worker.join().expect("the pool worker returns");
        assert_eq!(log.closed(), 1, "no step after shutdown");
    });
}

/// Finished messages handed over by a thread that must not block (a tokio worker) are
/// reported exactly once (R-LOG-3, R-EXE-4): a pool worker's steps racing the hand-overs
/// and `shutdown` report each message handed over before `shutdown` began (0 and 1) once,
/// a message handed over while it runs (2) at most once, and nothing after the cursor
/// closed.
///
/// Guards against: taking the handed-over messages by copying them and clearing the list
/// afterwards (a hand-over in between is lost, or reported twice), `shutdown` not
/// reporting what no step took (lost), and a step reporting after `shutdown` closed the
/// cursor.
#[test]
fn handed_over_finishes_are_reported_exactly_once() {
    check(|| {
        let (feeder, log, _offered) = feeder();
        let pool = Shared::new(Arc::new(SystemClock));
        let service: Arc<dyn Service> = feeder.clone();
        feeder.started(Box::new(Deferring(Box::new(pool.attach_service(&service)))));
        let worker = {
            let pool = pool.clone();
            thread::spawn(move || worker_loop(&pool))
        };
        let first = Arc::new(Tally::default());
        let dispatcher = {
            let (feeder, first) = (feeder.clone(), first.clone());
            thread::spawn(move || {
                feeder.on_finished(delivered(0));
                feeder.on_finished(delivered(1));
                first.add(0);
                feeder.on_finished(delivered(2));
            })
        };
        first.wait_for(1);
        feeder.shutdown();
        dispatcher.join().expect("the dispatcher returns");
        pool.stop();
        worker.join().expect("the pool worker returns");
        let reported = log.finished();
        let times = |m: usize| reported.iter().filter(|&&n| n == m).count();
        assert_eq!(
            (times(0), times(1)),
            (1, 1),
            "handed over before shutdown: reported once ({reported:?})"
        );
        assert!(
            times(2) <= 1,
            "handed over during shutdown: at most once ({reported:?})"
        );
    });
}
