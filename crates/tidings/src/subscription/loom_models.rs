//! Model-checked protocols of the subscription shell (loom; see `crate::sync`).
//!
//! Run with `RUSTFLAGS="--cfg tidings_loom" cargo test -p tidings --lib loom_models
//! --target-dir target/loom` (`.ci/run` does). Each model runs the production shell under
//! every interleaving loom explores within the preemption bound (`LOOM_MAX_PREEMPTIONS`, 2
//! unless set; `TIDINGS_LONG=1` raises it to 3 and the message counts by one). A lost
//! wake-up shows as a deadlock, which loom reports.
//!
//! Each model's doc names the bug it guards against; re-introducing that bug makes it fail.
//!
//! The shared helpers here are used by the drivers', scheduler's and inbox's models too.

use std::sync::Arc;

use crate::dlq::DeadLetterReason;
use crate::handler::HandlerError;
use crate::message::{Message, MessageBuilder};
use crate::options::{Overflow, SubscribeOptions};
use crate::sync::{Condvar, Mutex, thread};

use super::core::Refusal;
use super::shell::SubscriptionShell;

/// True when the longer bounds were asked for (`TIDINGS_LONG=1`).
pub(crate) fn long() -> bool {
    std::env::var_os("TIDINGS_LONG").is_some_and(|v| v == "1")
}

/// Messages a model publishes: 2, or 3 with `TIDINGS_LONG=1`.
pub(crate) fn messages() -> usize {
    if long() { 3 } else { 2 }
}

/// Explore `model` under loom with the preemption bound of the environment
/// (`LOOM_MAX_PREEMPTIONS`), else 2 (3 with `TIDINGS_LONG=1`).
pub(crate) fn check(model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(if long() { 3 } else { 2 });
    }
    builder.check(model);
}

/// A message whose payload is `n` (so a model can tell messages apart).
pub(crate) fn message(n: usize) -> Arc<Message> {
    Arc::new(
        MessageBuilder::new("t")
            .payload(n.to_string())
            .build_detached()
            .expect("a valid message"),
    )
}

/// The number in a [`message`]'s payload.
pub(crate) fn number(m: &Message) -> usize {
    std::str::from_utf8(m.payload())
        .ok()
        .and_then(|s| s.parse().ok())
        .expect("a model message")
}

/// A subscription shell on the system clock, not attached to any broker or driver.
pub(crate) fn shell(
    options: &SubscribeOptions,
    handler: impl Fn(&Message) -> Result<(), HandlerError> + Send + Sync + 'static,
) -> Arc<SubscriptionShell> {
    super::shell::detached(options, handler)
}

/// Events counted by a model, which waits for a count: if a wake-up is lost elsewhere the
/// count never arrives, every thread blocks, and loom reports the deadlock.
#[derive(Default)]
pub(crate) struct Tally {
    seen: Mutex<Vec<usize>>,
    changed: Condvar,
}

impl Tally {
    pub(crate) fn add(&self, n: usize) {
        self.seen.lock().push(n);
        self.changed.notify_all();
    }

    /// Wait until `count` events were counted; returns them, sorted.
    pub(crate) fn wait_for(&self, count: usize) -> Vec<usize> {
        let mut seen = self.seen.lock();
        while seen.len() < count {
            self.changed.wait(&mut seen);
        }
        let mut all = seen.clone();
        all.sort_unstable();
        all
    }

    pub(crate) fn len(&self) -> usize {
        self.seen.lock().len()
    }

    /// The events counted so far, in the order they were counted.
    pub(crate) fn in_order(&self) -> Vec<usize> {
        self.seen.lock().clone()
    }
}

/// `Overflow::Block` without a deadline: loom has no time, so a wait ends only by a
/// wake-up (room, close), which is what these models check.
fn blocking(capacity: usize) -> SubscribeOptions {
    SubscribeOptions::new()
        .capacity(capacity)
        .overflow(Overflow::Block {
            timeout: std::time::Duration::MAX,
        })
}

