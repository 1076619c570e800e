//! The sans-IO subscription state machine.
//!
//! [`Core`] does no I/O, spawns nothing and never sleeps. A driver owns it behind a mutex
//! and calls, in this order per delivery:
//!
//! 1. [`Core::handle_offer`] from publishers (any thread) — filter already applied;
//! 2. [`Core::poll_work`] from a dispatcher slot (`worker`) — returns a [`Delivery`], a
//!    wake-up time, `Idle` or `Stopped`;
//! 3. the driver runs the handler **with the lock released**;
//! 4. [`Core::handle_completion`] with the outcome.
//!
//! Each of these (and `close`, `begin_drain`, `handle_filter_panic`) takes `now` and
//! returns its [`Effects`] — dead letters to forward, finished messages to report, room
//! made for blocked publishers — which the shell applies with the lock released.
//!
//! Every message that enters ends in exactly one of: delivered, dead-lettered (by reason),
//! or still queued / in flight; every refusal is counted by reason (R-DEL-6).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::clock::{Now, deadline_after};
use crate::dlq::DeadLetterReason;
use crate::handler::{Deferral, HandlerError, panic_text};
use crate::message::Message;
use crate::options::{Concurrency, DeliveryMode, Overflow, Settings};
use crate::queue::Queued;
use crate::rate_limit::StartLog;
use crate::stats::SubscriptionStats;

use super::effects::{Effects, Lists};
use super::lanes::Lanes;
use super::ledger::{Counts, Ledger};
use super::per_key::PerKey;
use super::slots::{BoxedVec, Slots};

/// A message handed to a driver for one handler call.
#[derive(Debug)]
#[must_use = "a delivery must be completed with handle_completion"]
pub(crate) struct Delivery {
    pub(crate) message: Arc<Message>,
    /// 1 for the first attempt.
    pub(crate) attempt: u32,
    pub(crate) worker: usize,
}

/// A message waiting at the head of its lane or key: a failed one for its retry, or a
/// deferred one ([`HandlerError::defer_until`]) until it may start.
#[derive(Debug)]
pub(crate) struct Parked {
    pub(crate) message: Arc<Message>,
    /// Attempts made so far: the next delivery is attempt `attempts + 1`.
    pub(crate) attempts: u32,
    pub(crate) due: Instant,
    /// Deferred by the handler, not failed: a drain keeps it (it was never started) where
    /// it abandons a retry; close abandons both.
    pub(crate) deferred: bool,
}

/// What a dispatch flavor offers next.
pub(crate) enum Take {
    Fresh(Queued),
    Retry(Parked),
    WakeAt(Instant),
    Empty,
}

/// What a dispatcher slot should do next.
#[derive(Debug)]
#[must_use]
pub(crate) enum Poll {
    /// Run the handler on this, then report the outcome.
    Deliver(Delivery),
    /// Nothing to do before this time (a retry is due then).
    WakeAt(Instant),
    /// Nothing to do until an offer wakes this slot.
    Idle,
    /// The subscription is closed (or drained): the slot should exit.
    Stopped,
}

/// The result of an offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum Offered {
    /// Accepted; wake this dispatcher slot if `Some` (it was idle).
    Accepted(Option<usize>),
    /// Refused for this reason (counted).
    Refused(Refusal),
    /// `Block` policy and no room: the publisher should wait for room and try again.
    Full,
}

/// Why an offer was refused (R-CORE-5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refusal {
    /// The subscription's filter did not match.
    Filtered,
    /// The queue was full (R-BP-1).
    Overflow,
    /// The subscription or broker is closed.
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    /// Its deadline, if any, is in the ledger ([`Ledger::drain_deadline`]).
    Draining,
    Closed,
}

enum Flavor {
    Lanes(Lanes),
    /// Boxed: its maps are ~100 bytes, and most subscriptions are serial or laned.
    PerKey(Box<PerKey>),
}

