//! What every driver runs: a subscription's filter, core, handler and wake-up hooks.
//!
//! Drivers differ only in *who* calls [`SubShared::poll`] / [`SubShared::run`] /
//! [`SubShared::complete`] and *how they wait*; every rule lives in the core.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, OnceLock, Weak};

use crate::broker::BrokerInner;
use crate::clock::{Clock, Now, deadline_after};
use crate::driver::Wake;
use crate::filter::HeaderFilter;
use crate::handler::{Handler, HandlerError, invoke, panic_text};
use crate::message::Message;
use crate::options::{Overflow, Predicate, SubscribeOptions};
use crate::sync::{Condvar, Mutex, MutexGuard, protocol_thread_local, wait_until};
use crate::topic::Pattern;

use super::core::{Core, Delivery, Offered, Poll, Refusal};
use super::handle::SubscriptionId;
use super::ledger::Forwards;

/// What [`SubShared::redrive`] did with the entries it took.
#[derive(Debug, Default)]
pub(crate) struct Redriven {
    /// Ids of every entry taken out of the DLQ to be re-offered.
    pub(crate) taken: Vec<crate::message::MessageId>,
    /// Re-offered and accepted.
    pub(crate) accepted: usize,
    /// Refused for a full queue: dead-lettered again as `Overflow`.
    pub(crate) overflowed: usize,
    /// Refused otherwise (closed): put back in place.
    pub(crate) returned: usize,
}

/// Header naming the reason on messages forwarded to a dead-letter topic.
pub const DLQ_REASON_HEADER: &str = "tidings-dlq-reason";

/// Header names starting with this are tidings' own metadata: a publish that sets one is
/// refused ([`PublishError::ReservedHeader`](crate::PublishError::ReservedHeader)).
pub const RESERVED_HEADER_PREFIX: &str = "tidings-";

protocol_thread_local! {
    /// Set while this thread must never wait in an offer: the scheduler releasing due
    /// messages, and the manual driver delivering (nobody else would make room).
    static NO_WAIT: Cell<bool> = Cell::new(false);
}

/// Run `f` with `Overflow::Block` waits disabled on this thread: a full `Block` queue
/// refuses at once as `Overflow` (R-TIME-2, R-EXE-5).
pub(crate) fn without_waiting<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            NO_WAIT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(NO_WAIT.with(|c| c.replace(true)));
    f()
}

/// The subscriber's code: a plain function/trait object, or (tokio driver) an async one.
pub(crate) enum HandlerKind {
    /// `Fn(&Message) -> Result<(), HandlerError>`, run by any driver.
    Sync(Arc<dyn Handler>),
    /// An [`AsyncHandler`](crate::AsyncHandler): awaited by the tokio driver only (the broker
    /// refuses it at subscribe under any other driver, so [`SubShared::run`] never sees it).
    #[cfg(feature = "tokio")]
    Async(Arc<dyn crate::async_handler::AsyncHandler>),
}

pub(crate) struct SubShared {
    pub(crate) id: SubscriptionId,
    pub(crate) name: String,
    pub(crate) pattern: Pattern,
    pub(crate) core: Mutex<Core>,
    pub(crate) handler: HandlerKind,
    predicate: Option<Predicate>,
    header_filter: Option<HeaderFilter>,
    overflow: Overflow,
    dlq_topic: Option<String>,
    pub(crate) clock: Arc<dyn Clock>,
    waker: OnceLock<Arc<dyn Wake>>,
    /// Publishers blocked under `Overflow::Block` wait here for room.
    space: Condvar,
    broker: Weak<BrokerInner>,
    workers: usize,
    // --- durable streams (src/stream): completion hook, set once; see `set_on_finished`.
    on_finished: OnceLock<FinishedHook>,
    /// What it was configured with, for the snapshot (src/ops/snapshot.rs, R-OPS-1).
    pub(crate) summary: crate::options::OptionsSummary,
}

/// Called (outside the subscription lock) with messages that finished for good.
/// What offering one durable stream message did (see `SubShared::offer_from_stream`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FeedOffer {
    /// Queued (or dead-lettered at once, reported through the completion hook).
    Taken,
    /// The subscription's filter excluded it: nothing to deliver, finished now.
    Filtered,
    /// The queue has no room: nothing was counted; offer it again later.
    Full,
    /// The subscription is closed.
    Closed,
}

pub(crate) type FinishedHook = Arc<dyn Fn(Vec<Finished>) + Send + Sync>;
pub(crate) use super::ledger::Finished;

