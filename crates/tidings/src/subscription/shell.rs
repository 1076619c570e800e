//! The subscription shell: what every driver runs — a subscription's filter, its core
//! behind the one lock, its handler, and the hooks that connect it to the rest.
//!
//! Drivers differ only in *who* runs a slot and *how it waits*; every rule lives in the
//! sans-IO core, and the one delivery step ([`Locked::step`]: poll, run the handler with
//! the lock released, report) is shared by all of them. The core's lock is private to this
//! module: a driver holds it only through [`Locked`], which applies every step's
//! [`Effects`] — dead-letter forwards, finished reports, room for blocked publishers —
//! whenever it releases the lock, so none is left behind.
//!
//! # Arrows
//! The shell knows neither the broker nor the drivers: the broker injects a
//! [`DeadLetterSink`] (forwarding to a dead-letter topic), a driver injects its [`Wake`].

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

use crate::clock::{Clock, Now, deadline_after};
use crate::dlq::{DeadLetter, DeadLetterQueue};
use crate::filter::HeaderFilter;
use crate::handler::{Handler, HandlerError, invoke, panic_text};
use crate::message::Message;
use crate::options::{Overflow, Predicate, Settings, SubscribeOptions};
use crate::stats::SubscriptionStats;
use crate::sync::{
    AtomicU8, Condvar, Mutex, MutexGuard, Ordering, protocol_thread_local, wait_until,
};
use crate::telemetry::ProcessMetric;
use crate::topic::Pattern;

use super::core::{Core, Delivery, Offered, Poll, Refusal};
use super::effects::{Effects, FinishedHook, Lists};
use super::handle::SubscriptionId;
use super::ingress::{Ingress, room_for};
use super::ledger::Completions;
use super::run_flags::{OtherRunFlags, RunFlags};
use crate::message::Priority;
use crate::queue::Queued;

/// Most messages a dispatcher delivers per acquisition of the subscription's lock: the one
/// its poll started and up to `BATCH - 1` held with it (see [`Locked::step`]). Fits the
/// batch's `u8` counters.
const BATCH: usize = 16;

/// What [`SubscriptionShell::redrive`] did with the entries it took.
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
    /// refuses it at subscribe under any other driver, so [`SubscriptionShell::run`] never sees it).
    #[cfg(feature = "tokio")]
    Async(Arc<dyn crate::async_handler::AsyncHandler>),
}

/// How a publisher (or a clock jump, or close) wakes an idle dispatcher slot of `sub`. Each
/// driver implements it its own way (a condition variable, the pool's run queue, a tokio
/// task's wake-up). A waker is told which subscription it wakes, so one waker may serve
/// many (the pool's is the pool itself).
pub(crate) trait Wake: Send + Sync {
    /// Slot `worker` of `sub` has work.
    fn wake(&self, sub: &SubscriptionShell, worker: usize);
    /// Every slot of `sub` should re-check its state (close, clock jump).
    fn wake_all(&self, sub: &SubscriptionShell);
}

/// Publishes a dead letter to a dead-letter topic (R-DEL-4): `(topic, entry, subscription
/// name)`, true when published. Injected by the broker, so the shell does not know it.
pub(crate) type DeadLetterSink = Arc<dyn Fn(&str, &DeadLetter, &str) -> bool + Send + Sync>;

/// What every subscription of one broker shares: its clock and where dead letters are
/// forwarded (called only for a subscription with a dead-letter topic). One allocation per
/// broker instead of two fat pointers in every subscription.
pub(crate) struct ShellEnv {
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) dead_letter_sink: DeadLetterSink,
}

/// What offering one durable stream message did (see
/// [`SubscriptionShell::offer_from_stream`]).
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

/// What one delivery step of a dispatcher slot did (see [`Locked::step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// A message was delivered (its outcome reported): step again.
    Delivered,
    /// Nothing to do before this time (a retry is due then), or a wake.
    WakeAt(Instant),
    /// Nothing to do until a wake.
    Idle,
    /// The subscription is closed (or drained): the slot should exit.
    Stopped,
}