/// `close()` racing a publisher blocked for room under `Overflow::Block` (R-BP-1,
/// R-CORE-6): the blocked publisher wakes and is refused `Closed`, nothing is left
/// counted as blocked, and every message is accounted for.
///
/// Guards against: close not waking the publishers waiting for room (a lost wake-up).
#[test]
fn close_wakes_a_publisher_blocked_for_room() {
    check(|| {
        let sub = shell(&blocking(1), |_| Ok(()));
        // No dispatcher: the queue stays full until close.
        let publisher = {
            let sub = sub.clone();
            thread::spawn(move || {
                let first = sub.offer(&message(0));
                let second = sub.offer(&message(1));
                (first, second)
            })
        };
        let abandoned = sub.close();
        let (first, second) = publisher.join().expect("the publisher returns");
        assert_eq!(second, Err(Refusal::Closed), "the second offer cannot fit");
        let stats = sub.stats();
        assert_eq!(stats.blocked_publishers, 0);
        assert_eq!(stats.offered, 2);
        match first {
            // Accepted before close: abandoned by it.
            Ok(()) => assert_eq!(abandoned.len(), 1),
            Err(r) => {
                assert_eq!(r, Refusal::Closed);
                assert!(abandoned.is_empty());
            }
        }
        assert_eq!(stats.accepted, stats.dead_lettered.shutdown);
        assert_eq!(stats.accepted + stats.refused.closed, 2);
    });
}

/// A publisher blocked for room under `Overflow::Block` is woken when a dispatcher frees
/// room (R-BP-1): every message is delivered, none is refused.
///
/// Guards against: the dispatcher taking a message without waking the blocked publisher
/// (a lost wake-up: the publisher waits for ever with room in the queue).
#[test]
fn freed_room_wakes_a_blocked_publisher() {
    check(|| {
        let n = messages();
        let delivered = Arc::new(Tally::default());
        let sub = {
            let delivered = delivered.clone();
            shell(&blocking(1), move |m| {
                delivered.add(number(m));
                Ok(())
            })
        };
        let publisher = {
            let sub = sub.clone();
            thread::spawn(move || {
                for i in 0..n {
                    assert_eq!(sub.offer(&message(i)), Ok(()), "Block never refuses here");
                }
            })
        };
        // This thread is the dispatcher: deliver until everything arrived.
        while delivered.len() < n {
            if !sub.step(0) {
                thread::yield_now();
            }
        }
        publisher.join().expect("the publisher returns");
        assert_eq!(delivered.wait_for(n), (0..n).collect::<Vec<_>>());
        let stats = sub.stats();
        assert_eq!((stats.delivered, stats.blocked_publishers), (n as u64, 0));
    });
}

/// A redrive racing `close()` is loss-safe (R-DEL-4): the dead letter ends either back in
/// the DLQ or accepted again (and then abandoned by close, as `Shutdown`); never lost,
/// never twice.
///
/// Guards against: an entry taken out of the DLQ and refused `Closed` not being put back.
#[test]
fn redrive_racing_close_loses_no_dead_letter() {
    check(|| {
        let options = SubscribeOptions::new()
            .dead_letter(crate::options::DeadLetterOptions::new().keep_shutdown(false));
        let sub = shell(&options, |_| Err(HandlerError::reject("no")));
        sub.offer(&message(7)).expect("accepted");
        assert!(sub.step(0), "delivered once and rejected");
        let redrive = {
            let sub = sub.clone();
            thread::spawn(move || sub.redrive(|_| true))
        };
        let abandoned = sub.close();
        let done = redrive.join().expect("the redrive returns");
        let in_dlq = sub.dead_letters();
        let reported = in_dlq.len() + abandoned.len();
        assert_eq!(
            reported, 1,
            "the dead letter is in the DLQ or in the close report"
        );
        assert_eq!(done.taken.len(), 1);
        assert_eq!(done.accepted + done.returned, 1);
        if done.returned == 1 {
            assert!(matches!(
                in_dlq[0].reason,
                DeadLetterReason::Rejected { .. }
            ));
        }
    });
}