/// The state of one subscription (see the module docs).
///
/// # Memory
/// What never changes after subscribe is one shared [`Settings`]; the ledger beyond the
/// delivery counters is allocated on first use ([`Ledger`]), and the queues on the first
/// message, so an idle subscription's core is 136 bytes (a unit test below keeps it from growing
/// back unnoticed).
pub(crate) struct Core {
    settings: Arc<Settings>,
    flavor: Flavor,
    counts: Counts,
    /// `None` until the first refusal, failure, dead letter, close report or durable
    /// completion hook needs it.
    ledger: Option<Box<Ledger>>,
    queued: usize,
    /// Handler calls running: at most the number of slots (≤ 1024).
    running: u32,
    /// Publishers waiting for room; each is a blocked thread, so far below `u32::MAX`.
    blocked_publishers: u32,
    /// Per slot: found nothing to do, may be claimed by an offer.
    idle: Slots<bool>,
    state: State,
    space_freed: bool,
    /// The buffer the next ingress move swaps in (see `super::ingress`): the one emptied by
    /// the last move, kept so that moving allocates nothing. Boxed, and made by the first
    /// move that finds messages: an idle subscription pays one pointer for it, not three
    /// words.
    ingress_spare: Option<BoxedVec<Queued>>,
}

impl Core {
    pub(crate) fn new(settings: Arc<Settings>) -> Self {
        let workers = settings.concurrency.workers();
        let flavor = match settings.concurrency {
            Concurrency::PerKey { .. } => Flavor::PerKey(Box::default()),
            _ => Flavor::Lanes(Lanes::new(workers)),
        };
        Self {
            settings,
            flavor,
            counts: Counts::default(),
            ledger: None,
            queued: 0,
            running: 0,
            blocked_publishers: 0,
            idle: Slots::new(workers, || false),
            state: State::Open,
            space_freed: false,
            ingress_spare: None,
        }
    }

    /// When a drain gives up (`None`: not draining, or no deadline).
    fn drain_deadline(&self) -> Option<Instant> {
        self.ledger.as_ref().and_then(|l| l.drain_deadline)
    }

    pub(crate) fn workers(&self) -> usize {
        self.idle.len()
    }

    /// An open subscription whose queue is at capacity: an offer now would overflow.
    /// Durable feeders check this under the lock and wait instead (R-BP-2).
    pub(crate) fn is_full(&self) -> bool {
        self.state == State::Open && self.queued >= self.settings.capacity
    }

    /// Count an offer the filter refused (the filter runs outside the lock).
    pub(crate) fn handle_filtered(&mut self) {
        self.counts.offered += 1;
        self.ledger_mut().refused.filtered += 1;
    }

    /// The filter panicked on this message (R-DEL-1): it is accepted and dead-lettered at
    /// once as `Rejected` with the panic text, never having reached the handler.
    pub(crate) fn handle_filter_panic(
        &mut self,
        message: &Arc<Message>,
        error: String,
        now: &Now<'_>,
    ) -> Effects {
        self.counts.offered += 1;
        self.counts.accepted += 1;
        self.ledger_mut().dead_letter(
            message.clone(),
            DeadLetterReason::Rejected { error },
            0,
            now.wall(),
            true,
        );
        self.effects()
    }

    /// Offer a message. With `may_wait` and the `Block` policy, a full queue returns
    /// [`Offered::Full`] without counting anything, so the publisher can wait and retry;
    /// the final attempt passes `may_wait = false` and a full queue is refused.
    pub(crate) fn handle_offer(
        &mut self,
        message: &Arc<Message>,
        now: &Now<'_>,
        may_wait: bool,
    ) -> (Offered, Effects) {
        let offered = self.offer(message, now, may_wait);
        (offered, self.effects())
    }

