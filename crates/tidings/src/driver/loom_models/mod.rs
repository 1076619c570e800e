//! Model-checked protocols of the drivers (loom; see `crate::sync` and
//! `subscription/loom_models.rs` for how to run them).
//!
//! The models run the drivers' own loops — the pool's `worker_loop` over its run queue and
//! mailbox flags, the thread driver's `dispatch_loop` — on loom threads, against a real
//! subscription shell. The broker services' wake protocol has its models in `services`
//! (`loom_models/services.rs`); the durable feeder's wake/step protocol on these loops is
//! modelled in `durable::loom_models`, the scheduler's timer in `crate::scheduler`.

use std::sync::Arc;

use crate::clock::SystemClock;
use crate::handler::HandlerError;
use crate::options::SubscribeOptions;
use crate::subscription::core::Refusal;
use crate::subscription::loom_models::{Tally, check, counting, message, messages, number, shell};
use crate::subscription::shell::{Step, SubscriptionShell, Wake};
use crate::sync::{AtomicBool, Mutex, Ordering, thread};

use super::pool::{Shared, worker_loop};
use super::thread::{Parking, dispatch_loop};

mod services;

/// Two pool workers, started on loom threads.
fn pool_workers(pool: &Arc<Shared>) -> Vec<thread::JoinHandle<()>> {
    (0..2)
        .map(|_| {
            let pool = pool.clone();
            thread::spawn(move || worker_loop(&pool))
        })
        .collect()
}

/// Close the subscription, wait for its slots to stop, stop and join the workers (the
/// pool's close protocol).
fn close_pool(pool: &Arc<Shared>, sub: &SubscriptionShell, workers: Vec<thread::JoinHandle<()>>) {
    sub.close();
    assert!(pool.live_slots.wait_at_most(0, None), "every slot stopped");
    pool.stop();
    for w in workers {
        w.join().expect("a pool worker returns");
    }
}

/// The pool's mailbox flag loses no wake-up (R-EXE-1): a publisher offering while a worker
/// takes the slot idle always gets every message delivered.
///
/// Guards against: clearing the slot's `scheduled` flag after releasing the subscription's
/// lock — an offer in between sees the flag still set, queues nothing, and the message
/// waits for ever.
#[test]
fn pool_mailbox_loses_no_wakeup() {
    check(|| {
        let n = messages();
        let (sub, delivered) = counting();
        let pool = Shared::new(Arc::new(SystemClock));
        pool.attach(&sub);
        let workers = pool_workers(&pool);
        for i in 0..n {
            sub.offer(&message(i)).expect("accepted");
        }
        assert_eq!(delivered.wait_for(n), (0..n).collect::<Vec<_>>());
        close_pool(&pool, &sub, workers);
    });
}

/// Never two pool workers inside one dispatcher slot (max active == 1 per slot, R-CORE-3):
/// a wake of every slot (what a clock jump does) racing a publisher's offers queues a
/// running slot no second time — checked by the mailbox's occupancy assertion in every
/// worker — and everything is delivered in order.
///
/// Guards against: queueing a slot on every wake instead of only on the wake that set its
/// `scheduled` flag.
#[test]
fn pool_runs_a_slot_on_one_worker_at_a_time() {
    check(|| {
        let n = messages();
        let (sub, delivered) = counting();
        let pool = Shared::new(Arc::new(SystemClock));
        pool.attach(&sub);
        let workers = pool_workers(&pool);
        let clock_jump = {
            let sub = sub.clone();
            thread::spawn(move || sub.wake_all())
        };
        for i in 0..n {
            sub.offer(&message(i)).expect("accepted");
        }
        clock_jump.join().expect("the wake returns");
        assert_eq!(delivered.wait_for(n), (0..n).collect::<Vec<_>>());
        close_pool(&pool, &sub, workers);
    });
}