/// A redrive racing a delivery that dead-letters another message (R-DEL-4): each message
/// ends in the DLQ exactly once (the handler rejects everything), whatever the order.
///
/// Guards against: a redrive that re-offers first and removes the redriven entries from
/// the DLQ afterwards (by id), which also removes the entry a concurrent delivery of the
/// same message just added.
#[test]
fn redrive_racing_delivery_keeps_each_dead_letter_once() {
    check(|| {
        let sub = shell(&SubscribeOptions::default(), |_| {
            Err(HandlerError::reject("no"))
        });
        sub.offer(&message(0)).expect("accepted");
        assert!(sub.step(0), "message 0 dead-lettered");
        sub.offer(&message(1)).expect("accepted");
        let dispatcher = {
            let sub = sub.clone();
            // Deliver what is there now and what the redrive adds.
            thread::spawn(move || while sub.step(0) {})
        };
        let done = sub.redrive(|e| number(&e.message) == 0);
        dispatcher.join().expect("the dispatcher returns");
        while sub.step(0) {}
        let mut in_dlq: Vec<usize> = sub
            .dead_letters()
            .iter()
            .map(|e| number(&e.message))
            .collect();
        in_dlq.sort_unstable();
        assert_eq!(done.accepted, 1);
        assert_eq!(in_dlq, vec![0, 1], "each message dead-lettered once");
    });
}

/// A dispatcher thread stepping `sub`'s slot 0 until a step finds nothing to do.
fn stepping(sub: &Arc<SubscriptionShell>) -> thread::JoinHandle<()> {
    let sub = sub.clone();
    thread::spawn(move || while sub.step(0) {})
}

/// A serial subscription (default options) whose handler records each message it runs.
pub(crate) fn counting() -> (Arc<SubscriptionShell>, Arc<Tally>) {
    let delivered = Arc::new(Tally::default());
    let sub = {
        let delivered = delivered.clone();
        shell(&SubscribeOptions::default(), move |m| {
            delivered.add(number(m));
            Ok(())
        })
    };
    (sub, delivered)
}

/// Messages a batch model queues before its dispatcher runs: the one its poll starts and
/// the held ones after it (3, or 4 with `TIDINGS_LONG=1`).
fn batch_messages() -> usize {
    messages() + 1
}

/// A serial subscription whose handler counts each message it starts, with `n` messages
/// queued: the dispatcher's first step starts one and holds the others as its batch.
fn batched(n: usize) -> (Arc<SubscriptionShell>, Arc<Tally>) {
    let (sub, started) = counting();
    for i in 0..n {
        sub.offer(&message(i)).expect("room");
    }
    (sub, started)
}

/// `close()` racing a dispatcher in the middle of its batch (R-CORE-6, R-DEL-6): every
/// message is either delivered or abandoned by close, never both and never neither, in
/// order; nothing held for the batch starts after close took it back, and the counters
/// add up.
///
/// Guards against: a batch whose held messages close does not take back (they would run
/// after close, or be reported abandoned and delivered too), and a settle that loses or
/// double-counts a delivered one.
#[test]
fn close_racing_a_batch_delivers_or_abandons_each_message_once() {
    check(|| {
        let n = batch_messages();
        let (sub, started) = batched(n);
        let dispatcher = stepping(&sub);
        let abandoned: Vec<usize> = sub.close().iter().map(|m| number(m)).collect();
        // At most the one delivery started before close took the batch back starts late.
        let late = started.len();
        dispatcher.join().expect("the dispatcher returns");
        let delivered = started.in_order();
        assert!(
            delivered.len() <= late + 1,
            "nothing starts after close but the one started"
        );
        let all: Vec<usize> = delivered.iter().chain(&abandoned).copied().collect();
        assert_eq!(all, (0..n).collect::<Vec<_>>(), "in order, each once");
        let stats = sub.stats();
        assert_eq!(stats.delivered, delivered.len() as u64);
        assert_eq!(stats.dead_lettered.shutdown, abandoned.len() as u64);
        assert_eq!((stats.queued, stats.in_flight), (0, 0));
        assert_eq!(stats.attempts, delivered.len() as u64);
    });
}