    fn offer(&mut self, message: &Arc<Message>, now: &Now<'_>, may_wait: bool) -> Offered {
        if self.state != State::Open {
            self.counts.offered += 1;
            self.ledger_mut().refused.closed += 1;
            return Offered::Refused(Refusal::Closed);
        }
        if self.queued >= self.settings.capacity {
            match self.settings.overflow {
                Overflow::Block { .. } if may_wait => return Offered::Full,
                Overflow::Reject | Overflow::Block { .. } => {
                    self.counts.offered += 1;
                    let ledger = self.ledger_mut();
                    ledger.refused.overflow += 1;
                    ledger.dead_letter(
                        message.clone(),
                        DeadLetterReason::Overflow,
                        0,
                        now.wall(),
                        true,
                    );
                    return Offered::Refused(Refusal::Overflow);
                }
                Overflow::DropOldest { keep } => {
                    let victim = match &mut self.flavor {
                        Flavor::Lanes(l) => l.evict_for(message.key()),
                        Flavor::PerKey(p) => p.evict_for(message.key()),
                    };
                    if let Some(v) = victim {
                        self.queued -= 1;
                        self.ledger_mut().dead_letter(
                            v.message,
                            DeadLetterReason::DroppedOldest,
                            0,
                            now.wall(),
                            keep,
                        );
                    }
                }
            }
        }
        self.counts.offered += 1;
        self.counts.accepted += 1;
        self.queued += 1;
        let item = Queued {
            message: message.clone(),
            enqueued: now.stamp(),
        };
        let target = match &mut self.flavor {
            Flavor::Lanes(l) => Some(l.push(item)),
            Flavor::PerKey(p) => {
                p.push(item);
                None
            }
        };
        Offered::Accepted(self.claim_idle(target))
    }

    /// Clear and return the idle flag of `target` (or of any idle slot when `None`).
    fn claim_idle(&mut self, target: Option<usize>) -> Option<usize> {
        let slot = match target {
            Some(w) => self.idle[w].then_some(w),
            None => self.idle.iter().position(|idle| *idle),
        }?;
        self.idle[slot] = false;
        Some(slot)
    }

    /// What dispatcher slot `worker` should do now.
    pub(crate) fn poll_work(&mut self, worker: usize, now: &Now<'_>) -> (Poll, Effects) {
        let poll = self.poll(worker, now);
        (poll, self.effects())
    }

    fn poll(&mut self, worker: usize, now: &Now<'_>) -> Poll {
        loop {
            match self.state {
                State::Closed => return Poll::Stopped,
                State::Draining if self.drain_deadline().is_some_and(|d| now.mono() >= d) => {
                    return Poll::Stopped;
                }
                _ => {}
            }
            if self.running as usize >= self.idle.len() {
                self.idle[worker] = true;
                return Poll::Idle;
            }
            let take = match &mut self.flavor {
                Flavor::Lanes(l) => l.take(worker, now),
                Flavor::PerKey(p) => p.take(now),
            };
            match take {
                Take::Fresh(q) => {
                    self.queued -= 1;
                    // Wake blocked publishers once a quarter of the queue is free, so a
                    // publisher refills in a batch instead of one futex round trip per slot.
                    let capacity = self.settings.capacity;
                    if self.blocked_publishers > 0
                        && capacity - self.queued >= (capacity / 4).max(1)
                    {
                        self.space_freed = true;
                    }
                    self.counts.in_flight += 1;
                    if self.is_expired(&q.message, now) {
                        self.finish_take(worker, &q.message, None);
                        self.counts.finished();
                        self.ledger_mut().dead_letter(
                            q.message,
                            DeadLetterReason::Expired,
                            0,
                            now.wall(),
                            true,
                        );
                        continue;
                    }
                    if self.release_if_gated(worker, &q.message) {
                        continue;
                    }
                    if let Some(due) = self.rate_limited(now) {
                        self.wait_for_room(worker, q.message, 0, true, due);
                        continue;
                    }
                    return self.start(worker, q.message, 1);
                }
                Take::Retry(p) => {
                    // R-TIME-1: expiry is checked before every attempt, retries included.
                    if self.is_expired(&p.message, now) {
                        self.finish_take(worker, &p.message, None);
                        self.counts.finished();
                        self.ledger_mut().dead_letter(
                            p.message,
                            DeadLetterReason::Expired,
                            p.attempts,
                            now.wall(),
                            true,
                        );
                        continue;
                    }
                    if self.release_if_gated(worker, &p.message) {
                        continue;
                    }
                    if let Some(due) = self.rate_limited(now) {
                        self.wait_for_room(worker, p.message, p.attempts, p.deferred, due);
                        continue;
                    }
                    return self.start(worker, p.message, p.attempts + 1);
                }
                Take::WakeAt(t) => {
                    // Per-key: a new offer of another key may be dispatchable before `t`.
                    if matches!(self.flavor, Flavor::PerKey(_)) {
                        self.idle[worker] = true;
                    }
                    // Draining, only a deferral waits: no later than the drain's deadline,
                    // when the slot must stop.
                    return Poll::WakeAt(self.drain_deadline().map_or(t, |d| t.min(d)));
                }
                Take::Empty => {
                    if self.state == State::Draining {
                        return Poll::Stopped;
                    }
                    self.idle[worker] = true;
                    return Poll::Idle;
                }
            }
        }
    }

