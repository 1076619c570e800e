//! A deterministic harness for the sans-IO core (the shape of quinn-proto's `Pair`).
//!
//! [`Harness`] owns one [`Core`] and a [`ManualClock`], and plays the driver: it calls the
//! core's `handle_*` / `poll_work` methods with an explicit `now`, runs a scripted handler,
//! and records what the core answered — every delivery it handed out and every effect it
//! returned — as [`Event`]s a case can compare exactly.
//!
//! # The driver it models
//! Each dispatcher slot is in one [`Slot`] state, as a real driver's slot would be: it polls
//! when awake; a delivery makes it busy until the harness completes it; `Idle` puts it to
//! sleep until an offer claims it (`Offered::Accepted(Some(slot))`) or a drain/close wakes
//! every slot; `WakeAt(t)` puts it to sleep until `t` (or an earlier wake). Time never
//! wakes an `Idle` slot: that is what a driver on the system clock does, so a wake-up the
//! core forgets to ask for leaves work stranded, and the harness fails.
//!
//! [`Harness::drive`] runs to idle: in rounds, every awake slot polls once (so what runs
//! concurrently is visible), then every delivery of the round completes with the script's
//! outcome; when no slot is awake, the clock jumps to the earliest slot timer. A case may
//! also take each step by hand ([`Harness::poll`], [`Harness::complete`]).
//!
//! # Invariants checked after every step
//! - R-DEL-6 conservation: `offered = accepted + refused`, `accepted = delivered +
//!   dead-lettered + queued + in-flight`, and every delivery still running is in flight;
//! - R-CORE-3 / R-ORD-3 / R-ORD-4: no two running deliveries share a key; under lanes, none
//!   share a lane, and each runs on its key's lane;
//! - a message's attempts are numbered 1, 2, 3, … in the order it is delivered (a deferred
//!   delivery, `HandlerError::defer_until`, is taken back: the next one repeats its number);
//! - a message finishes (delivered, or a dead letter forwarded) at most once;
//! - with a dead-letter topic, every dead letter kept is forwarded once, with `at = now`;
//! - a `WakeAt(t)` answer lies in the future and no earlier than the core's `next_wake`;
//! - at every quiescent point, nothing is stranded: if a message is queued or waiting to
//!   retry while the subscription is open, some slot sleeps with a timer.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::{Clock, ManualClock, Now};
use crate::dlq::DeadLetterReason;
use crate::handler::HandlerError;
use crate::limits::Limits;
use crate::message::{IdGenerator, Message, MessageBuilder, MessageId};
use crate::options::{Concurrency, Settings, SubscribeOptions};
use crate::stats::SubscriptionStats;
use crate::subscription::core::{Core, Delivery, Offered, Poll};
use crate::subscription::effects::{Effects, Finished, Outcome};
use crate::subscription::lanes::fnv1a;
use crate::subscription::ledger::Completions;

/// `n` milliseconds: the unit every case writes its times in.
pub(super) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// What the core answered, as the harness recorded it. `at` is the clock's time since the
/// harness started; `msg` is the message's payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Event {
    /// `poll_work` handed `msg` to slot `worker` for attempt `attempt` (1 = first).
    Deliver {
        at: Duration,
        worker: usize,
        msg: String,
        attempt: u32,
    },
    /// An effect: forward this dead letter (only with a dead-letter topic).
    DeadLetter {
        at: Duration,
        msg: String,
        reason: DeadLetterReason,
        attempts: u32,
    },
    /// An effect: report this message finished (only with [`Harness::reporting_finished`]):
    /// delivered (`None`) or dead-lettered with this reason and attempt count.
    Finished {
        at: Duration,
        msg: String,
        dead_letter: Option<(DeadLetterReason, u32)>,
    },
    /// An effect: room was made, wake the blocked publishers.
    Room { at: Duration },
}

/// [`Event::Deliver`], for writing expected traces.
pub(super) fn deliver(at_ms: u64, worker: usize, msg: &str, attempt: u32) -> Event {
    Event::Deliver {
        at: ms(at_ms),
        worker,
        msg: msg.to_owned(),
        attempt,
    }
}

/// [`Event::DeadLetter`], for writing expected traces.
pub(super) fn dead_letter(at_ms: u64, msg: &str, reason: DeadLetterReason, attempts: u32) -> Event {
    Event::DeadLetter {
        at: ms(at_ms),
        msg: msg.to_owned(),
        reason,
        attempts,
    }
}