/// A high-priority offer and a stats read racing a dispatcher's batch (R-ORD-1, R-DEL-6,
/// R-BP-3): the high-priority message overtakes every message not started when it was
/// accepted, exactly as without batches, and the counters read meanwhile are exact — at
/// most the one running message in flight, everything else queued or delivered.
///
/// Guards against: held messages that keep their place against a later higher-priority
/// message, and counters that show a batch's held messages in flight.
#[test]
fn a_priority_offer_and_stats_racing_a_batch_see_it_as_unbatched() {
    check(|| {
        let n = batch_messages();
        let (sub, started) = batched(n);
        let dispatcher = stepping(&sub);
        let high = Arc::new(
            MessageBuilder::new("t")
                .payload(n.to_string())
                .priority(crate::message::Priority::High)
                .build_detached()
                .expect("a valid message"),
        );
        sub.offer(&high).expect("room");
        let before = started.len();
        let stats = sub.stats();
        assert!(
            stats.in_flight <= 1,
            "one message in flight at most: {stats:?}"
        );
        assert_eq!(
            stats.accepted,
            stats.delivered + stats.queued + stats.in_flight
        );
        dispatcher.join().expect("the dispatcher returns");
        while sub.step(0) {}
        let order = started.in_order();
        assert_eq!(order.len(), n + 1);
        let at = order.iter().position(|&m| m == n).expect("delivered");
        // Started by then, plus at most the one whose start was under way.
        assert!(
            at <= before + 1,
            "the high-priority message waited: {order:?}"
        );
        let normal: Vec<usize> = order.iter().copied().filter(|&m| m != n).collect();
        assert_eq!(normal, (0..n).collect::<Vec<_>>());
        assert_eq!(sub.stats().delivered, n as u64 + 1);
    });
}

/// Wakes a [`park_loop`] dispatcher: one condition variable, as the thread driver's; and
/// counts the dispatcher's waits.
#[derive(Default)]
struct Bell(Condvar, Tally);

impl super::shell::Wake for Bell {
    fn wake(&self, _: &SubscriptionShell, _: usize) {
        self.0.notify_all();
    }
    fn wake_all(&self, _: &SubscriptionShell) {
        self.0.notify_all();
    }
}

/// A dispatcher that announces every idle poll and parks until a wake (the thread
/// driver's loop without its spin): a lost wake-up leaves it parked with work queued.
fn park_loop(sub: &SubscriptionShell, bell: &Bell) {
    let mut locked = sub.lock();
    loop {
        match locked.step(0, true) {
            super::shell::Step::Delivered => {}
            super::shell::Step::Stopped => return,
            super::shell::Step::Idle | super::shell::Step::WakeAt(_) => {
                bell.1.add(0);
                locked.park(&bell.0, None);
            }
        }
    }
}

/// A serial subscription with a parking dispatcher on its own thread, whose handler
/// records each message it runs, and whose ingress already has room reserved (one message,
/// `primer`, went through the core and was delivered): later offers take the fast path.
/// Returns once the dispatcher found nothing to do and waits (so the models spend no
/// preemption on getting it there first).
fn with_dispatcher(primer: usize) -> (Arc<SubscriptionShell>, Arc<Tally>, thread::JoinHandle<()>) {
    let (sub, delivered) = counting();
    sub.offer(&message(primer)).expect("room");
    assert!(sub.step(0), "the primer is delivered");
    let bell = Arc::new(Bell::default());
    sub.set_waker(bell.clone());
    let dispatcher = {
        let sub = sub.clone();
        let bell = bell.clone();
        thread::spawn(move || park_loop(&sub, &bell))
    };
    bell.1.wait_for(1);
    (sub, delivered, dispatcher)
}

