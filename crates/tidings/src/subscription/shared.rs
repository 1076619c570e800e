//! What every driver runs: a subscription's filter, core, handler and wake-up hooks.
//!
//! Drivers differ only in *who* calls [`SubShared::poll`] / [`SubShared::run`] /
//! [`SubShared::complete`] and *how they wait*; every rule lives in the core.

use std::sync::{Arc, OnceLock, Weak};

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::broker::BrokerInner;
use crate::clock::{Clock, Now, wait_until};
use crate::driver::Wake;
use crate::filter::HeaderFilter;
use crate::handler::{Handler, HandlerError, invoke};
use crate::message::{Message, MessageBuilder};
use crate::options::{Overflow, Predicate, SubscribeOptions};
use crate::topic::Pattern;

use super::core::{Core, Delivery, Offered, Poll, Refusal};
use super::handle::SubscriptionId;
use super::ledger::Forwards;

/// Header naming the reason on messages forwarded to a dead-letter topic.
pub const DLQ_REASON_HEADER: &str = "tidings-dlq-reason";

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
    pub(crate) summary: crate::ops::snapshot::OptionsSummary,
}

/// Called (outside the subscription lock) with messages that finished for good.
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
            summary: crate::ops::snapshot::OptionsSummary::of(options),
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
        if !self.passes_filter(message) {
            self.core.lock().handle_filtered();
            return Err(Refusal::Filtered);
        }
        self.offer_unfiltered(message)
    }

    /// Offer without applying the filter (redrive).
    pub(crate) fn offer_unfiltered(&self, message: &Arc<Message>) -> Result<(), Refusal> {
        let mut core = self.core.lock();
        let mut outcome = core.handle_offer(message, &self.now(), true);
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

    fn passes_filter(&self, message: &Message) -> bool {
        self.header_filter
            .as_ref()
            .is_none_or(|f| f.matches(message))
            && self.predicate.as_ref().is_none_or(|p| p.test(message))
    }

    /// `Overflow::Block`: wait (holding no broker lock, only releasing this subscription's
    /// lock while waiting) until room is made, the timeout passes on the broker's clock, or
    /// the subscription closes.
    fn wait_for_room(&self, core: &mut MutexGuard<'_, Core>, message: &Arc<Message>) -> Offered {
        let Overflow::Block { timeout } = self.overflow else {
            return Offered::Full;
        };
        let deadline = self.now().mono() + timeout;
        core.set_blocked(true);
        let outcome = loop {
            if wait_until(self.clock.as_ref(), &self.space, core, Some(deadline)) {
                break core.handle_offer(message, &self.now(), false);
            }
            let now = self.now();
            match core.handle_offer(message, &now, now.mono() < deadline) {
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
            HandlerKind::Sync(h) => crate::ops::trace::in_process_span(
                &delivery.message,
                &self.name,
                delivery.attempt,
                || crate::ops::timed(&self.name, || invoke(h.as_ref(), &delivery.message)),
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

    /// Pool driver: the slot is no longer queued or running (called with the core lock
    /// held, so an offer that follows sees the slot idle and schedules it again).
    pub(crate) fn mailbox_clear(&self, worker: usize) {
        if let Some(w) = self.waker.get() {
            w.unschedule(worker);
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
        let Some(broker) = self.broker.upgrade() else {
            return;
        };
        for e in entries {
            // A dead letter of a dead letter is not forwarded again: no loops.
            if e.message.header(DLQ_REASON_HEADER).is_some() {
                continue;
            }
            let mut b = MessageBuilder::new(topic.clone())
                .payload(e.message.payload().clone())
                .priority(e.message.priority());
            for (k, v) in e.message.headers().iter() {
                b = b.header(k, v);
            }
            if let Some(k) = e.message.key() {
                b = b.key(k);
            }
            b = b
                .header(DLQ_REASON_HEADER, e.reason.to_string())
                .header("tidings-dlq-subscription", self.name.clone())
                .header("tidings-dlq-original-topic", e.message.topic().to_string())
                .header("tidings-dlq-original-id", e.message.id().to_string());
            // Refusals of the forward are counted by the receiving subscriptions.
            let _ = broker.publish_builder(b);
        }
    }
}