/// [`Event::Finished`], for writing expected traces.
pub(super) fn finished(
    at_ms: u64,
    msg: &str,
    dead_letter: Option<(DeadLetterReason, u32)>,
) -> Event {
    Event::Finished {
        at: ms(at_ms),
        msg: msg.to_owned(),
        dead_letter,
    }
}

/// What one [`Harness::poll`] answered, with the delivery kept by the harness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Polled {
    Deliver {
        msg: String,
        attempt: u32,
    },
    /// Asleep until this time since the start.
    WakeAt(Duration),
    Idle,
    Stopped,
}

/// One dispatcher slot, as a driver runs it (see the module docs).
#[derive(Debug)]
enum Slot {
    /// Polls at the next chance: started, woken, or back from a handler call.
    Awake,
    /// Running the handler on this delivery.
    Busy(Delivery),
    /// Answered `Idle`: sleeps until an offer claims it or every slot is woken.
    Asleep,
    /// Answered `WakeAt(t)`: sleeps until `t`, or an earlier wake.
    Timer(Instant),
    /// Answered `Stopped`: exited.
    Stopped,
}

type Script = Box<dyn FnMut(&str, u32) -> Result<(), HandlerError>>;

/// A [`Core`] driven deterministically (see the module docs).
pub(super) struct Harness {
    core: Core,
    clock: ManualClock,
    start: Instant,
    ids: IdGenerator,
    concurrency: Concurrency,
    forwarding: bool,
    slots: Vec<Slot>,
    script: Script,
    events: Vec<Event>,
    /// Labels of the messages the harness built, by id.
    labels: HashMap<MessageId, String>,
    /// Attempt number of each message's last delivery.
    attempts: HashMap<MessageId, u32>,
    /// Messages delivered successfully or forwarded as dead letters.
    ended: HashSet<MessageId>,
    forwarded: u64,
    /// The most deliveries running at once.
    max_running: usize,
    /// Set by `begin_drain` / `close`: work left queued is no longer stranded.
    closing: bool,
}

impl Harness {
    /// A core with these options (validated as `subscribe` would), at time zero, whose
    /// handler succeeds until [`Harness::handler`] says otherwise. Every slot starts awake.
    pub(super) fn new(options: SubscribeOptions) -> Self {
        options.validate().expect("valid options");
        let settings = Settings::shared(&options);
        let core = Core::new(settings);
        let clock = ManualClock::new();
        let start = clock.now();
        let slots = (0..core.workers()).map(|_| Slot::Awake).collect();
        Self {
            core,
            clock,
            start,
            ids: IdGenerator::new(),
            concurrency: options.concurrency,
            forwarding: options.dead_letter.topic.is_some(),
            slots,
            script: Box::new(|_, _| Ok(())),
            events: Vec::new(),
            labels: HashMap::new(),
            attempts: HashMap::new(),
            ended: HashSet::new(),
            forwarded: 0,
            max_running: 0,
            closing: false,
        }
    }

    /// Also report finished messages, as a durable subscription does ([`Event::Finished`]).
    pub(super) fn reporting_finished(mut self) -> Self {
        self.core.ledger_mut().completions = Some(Completions {
            items: Vec::new(),
            hook: Arc::new(|_| {}),
            gate: None,
        });
        self
    }

    /// Report finished messages and ask `admit` (with the message's payload) before every
    /// handler attempt, as a keyed group's cursor does (R-DIST-6).
    pub(super) fn gated(mut self, admit: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        struct Gate<F>(F);
        impl<F: Fn(&str) -> bool + Send + Sync> crate::subscription::StartGate for Gate<F> {
            fn admit(&self, message: &Arc<Message>) -> bool {
                (self.0)(&String::from_utf8_lossy(message.payload()))
            }
        }
        self.core.ledger_mut().completions = Some(Completions {
            items: Vec::new(),
            hook: Arc::new(|_| {}),
            gate: Some(Arc::new(Gate(admit))),
        });
        self
    }

    /// The handler: called with the message's payload and the attempt number.
    pub(super) fn handler(
        &mut self,
        script: impl FnMut(&str, u32) -> Result<(), HandlerError> + 'static,
    ) {
        self.script = Box::new(script);
    }

    /// The core, for what the harness does not wrap.
    pub(super) fn core(&mut self) -> &mut Core {
        &mut self.core
    }

    /// Time since the harness started.
    pub(super) fn elapsed(&self) -> Duration {
        self.clock.elapsed()
    }

    /// Move the clock forward (no slot is woken: see [`Harness::drive`]).
    pub(super) fn advance(&mut self, by: Duration) {
        self.clock.advance(by);
    }