    /// R-TIME-1: its own expiry or the subscription's default TTL has passed. Reads the
    /// wall clock only when the message can expire.
    fn is_expired(&self, message: &Message, now: &Now<'_>) -> bool {
        let ttl = self.settings.ttl;
        (message.expires_at.is_some() || ttl.is_some()) && message.is_expired(now.wall(), ttl)
    }

    /// Ask the retry policy, containing a panic in a custom one (R-DEL-1): a panicking
    /// policy gives up, with the panic in the dead letter's `last_error`.
    fn decide_retry(
        &self,
        attempt: u32,
        error: &HandlerError,
        message: &Message,
    ) -> Result<Option<Duration>, String> {
        match self.settings.delivery {
            DeliveryMode::AtMostOnce => Ok(None),
            DeliveryMode::AtLeastOnce => catch_unwind(AssertUnwindSafe(|| {
                self.settings.retry.decide(attempt, error, message)
            }))
            .map_err(|payload| {
                format!(
                    "{}; retry policy panicked: {}",
                    error.message(),
                    panic_text(payload.as_ref())
                )
            }),
        }
    }

    /// Ask the cursor's start gate (a keyed group's leases, R-DIST-6) before an attempt:
    /// a message it refuses is *released* — not run, not finished (its cursor delivers it
    /// again where it may start), its key or lane free again — and counted. True when
    /// released.
    fn release_if_gated(&mut self, worker: usize, message: &Arc<Message>) -> bool {
        let refused = self
            .ledger
            .as_ref()
            .and_then(|l| l.completions.as_ref())
            .and_then(|c| c.gate.as_ref())
            .is_some_and(|gate| !gate.admit(message));
        if refused {
            self.finish_take(worker, message, None);
            self.counts.finished();
            self.ledger_mut().released += 1;
        }
        refused
    }

    /// R-PAT-2: record a handler start now in the rate limit's window, or say when the
    /// window has room (`None` without a rate limit, or when the start was recorded).
    fn rate_limited(&mut self, now: &Now<'_>) -> Option<Instant> {
        let limit = self.settings.rate_limit?;
        self.ledger_mut()
            .start_log
            .get_or_insert_with(|| StartLog::new(limit))
            .admit(now.mono())
            .err()
    }

    /// A message the rate limit does not let start yet: parked at the head of its lane or
    /// key until `due`, as a deferral is — not started, so no attempt is counted and the
    /// next delivery is attempt `attempts + 1`. A waiting retry stays a retry (`deferred`
    /// false: a drain abandons it); a fresh message waits as a deferred one.
    fn wait_for_room(
        &mut self,
        worker: usize,
        message: Arc<Message>,
        attempts: u32,
        deferred: bool,
        due: Instant,
    ) {
        let parked = Parked {
            message: message.clone(),
            attempts,
            due,
            deferred,
        };
        self.finish_take(worker, &message, Some(parked));
    }