/// What a subscription lets through (R-RT-3): the header filter first, then the predicate.
struct Filters {
    header_filter: Option<HeaderFilter>,
    predicate: Option<Predicate>,
}

impl Filters {
    /// `None` when the options filter nothing.
    fn of(options: &SubscribeOptions) -> Option<Box<Self>> {
        let (header_filter, predicate) = (options.header_filter.clone(), options.predicate.clone());
        (header_filter.is_some() || predicate.is_some()).then(|| {
            Box::new(Self {
                header_filter,
                predicate,
            })
        })
    }
}

/// One subscription as every driver runs it (see the module docs).
pub(crate) struct SubscriptionShell {
    pub(crate) id: SubscriptionId,
    pub(crate) name: Box<str>,
    pub(crate) pattern: Pattern,
    /// The sans-IO core; locked only here, and through [`Locked`]. Written by the
    /// dispatcher at every delivery, so it lives in an allocation of its own: publishers
    /// reading the fields of the shell (filters, the ingress) do not miss on each of its
    /// writes. A box, not cache-line padding, which would cost every idle subscription
    /// hundreds of bytes (figures in BENCHMARKS.md, "Measurements behind design choices").
    core: Box<Mutex<Core>>,
    /// Publishers' fast path into a single-dispatcher subscription (see `super::ingress`);
    /// moved into the core under its lock before anything reads or changes it.
    ingress: Ingress,
    pub(crate) handler: HandlerKind,
    /// The header filter and predicate, boxed together: most subscriptions have neither,
    /// and then pay 8 bytes and one check per offer.
    filters: Option<Box<Filters>>,
    /// The broker's clock and dead-letter sink, shared by its subscriptions.
    env: Arc<ShellEnv>,
    waker: OnceLock<Arc<dyn Wake>>,
    /// This subscription, for a driver that queues its slots (the pool's run queue holds
    /// this, not an allocation of its own per subscription).
    me: Weak<SubscriptionShell>,
    /// Offers may take the ingress (see `super::ingress`).
    fast: bool,
    /// Slot 0's run flags (see `super::run_flags`), beside `fast`: no byte of its own.
    first_run_flags: RunFlags,
    /// The dispatcher's batch (see [`Locked::step`]), beside them in what was padding:
    /// held messages it may still start (it takes one before each start; whoever takes
    /// the lock takes the rest, and they go back to the queue) ...
    batch_unstarted: AtomicU8,
    /// ... and held messages it delivered (their handlers returned `Ok`) not yet counted.
    batch_delivered: AtomicU8,
    /// The other slots' run flags.
    other_run_flags: OtherRunFlags,
    /// Publishers blocked under `Overflow::Block` wait here for room.
    space: Condvar,
    /// What never changes after subscribe (overflow policy, dead-letter topic, the options
    /// summary for the snapshot, R-OPS-1): shared with its core and with every
    /// subscription of equal options.
    pub(crate) settings: Arc<Settings>,
    /// Its handler-duration series (R-OPS-2), labels built once; empty without `metrics`.
    pub(crate) process_metric: ProcessMetric,
}

/// A subscription shell on the system clock, attached to no broker or driver, whose dead
/// letters are forwarded nowhere: for the drivers' unit tests and the loom models.
#[cfg(test)]
pub(crate) fn detached(
    options: &SubscribeOptions,
    handler: impl Fn(&Message) -> Result<(), HandlerError> + Send + Sync + 'static,
) -> Arc<SubscriptionShell> {
    detached_with_id(SubscriptionId(1), options, handler)
}

/// [`detached`], with this id.
#[cfg(test)]
pub(crate) fn detached_with_id(
    id: SubscriptionId,
    options: &SubscribeOptions,
    handler: impl Fn(&Message) -> Result<(), HandlerError> + Send + Sync + 'static,
) -> Arc<SubscriptionShell> {
    SubscriptionShell::new(
        id,
        Pattern::new("t").expect("a valid pattern"),
        options,
        HandlerKind::Sync(Arc::new(crate::handler::handler_fn(handler))),
        Arc::new(ShellEnv {
            clock: Arc::new(crate::clock::SystemClock),
            dead_letter_sink: Arc::new(|_: &str, _: &DeadLetter, _: &str| false),
        }),
    )
}

