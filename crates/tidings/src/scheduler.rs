//! Delayed and scheduled messages (R-TIME-2).
//!
//! One scheduler per broker: a min-heap keyed by (due time, publish sequence), so due
//! messages are offered in due-time order and ties in publish order. Its timer (started on
//! the first delayed publish) is a service the driver runs (R-EXE-4, `driver::Service`):
//! each step releases what is due and says when the earliest due time is; the driver
//! waits for it (a thread of the thread driver, the pool's timer and a worker, a task with
//! its releases on the blocking pool, `run_until_idle` under the manual driver). Nothing
//! waits per message. Close cancels what is pending and reports it.
//!
//! # Never waiting on a queue
//! The timer offers a due message without waiting (R-TIME-2, R-CORE-1): a full
//! `Overflow::Block` queue refuses it as `Overflow` (dead-lettered, as under `Reject`), so
//! one subscription's backpressure never delays another subscription's due messages.
//!
//! A due message goes to every matching subscription (a delayed publish), or to one
//! subscription through a callback (a durable subscription reading a delayed record: the
//! record is in the log since publish; only its delivery waits).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use crate::clock::Clock;
use crate::driver::{Executor, Service, ServiceHandle, ServiceStep};
use crate::error::SubscribeError;
use crate::message::Message;
use crate::subscription::SubscriptionId;
use crate::sync::Mutex;

/// Offers a due message to one subscription.
pub(crate) type Deliver = Box<dyn FnOnce(&Arc<Message>) + Send>;

/// Who a due message is offered to.
pub(crate) enum Target {
    /// Every subscription whose pattern matches (a delayed publish).
    Route,
    /// One subscription, through this callback.
    Only(SubscriptionId, Deliver),
}

impl Target {
    fn subscription(&self) -> Option<SubscriptionId> {
        match self {
            Target::Route => None,
            Target::Only(id, _) => Some(*id),
        }
    }
}

/// A message that became due, and who gets it.
pub(crate) type Due = (Arc<Message>, Target);

struct Entry {
    due: Instant,
    seq: u64,
    message: Arc<Message>,
    target: Target,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.seq) == (other.due, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.due, self.seq).cmp(&(other.due, other.seq))
    }
}

#[derive(Default)]
struct State {
    heap: BinaryHeap<Reverse<Entry>>,
    seq: u64,
    closed: bool,
    timer_started: bool,
}

#[derive(Default)]
pub(crate) struct Scheduler {
    state: Mutex<State>,
    /// The driver's handle on the timer, once started (a one-time publication: until it is
    /// set no timer runs, and the messages scheduled meanwhile are found by its first step).
    timer: OnceLock<Box<dyn ServiceHandle>>,
    /// The timer itself (the pool, tokio and manual drivers hold it weakly), dropped at
    /// close.
    timer_service: Mutex<Option<Arc<dyn Service>>>,
}

/// Hands a due message to the broker.
pub(crate) type Release = Box<dyn Fn(Due) + Send + Sync>;

/// The scheduler's timer, a service the driver runs.
struct Timer {
    scheduler: Arc<Scheduler>,
    clock: Arc<dyn Clock>,
    release: Release,
}

impl Service for Timer {
    fn name(&self) -> String {
        "tidings-scheduler".into()
    }
    fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }
    /// Release what is due at `now`; then run again at the next due time (or when a
    /// message scheduled earlier than that, a clock jump or close wakes it).
    fn step(&self, now: Instant) -> ServiceStep {
        let (due, next) = {
            let mut s = self.scheduler.state.lock();
            if s.closed {
                return ServiceStep::Stopped;
            }
            let due = Scheduler::pop_due(&mut s, now);
            (due, s.heap.peek().map(|Reverse(e)| e.due))
        };
        if !due.is_empty() {
            for entry in due {
                (self.release)(entry);
            }
            return ServiceStep::Again;
        }
        next.map_or(ServiceStep::Idle, ServiceStep::WakeAt)
    }
}

/// What `schedule` asks of the caller.
pub(crate) enum Scheduled {
    /// Held; start the timer thread if `start_timer`.
    Held { start_timer: bool },
    /// The scheduler is closed.
    Closed,
}

impl Scheduler {
    /// Start the timer on `executor` (once, on the first delayed publish). The scheduler
    /// keeps it alive until close (the thread driver's thread holds it too, until the timer
    /// stops).
    pub(crate) fn start_timer(
        self: &Arc<Self>,
        clock: Arc<dyn Clock>,
        release: Release,
        executor: &dyn Executor,
    ) -> Result<(), SubscribeError> {
        let timer: Arc<dyn Service> = Arc::new(Timer {
            scheduler: self.clone(),
            clock,
            release,
        });
        let handle = executor.start_service(timer.clone())?;
        let _ = self.timer.set(handle); // started once (`timer_started`)
        self.timer_service.lock().replace(timer);
        self.notify();
        Ok(())
    }