    fn start(&mut self, worker: usize, message: Arc<Message>, attempt: u32) -> Poll {
        // The slot is busy now, however it was woken (an offer, its timer, a wake-all):
        // an offer must claim a free slot, not this one (R-ORD-4).
        self.idle[worker] = false;
        self.running += 1;
        self.counts.attempts += 1;
        Poll::Deliver(Delivery {
            message,
            attempt,
            worker,
        })
    }

    fn finish_take(&mut self, worker: usize, message: &Arc<Message>, parked: Option<Parked>) {
        match &mut self.flavor {
            Flavor::Lanes(l) => l.finish(worker, parked),
            Flavor::PerKey(p) => p.finish(&message.key, parked),
        }
    }

    /// Start a batch (see `shell::Locked::step`): `first` was just started by a poll of
    /// the one slot of a single-lane subscription; hold up to `out.len()` more messages to
    /// run after it without taking the lock again. Only where no per-start decision is
    /// left to make: open, no rate limit, no default TTL, no start gate or completion hook,
    /// a first attempt, and only messages nothing could overtake
    /// ([`crate::queue::PriorityQueue::hold_plain`]). Each held message is counted started
    /// (in flight, one attempt) now; [`Core::settle_batch`] undoes that for those that never
    /// start. `first` is held too, ahead of them, so it is settled like them. Returns how
    /// many more were held (0: no batch, `first` completes as usual).
    pub(crate) fn hold_batch(
        &mut self,
        first: &Delivery,
        out: &mut [Option<Arc<Message>>],
    ) -> usize {
        if first.attempt != 1
            || self.state != State::Open
            || self.settings.rate_limit.is_some()
            || self.settings.ttl.is_some()
            || self
                .ledger
                .as_ref()
                .is_some_and(|l| l.completions.is_some())
        {
            return 0;
        }
        let Flavor::Lanes(lanes) = &mut self.flavor else {
            return 0;
        };
        let mut held = 0;
        for slot in out.iter_mut() {
            let Some(message) = lanes.hold_plain() else {
                break;
            };
            self.queued -= 1;
            self.counts.in_flight += 1;
            self.counts.attempts += 1;
            *slot = Some(message);
            held += 1;
        }
        if held > 0 {
            lanes.hold_started(first.message.clone());
        }
        held
    }

    /// Messages held for a dispatcher's batch and not yet settled.
    pub(crate) fn held(&self) -> usize {
        match &self.flavor {
            Flavor::Lanes(l) => l.held(),
            Flavor::PerKey(_) => 0,
        }
    }

    /// Settle a batch (the caller holds the lock and took both counts from the batch's
    /// atomics): the last `unstarted` held messages go back to the head of the queue, in
    /// place, as never taken; the first `delivered` are finished as delivered. What stays
    /// held is at most the one message whose handler is running, or whose failure the
    /// dispatcher reports through [`Core::end_batch`].
    pub(crate) fn settle_batch(&mut self, unstarted: usize, delivered: usize) {
        let Flavor::Lanes(lanes) = &mut self.flavor else {
            return;
        };
        for _ in 0..unstarted {
            if lanes.unhold_last() {
                self.queued += 1;
                self.counts.in_flight -= 1;
                self.counts.attempts -= 1;
            }
        }
        for _ in 0..delivered {
            let Some(q) = lanes.release_held() else {
                break;
            };
            self.counts.finished();
            self.counts.delivered += 1;
            if let Some(ledger) = &mut self.ledger {
                ledger.completed(&q.message);
            }
            crate::message_pool::recycle(q.message);
        }
        // As a start does in `poll`: wake blocked publishers once a quarter is free.
        let capacity = self.settings.capacity;
        if self.blocked_publishers > 0 && capacity - self.queued >= (capacity / 4).max(1) {
            self.space_freed = true;
        }
    }