/// The thread driver's park/wake handshake (R-EXE-1): the dispatcher marks its slot idle
/// and parks under one lock; a publisher that finds the slot idle wakes it. Every message
/// is delivered, and close stops the dispatcher.
///
/// Guards against: a dispatcher that releases the lock between deciding it is idle and
/// parking — a wake-up in that gap is lost.
#[test]
fn thread_dispatcher_is_woken_by_every_offer() {
    check(|| {
        let n = messages();
        let (sub, delivered) = counting();
        let parking = Arc::new(Parking::new(1));
        sub.set_waker(parking.clone());
        let dispatcher = {
            let sub = sub.clone();
            thread::spawn(move || dispatch_loop(&sub, &parking, 0))
        };
        for i in 0..n {
            sub.offer(&message(i)).expect("accepted");
        }
        assert_eq!(delivered.wait_for(n), (0..n).collect::<Vec<_>>());
        sub.close();
        dispatcher.join().expect("the dispatcher stops at close");
    });
}

/// `close()` racing a publisher and a running dispatcher (R-CORE-6, R-DEL-6): every
/// message ends exactly once — delivered, refused `Closed`, or abandoned and reported by
/// close — and the dispatcher stops.
///
/// Guards against: close not waking an idle dispatcher (it never sees `Stopped`).
#[test]
fn close_racing_publish_accounts_for_every_message() {
    check(|| {
        let n = messages();
        let (sub, delivered) = counting();
        let parking = Arc::new(Parking::new(1));
        sub.set_waker(parking.clone());
        let dispatcher = {
            let sub = sub.clone();
            thread::spawn(move || dispatch_loop(&sub, &parking, 0))
        };
        let publisher = {
            let sub = sub.clone();
            thread::spawn(move || {
                (0..n)
                    .filter(|&i| sub.offer(&message(i)) == Err(Refusal::Closed))
                    .collect::<Vec<_>>()
            })
        };
        let abandoned: Vec<usize> = sub.close().iter().map(|m| number(m)).collect();
        let refused = publisher.join().expect("the publisher returns");
        dispatcher.join().expect("the dispatcher stops at close");
        let delivered = delivered.wait_for(0);
        let mut all: Vec<usize> = [delivered, abandoned, refused].concat();
        all.sort_unstable();
        assert_eq!(
            all,
            (0..n).collect::<Vec<_>>(),
            "each message ends exactly once"
        );
        let stats = sub.stats();
        assert_eq!((stats.queued, stats.in_flight), (0, 0));
        assert_eq!(
            stats.accepted,
            stats.delivered + stats.dead_lettered.shutdown,
            "R-DEL-6"
        );
    });
}

/// The finished hook of a durable subscription (the feeder's finished → commit path):
/// every message that finishes — delivered or dead-lettered — is reported exactly once,
/// and promptly (the model waits for the reports before closing).
///
/// Guards against: a dispatcher that parks with finished messages still in the ledger
/// (they are reported only by some later operation, if ever: the commit stalls).
#[test]
fn finished_hook_reports_each_message_once() {
    check(|| {
        let n = messages();
        let finished = Arc::new(Tally::default());
        let sub = shell(&SubscribeOptions::default(), |m| {
            if number(m) % 2 == 0 {
                Ok(())
            } else {
                Err(HandlerError::reject("odd"))
            }
        });
        {
            let finished = finished.clone();
            sub.set_on_finished(
                Arc::new(move |items| {
                    for f in items {
                        finished.add(number(&f.message));
                    }
                }),
                None,
            );
        }
        let parking = Arc::new(Parking::new(1));
        sub.set_waker(parking.clone());
        let dispatcher = {
            let sub = sub.clone();
            thread::spawn(move || dispatch_loop(&sub, &parking, 0))
        };
        for i in 0..n {
            sub.offer(&message(i)).expect("accepted");
        }
        assert_eq!(finished.wait_for(n), (0..n).collect::<Vec<_>>());
        sub.close();
        dispatcher.join().expect("the dispatcher stops at close");
        assert_eq!(finished.len(), n, "nothing reported twice");
    });
}

/// The tokio driver's slot protocol, with a loom thread for each spawned task: the wake
/// that sets a slot's `scheduled` flag spawns its task; the task delivers, then polls
/// announcing the slot idle and leaves it under the same lock hold ([`RunFlags::leave`](crate::subscription::run_flags::RunFlags::leave)).
struct Spawner(Mutex<Vec<thread::JoinHandle<()>>>);