impl SubShared {
    pub(crate) fn new(
        id: SubscriptionId,
        pattern: Pattern,
        options: &SubscribeOptions,
        handler: HandlerKind,
        clock: Arc<dyn Clock>,
        broker: Weak<BrokerInner>,
    ) -> Self {
        let core = Core::new(options);
        Self {
            id,
            name: options.name.clone().unwrap_or_else(|| id.to_string()),
            pattern,
            workers: core.workers(),
            core: Mutex::new(core),
            handler,
            predicate: options.predicate.clone(),
            header_filter: options.header_filter.clone(),
            overflow: options.overflow,
            dlq_topic: options.dead_letter.topic.clone(),
            clock,
            waker: OnceLock::new(),
            space: Condvar::new(),
            broker,
            on_finished: OnceLock::new(),
            summary: crate::options::OptionsSummary::of(options),
        }
    }

    /// Durable subscriptions: record completions in the ledger and hand them to `hook`
    /// after each operation, outside the lock. Set before the first offer.
    pub(crate) fn set_on_finished(&self, hook: FinishedHook) {
        if self.on_finished.set(hook).is_ok() {
            self.core.lock().ledger_mut().completions = Some(Vec::new());
        }
    }

    /// Number of dispatcher slots (1, lanes, or per-key in-flight limit).
    pub(crate) fn workers(&self) -> usize {
        self.workers
    }

    pub(crate) fn set_waker(&self, waker: Arc<dyn Wake>) {
        let _ = self.waker.set(waker);
    }