    /// The dispatcher's batch is over and settled: free its slot, reporting the one
    /// message left held — the batch's failed one (`failed`) — through the ordinary
    /// completion (retries parked in place, dead letters counted).
    pub(crate) fn end_batch(
        &mut self,
        worker: usize,
        failed: Option<Result<(), HandlerError>>,
        now: &Now<'_>,
    ) -> Effects {
        let Flavor::Lanes(lanes) = &mut self.flavor else {
            return self.effects();
        };
        match (failed, lanes.release_held()) {
            (Some(outcome), Some(q)) => {
                let delivery = Delivery {
                    message: q.message,
                    attempt: 1,
                    worker,
                };
                self.handle_completion(delivery, outcome, now)
            }
            _ => {
                self.running -= 1;
                lanes.finish(worker, None);
                self.effects()
            }
        }
    }

    /// Report the outcome of a delivery. Retries are parked in place (R-ORD-1).
    pub(crate) fn handle_completion(
        &mut self,
        delivery: Delivery,
        outcome: Result<(), HandlerError>,
        now: &Now<'_>,
    ) -> Effects {
        self.complete(delivery, outcome, now);
        self.effects()
    }

    fn complete(&mut self, delivery: Delivery, outcome: Result<(), HandlerError>, now: &Now<'_>) {
        self.running -= 1;
        let Delivery {
            message,
            attempt,
            worker,
        } = delivery;
        let outcome = match outcome.as_ref().err().and_then(HandlerError::deferral) {
            None => outcome,
            Some(Deferral::Until(due)) => {
                self.defer(worker, message, attempt, due, now);
                return;
            }
            Some(Deferral::For(wait)) => match deadline_after(now.mono(), wait) {
                Some(due) => {
                    self.defer(worker, message, attempt, due, now);
                    return;
                }
                // A wait past the clock's range would park the message (and its lane or
                // key) for good: refuse it as the handler's answer instead (R-LIM-1).
                None => Err(HandlerError::reject(format!(
                    "deferred for {wait:?}, past the clock's range"
                ))),
            },
        };
        let error = match outcome {
            Ok(()) => {
                self.finish_take(worker, &message, None);
                self.counts.finished();
                self.counts.delivered += 1;
                if let Some(ledger) = &mut self.ledger {
                    ledger.completed(&message);
                }
                crate::message_pool::recycle(message);
                return;
            }
            Err(e) => e,
        };
        self.ledger_mut().failures += 1;
        let reason = if !error.is_retryable() {
            DeadLetterReason::Rejected {
                error: error.message().to_owned(),
            }
        } else {
            let retry_in = match self.decide_retry(attempt, &error, &message) {
                Ok(wait) => wait,
                Err(last_error) => {
                    self.finish_take(worker, &message, None);
                    self.counts.finished();
                    let reason = DeadLetterReason::RetriesExhausted {
                        attempts: attempt,
                        last_error,
                    };
                    self.ledger_mut()
                        .dead_letter(message, reason, attempt, now.wall(), true);
                    return;
                }
            };
            // A wait whose deadline is not representable means the retry never happens:
            // give up now (R-LIM-1) rather than park the message forever.
            let due = retry_in.and_then(|wait| deadline_after(now.mono(), wait));
            match due {
                Some(_) if self.state != State::Open => {
                    self.finish_take(worker, &message, None);
                    self.counts.finished();
                    self.ledger_mut().abandon(message, attempt, now.wall());
                    return;
                }
                Some(due) => {
                    let parked = Parked {
                        due,
                        message: message.clone(),
                        attempts: attempt,
                        deferred: false,
                    };
                    self.finish_take(worker, &message, Some(parked));
                    return;
                }
                None => DeadLetterReason::RetriesExhausted {
                    attempts: attempt,
                    last_error: error.message().to_owned(),
                },
            }
        };
        self.finish_take(worker, &message, None);
        self.counts.finished();
        self.ledger_mut()
            .dead_letter(message, reason, attempt, now.wall(), true);
    }