    /// The instant `since_start` after the harness started.
    pub(super) fn instant(&self, since_start: Duration) -> Instant {
        self.start + since_start
    }

    pub(super) fn stats(&self) -> SubscriptionStats {
        self.core.stats(self.clock.wall())
    }

    /// The events recorded since the last call.
    pub(super) fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// The most deliveries that ran at once so far.
    pub(super) fn max_running(&self) -> usize {
        self.max_running
    }

    /// Offer a message built now (its payload is its label); the offer may wait
    /// (`Overflow::Block`). A slot the core claims is woken.
    pub(super) fn offer(&mut self, message: MessageBuilder) -> Offered {
        self.offer_with(message, true)
    }

    /// [`Harness::offer`], choosing whether a `Block` offer may wait.
    pub(super) fn offer_with(&mut self, message: MessageBuilder, may_wait: bool) -> Offered {
        let message = self.build(message);
        let now = Now::new(&self.clock);
        let (offered, effects) = self.core.handle_offer(&message, &now, may_wait);
        if let Offered::Accepted(Some(slot)) = offered {
            self.wake(slot);
        }
        self.record(effects);
        self.check();
        offered
    }

    /// Offer a message that must be accepted.
    pub(super) fn accept(&mut self, message: MessageBuilder) {
        let offered = self.offer(message);
        assert!(matches!(offered, Offered::Accepted(_)), "{offered:?}");
    }

    /// Offer plain messages with these payloads, each of which must be accepted.
    pub(super) fn offer_all(&mut self, payloads: &[&str]) {
        for p in payloads {
            self.accept(Message::to("t").payload(p.to_string()));
        }
    }

    /// The filter refused an offer (it runs outside the core).
    pub(super) fn filtered(&mut self) {
        self.core.handle_filtered();
        self.check();
    }

    /// The filter panicked on this message.
    pub(super) fn filter_panicked(&mut self, message: MessageBuilder, error: &str) {
        let message = self.build(message);
        let now = Now::new(&self.clock);
        let effects = self
            .core
            .handle_filter_panic(&message, error.to_owned(), &now);
        self.record(effects);
        self.check();
    }

    /// Poll slot `worker` once, by hand. A delivery stays with the harness until
    /// [`Harness::complete`].
    pub(super) fn poll(&mut self, worker: usize) -> Polled {
        assert!(
            !matches!(self.slots[worker], Slot::Busy(_)),
            "slot {worker} is running a handler: a driver does not poll it"
        );
        let polled = self.poll_slot(worker);
        self.check();
        polled
    }

    /// Complete slot `worker`'s delivery with `outcome`, by hand.
    pub(super) fn complete(&mut self, worker: usize, outcome: Result<(), HandlerError>) {
        self.complete_slot(worker, outcome);
        self.check();
    }

    /// Drive to idle (see the module docs): run every awake slot, complete its delivery with
    /// the script's outcome, and jump the clock to the next slot timer, until no slot is
    /// awake and none has a timer. Returns the number of deliveries.
    pub(super) fn drive(&mut self) -> usize {
        self.drive_until(None)
    }

    /// [`Harness::drive`], jumping the clock no later than `limit` after the start.
    pub(super) fn drive_until(&mut self, limit: Option<Duration>) -> usize {
        let limit = limit.map(|l| self.start + l);
        let mut delivered = 0;
        for _ in 0..100_000 {
            let mut round = Vec::new();
            for w in 0..self.slots.len() {
                if matches!(self.slots[w], Slot::Awake)
                    && matches!(self.poll_slot(w), Polled::Deliver { .. })
                {
                    round.push(w);
                }
            }
            self.check();
            if !round.is_empty() {
                delivered += round.len();
                for w in round {
                    let Slot::Busy(d) = &self.slots[w] else {
                        unreachable!("a delivery makes its slot busy")
                    };
                    let label = self.label(&d.message);
                    let attempt = d.attempt;
                    let outcome = (self.script)(&label, attempt);
                    self.complete_slot(w, outcome);
                    self.check();
                }
                continue;
            }
            // Quiescent: nothing awake, nothing running.
            self.check_not_stranded();
            let next = self
                .slots
                .iter()
                .filter_map(|s| match s {
                    Slot::Timer(t) => Some(*t),
                    _ => None,
                })
                .min();
            match next {
                Some(t) if limit.is_none_or(|l| t <= l) => {
                    self.clock.advance_to(t);
                    let now = self.clock.now();
                    for s in &mut self.slots {
                        if matches!(s, Slot::Timer(t) if *t <= now) {
                            *s = Slot::Awake;
                        }
                    }
                }
                _ => return delivered,
            }
        }
        panic!("the core never went idle");
    }