/// Fast offers (`super::ingress`) from two publishers racing a dispatcher that moves the
/// ingress in, goes idle and parks (R-EXE-1, R-ORD-1, R-DEL-6): every message is
/// delivered exactly once, each publisher's in its offer order, and the counters book
/// each once.
///
/// Guards against: a dispatcher that looks at the ingress and announces idle in two steps
/// — a fast offer between them sees no flag and wakes nobody, and its message waits for
/// ever (a deadlock here, at the default bound); a move that loses, repeats or reorders
/// an offer. (A lock-free ingress was tried against it — BENCHMARKS.md, issue 36 — where
/// the same deadlock is an idle check that misses a slot taken but not yet filled; that
/// window takes `LOOM_MAX_PREEMPTIONS=3`.)
#[test]
fn fast_offers_racing_the_dispatcher_are_delivered_once_in_order_and_wake_it() {
    check(|| {
        // Publisher 1 offers `messages()`, publisher 2 one fewer: three (four) in all.
        let counts = [messages(), messages() - 1];
        let (sub, delivered, dispatcher) = with_dispatcher(1000);
        let offer = move |sub: &SubscriptionShell, p: usize| {
            for i in 0..counts[p - 1] {
                sub.offer(&message(p * 100 + i)).expect("room");
            }
        };
        let publisher = {
            let sub = sub.clone();
            thread::spawn(move || offer(&sub, 1))
        };
        // This thread is publisher 2.
        offer(&sub, 2);
        publisher.join().expect("a publisher returns");
        let n = counts[0] + counts[1];
        let all = delivered.wait_for(n + 1);
        let sent = |p: usize| (0..counts[p - 1]).map(move |i| p * 100 + i);
        let expected: Vec<usize> = sent(1).chain(sent(2)).chain([1000]).collect();
        assert_eq!(all, expected, "each message delivered once");
        let order = delivered.in_order();
        for p in 1..=2 {
            let mine: Vec<usize> = order.iter().copied().filter(|m| m / 100 == p).collect();
            assert_eq!(mine, sent(p).collect::<Vec<_>>(), "publisher {p}'s order");
        }
        // The last handler may still be returning: read the counters once it stopped.
        assert!(sub.close().is_empty(), "nothing left to abandon");
        dispatcher.join().expect("the dispatcher stops at close");
        let stats = sub.stats();
        let total = n as u64 + 1;
        assert_eq!((stats.offered, stats.accepted), (total, total));
        assert_eq!(
            (stats.delivered, stats.queued, stats.in_flight),
            (total, 0, 0)
        );
    });
}

/// `close()` racing fast offers and a running dispatcher (R-CORE-6, R-DEL-6): each
/// message ends exactly once — delivered, abandoned and reported by close, or refused
/// `Closed` — in the publisher's order among those accepted, and the counters add up.
///
/// Guards against: a close that stops fast offers without first moving in what the
/// ingress took (each offer returned `Ok`; the message is neither delivered nor
/// abandoned), or that leaves room reserved so an offer lands after it; for a lock-free
/// ingress, a close that does not wait for an offer that took its slot but has not filled
/// it yet.
#[test]
fn close_racing_fast_offers_loses_and_double_counts_nothing() {
    check(|| {
        let n = messages();
        let (sub, delivered, dispatcher) = with_dispatcher(1000);
        let publisher = {
            let sub = sub.clone();
            thread::spawn(move || {
                (0..n)
                    .filter(|&i| match sub.offer(&message(i)) {
                        Ok(()) => false,
                        Err(r) => {
                            assert_eq!(r, Refusal::Closed);
                            true
                        }
                    })
                    .collect::<Vec<_>>()
            })
        };
        let abandoned: Vec<usize> = sub.close().iter().map(|m| number(m)).collect();
        let refused = publisher.join().expect("the publisher returns");
        dispatcher.join().expect("the dispatcher stops at close");
        let delivered: Vec<usize> = delivered
            .in_order()
            .into_iter()
            .filter(|&m| m != 1000)
            .collect();
        let accepted: Vec<usize> = delivered.iter().chain(&abandoned).copied().collect();
        let expected: Vec<usize> = (0..n).filter(|i| !refused.contains(i)).collect();
        assert_eq!(accepted, expected, "accepted ones in order, each once");
        let stats = sub.stats();
        assert_eq!(stats.offered, n as u64 + 1);
        assert_eq!(stats.refused.closed, refused.len() as u64);
        assert_eq!(stats.delivered, delivered.len() as u64 + 1);
        assert_eq!(stats.dead_lettered.shutdown, abandoned.len() as u64);
        assert_eq!(
            stats.accepted,
            stats.delivered + stats.dead_lettered.shutdown
        );
        assert_eq!((stats.queued, stats.in_flight), (0, 0));
    });
}