/// The subscription's lock, held by a driver's dispatcher slot. Every core step taken
/// through it adds its [`Effects`]; they are applied whenever the lock is released —
/// [`Locked::unlocked`], [`Locked::park`], or drop — so a driver cannot leave one behind.
pub(crate) struct Locked<'a> {
    shell: &'a SubscriptionShell,
    /// `None` only while the effects are applied in `drop`.
    core: Option<MutexGuard<'a, Core>>,
    effects: Effects,
}

impl<'a> Locked<'a> {
    fn core(&mut self) -> &mut Core {
        // Invariant: `Some` until `drop`.
        self.core.as_mut().expect("held until drop")
    }

    fn guard(&mut self) -> &mut MutexGuard<'a, Core> {
        self.core.as_mut().expect("held until drop")
    }

    /// What slot `worker` should do next (step 2 of the core's call order). With
    /// `announce`, an `Idle` answer also tells fast offers to wake this slot; a driver that
    /// spins before it waits polls without it, so publishers skip the wake meanwhile, and
    /// announces on its last poll before waiting.
    pub(crate) fn poll(&mut self, worker: usize, announce: bool) -> Poll {
        let now = self.shell.now();
        let shell = self.shell;
        shell.settle(self.core());
        loop {
            let shell = self.shell;
            if self.core().wants_ingress() {
                shell.move_ingress_in(self.core(), false);
            }
            let (poll, effects) = self.core().poll_work(worker, &now);
            self.effects.absorb(effects);
            if !matches!(poll, Poll::Idle) || !shell.fast {
                return poll;
            }
            // Idle only if the ingress is empty too; announced under the ingress's lock, so
            // a fast offer either lands before this look or sees the flag.
            let mut ingress = shell.ingress.lock();
            if ingress.items.is_empty() {
                ingress.idle |= announce;
                return poll;
            }
        }
    }

    /// Report a delivery's outcome (step 4).
    pub(crate) fn complete(&mut self, delivery: Delivery, outcome: Result<(), HandlerError>) {
        let now = self.shell.now();
        let effects = self.core().handle_completion(delivery, outcome, &now);
        self.effects.absorb(effects);
    }

    /// The one "deliver one message" step every driver runs: poll slot `worker`
    /// (`announce` as in [`Locked::poll`]); if a message is due, run the handler with the
    /// lock released (applying the effects so far first), take the lock again and report
    /// the outcome — so the report and the next poll share one lock acquisition. Where the
    /// subscription allows it, the step delivers a batch of up to [`BATCH`] messages per
    /// lock acquisition (see below).
    pub(crate) fn step(&mut self, worker: usize, announce: bool) -> Step {
        let mut budget = BATCH;
        self.step_within(worker, announce, &mut budget)
    }

    /// [`Locked::step`], delivering at most `budget` messages (at least one), and taking
    /// the ones delivered off it: a driver that bounds a slot's deliveries per turn (the
    /// pool, for fairness) counts messages, not steps.
    pub(crate) fn step_within(
        &mut self,
        worker: usize,
        announce: bool,
        budget: &mut usize,
    ) -> Step {
        match self.poll(worker, announce) {
            Poll::Deliver(delivery) => {
                let shell = self.shell;
                // N messages per lock: hold more where nothing could overtake them or stop
                // them from starting (see `Core::hold_batch`), and run them after this one
                // with the lock released. Each start first takes one from
                // `batch_unstarted`, and each `Ok` adds one to `batch_delivered`; anyone who
                // takes the lock meanwhile settles the batch (`SubscriptionShell::settle`),
                // so they see the queue, the order and the counters exactly as if each
                // message had been polled on its own, and the dispatcher starts nothing
                // more.
                let mut extras: [Option<Arc<Message>>; BATCH - 1] = Default::default();
                let room = (*budget).clamp(1, BATCH) - 1;
                let held = if shell.fast && room > 0 {
                    self.core().hold_batch(&delivery, &mut extras[..room])
                } else {
                    0
                };
                if held == 0 {
                    *budget = budget.saturating_sub(1);
                    let outcome = self.unlocked(|| shell.run(&delivery));
                    self.complete(delivery, outcome);
                    return Step::Delivered;
                }
                // Under the lock, like every settle: `held` < `BATCH` fits.
                shell.batch_unstarted.store(held as u8, Ordering::Release);
                let worker = delivery.worker;
                let (failed, started) =
                    self.unlocked(|| shell.run_batch(delivery, &mut extras[..held]));
                *budget = budget.saturating_sub(started);
                drop(extras);
                shell.settle(self.core());
                let now = shell.now();
                let effects = self.core().end_batch(worker, failed, &now);
                self.effects.absorb(effects);
                Step::Delivered
            }
            Poll::WakeAt(t) => Step::WakeAt(t),
            Poll::Idle => Step::Idle,
            Poll::Stopped => Step::Stopped,
        }
    }

    /// Run `f` with the lock released, after applying the effects gathered so far.
    pub(crate) fn unlocked<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let effects = std::mem::take(&mut self.effects);
        let shell = self.shell;
        MutexGuard::unlocked(self.guard(), || {
            shell.apply(effects);
            f()
        })
    }

    /// Wait on `cv` (a driver's per-slot condition variable, notified by its [`Wake`])
    /// until woken or until `deadline` on the subscription's clock. The lock is released
    /// only by the wait itself, so a wake after the poll that found the slot idle is not
    /// lost. If the steps so far left effects, they are applied instead of waiting (the
    /// caller polls again): a finished report never waits for the next wake.
    pub(crate) fn park(&mut self, cv: &Condvar, deadline: Option<Instant>) {
        if !self.effects.is_empty() {
            self.unlocked(|| ());
            return;
        }
        let clock = self.shell.env.clock.clone();
        wait_until(clock.as_ref(), cv, self.guard(), deadline);
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        drop(self.core.take());
        let effects = std::mem::take(&mut self.effects);
        if !effects.is_empty() {
            self.shell.apply(effects);
        }
    }
}