    /// Stop accepting and drain; `deadline` since the start. Every slot is woken.
    pub(super) fn begin_drain(&mut self, deadline: Option<Duration>) {
        let deadline = deadline.map(|d| self.start + d);
        let now = Now::new(&self.clock);
        let effects = self.core.begin_drain(deadline, &now);
        self.closing = true;
        self.wake_all();
        self.record(effects);
        self.check();
    }

    /// Close; returns the payloads of the messages abandoned. Every slot is woken.
    pub(super) fn close(&mut self) -> Vec<String> {
        let now = Now::new(&self.clock);
        let (abandoned, effects) = self.core.close(&now);
        self.closing = true;
        self.wake_all();
        self.record(effects);
        self.check();
        abandoned.iter().map(|m| self.label(m)).collect()
    }

    /// Payloads abandoned since the last `close` / `take_shutdown` (a handler that failed
    /// retryably after close began).
    pub(super) fn take_shutdown(&mut self) -> Vec<String> {
        let shutdown = std::mem::take(&mut self.core.ledger_mut().shutdown);
        shutdown.iter().map(|m| self.label(m)).collect()
    }

    fn build(&mut self, message: MessageBuilder) -> Arc<Message> {
        let now = Now::new(&self.clock);
        let message = message
            .build(None, &Limits::default(), &now, &self.ids)
            .expect("a valid message");
        let label = String::from_utf8(message.payload().to_vec()).expect("a text payload");
        self.labels.insert(message.id(), label);
        Arc::new(message)
    }

    fn label(&self, message: &Message) -> String {
        self.labels
            .get(&message.id())
            .cloned()
            .expect("a message the harness built")
    }

    fn at(&self) -> Duration {
        self.clock.now() - self.start
    }

    fn wake(&mut self, slot: usize) {
        // A wake reaches a sleeping slot; a running one polls after its handler anyway.
        if matches!(self.slots[slot], Slot::Asleep | Slot::Timer(_)) {
            self.slots[slot] = Slot::Awake;
        }
    }

    fn wake_all(&mut self) {
        for w in 0..self.slots.len() {
            self.wake(w);
        }
    }

    fn poll_slot(&mut self, worker: usize) -> Polled {
        let now = Now::new(&self.clock);
        let (poll, effects) = self.core.poll_work(worker, &now);
        self.record(effects);
        match poll {
            Poll::Deliver(d) => {
                assert_eq!(d.worker, worker, "a delivery names the slot that polled");
                let label = self.label(&d.message);
                let id = d.message.id();
                let last = self.attempts.insert(id, d.attempt).unwrap_or(0);
                assert_eq!(
                    d.attempt,
                    last + 1,
                    "{label}: attempts are numbered in order"
                );
                self.check_may_run(&d);
                self.events.push(Event::Deliver {
                    at: self.at(),
                    worker,
                    msg: label.clone(),
                    attempt: d.attempt,
                });
                let attempt = d.attempt;
                self.slots[worker] = Slot::Busy(d);
                let running = self.running().count();
                self.max_running = self.max_running.max(running);
                Polled::Deliver {
                    msg: label,
                    attempt,
                }
            }
            Poll::WakeAt(t) => {
                assert!(t > self.clock.now(), "WakeAt({t:?}) is not in the future");
                assert!(
                    self.core.next_wake().is_some_and(|w| w <= t),
                    "WakeAt({t:?}) before the core's next wake {:?}",
                    self.core.next_wake()
                );
                self.slots[worker] = Slot::Timer(t);
                Polled::WakeAt(t - self.start)
            }
            Poll::Idle => {
                self.slots[worker] = Slot::Asleep;
                Polled::Idle
            }
            Poll::Stopped => {
                self.slots[worker] = Slot::Stopped;
                Polled::Stopped
            }
        }
    }

    fn complete_slot(&mut self, worker: usize, outcome: Result<(), HandlerError>) {
        let Slot::Busy(delivery) = std::mem::replace(&mut self.slots[worker], Slot::Awake) else {
            panic!("slot {worker} has no delivery to complete");
        };
        match &outcome {
            Ok(()) => self.end(delivery.message.id(), "delivered"),
            // A deferral takes the call back: the next delivery repeats its attempt number.
            Err(e) if e.is_deferral() => {
                self.attempts
                    .insert(delivery.message.id(), delivery.attempt - 1);
            }
            Err(_) => {}
        }
        let now = Now::new(&self.clock);
        let effects = self.core.handle_completion(delivery, outcome, &now);
        self.record(effects);
    }