    /// The handler deferred this delivery to `due` ([`HandlerError::defer_until`]): the
    /// call is taken back — neither an attempt nor a failure — and the message waits at the
    /// head of its lane or key to be delivered again with the same attempt number. After
    /// close it is abandoned at once; while draining it waits (see `begin_drain`).
    fn defer(
        &mut self,
        worker: usize,
        message: Arc<Message>,
        attempt: u32,
        due: Instant,
        now: &Now<'_>,
    ) {
        self.counts.attempts -= 1;
        let attempts = attempt - 1;
        if self.state == State::Closed {
            self.finish_take(worker, &message, None);
            self.counts.finished();
            self.ledger_mut().abandon(message, attempts, now.wall());
            return;
        }
        let parked = Parked {
            message: message.clone(),
            attempts,
            due,
            deferred: true,
        };
        self.finish_take(worker, &message, Some(parked));
    }

    /// Stop accepting; deliver what is queued until `deadline`; abandon retries at once.
    /// A deferred message was never started, so it is treated as queued: delivered when it
    /// comes due before the deadline, abandoned at close otherwise.
    pub(crate) fn begin_drain(&mut self, deadline: Option<Instant>, now: &Now<'_>) -> Effects {
        if self.state == State::Open {
            self.state = State::Draining;
            if deadline.is_some() {
                self.ledger_mut().drain_deadline = deadline;
            }
        }
        self.abandon_parked(false, now);
        self.effects()
    }

    /// Close for good: everything still queued or waiting to retry is abandoned (counted
    /// as `Shutdown`). Returns every message abandoned since draining began.
    pub(crate) fn close(&mut self, now: &Now<'_>) -> (Vec<Arc<Message>>, Effects) {
        self.state = State::Closed;
        self.abandon_parked(true, now);
        let queued = match &mut self.flavor {
            Flavor::Lanes(l) => l.drain_queued(),
            Flavor::PerKey(p) => p.drain_queued(),
        };
        for q in queued {
            self.queued -= 1;
            self.counts.in_flight += 1;
            self.counts.finished();
            self.ledger_mut().abandon(q.message, 0, now.wall());
        }
        self.space_freed = true;
        let abandoned = self
            .ledger
            .as_mut()
            .map(|ledger| std::mem::take(&mut ledger.shutdown))
            .unwrap_or_default();
        (abandoned, self.effects())
    }

    /// Abandon the waiting retries, and the deferred messages too when `deferred`.
    fn abandon_parked(&mut self, deferred: bool, now: &Now<'_>) {
        let parked = match &mut self.flavor {
            Flavor::Lanes(l) => l.take_parked(deferred),
            Flavor::PerKey(p) => p.take_parked(deferred),
        };
        for p in parked {
            self.counts.finished();
            self.ledger_mut().abandon(p.message, p.attempts, now.wall());
        }
    }

    /// Earliest time a waiting message is due (a retry or a deferral; while draining, no
    /// later than the drain's deadline), for the manual driver's "jump to next wake-up".
    pub(crate) fn next_wake(&self) -> Option<Instant> {
        let due = match &self.flavor {
            Flavor::Lanes(l) => l.next_wake(),
            Flavor::PerKey(p) => p.next_wake(),
        }?;
        Some(self.drain_deadline().map_or(due, |d| due.min(d)))
    }

    /// A publisher starts or stops waiting for room (`Block`).
    pub(crate) fn set_blocked(&mut self, waiting: bool) {
        if waiting {
            self.blocked_publishers += 1;
        } else {
            self.blocked_publishers -= 1;
        }
    }

    /// The effects of the step that just ran (everything it left for the shell).
    fn effects(&mut self) -> Effects {
        let room = std::mem::take(&mut self.space_freed);
        // The delivery path's common case: no ledger, nothing but the room flag.
        let Some(ledger) = &mut self.ledger else {
            return Effects::only_room(room);
        };
        let (finished, on_finished) = match &mut ledger.completions {
            Some(c) if !c.items.is_empty() => (std::mem::take(&mut c.items), Some(c.hook.clone())),
            _ => (Vec::new(), None),
        };
        Effects::new(
            room,
            Lists {
                forward: std::mem::take(&mut ledger.to_forward),
                finished,
                on_finished,
            },
        )
    }

    /// The empty buffer to swap with the ingress's items (`None` before the first move
    /// that found any); hand it back, filled, to [`Core::accept_ingress`], or unused to
    /// [`Core::keep_ingress_spare`].
    pub(crate) fn take_ingress_spare(&mut self) -> Option<BoxedVec<Queued>> {
        self.ingress_spare.take()
    }