impl SubscriptionShell {
    pub(crate) fn new(
        id: SubscriptionId,
        pattern: Pattern,
        options: &SubscribeOptions,
        handler: HandlerKind,
        env: Arc<ShellEnv>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Self::with_self(me.clone(), id, pattern, options, handler, env))
    }

    fn with_self(
        me: Weak<Self>,
        id: SubscriptionId,
        pattern: Pattern,
        options: &SubscribeOptions,
        handler: HandlerKind,
        env: Arc<ShellEnv>,
    ) -> Self {
        let settings = Settings::shared(options);
        let core = Core::new(settings.clone());
        let name: Box<str> = match &options.name {
            Some(name) => name.as_str().into(),
            None => id.to_string().into(),
        };
        let process_metric = ProcessMetric::new(&name);
        // One dispatcher slot, lanes (not per-key) dispatch: the case the ingress serves.
        let fast = core.workers() == 1
            && !matches!(
                options.concurrency,
                crate::options::Concurrency::PerKey { .. }
            );
        let ingress = Ingress::default();
        ingress.lock().open = fast;
        let other_run_flags = OtherRunFlags::new(core.workers());
        Self {
            me,
            first_run_flags: RunFlags::default(),
            batch_unstarted: AtomicU8::new(0),
            batch_delivered: AtomicU8::new(0),
            other_run_flags,
            fast,
            ingress,
            id,
            name,
            process_metric,
            pattern,
            core: Box::new(Mutex::new(core)),
            handler,
            filters: Filters::of(options),
            env,
            waker: OnceLock::new(),
            space: Condvar::new(),
            settings,
        }
    }

    /// Take the subscription's lock for a dispatcher slot (see [`Locked`]).
    pub(crate) fn lock(&self) -> Locked<'_> {
        Locked {
            shell: self,
            core: Some(self.core_locked()),
            effects: Effects::default(),
        }
    }

    /// Durable subscriptions: record completions in the ledger and hand them to `hook`
    /// after each operation, outside the lock; ask `gate` before every handler attempt.
    /// Set before the first offer.
    pub(crate) fn set_on_finished(
        &self,
        hook: FinishedHook,
        gate: Option<Arc<dyn crate::subscription::StartGate>>,
    ) {
        let mut core = self.core_synced();
        let ledger = core.ledger_mut();
        if ledger.completions.is_none() {
            // A durable subscription's offers come from its feeder, one at a time, through
            // the core (which checks room for it): no fast path.
            self.ingress.lock().open = false;
            ledger.completions = Some(Completions {
                items: Vec::new(),
                hook,
                gate,
            });
        }
    }

    /// Number of dispatcher slots (1, lanes, or per-key in-flight limit).
    pub(crate) fn workers(&self) -> usize {
        self.settings.concurrency.workers().max(1)
    }

    pub(crate) fn set_waker(&self, waker: Arc<dyn Wake>) {
        let _ = self.waker.set(waker);
    }

    /// This subscription, while it lives (for a driver's run queue).
    pub(crate) fn weak(&self) -> Weak<Self> {
        self.me.clone()
    }

    /// Slot `worker`'s run flags (see `super::run_flags`); `None`: no such slot.
    pub(crate) fn run_flags(&self, worker: usize) -> Option<&RunFlags> {
        match worker {
            0 => Some(&self.first_run_flags),
            w => self.other_run_flags.get(w),
        }
    }

    /// The broker's clock (the tokio driver asks it how long to wait).
    #[cfg(feature = "tokio")]
    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.env.clock
    }

    pub(crate) fn now(&self) -> Now<'_> {
        Now::new(self.env.clock.as_ref())
    }

    /// Offer a message (R-CORE-2: runs filters on the caller's thread, holds only this
    /// subscription's lock, never runs the handler).
    pub(crate) fn offer(&self, message: &Arc<Message>) -> Result<(), Refusal> {
        self.offer_at(message, &self.now())
    }

    /// [`offer`](Self::offer) at `now`: one publish reads the clock once for all the
    /// subscriptions it reaches.
    pub(crate) fn offer_at(&self, message: &Arc<Message>, now: &Now<'_>) -> Result<(), Refusal> {
        match self.passes_filter(message) {
            Ok(true) => self.offer_unfiltered_at(message, now),
            Ok(false) => {
                self.core_locked().handle_filtered();
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
        let effects = self
            .core
            .lock()
            .handle_filter_panic(message, error, &self.now());
        self.apply(effects);
    }

    /// Offer without applying the filter (redrive).
    pub(crate) fn offer_unfiltered(&self, message: &Arc<Message>) -> Result<(), Refusal> {
        self.offer_unfiltered_at(message, &self.now())
    }

    fn offer_unfiltered_at(&self, message: &Arc<Message>, now: &Now<'_>) -> Result<(), Refusal> {
        if self.fast && message.priority() == Priority::Normal {
            let item = Queued {
                message: message.clone(),
                enqueued: now.stamp(),
            };
            if let Some(wake) = self.ingress.offer(item) {
                if wake {
                    self.wake_from_ingress();
                }
                return Ok(());
            }
        }
        let mut core = self.core_locked();
        // The decision is the core's, with everything offered so far in it and no room
        // reserved for fast offers meanwhile (see `super::ingress`).
        self.move_ingress_in(&mut core, true);
        let may_wait = !NO_WAIT.with(Cell::get);
        let (mut outcome, mut effects) = core.handle_offer(message, now, may_wait);
        if outcome == Offered::Full {
            outcome = self.wait_for_room(&mut core, message, &mut effects);
        }
        self.reserve_ingress_room(&core);
        drop(core);
        self.apply(effects);
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
                self.core_locked().handle_filtered();
                return FeedOffer::Filtered;
            }
            Err(error) => {
                self.dead_letter_filter_panic(message, error);
                return FeedOffer::Taken;
            }
        }
        let mut core = self.core_synced();
        if core.is_full() {
            return FeedOffer::Full;
        }
        let (outcome, effects) = core.handle_offer(message, &self.now(), false);
        drop(core);
        self.apply(effects);
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
    pub(crate) fn redrive(&self, select: impl FnMut(&DeadLetter) -> bool) -> Redriven {
        let entries = self.remove_dead_letters(select);
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
            self.core_locked().ledger_mut().dlq.restore(keep);
        }
        done
    }

    /// Header filter, then predicate. `Err` with the panic text when the user's predicate
    /// panicked (R-DEL-1): the caller dead-letters the message instead of unwinding into
    /// the publisher.
    pub(crate) fn passes_filter(&self, message: &Message) -> Result<bool, String> {
        let Some(filters) = &self.filters else {
            return Ok(true);
        };
        if !filters
            .header_filter
            .as_ref()
            .is_none_or(|f| f.matches(message))
        {
            return Ok(false);
        }
        let Some(p) = &filters.predicate else {
            return Ok(true);
        };
        catch_unwind(AssertUnwindSafe(|| p.test(message)))
            .map_err(|payload| format!("predicate panicked: {}", panic_text(payload.as_ref())))
    }

    /// Whether an offer to a full queue makes the publisher wait (`Overflow::Block`).
    #[cfg(feature = "tokio")]
    pub(crate) fn makes_publishers_wait(&self) -> bool {
        matches!(self.settings.overflow, Overflow::Block { .. })
    }

    /// `Overflow::Block`: wait (holding no broker lock, only releasing this subscription's
    /// lock while waiting) until room is made, the timeout passes on the broker's clock, or
    /// the subscription closes. The offers' effects are gathered into `effects`.
    fn wait_for_room(
        &self,
        core: &mut MutexGuard<'_, Core>,
        message: &Arc<Message>,
        effects: &mut Effects,
    ) -> Offered {
        let Overflow::Block { timeout } = self.settings.overflow else {
            return Offered::Full;
        };
        // A timeout too long to be a deadline (`Duration::MAX`) waits until room is made or
        // the subscription closes (R-LIM-1).
        let deadline = deadline_after(self.now().mono(), timeout);
        core.set_blocked(true);
        let outcome = loop {
            let timed_out = wait_until(self.env.clock.as_ref(), &self.space, core, deadline);
            self.settle(core);
            self.move_ingress_in(core, true);
            let now = self.now();
            let in_time = !timed_out && deadline.is_none_or(|d| now.mono() < d);
            let (outcome, more) = core.handle_offer(message, &now, in_time);
            effects.absorb(more);
            if outcome != Offered::Full {
                break outcome;
            }
        };
        core.set_blocked(false);
        outcome
    }

    /// Run the handler for one delivery: no lock held, panics caught (R-CORE-2, R-DEL-1).
    pub(crate) fn run(&self, delivery: &Delivery) -> Result<(), HandlerError> {
        match &self.handler {
            // R-OPS-3 span; R-OPS-2 duration histogram (feature `metrics`), src/ops.
            HandlerKind::Sync(h) => crate::telemetry::trace::in_process_span(
                &delivery.message,
                &self.name,
                delivery.attempt,
                || {
                    crate::telemetry::timed(&self.process_metric, || {
                        invoke(h.as_ref(), &delivery.message)
                    })
                },
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

    /// Report a delivery's outcome (the tokio driver, after an async handler).
    #[cfg(feature = "tokio")]
    pub(crate) fn complete(&self, delivery: Delivery, outcome: Result<(), HandlerError>) {
        self.lock().complete(delivery, outcome);
    }

    /// One delivery step in the caller's thread (the manual driver). False when there was
    /// nothing to deliver now.
    pub(crate) fn step(&self, worker: usize) -> bool {
        self.lock().step(worker, true) == Step::Delivered
    }

    pub(crate) fn wake(&self, worker: usize) {
        if let Some(w) = self.waker.get() {
            w.wake(self, worker);
        }
    }

    /// Wake every slot and every blocked publisher (close, clock jumps). Takes the lock
    /// first so a waiter between its check and its wait cannot miss the wake-up.
    pub(crate) fn wake_all(&self) {
        drop(self.core_locked());
        self.space.notify_all();
        if let Some(w) = self.waker.get() {
            w.wake_all(self);
        }
    }

    pub(crate) fn begin_drain(&self, deadline: Option<std::time::Instant>) {
        let effects = self.core_closing().begin_drain(deadline, &self.now());
        self.apply(effects);
        self.wake_all();
    }

    /// True when nothing is queued or in flight (retry waits count as in flight).
    pub(crate) fn is_idle(&self) -> bool {
        let s = self.stats();
        s.queued == 0 && s.in_flight == 0
    }

    /// Counters and gauges now (R-DEL-6, R-BP-3).
    pub(crate) fn stats(&self) -> SubscriptionStats {
        let now = self.env.clock.wall();
        self.core_synced().stats(now)
    }

    /// Queued messages per priority level, lowest first (R-OPS-1 snapshot).
    pub(crate) fn depth_by_priority(&self) -> [u64; crate::message::Priority::LEVELS] {
        self.core_synced().depth_by_priority()
    }

    /// Earliest retry due time, for the manual driver's "jump to next wake-up".
    pub(crate) fn next_wake(&self) -> Option<Instant> {
        self.core_locked().next_wake()
    }

    /// Read the dead-letter queue under the lock (snapshots and admin pages).
    pub(crate) fn with_dead_letters<R>(&self, f: impl FnOnce(&DeadLetterQueue) -> R) -> R {
        f(&self.core_locked().ledger_mut().dlq)
    }

    /// The dead-letter entries, oldest first (R-DEL-4).
    pub(crate) fn dead_letters(&self) -> Vec<DeadLetter> {
        self.with_dead_letters(DeadLetterQueue::list)
    }

    /// Remove and return the dead-letter entries `select` picks, keeping the rest in order.
    pub(crate) fn remove_dead_letters(
        &self,
        select: impl FnMut(&DeadLetter) -> bool,
    ) -> Vec<DeadLetter> {
        self.core_locked().ledger_mut().dlq.take_where(select)
    }

    /// Remove and return every dead-letter entry.
    pub(crate) fn drain_dead_letters(&self) -> Vec<DeadLetter> {
        self.core_locked().ledger_mut().dlq.drain()
    }

    /// Messages abandoned (dead-lettered as `Shutdown`) since the last `close`/`take`:
    /// handlers that were running at close and then failed retryably.
    pub(crate) fn take_shutdown(&self) -> Vec<Arc<Message>> {
        std::mem::take(&mut self.core_locked().ledger_mut().shutdown)
    }

    /// Close: refuse offers, abandon what is queued. Returns what was abandoned.
    pub(crate) fn close(&self) -> Vec<Arc<Message>> {
        let (abandoned, effects) = self.core_closing().close(&self.now());
        self.apply(effects);
        self.wake_all();
        abandoned
    }

    /// Lock the core, settling the dispatcher's batch first (see [`Locked::step`]).
    fn core_locked(&self) -> MutexGuard<'_, Core> {
        let mut core = self.core.lock();
        self.settle(&mut core);
        core
    }

    /// With the core's lock held: end the dispatcher's batch, if one is out. The messages
    /// it has not started go back to the queue in place and it starts no more; those it
    /// delivered are counted. What stays held is the one whose handler is running (or
    /// whose failure the dispatcher reports). Costs one branch when no batch is out.
    fn settle(&self, core: &mut Core) {
        if core.held() == 0 {
            return;
        }
        let unstarted = self.batch_unstarted.swap(0, Ordering::AcqRel);
        let delivered = self.batch_delivered.swap(0, Ordering::AcqRel);
        core.settle_batch(usize::from(unstarted), usize::from(delivered));
    }

    /// Run a batch with the lock released (see [`Locked::step`]): `first`, then each held
    /// message while the batch is not settled, stopping at the first failure, which is
    /// returned (the message stays held for the dispatcher to report), with how many
    /// handlers ran. Each reference is dropped before its `Ok` is counted, so the settle
    /// recycles the message.
    fn run_batch(
        &self,
        first: Delivery,
        held: &mut [Option<Arc<Message>>],
    ) -> (Option<Result<(), HandlerError>>, usize) {
        let worker = first.worker;
        let outcome = self.run(&first);
        drop(first);
        if outcome.is_err() {
            return (Some(outcome), 1);
        }
        let mut started = 1;
        self.batch_delivered.fetch_add(1, Ordering::AcqRel);
        for slot in held {
            let Some(message) = slot.take() else {
                break;
            };
            if !self.start_held() {
                break;
            }
            started += 1;
            let delivery = Delivery {
                message,
                attempt: 1,
                worker,
            };
            let outcome = self.run(&delivery);
            drop(delivery);
            if outcome.is_err() {
                return (Some(outcome), started);
            }
            self.batch_delivered.fetch_add(1, Ordering::AcqRel);
        }
        (None, started)
    }

    /// The dispatcher may start its next held message: true when one was left to take
    /// (none is once the batch was settled).
    fn start_held(&self) -> bool {
        self.batch_unstarted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Lock the core with every fast offer moved in (see `super::ingress`).
    fn core_synced(&self) -> MutexGuard<'_, Core> {
        let mut core = self.core_locked();
        self.move_ingress_in(&mut core, false);
        core
    }

    /// Lock the core to stop accepting: the ingress is moved in and takes no more offers
    /// (they go through the core, which refuses them).
    fn core_closing(&self) -> MutexGuard<'_, Core> {
        let mut core = self.core_locked();
        self.move_ingress_in(&mut core, true);
        self.ingress.lock().open = false;
        core
    }

    /// Move the ingress into the core (whose lock the caller holds), in offer order, and
    /// reserve the core's remaining room for fast offers — or none with `pause`, while the
    /// caller decides an offer through the core.
    fn move_ingress_in(&self, core: &mut Core, pause: bool) {
        if !self.fast {
            return;
        }
        let mut spare = core.take_ingress_spare();
        let moved = {
            let mut ingress = self.ingress.lock();
            // Nothing to move (an idle dispatcher's every poll): swap nothing, so an idle
            // subscription never makes the spare buffer.
            let moved = (!ingress.items.is_empty()).then(|| {
                let mut items = spare.take().unwrap_or_default();
                std::mem::swap(&mut *items, &mut ingress.items);
                items
            });
            let held = moved.as_ref().map_or(0, |items| items.len());
            ingress.room = if pause {
                0
            } else {
                room_for(core.ingress_room().saturating_sub(held))
            };
            moved
        };
        match moved {
            Some(items) => core.accept_ingress(items),
            None => core.keep_ingress_spare(spare),
        }
    }

    /// After an offer through the core: reserve what room is left for fast offers.
    fn reserve_ingress_room(&self, core: &Core) {
        if self.fast {
            let mut ingress = self.ingress.lock();
            ingress.room = room_for(core.ingress_room().saturating_sub(ingress.items.len()));
        }
    }

    /// A fast offer found the dispatcher idle. The dispatcher announced that with the
    /// core's lock held and keeps holding it until it waits (or, in the pool, gives its
    /// slot up), so taking the lock once here orders this wake after that wait.
    fn wake_from_ingress(&self) {
        drop(self.core_locked());
        self.wake(0);
    }

    /// Apply a core step's effects, with the lock released: report finished messages to
    /// the durable hook, publish dead letters to the dead-letter topic (R-DEL-4), wake
    /// publishers blocked for room.
    ///
    /// A forward that fails (the broker is closed — e.g. `Shutdown` dead letters at close —
    /// or a durable stream's append failed) is counted in the subscription's
    /// `dlq_forward_failures`; the entry itself stays in the DLQ.
    fn apply(&self, effects: Effects) {
        if effects.is_empty() {
            return;
        }
        let (
            room,
            Lists {
                forward,
                finished,
                on_finished,
            },
        ) = effects.into_lists();
        if room {
            self.space.notify_all();
        }
        if !finished.is_empty()
            && let Some(hook) = on_finished
        {
            hook(finished);
        }
        let (Some(topic), false) = (&self.settings.dlq_topic, forward.is_empty()) else {
            return;
        };
        let mut failed = 0u64;
        for e in forward {
            // A dead letter of a dead letter is not forwarded again: no loops. Users cannot
            // set the reserved header, so only a forward carries it.
            if e.message.header(DLQ_REASON_HEADER).is_some() {
                continue;
            }
            if !(self.env.dead_letter_sink)(topic, &e, &self.name) {
                failed += 1;
            }
        }
        if failed > 0 {
            self.core_locked().ledger_mut().forward_failures += failed;
        }
    }
}