impl Wake for Spawner {
    fn wake(&self, sub: &SubscriptionShell, worker: usize) {
        let flags = sub.run_flags(worker).expect("a slot");
        if flags.scheduled.swap(true, Ordering::AcqRel) {
            return; // its task polls again
        }
        let Some(sub) = sub.weak().upgrade() else {
            return;
        };
        self.0
            .lock()
            .push(thread::spawn(move || slot_task(&sub, worker)));
    }
    fn wake_all(&self, sub: &SubscriptionShell) {
        for w in 0..sub.workers() {
            self.wake(sub, w);
        }
    }
}

/// The body of `driver::tokio::run_slot` for a sync handler, without its grace: the quiet
/// polls before the announcing one change no flag a waker reads, and a yield among them
/// would spend the preemption that reaching the racy window needs.
fn slot_task(sub: &SubscriptionShell, worker: usize) {
    let flags = sub.run_flags(worker).expect("a slot");
    assert!(
        !flags.running.swap(true, Ordering::AcqRel),
        "two tasks inside one dispatcher slot"
    );
    loop {
        let mut locked = sub.lock();
        match locked.step(worker, true) {
            Step::Delivered => {}
            Step::Idle => {
                flags.leave();
                return;
            }
            Step::Stopped => {
                flags.running.store(false, Ordering::Release);
                return;
            }
            Step::WakeAt(_) => unreachable!("no retries in this model"),
        }
    }
}

/// The tokio driver's slot task loses no wake-up and never runs twice at once (R-EXE-1):
/// a message offered while the slot's task is on its way out (announcing poll, leaving) is
/// delivered, by that task or a new one, and no second task is spawned inside
/// the slot meanwhile (checked by each task's `running` assertion).
///
/// Guards against: clearing `scheduled` after releasing the subscription's lock — an offer
/// in between sees the flag still set, spawns nothing, and the message waits for ever
/// (loom reports the deadlock).
#[test]
fn tokio_slot_task_loses_no_wakeup() {
    check(|| {
        let (sub, delivered) = counting();
        let spawner = Arc::new(Spawner(Mutex::new(Vec::new())));
        sub.set_waker(spawner.clone());
        sub.wake_all(); // the driver's `start`: each slot runs once and goes idle
        // Loom's five threads: this one and at most three tasks (`start`'s, the offer's,
        // the close's), so one message.
        sub.offer(&message(0)).expect("accepted");
        assert_eq!(delivered.wait_for(1), vec![0]);
        sub.close();
        loop {
            let Some(task) = spawner.0.lock().pop() else {
                break;
            };
            task.join().expect("a slot task ends");
        }
    });
}

/// A waker that records it was woken (a slot task's waker, to the model).
struct Recorded(AtomicBool);

impl std::task::Wake for Recorded {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
}

/// A slot task that goes to sleep until a wake-up (the tokio driver's wait for a retry's
/// due time) loses no wake-up: when a waker makes a change and wakes the slot while the
/// task, having seen no change, goes to sleep, either the task's sleep is ready at once
/// and the change is visible to it, or the task's waker is woken.
///
/// Guards against: the waker's side skipping the sleeper when the task's registration is
/// not yet visible, or the task going to sleep without checking for a wake-up left after
/// it registered.
#[test]
fn a_sleeping_slot_task_loses_no_wakeup() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    use super::sleepers::Sleepers;
    use crate::subscription::run_flags::RunFlags;

    check(|| {
        let sleepers = Arc::new(Sleepers::default());
        let flags = Arc::new(RunFlags::default());
        let changed = Arc::new(AtomicBool::new(false));
        let key = (1, 0);
        let waker_side = {
            let (sleepers, flags, changed) = (sleepers.clone(), flags.clone(), changed.clone());
            thread::spawn(move || {
                changed.store(true, Ordering::Release);
                sleepers.wake(&flags, key);
            })
        };
        let recorded = Arc::new(Recorded(AtomicBool::new(false)));
        if !changed.load(Ordering::Acquire) {
            let waker = Waker::from(recorded.clone());
            let mut sleep = std::pin::pin!(sleepers.woken(&flags, key));
            match sleep.as_mut().poll(&mut Context::from_waker(&waker)) {
                Poll::Ready(()) => assert!(changed.load(Ordering::Acquire), "woken, sees it"),
                Poll::Pending => {
                    waker_side.join().expect("the waker returns");
                    assert!(
                        recorded.0.load(Ordering::Acquire),
                        "a sleeping task is woken"
                    );
                    return;
                }
            }
        }
        waker_side.join().expect("the waker returns");
    });
}