    /// Keep a buffer [`Core::take_ingress_spare`] gave out that was not needed.
    pub(crate) fn keep_ingress_spare(&mut self, spare: Option<BoxedVec<Queued>>) {
        self.ingress_spare = spare;
    }

    /// Book and queue messages the ingress took with room reserved for them (see
    /// `super::ingress`): accepted already, in offer order, so no overflow policy applies.
    /// The emptied buffer is kept for the next move.
    pub(crate) fn accept_ingress(&mut self, mut items: BoxedVec<Queued>) {
        for item in items.drain(..) {
            self.counts.offered += 1;
            self.counts.accepted += 1;
            self.queued += 1;
            match &mut self.flavor {
                Flavor::Lanes(l) => {
                    l.push(item);
                }
                Flavor::PerKey(p) => p.push(item),
            }
        }
        self.ingress_spare = Some(items);
    }

    /// Room the ingress may reserve: what the capacity leaves while open, else none.
    pub(crate) fn ingress_room(&self) -> usize {
        match self.state {
            State::Open => self.settings.capacity.saturating_sub(self.queued),
            _ => 0,
        }
    }

    /// The ingress must be moved in before the next poll: nothing is queued, or something
    /// queued has a lower priority than the default, which the ingress's default-priority
    /// messages would overtake.
    pub(crate) fn wants_ingress(&self) -> bool {
        self.queued == 0
            || match &self.flavor {
                Flavor::Lanes(l) => l.has_below(crate::message::Priority::Normal),
                Flavor::PerKey(_) => true,
            }
    }

    /// Queued messages per priority level, lowest first (R-OPS-1 snapshot).
    pub(crate) fn depth_by_priority(&self) -> [u64; crate::message::Priority::LEVELS] {
        let mut out = [0; crate::message::Priority::LEVELS];
        match &self.flavor {
            Flavor::Lanes(x) => x.depth_by_priority(&mut out),
            Flavor::PerKey(x) => x.depth_by_priority(&mut out),
        }
        out
    }

    /// The ledger beyond the delivery counters (dead-letter queue, close report, durable
    /// completions), allocated by this call if nothing needed them before.
    pub(crate) fn ledger_mut(&mut self) -> &mut Ledger {
        self.ledger
            .get_or_insert_with(|| Box::new(Ledger::new(&self.settings)))
    }

    pub(crate) fn stats(&self, now: SystemTime) -> SubscriptionStats {
        let c = &self.counts;
        let l = self.ledger.as_deref();
        let oldest = match &self.flavor {
            Flavor::Lanes(x) => x.oldest_enqueued(),
            Flavor::PerKey(x) => x.oldest_enqueued(),
        };
        SubscriptionStats {
            offered: c.offered,
            accepted: c.accepted,
            refused: l.map(|l| l.refused).unwrap_or_default(),
            delivered: c.delivered,
            dead_lettered: l.map(|l| l.dead_lettered).unwrap_or_default(),
            queued: self.queued as u64,
            in_flight: c.in_flight,
            attempts: c.attempts,
            failures: l.map_or(0, |l| l.failures),
            released: l.map_or(0, |l| l.released),
            dlq_len: l.map_or(0, |l| l.dlq.len() as u64),
            dlq_evicted: l.map_or(0, |l| l.dlq.evicted()),
            dlq_forward_failures: l.map_or(0, |l| l.forward_failures),
            blocked_publishers: u64::from(self.blocked_publishers),
            oldest_age: oldest.map(|t| t.age_at(now)),
        }
    }
}

#[cfg(all(test, target_pointer_width = "64"))]
mod tests {
    // Every idle subscription holds one core. Growing it is a deliberate choice:
    // update this figure and the `bytes-per-sub` benchmark notes together.
    #[test]
    fn an_idle_core_stays_small() {
        assert_eq!(std::mem::size_of::<super::Core>(), 136);
    }
}