    fn running(&self) -> impl Iterator<Item = &Delivery> {
        self.slots.iter().filter_map(|s| match s {
            Slot::Busy(d) => Some(d),
            _ => None,
        })
    }

    /// R-CORE-3, R-ORD-3, R-ORD-4: `d` may run beside the deliveries already running.
    fn check_may_run(&self, d: &Delivery) {
        let lanes = match self.concurrency {
            Concurrency::Lanes(n) => n,
            _ => 1,
        };
        let lane_of = |m: &Message| match m.key() {
            Some(k) if lanes > 1 => (fnv1a(k) % lanes as u64) as usize,
            _ => 0,
        };
        if let Concurrency::Lanes(_) | Concurrency::Serial = self.concurrency {
            assert_eq!(d.worker, lane_of(&d.message), "a message runs on its lane");
        }
        for other in self.running() {
            assert_ne!(
                other.message.key(),
                d.message.key(),
                "two deliveries of one key at once ({} and {})",
                self.label(&other.message),
                self.label(&d.message)
            );
            if !matches!(self.concurrency, Concurrency::PerKey { .. }) {
                assert_ne!(
                    lane_of(&other.message),
                    lane_of(&d.message),
                    "two deliveries in one lane at once"
                );
            }
        }
    }

    fn end(&mut self, id: MessageId, how: &str) {
        assert!(
            self.ended.insert(id),
            "{} finished twice (now {how})",
            self.labels[&id]
        );
    }

    /// Record a step's effects, in order: dead letters to forward, finished reports, room.
    fn record(&mut self, effects: Effects) {
        let (room, lists) = effects.into_lists();
        let at = self.at();
        let wall = self.clock.wall();
        for dl in lists.forward {
            assert!(self.forwarding, "a forward without a dead-letter topic");
            assert_eq!(dl.at, wall, "a dead letter is stamped with the step's time");
            self.forwarded += 1;
            self.end(dl.message.id(), dl.reason.name());
            self.events.push(Event::DeadLetter {
                at,
                msg: self.label(&dl.message),
                reason: dl.reason,
                attempts: dl.attempts,
            });
        }
        if !lists.finished.is_empty() {
            assert!(lists.on_finished.is_some(), "finished reports with no hook");
        }
        for f in lists.finished {
            let (msg, dead_letter) = self.finished_parts(f);
            self.events.push(Event::Finished {
                at,
                msg,
                dead_letter,
            });
        }
        if room {
            self.events.push(Event::Room { at });
        }
    }

    /// The one place that reads a finished report's fields.
    fn finished_parts(&self, f: Finished) -> (String, Option<(DeadLetterReason, u32)>) {
        let dead_letter = match f.outcome {
            Outcome::DeadLettered { reason, attempts } => Some((reason, attempts)),
            Outcome::Delivered | Outcome::Filtered => None,
        };
        (self.label(&f.message), dead_letter)
    }

    /// The invariants every step keeps (see the module docs).
    fn check(&self) {
        let s = self.stats();
        // R-DEL-6
        assert_eq!(
            s.offered,
            s.accepted + s.refused.total(),
            "offered = accepted + refused: {s:?}"
        );
        assert_eq!(
            s.accepted,
            s.delivered + s.dead_lettered.total() + s.released + s.queued + s.in_flight,
            "accepted = delivered + dead-lettered + released + queued + in flight: {s:?}"
        );
        let running = self.running().count() as u64;
        assert!(
            s.in_flight >= running,
            "{running} deliveries running, {} in flight",
            s.in_flight
        );
        if self.forwarding {
            assert_eq!(
                s.dlq_len + s.dlq_evicted,
                self.forwarded,
                "every dead letter kept is forwarded once"
            );
        }
    }

    /// At a quiescent point of an open subscription, work left queued or waiting to retry
    /// has a slot with a timer, or it would wait for an offer that may never come.
    fn check_not_stranded(&self) {
        if self.closing {
            return;
        }
        let s = self.stats();
        let timer = self.slots.iter().any(|s| matches!(s, Slot::Timer(_)));
        assert!(
            timer || (s.queued == 0 && self.core.next_wake().is_none()),
            "stranded: {} queued, next wake {:?} after the start, every slot asleep without \
             a timer",
            s.queued,
            self.core.next_wake().map(|t| t - self.start)
        );
    }
}
