//! The publish path (R-CORE-2, R-CORE-4, R-CORE-5): validate and stamp, append to the
//! matching durable streams, then offer to the matching subscriptions — or hold a delayed
//! message in the scheduler until it is due (R-TIME-2). Dead letters forwarded to a
//! dead-letter topic take the same path (R-DEL-4).
//!
//! # Ordering
//! Durable streams first: a failed append fails the publish and nothing is offered. The
//! snapshot of matching subscriptions is taken under the registry's read lock (or from the
//! route cache) and offered to after the lock is released.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::clock::{Now, deadline_after};
use crate::dlq::DeadLetter;
use crate::durable::registry::Appends;
use crate::error::PublishError;
use crate::message::{Message, MessageBuilder, Stamp};
use crate::report::PublishReport;
use crate::route_cache::{Route, Targets};
use crate::scheduler::{Due, Scheduled, Target};
use crate::subscription::shell::{DLQ_REASON_HEADER, RESERVED_HEADER_PREFIX, without_waiting};
use crate::topic::Topic;

use super::BrokerInner;

/// "Never" for a delivery time past what `Instant` can hold (about a century).
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 86_400);

/// Longest dead-letter reason copied into the forwarded message's reason header.
const MAX_REASON_HEADER_BYTES: usize = 1024;

impl BrokerInner {
    /// Publish `b`, taking its parts (borrowed, so the builder is not copied whole on the
    /// way: ~250 bytes per call level).
    pub(crate) fn publish_builder(
        &self,
        b: &mut MessageBuilder,
    ) -> Result<PublishReport, PublishError> {
        // R-OPS-3: the publish span, and (feature `otel`) the traceparent header (src/ops).
        let span = crate::telemetry::trace::publish_span(&b.topic);
        let _entered = span.enter();
        // One clock reading for the whole publish: the message's time stamps it and its
        // entry into every queue it reaches.
        let now = Now::new(self.clock.as_ref());
        let prepared = self.prepare(b, &span, &now)?;
        // Durable streams first: a failed append fails the publish (src/durable).
        let appends = self.durables.append(&prepared.message)?;
        self.finish(prepared, appends, &now)
    }