    pub(crate) fn now(&self) -> Now<'_> {
        Now::new(self.clock.as_ref())
    }

    /// Offer a message (R-CORE-2: runs filters on the caller's thread, holds only this
    /// subscription's lock, never runs the handler).
    pub(crate) fn offer(&self, message: &Arc<Message>) -> Result<(), Refusal> {
        match self.passes_filter(message) {
            Ok(true) => self.offer_unfiltered(message),
            Ok(false) => {
                self.core.lock().handle_filtered();
                Err(Refusal::Filtered)
            }
            Err(error) => {
                self.dead_letter_filter_panic(message, error);
                Ok(())
            }
        }
    }

    /// R-DEL-1: a message whose predicate panicked is accepted and dead-lettered as
    /// `Rejected` (for a durable subscription the completion hook then finishes its offset).
    pub(crate) fn dead_letter_filter_panic(&self, message: &Arc<Message>, error: String) {
        let mut core = self.core.lock();
        core.handle_filter_panic(message, error, &self.now());
        let forwards = core.take_forwards();
        drop(core);
        self.forward(forwards);
    }

    /// Offer without applying the filter (redrive).
    pub(crate) fn offer_unfiltered(&self, message: &Arc<Message>) -> Result<(), Refusal> {
        let mut core = self.core.lock();
        let may_wait = !NO_WAIT.with(Cell::get);
        let mut outcome = core.handle_offer(message, &self.now(), may_wait);
        if outcome == Offered::Full {
            outcome = self.wait_for_room(&mut core, message);
        }
        let forwards = core.take_forwards();
        drop(core);
        self.forward(forwards);
        match outcome {
            Offered::Accepted(Some(worker)) => {
                self.wake(worker);
                Ok(())
            }
            Offered::Accepted(None) => Ok(()),
            Offered::Refused(r) => Err(r),
            Offered::Full => Err(Refusal::Overflow),
        }
    }

    /// Offer a message read from a durable stream (R-BP-2): filters first (a filtered
    /// message is counted and reported [`FeedOffer::Filtered`]; a panicking predicate
    /// dead-letters it, and the completion hook reports it finished), then — under one lock
    /// with the room check — the offer. A durable message is never refused for overflow:
    /// when the queue is full (in-memory redrives share it) nothing is counted and the
    /// feeder offers it again later.
    pub(crate) fn offer_from_stream(&self, message: &Arc<Message>) -> FeedOffer {
        match self.passes_filter(message) {
            Ok(true) => {}
            Ok(false) => {
                self.core.lock().handle_filtered();
                return FeedOffer::Filtered;
            }
            Err(error) => {
                self.dead_letter_filter_panic(message, error);
                return FeedOffer::Taken;
            }
        }
        let mut core = self.core.lock();
        if core.is_full() {
            return FeedOffer::Full;
        }
        let outcome = core.handle_offer(message, &self.now(), false);
        let forwards = core.take_forwards();
        drop(core);
        self.forward(forwards);
        match outcome {
            Offered::Accepted(Some(worker)) => {
                self.wake(worker);
                FeedOffer::Taken
            }
            Offered::Accepted(None) => FeedOffer::Taken,
            Offered::Refused(Refusal::Closed) => FeedOffer::Closed,
            // Not reached (room was checked under the lock); were it, the core dead-lettered
            // the message and the completion hook finished it durably.
            Offered::Refused(_) | Offered::Full => FeedOffer::Taken,
        }
    }

    /// Re-offer the dead letters `select` picks (R-DEL-4), loss-safe: an entry leaves the
    /// DLQ only when the queue accepted it, or when a full queue dead-lettered it again as
    /// `Overflow` (a new entry at the back); any other refusal (closed) puts it back in
    /// place. One step for `Subscription::redrive` and the admin actions.
    pub(crate) fn redrive(&self, select: impl FnMut(&crate::dlq::DeadLetter) -> bool) -> Redriven {
        let entries = self.core.lock().ledger_mut().dlq.take_where(select);
        let mut done = Redriven::default();
        let mut keep = Vec::new();
        for e in entries {
            done.taken.push(e.message.id());
            match self.offer_unfiltered(&e.message) {
                Ok(()) => done.accepted += 1,
                Err(Refusal::Overflow) => done.overflowed += 1,
                Err(_) => keep.push(e),
            }
        }
        done.returned = keep.len();
        if !keep.is_empty() {
            self.core.lock().ledger_mut().dlq.restore(keep);
        }
        done
    }

    /// Header filter, then predicate. `Err` with the panic text when the user's predicate
    /// panicked (R-DEL-1): the caller dead-letters the message instead of unwinding into
    /// the publisher.
    pub(crate) fn passes_filter(&self, message: &Message) -> Result<bool, String> {
        if !self
            .header_filter
            .as_ref()
            .is_none_or(|f| f.matches(message))
        {
            return Ok(false);
        }
        let Some(p) = &self.predicate else {
            return Ok(true);
        };
        catch_unwind(AssertUnwindSafe(|| p.test(message)))
            .map_err(|payload| format!("predicate panicked: {}", panic_text(payload.as_ref())))
    }

    /// `Overflow::Block`: wait (holding no broker lock, only releasing this subscription's
    /// lock while waiting) until room is made, the timeout passes on the broker's clock, or
    /// the subscription closes.
    fn wait_for_room(&self, core: &mut MutexGuard<'_, Core>, message: &Arc<Message>) -> Offered {
        let Overflow::Block { timeout } = self.overflow else {
            return Offered::Full;
        };
        // A timeout too long to be a deadline (`Duration::MAX`) waits until room is made or
        // the subscription closes (R-LIM-1).
        let deadline = deadline_after(self.now().mono(), timeout);
        core.set_blocked(true);
        let outcome = loop {
            if wait_until(self.clock.as_ref(), &self.space, core, deadline) {
                break core.handle_offer(message, &self.now(), false);
            }
            let now = self.now();
            let in_time = deadline.is_none_or(|d| now.mono() < d);
            match core.handle_offer(message, &now, in_time) {
                Offered::Full => continue,
                other => break other,
            }
        };
        core.set_blocked(false);
        outcome
    }

    /// Next thing for slot `worker`, with this subscription's lock held by the caller.
    pub(crate) fn poll_locked(&self, core: &mut MutexGuard<'_, Core>, worker: usize) -> Poll {
        let poll = core.poll_work(worker, &self.now());
        if core.take_space_freed() {
            self.space.notify_all();
        }
        poll
    }

    /// Lock, poll, unlock.
    pub(crate) fn poll(&self, worker: usize) -> Poll {
        let mut core = self.core.lock();
        let poll = self.poll_locked(&mut core, worker);
        let forwards = core.take_forwards();
        drop(core);
        self.forward(forwards);
        poll
    }

    /// Run the handler for one delivery: no lock held, panics caught (R-CORE-2, R-DEL-1).
    pub(crate) fn run(&self, delivery: &Delivery) -> Result<(), HandlerError> {
        match &self.handler {
            // R-OPS-3 span; R-OPS-2 duration histogram (feature `metrics`), src/ops.
            HandlerKind::Sync(h) => crate::telemetry::trace::in_process_span(
                &delivery.message,
                &self.name,
                delivery.attempt,
                || crate::telemetry::timed(&self.name, || invoke(h.as_ref(), &delivery.message)),
            ),
            // Unreachable: refused at subscribe under non-tokio drivers, and the tokio
            // driver awaits it via `async_handler`. Dead-letter rather than panic.
            #[cfg(feature = "tokio")]
            HandlerKind::Async(_) => Err(HandlerError::reject(
                "async handler run by a sync driver path",
            )),
        }
    }

    /// The async handler, if this subscription has one (tokio driver).
    #[cfg(feature = "tokio")]
    pub(crate) fn async_handler(&self) -> Option<&Arc<dyn crate::async_handler::AsyncHandler>> {
        match &self.handler {
            HandlerKind::Async(h) => Some(h),
            HandlerKind::Sync(_) => None,
        }
    }

    /// Report a delivery's outcome.
    pub(crate) fn complete(&self, delivery: Delivery, outcome: Result<(), HandlerError>) {
        let mut core = self.core.lock();
        core.handle_completion(delivery, outcome, &self.now());
        let forwards = core.take_forwards();
        drop(core);
        self.forward(forwards);
    }

    /// Poll, run and complete one delivery in the caller's thread. False when there was
    /// nothing to deliver now.
    pub(crate) fn step(&self, worker: usize) -> bool {
        match self.poll(worker) {
            Poll::Deliver(d) => {
                let outcome = self.run(&d);
                self.complete(d, outcome);
                true
            }
            Poll::WakeAt(_) | Poll::Idle | Poll::Stopped => false,
        }
    }

    pub(crate) fn wake(&self, worker: usize) {
        if let Some(w) = self.waker.get() {
            w.wake(worker);
        }
    }

    /// Wake every slot and every blocked publisher (close, clock jumps). Takes the lock
    /// first so a waiter between its check and its wait cannot miss the wake-up.
    pub(crate) fn wake_all(&self) {
        drop(self.core.lock());
        self.space.notify_all();
        if let Some(w) = self.waker.get() {
            w.wake_all();
        }
    }

    pub(crate) fn begin_drain(&self, deadline: Option<std::time::Instant>) {
        let mut core = self.core.lock();
        core.begin_drain(deadline, &self.now());
        let forwards = core.take_forwards();
        drop(core);
        self.forward(forwards);
        self.wake_all();
    }

    /// True when nothing is queued or in flight (retry waits count as in flight).
    pub(crate) fn is_idle(&self) -> bool {
        let now = self.clock.now();
        let s = self.core.lock().stats(now);
        s.queued == 0 && s.in_flight == 0
    }

    /// Messages abandoned (dead-lettered as `Shutdown`) since the last `close`/`take`:
    /// handlers that were running at close and then failed retryably.
    pub(crate) fn take_shutdown(&self) -> Vec<Arc<Message>> {
        std::mem::take(&mut self.core.lock().ledger_mut().shutdown)
    }

    /// Close: refuse offers, abandon what is queued. Returns what was abandoned.
    pub(crate) fn close(&self) -> Vec<Arc<Message>> {
        let mut core = self.core.lock();
        let abandoned = core.close(&self.now());
        let forwards = core.take_forwards();
        drop(core);
        self.forward(forwards);
        self.wake_all();
        abandoned
    }

    /// Publish dead letters to the dead-letter topic, if one is configured (R-DEL-4).
    /// Also hands completions to the durable-stream hook, if one is set.
    ///
    /// A forward that fails (the broker is closed — e.g. `Shutdown` dead letters at close —
    /// or a durable stream's append failed) is counted in the subscription's
    /// `dlq_forward_failures`; the entry itself stays in the DLQ.
    pub(crate) fn forward(&self, forwards: Forwards) {
        let Forwards {
            dead: entries,
            finished,
        } = forwards;
        if !finished.is_empty()
            && let Some(hook) = self.on_finished.get()
        {
            hook(finished);
        }
        let (Some(topic), false) = (&self.dlq_topic, entries.is_empty()) else {
            return;
        };
        let broker = self.broker.upgrade();
        let mut failed = 0u64;
        for e in entries {
            // A dead letter of a dead letter is not forwarded again: no loops. Users cannot
            // set the reserved header, so only a forward carries it.
            if e.message.header(DLQ_REASON_HEADER).is_some() {
                continue;
            }
            let sent = broker
                .as_ref()
                .map(|b| b.forward_dead_letter(topic, &e, &self.name));
            if !matches!(sent, Some(Ok(_))) {
                failed += 1;
            }
        }
        if failed > 0 {
            self.core.lock().ledger_mut().forward_failures += failed;
        }
    }
}