    /// Wake the timer (after the change): the earliest due time changed, the clock jumped,
    /// or close.
    fn notify(&self) {
        if let Some(t) = self.timer.get() {
            t.wake();
        }
    }

    /// Manual driver: release what is due now, in the caller's thread (see
    /// [`ServiceHandle::run_here`]). Returns the timer's steps that released something.
    pub(crate) fn run_here(&self) -> usize {
        self.timer.get().map_or(0, |t| t.run_here())
    }

    /// Wait for the timer's thread to end (thread driver; close, after `close`).
    pub(crate) fn join_timer(&self) {
        if let Some(t) = self.timer.get() {
            t.join();
        }
        self.timer_service.lock().take();
    }

    pub(crate) fn schedule(
        &self,
        due: Instant,
        message: Arc<Message>,
        target: Target,
        wants_timer: bool,
    ) -> Scheduled {
        let mut s = self.state.lock();
        if s.closed {
            return Scheduled::Closed;
        }
        let seq = s.seq;
        s.seq += 1;
        let earliest = s.heap.peek().is_none_or(|Reverse(e)| due < e.due);
        s.heap.push(Reverse(Entry {
            due,
            seq,
            message,
            target,
        }));
        let start_timer = wants_timer && !s.timer_started;
        s.timer_started |= start_timer;
        drop(s);
        if earliest {
            self.notify();
        }
        Scheduled::Held { start_timer }
    }

    fn pop_due(s: &mut State, now: Instant) -> Vec<Due> {
        let mut due = Vec::new();
        while s.heap.peek().is_some_and(|Reverse(e)| e.due <= now) {
            if let Some(Reverse(e)) = s.heap.pop() {
                due.push((e.message, e.target));
            }
        }
        due
    }

    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.state.lock().heap.peek().map(|Reverse(e)| e.due)
    }

    pub(crate) fn len(&self) -> usize {
        self.state.lock().heap.len()
    }

    /// Wake the timer (the clock jumped).
    pub(crate) fn wake(&self) {
        self.notify();
    }

    /// Cancel everything pending; returns it in due order, with the one subscription it was
    /// for (if it was for one).
    pub(crate) fn close(&self) -> Vec<(Arc<Message>, Option<SubscriptionId>)> {
        let mut s = self.state.lock();
        s.closed = true;
        let mut rest: Vec<Entry> = s.heap.drain().map(|Reverse(e)| e).collect();
        drop(s);
        self.notify();
        rest.sort();
        rest.into_iter()
            .map(|e| {
                let sub = e.target.subscription();
                (e.message, sub)
            })
            .collect()
    }
}

#[cfg(all(test, tidings_loom))]
mod loom_models {
    //! The timer handshake, model-checked (see `subscription/loom_models.rs` to run it).

    use super::*;
    use crate::clock::SystemClock;
    use crate::driver::thread::ThreadExecutor;
    use crate::subscription::loom_models::{Tally, check, message, messages, number};

    /// The timer — a service on the thread driver's own service thread and loop — racing
    /// `schedule` and `close` (R-TIME-2, R-EXE-4): a message scheduled while the timer
    /// waits is released, in order, and close ends the timer.
    ///
    /// Guards against: `schedule` not waking the timer when its message becomes the
    /// earliest (the timer keeps waiting: a lost wake-up).
    #[test]
    fn timer_releases_what_is_scheduled_while_it_waits() {
        check(|| {
            let n = messages();
            let scheduler = Arc::new(Scheduler::default());
            let released = Arc::new(Tally::default());
            let release: Release = {
                let released = released.clone();
                Box::new(move |(m, _)| released.add(number(&m)))
            };
            scheduler
                .start_timer(Arc::new(SystemClock), release, &ThreadExecutor::new())
                .expect("a timer thread");
            for i in 0..n {
                let held = scheduler.schedule(SystemClock.now(), message(i), Target::Route, false);
                assert!(matches!(held, Scheduled::Held { start_timer: false }));
            }
            assert_eq!(released.wait_for(n), (0..n).collect::<Vec<_>>());
            assert!(scheduler.close().is_empty(), "everything was released");
            scheduler.join_timer(); // the timer ends at close
            assert!(matches!(
                scheduler.schedule(SystemClock.now(), message(n), Target::Route, false),
                Scheduled::Closed
            ));
        });
    }
}