    /// A publish's first step: refused when closed, validated, stamped with `now`, its
    /// route looked up when cached. Never waits. Takes `b`'s parts (borrowed, so the
    /// builder is not copied whole on the way).
    pub(super) fn prepare(
        &self,
        b: &mut MessageBuilder,
        span: &tracing::Span,
        now: &Now<'_>,
    ) -> Result<Prepared, PublishError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(PublishError::Closed);
        }
        // A hot topic's route, looked up first, by the spelling's bytes: its topic is shared
        // (no check, not even of the UTF-8, no allocation) and its subscriptions are offered
        // to without a second lookup.
        let (topic, targets) = match self.cached_route(b.topic.as_bytes()) {
            Some(route) => (Some(route.topic), Some(route.targets)),
            None => (None, None),
        };
        let stamp = b.stamp(topic, &self.limits, now, &self.ids)?;
        let message = self.allocate(b, stamp);
        crate::telemetry::trace::record_published(span, &message);
        Ok(Prepared { message, targets })
    }

    /// A publish's last step, once the message is in every matching stream (`appends`):
    /// hold it until due, or offer it (to the matching subscriptions, or the transport).
    /// Waits only where an offer waits: a full `Overflow::Block` queue, or the transport.
    pub(super) fn finish(
        &self,
        prepared: Prepared,
        (streams, duplicate_in): Appends,
        now: &Now<'_>,
    ) -> Result<PublishReport, PublishError> {
        let Prepared { message, targets } = prepared;
        let mut report = match self.due_time(&message, now) {
            // With a transport a delayed message travels now; receivers hold it, and a
            // held message is routed when due, to the subscriptions there are then.
            Some(due) if !self.has_transport() => self.schedule(due, message)?,
            _ => {
                let report = self.dispatch(&message, !streams.is_empty(), targets, now);
                crate::message_pool::recycle(message);
                report?
            }
        };
        report.streams = streams;
        report.duplicate_in = duplicate_in;
        Ok(report)
    }

    /// Whether [`Self::finish`] may wait: it publishes to the transport, or offers to a
    /// subscription whose full queue makes a publisher wait (`Overflow::Block`). Looks the
    /// route up now when `prepared` has none yet, and keeps it there.
    #[cfg(feature = "tokio")]
    pub(super) fn finish_may_wait(&self, prepared: &mut Prepared, appended: bool) -> bool {
        if self.has_transport() {
            return self.transport_publishes(appended);
        }
        let targets = self.targets(&prepared.message, prepared.targets.take());
        let may_wait = targets.iter().any(|sub| sub.makes_publishers_wait());
        prepared.targets = Some(targets);
        may_wait
    }

    /// The monotonic due time of a message delivered in the future (R-TIME-2), from the
    /// clock reading `now` (the publish's own, when it is the publish that asks).
    pub(crate) fn due_time(&self, message: &Message, now: &Now<'_>) -> Option<Instant> {
        let at = message.deliver_at()?;
        let wait = at
            .duration_since(now.wall())
            .ok()
            .filter(|d| !d.is_zero())?;
        // A delivery time too far away for an `Instant` is held until close, in practice
        // (R-LIM-1): the furthest representable of these.
        let mono = now.mono();
        [wait, FAR_FUTURE, Duration::from_secs(86_400)]
            .into_iter()
            .find_map(|d| deadline_after(mono, d))
            .or(Some(mono))
    }

    pub(super) fn schedule(
        &self,
        due: Instant,
        message: Arc<Message>,
    ) -> Result<PublishReport, PublishError> {
        let id = message.id();
        if !self.schedule_for(due, message, Target::Route) {
            return Err(PublishError::Closed);
        }
        Ok(PublishReport {
            id,
            accepted: 0,
            refused: Vec::new(),
            scheduled: true,
            streams: Vec::new(),
            duplicate_in: Vec::new(),
        })
    }

    /// Hold `message` until `due`, then hand it to `target`. False when the broker is closed.
    pub(crate) fn schedule_for(&self, due: Instant, message: Arc<Message>, target: Target) -> bool {
        // The driver decides how the timer runs (under the manual driver it is not a
        // service: `run_until_idle` releases what is due).
        match self.scheduler.schedule(due, message, target, true) {
            Scheduled::Closed => false,
            Scheduled::Held { start_timer } => {
                if start_timer {
                    self.start_timer();
                }
                true
            }
        }
    }

    /// Offer a message that became due. The scheduler never waits on a queue (R-TIME-2,
    /// R-CORE-1): a full `Overflow::Block` queue refuses a due message as `Overflow` (it is
    /// dead-lettered, as under `Reject`) instead of stalling every other due message.
    pub(super) fn release(&self, (message, target): Due) {
        without_waiting(|| match target {
            Target::Route => {
                // Only without a transport are delayed publishes held here (publish_builder).
                self.route(&message, None, &Now::new(self.clock.as_ref()));
            }
            Target::Only(_, offer) => offer(&message),
        });
    }

    /// One timer per broker, run by the driver (src/scheduler.rs), offers due messages
    /// (R-TIME-2); it never blocks on a subscription's queue (see [`BrokerInner::release`]).
    pub(super) fn start_timer(&self) {
        let weak = self.weak.clone();
        let release = Box::new(move |due: Due| {
            if let Some(broker) = weak.upgrade() {
                broker.release(due);
            }
        });
        let started = self
            .scheduler
            .start_timer(self.clock.clone(), release, &*self.executor);
        // Without a timer the messages stay scheduled and are reported at close.
        if let Err(e) = started {
            tracing::error!("tidings: could not start the scheduler's timer: {e}");
        }
    }

    /// Publish a dead letter to its subscription's dead-letter topic (R-DEL-4).
    ///
    /// The forward carries the original's payload, key, priority and user headers, plus
    /// tidings' metadata in the reserved headers [`DLQ_REASON_HEADER`] (the reason, at
    /// most 1 KiB), `tidings-dlq-subscription`, `tidings-dlq-original-topic` and
    /// `tidings-dlq-original-id`. The user's headers passed the broker's limits at
    /// publish; the metadata is added after those limits are checked, so a message that
    /// carries the maximum number or size of headers is still forwarded. Users cannot set
    /// `tidings-` headers ([`PublishError::ReservedHeader`]), so the metadata cannot be
    /// forged, and the loop guard (a forwarded dead letter is never forwarded again) is
    /// exact.
    pub(crate) fn forward_dead_letter(
        &self,
        topic: &str,
        entry: &DeadLetter,
        subscription: &str,
    ) -> Result<PublishReport, PublishError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(PublishError::Closed);
        }
        let original = &entry.message;
        let mut b = MessageBuilder::new(topic)
            .payload(original.payload().clone())
            .priority(original.priority());
        for (k, v) in original.headers().iter() {
            b = b.header(k, v);
        }
        if let Some(k) = original.key() {
            b = b.key(k);
        }
        let now = Now::new(self.clock.as_ref());
        let mut message = self.build_message(b, None, &now)?;
        let mut reason = entry.reason.to_string();
        if reason.len() > MAX_REASON_HEADER_BYTES {
            let mut cut = MAX_REASON_HEADER_BYTES;
            while !reason.is_char_boundary(cut) {
                cut -= 1;
            }
            reason.truncate(cut);
        }
        message.headers.insert(DLQ_REASON_HEADER, reason);
        message
            .headers
            .insert("tidings-dlq-subscription", subscription);
        message
            .headers
            .insert("tidings-dlq-original-topic", original.topic().to_string());
        message
            .headers
            .insert("tidings-dlq-original-id", original.id().to_string());
        let message = Arc::new(message);
        let (streams, duplicate_in) = self.durables.append(&message)?;
        let mut report = self.dispatch(&message, !streams.is_empty(), None, &now)?;
        report.streams = streams;
        report.duplicate_in = duplicate_in;
        Ok(report)
    }

    /// Validate limits and stamp id and time (R-CORE-4, R-LIM-1). `checked`: the builder's
    /// topic, already validated (from the route cache).
    pub(super) fn build_message(
        &self,
        b: MessageBuilder,
        checked: Option<Topic>,
        now: &Now<'_>,
    ) -> Result<Message, PublishError> {
        b.build(checked, &self.limits, now, &self.ids)
    }

    /// The message `b` and its `stamp` make, in a shared allocation: written field by field
    /// into a recycled one when this thread has one (src/message_pool.rs), so neither the
    /// builder nor the message is copied whole on the way; else in a new one.
    #[inline]
    fn allocate(&self, b: &mut MessageBuilder, stamp: Stamp) -> Arc<Message> {
        let Some(mut arc) = crate::message_pool::recycled() else {
            return self.allocate_new(b.take_message(stamp));
        };
        match Arc::get_mut(&mut arc) {
            Some(slot) => {
                b.write_into(stamp, slot);
                crate::telemetry::trace::stamp(slot, &self.limits);
                arc
            }
            // Unreachable: only unique messages are recycled, and nothing else can see them.
            None => self.allocate_new(b.take_message(stamp)),
        }
    }

    /// `message` in a new allocation (no recycled one at hand).
    #[cold]
    fn allocate_new(&self, mut message: Message) -> Arc<Message> {
        crate::telemetry::trace::stamp(&mut message, &self.limits);
        Arc::new(message)
    }

    /// The route cache's current entry for the topic spelled `name` (src/route_cache.rs).
    fn cached_route(&self, name: &[u8]) -> Option<Route> {
        self.routes.get(name)
    }

    /// The subscriptions `message`'s topic matches now: `known` when the publish already
    /// looked them up, else from the route cache, else computed under the registry's read
    /// lock (and cached).
    fn targets(&self, message: &Message, known: Option<Targets>) -> Targets {
        known.unwrap_or_else(|| {
            let reg = self.registry.read();
            let topic = message.topic();
            self.routes.get_or_compute(topic, || {
                let mut targets = Vec::new();
                reg.router
                    .for_each_match(topic, |_, sub| targets.push(sub.clone()));
                targets
            })
        })
    }

    /// Snapshot the matching subscriptions, release the lock, offer to each (R-CORE-2).
    /// A topic published before, with no subscribe or unsubscribe since, takes its
    /// snapshot from the route cache: one hash lookup (src/route_cache.rs). `known`: that
    /// snapshot, when the publish already looked it up. `now`: the time the message enters
    /// the queues it reaches (the publish's own reading, or when a delayed one became due).
    pub(super) fn route(
        &self,
        message: &Arc<Message>,
        known: Option<Targets>,
        now: &Now<'_>,
    ) -> PublishReport {
        let targets = self.targets(message, known);
        let mut report = PublishReport {
            id: message.id(),
            accepted: 0,
            refused: Vec::new(),
            scheduled: false,
            streams: Vec::new(),
            duplicate_in: Vec::new(),
        };
        for sub in targets.iter() {
            match sub.offer_at(message, now) {
                Ok(()) => report.accepted += 1,
                Err(reason) => report.refused.push((sub.id, reason)),
            }
        }
        report
    }
}

/// A message between the steps of a publish (see [`BrokerInner::prepare`]).
pub(crate) struct Prepared {
    message: Arc<Message>,
    /// Its route, when already looked up.
    targets: Option<Targets>,
}

impl Prepared {
    /// The message being published.
    #[cfg(feature = "tokio")]
    pub(crate) fn message(&self) -> &Arc<Message> {
        &self.message
    }
}

/// Refuse user headers in tidings' reserved namespace (R-DEL-4: metadata is unforgeable).
pub(super) fn refuse_reserved_headers(message: &MessageBuilder) -> Result<(), PublishError> {
    match message
        .headers
        .iter()
        .find(|(k, _)| k.starts_with(RESERVED_HEADER_PREFIX))
    {
        Some((name, _)) => Err(PublishError::ReservedHeader {
            name: name.to_owned(),
        }),
        None => Ok(()),
    }
}
