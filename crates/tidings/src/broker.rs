//! The broker: one entry point (the Facade of R-PAT-2).
//!
//! # Publishing
//! `publish` validates the message, stamps a unique time-ordered id and timestamp, takes a
//! snapshot of the matching subscriptions under a read lock, releases it, then offers the
//! one shared `Arc<Message>` to each (R-CORE-2, R-CORE-4). It never runs a handler and
//! returns a [`PublishReport`] without waiting for delivery (R-CORE-5).
//!
//! # Ordering
//! Each subscription sees each publisher's messages in that publisher's order (R-ORD-2),
//! then orders them priority-first (R-ORD-1).
//!
//! # Backpressure
//! Every subscription queue is bounded; the subscription's [`Overflow`](crate::Overflow)
//! policy decides what a full queue does (R-BP-1). Only `Block` can make `publish` wait.
//!
//! # Closing
//! [`Broker::close`] stops accepting, lets dispatchers drain until a deadline, interrupts
//! retry waits at once, joins every thread and reports what was left (R-CORE-6). Dropping
//! the last `Broker` handle closes it with a zero drain deadline.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::clock::{Clock, ClockWaiter, Now, SystemClock};
use crate::driver::{Driver, Executor, executor_for};
use crate::error::{ConfigError, PublishError, SubscribeError};
use crate::handler::Handler;
use crate::limits::Limits;
use crate::message::{IdGenerator, Message, MessageBuilder};
use crate::options::SubscribeOptions;
use crate::report::{CloseReport, PublishReport, Undelivered};
use crate::request::{Inbox, RequestError};
use crate::scheduler::{Due, Scheduled, Scheduler, Target};
use crate::subscription::Subscription;
use crate::subscription::handle::SubscriptionId;
use crate::subscription::shared::{HandlerKind, SubShared};
use crate::topic::trie::TopicTrie;
use crate::topic::{Pattern, Topic};

/// How long close waits for a handler that is still running after queues were closed.
const JOIN_GRACE: Duration = Duration::from_secs(5);

thread_local! {
    /// Reused snapshot buffer: publish allocates no vector per call.
    static TARGETS: RefCell<Vec<Arc<SubShared>>> = const { RefCell::new(Vec::new()) };
    /// Set while `run_until_idle` delivers on this thread (re-entrant calls return 0).
    static DRIVING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[derive(Default)]
struct Registry {
    router: TopicTrie<Arc<SubShared>>,
    all: BTreeMap<SubscriptionId, Arc<SubShared>>,
}

/// Builds a [`Broker`].
#[must_use]
pub struct BrokerBuilder {
    clock: Arc<dyn Clock>,
    driver: Driver,
    limits: Limits,
    /// Streams' data directory (`BrokerBuilder::data_dir`, src/stream/api.rs).
    pub(crate) data_dir: Option<std::path::PathBuf>,
}

impl BrokerBuilder {
    /// Use this clock for every time decision (R-TIME-3). Default: the system clock.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }
    /// Use this driver (R-EXE-1). Default: a thread per subscription.
    pub fn driver(mut self, driver: Driver) -> Self {
        self.driver = driver;
        self
    }
    /// Use these limits (R-LIM-1).
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }
    /// Build the broker. Fails on inconsistent limits.
    pub fn build(self) -> Result<Broker, ConfigError> {
        self.limits.validate()?;
        let executor = executor_for(&self.driver, &self.clock)?;
        let inner = Arc::new_cyclic(|weak| BrokerInner {
            registry: RwLock::new(Registry::default()),
            executor,
            clock: self.clock,
            limits: self.limits,
            ids: IdGenerator::new(),
            next_sub: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            weak: weak.clone(),
            scheduler: Arc::new(Scheduler::default()),
            timer: Mutex::new(None),
            inbox: OnceLock::new(),
            streams: crate::stream::Streams::new(self.data_dir),
            driver_name: crate::ops::snapshot::driver_name(&self.driver),
        });
        let waiter: Weak<dyn ClockWaiter> = Arc::downgrade(&inner) as Weak<dyn ClockWaiter>;
        inner.clock.register_waiter(waiter);
        Ok(Broker { inner })
    }
}

/// An in-process publish-subscribe broker. Cheap to clone; all clones share one broker.
///
/// ```
/// use std::time::Duration;
/// use tidings::{Broker, Driver, HandlerError, ManualClock, Message, SubscribeOptions};
///
/// let clock = ManualClock::new();
/// let broker = Broker::builder().driver(Driver::Manual).clock(clock.clone()).build()?;
/// let sub = broker.subscribe("orders.created", SubscribeOptions::default(), |m: &Message| {
///     println!("order {:?}", m.payload());
///     Ok::<(), HandlerError>(())
/// })?;
/// let report = broker.publish(Message::to("orders.created").payload("42"))?;
/// assert_eq!(report.accepted, 1);
/// broker.run_until_idle();
/// assert_eq!(sub.stats().delivered, 1);
/// assert!(broker.close(Duration::from_secs(1)).is_clean());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Broker {
    pub(crate) inner: Arc<BrokerInner>,
}

/// A handle that does not keep the broker open; for handlers that publish (a handler that
/// captured a `Broker` clone would keep its own broker alive).
#[derive(Clone)]
pub struct WeakBroker {
    inner: Weak<BrokerInner>,
}

impl WeakBroker {
    /// The broker, if it is still alive.
    #[must_use]
    pub fn upgrade(&self) -> Option<Broker> {
        self.inner.upgrade().map(|inner| Broker { inner })
    }
}

pub(crate) struct BrokerInner {
    registry: RwLock<Registry>,
    pub(crate) executor: Box<dyn Executor>,
    pub(crate) clock: Arc<dyn Clock>,
    limits: Limits,
    ids: IdGenerator,
    next_sub: AtomicU64,
    closed: AtomicBool,
    weak: Weak<BrokerInner>,
    scheduler: Arc<Scheduler>,
    timer: Mutex<Option<JoinHandle<()>>>,
    inbox: OnceLock<Arc<Inbox>>,
    /// Durable streams and durable subscriptions (src/stream).
    pub(crate) streams: crate::stream::Streams,
    /// The driver's name, for the snapshot (src/ops/snapshot.rs).
    pub(crate) driver_name: &'static str,
}

impl Broker {
    /// A builder with the system clock, thread driver and default limits.
    pub fn builder() -> BrokerBuilder {
        BrokerBuilder {
            clock: Arc::new(SystemClock),
            driver: Driver::Thread,
            limits: Limits::default(),
            data_dir: None,
        }
    }

    /// A broker with every default.
    #[must_use]
    pub fn new() -> Self {
        match Self::builder().build() {
            Ok(b) => b,
            // Default limits are valid; this arm is unreachable in practice.
            Err(e) => unreachable!("default configuration is valid: {e}"),
        }
    }

    /// A handle that does not keep the broker alive.
    #[must_use]
    pub fn downgrade(&self) -> WeakBroker {
        WeakBroker {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// The broker's clock.
    #[must_use]
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// Subscribe `handler` to every topic matching `pattern` (R-CORE-1).
    ///
    /// The subscription gets its own bounded queue, dispatcher(s), DLQ and counters. It
    /// receives messages published after this returns.
    pub fn subscribe(
        &self,
        pattern: &str,
        options: SubscribeOptions,
        handler: impl Handler,
    ) -> Result<Subscription, SubscribeError> {
        self.inner
            .subscribe(pattern, options, HandlerKind::Sync(Arc::new(handler)))
    }

    /// Publish a message (see the module docs for the contract).
    ///
    /// # Errors
    /// Invalid topic, limits exceeded, or the broker is closed: nothing was offered.
    pub fn publish(
        &self,
        message: impl Into<MessageBuilder>,
    ) -> Result<PublishReport, PublishError> {
        self.inner.publish_builder(message.into())
    }

    /// Send a request and wait for its reply (R-PAT-1).
    ///
    /// Publishes `message` with `reply_to` set to this broker's shared reply inbox and a
    /// fresh correlation id, then waits up to `timeout` (on the broker's clock) for the
    /// reply carrying that id. Responders answer with [`Message::reply`]. Under the manual
    /// driver the request is delivered in this thread by `run_until_idle`, and the reply
    /// must exist by the time that returns.
    ///
    /// # Errors
    /// `NoResponders` at once when no subscription accepted the request; `Timeout` when
    /// no reply came in time (the outstanding entry is removed either way).
    pub fn request(
        &self,
        message: impl Into<MessageBuilder>,
        timeout: Duration,
    ) -> Result<Arc<Message>, RequestError> {
        let inner = &self.inner;
        let inbox = inner.inbox()?;
        let id = inbox.register();
        let request = message
            .into()
            .reply_to(inbox.topic.clone())
            .correlation_id(id.clone());
        let deadline = inner.clock.now() + timeout;
        let report = match inner.publish_builder(request) {
            Ok(r) => r,
            Err(e) => {
                inbox.forget(&id);
                return Err(e.into());
            }
        };
        if !report.scheduled && report.accepted == 0 {
            inbox.forget(&id);
            return Err(RequestError::NoResponders);
        }
        if inner.executor.is_manual() {
            inner.run_until_idle();
            let reply = inbox.try_take(&id);
            inbox.forget(&id);
            return reply.ok_or(RequestError::Timeout);
        }
        inbox
            .wait(&id, deadline, inner.clock.as_ref())
            .ok_or(RequestError::Timeout)
    }

    /// Requests waiting for a reply now (0 when none are outstanding).
    #[must_use]
    pub fn pending_requests(&self) -> usize {
        self.inner.inbox.get().map_or(0, |i| i.outstanding())
    }

    /// Replies that arrived after their request timed out (dropped, counted here).
    #[must_use]
    pub fn late_replies(&self) -> u64 {
        self.inner.inbox.get().map_or(0, |i| i.late_replies())
    }

    /// Delayed messages waiting in the scheduler (R-TIME-2).
    #[must_use]
    pub fn scheduled(&self) -> usize {
        self.inner.scheduler.len()
    }

    /// Unsubscribe by id (R-CORE-6): effective for offers after it returns; a handler call
    /// in flight completes. Returns the messages that were still queued, or `None` if no
    /// such subscription is live. Safe from inside any handler, including its own.
    pub fn unsubscribe(&self, id: SubscriptionId) -> Option<Vec<Arc<Message>>> {
        self.inner.unsubscribe(id)
    }

    /// Manual driver: deliver everything deliverable at the clock's current time, in this
    /// thread, until nothing is left to do now (R-EXE-2). Returns the number of handler
    /// calls made. Does nothing under other drivers, and returns 0 when called from inside
    /// a handler it is running.
    pub fn run_until_idle(&self) -> usize {
        self.inner.run_until_idle()
    }

    /// The earliest time something is scheduled to happen (a retry, a delayed message), so
    /// a test can advance a manual clock straight to it.
    #[must_use]
    pub fn next_wake(&self) -> Option<Instant> {
        self.inner.next_wake()
    }

    /// Ids of the live subscriptions, ascending.
    #[must_use]
    pub fn subscriptions(&self) -> Vec<SubscriptionId> {
        self.inner.registry.read().all.keys().copied().collect()
    }

    /// Close the broker (R-CORE-6): refuse new publishes and subscriptions; let
    /// dispatchers deliver what is queued until `drain` has passed; abandon retry waits at
    /// once; then close every queue, wait up to 5 s more for handler calls still running,
    /// join every thread, and report what was left. A second call returns an empty report.
    pub fn close(&self, drain: Duration) -> CloseReport {
        self.inner.close(drain)
    }

    /// True once `close` has begun.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }
}

impl Default for Broker {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("subscriptions", &self.inner.registry.read().all.len())
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl BrokerInner {
    pub(crate) fn subscribe(
        &self,
        pattern: &str,
        options: SubscribeOptions,
        handler: HandlerKind,
    ) -> Result<Subscription, SubscribeError> {
        self.subscribe_with(pattern, options, handler, true)
    }

    /// `routed: false` creates a subscription outside the topic router, fed only by its
    /// owner (a durable subscription's pump, src/stream/pump.rs).
    pub(crate) fn subscribe_with(
        &self,
        pattern: &str,
        options: SubscribeOptions,
        handler: HandlerKind,
        routed: bool,
    ) -> Result<Subscription, SubscribeError> {
        let pattern = Pattern::new(pattern).map_err(SubscribeError::InvalidPattern)?;
        options.validate()?;
        if self.closed.load(Ordering::Acquire) {
            return Err(SubscribeError::Closed);
        }
        let id = SubscriptionId(self.next_sub.fetch_add(1, Ordering::Relaxed));
        let shared = Arc::new(SubShared::new(
            id,
            pattern.clone(),
            &options,
            handler,
            self.clock.clone(),
            self.weak.clone(),
        ));
        {
            let mut reg = self.registry.write();
            if reg.all.len() >= self.limits.max_subscriptions {
                return Err(SubscribeError::TooManySubscriptions {
                    limit: self.limits.max_subscriptions,
                });
            }
            self.executor.start(&shared)?;
            if routed {
                reg.router.insert(&pattern, id.0, shared.clone());
            }
            reg.all.insert(id, shared.clone());
        }
        Ok(Subscription {
            shared,
            broker: self.weak.clone(),
            attached: true,
        })
    }

    pub(crate) fn unsubscribe(&self, id: SubscriptionId) -> Option<Vec<Arc<Message>>> {
        let shared = {
            let mut reg = self.registry.write();
            let shared = reg.all.remove(&id)?;
            reg.router.remove(&shared.pattern, id.0);
            shared
        };
        Some(shared.close())
    }

    pub(crate) fn publish_builder(&self, b: MessageBuilder) -> Result<PublishReport, PublishError> {
        // R-OPS-3: the publish span, and (feature `otel`) the traceparent header (src/ops).
        let span = crate::ops::trace::publish_span(&b.topic);
        let _entered = span.enter();
        if self.closed.load(Ordering::Acquire) {
            return Err(PublishError::Closed);
        }
        let message = Arc::new(crate::ops::trace::stamped(
            self.build_message(b)?,
            &self.limits,
        ));
        crate::ops::trace::record_published(&span, &message);
        // Durable streams first: a failed append fails the publish (src/stream).
        let streams = self.streams.append(&message)?;
        let mut report = match self.due_time(&message) {
            Some(due) => self.schedule(due, message)?,
            None => self.route(&message),
        };
        report.streams = streams;
        Ok(report)
    }

    /// The monotonic due time of a message delivered in the future (R-TIME-2).
    pub(crate) fn due_time(&self, message: &Message) -> Option<Instant> {
        let at = message.deliver_at()?;
        let now = Now::new(self.clock.as_ref());
        let wait = at
            .duration_since(now.wall())
            .ok()
            .filter(|d| !d.is_zero())?;
        Some(now.mono() + wait)
    }

    fn schedule(&self, due: Instant, message: Arc<Message>) -> Result<PublishReport, PublishError> {
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
        })
    }

    /// Hold `message` until `due`, then hand it to `target`. False when the broker is closed.
    pub(crate) fn schedule_for(&self, due: Instant, message: Arc<Message>, target: Target) -> bool {
        let wants_timer = !self.executor.is_manual();
        match self.scheduler.schedule(due, message, target, wants_timer) {
            Scheduled::Closed => false,
            Scheduled::Held { start_timer } => {
                if start_timer {
                    self.start_timer();
                }
                true
            }
        }
    }

    /// Offer a message that became due.
    fn release(&self, (message, target): Due) {
        match target {
            Target::Route => {
                self.route(&message);
            }
            Target::Only(_, offer) => offer(&message),
        }
    }

    /// One timer thread per broker offers due messages (R-TIME-2).
    fn start_timer(&self) {
        let (scheduler, clock, weak) = (
            self.scheduler.clone(),
            self.clock.clone(),
            self.weak.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name("tidings-scheduler".into())
            .spawn(move || {
                while let Some(due) = scheduler.wait_due(clock.as_ref()) {
                    let Some(broker) = weak.upgrade() else { return };
                    for entry in due {
                        broker.release(entry);
                    }
                }
            });
        match spawned {
            Ok(h) => *self.timer.lock() = Some(h),
            // Without a timer thread the messages stay scheduled and are reported at close.
            Err(e) => tracing::error!("tidings: could not start the scheduler thread: {e}"),
        }
    }

    /// The shared reply inbox, created on first use (R-PAT-1).
    fn inbox(&self) -> Result<Arc<Inbox>, RequestError> {
        if let Some(i) = self.inbox.get() {
            return Ok(i.clone());
        }
        let inbox = Arc::new(Inbox::new(self.ids.next(self.clock.wall()).as_u128() as u64));
        let handler_inbox = inbox.clone();
        let options = SubscribeOptions {
            name: Some("reply-inbox".into()),
            capacity: 1 << 16,
            retry: crate::retry::Retry::None,
            ..Default::default()
        };
        let mut sub = self
            .subscribe(
                &inbox.topic,
                options,
                HandlerKind::Sync(Arc::new(move |m: &Message| handler_inbox.accept(m))),
            )
            .map_err(|e| RequestError::Inbox(e.to_string()))?;
        match self.inbox.set(inbox) {
            Ok(()) => sub.attached = false,
            // Another thread won the race; drop (unsubscribe) ours and use theirs.
            Err(_) => drop(sub),
        }
        self.inbox
            .get()
            .cloned()
            .ok_or_else(|| RequestError::Inbox("inbox vanished".into()))
    }

    /// Validate limits and stamp id and time (R-CORE-4, R-LIM-1).
    fn build_message(&self, b: MessageBuilder) -> Result<Message, PublishError> {
        let limits = &self.limits;
        if b.payload.len() > limits.max_payload_bytes {
            return Err(PublishError::PayloadTooLarge {
                size: b.payload.len(),
                limit: limits.max_payload_bytes,
            });
        }
        if b.headers.len() > limits.max_headers {
            return Err(PublishError::TooManyHeaders {
                count: b.headers.len(),
                limit: limits.max_headers,
            });
        }
        let header_bytes = b.headers.byte_len();
        if header_bytes > limits.max_header_bytes {
            return Err(PublishError::HeadersTooLarge {
                size: header_bytes,
                limit: limits.max_header_bytes,
            });
        }
        if let Some(k) = &b.key
            && k.len() > limits.max_key_bytes
        {
            return Err(PublishError::KeyTooLarge {
                size: k.len(),
                limit: limits.max_key_bytes,
            });
        }
        let topic = Topic::new(&b.topic).map_err(PublishError::InvalidTopic)?;
        let reply_to = b
            .reply_to
            .as_deref()
            .map(Topic::new)
            .transpose()
            .map_err(PublishError::InvalidReplyTo)?;
        let wall = self.clock.wall();
        let expires_at = b.expires_at.or_else(|| b.ttl.map(|ttl| wall + ttl));
        let deliver_at = b.deliver_at.or_else(|| b.delay.map(|d| wall + d));
        Ok(Message {
            id: self.ids.next(wall),
            topic,
            payload: b.payload,
            headers: b.headers,
            key: b.key,
            priority: b.priority,
            timestamp: wall,
            expires_at,
            deliver_at,
            reply_to,
            correlation_id: b.correlation_id,
            log_offset: None,
        })
    }

    /// Snapshot the matching subscriptions, release the lock, offer to each (R-CORE-2).
    fn route(&self, message: &Arc<Message>) -> PublishReport {
        let mut targets = TARGETS.with(|t| std::mem::take(&mut *t.borrow_mut()));
        {
            let reg = self.registry.read();
            reg.router
                .for_each_match(message.topic(), |_, sub| targets.push(sub.clone()));
        }
        let mut report = PublishReport {
            id: message.id(),
            accepted: 0,
            refused: Vec::new(),
            scheduled: false,
            streams: Vec::new(),
        };
        for sub in targets.drain(..) {
            match sub.offer(message) {
                Ok(()) => report.accepted += 1,
                Err(reason) => report.refused.push((sub.id, reason)),
            }
        }
        TARGETS.with(|t| {
            let mut slot = t.borrow_mut();
            if slot.capacity() < targets.capacity() {
                *slot = targets;
            }
        });
        report
    }

    pub(crate) fn live(&self) -> Vec<Arc<SubShared>> {
        self.registry.read().all.values().cloned().collect()
    }

    fn run_until_idle(&self) -> usize {
        if !self.executor.is_manual() || DRIVING.with(|d| d.replace(true)) {
            return 0;
        }
        let mut delivered = 0;
        loop {
            let mut progress = 0;
            for entry in self.scheduler.take_due(self.clock.now()) {
                self.release(entry);
                progress += 1;
            }
            progress += self.streams.pump_all(&self.weak);
            for sub in self.live() {
                for worker in 0..sub.workers() {
                    while sub.step(worker) {
                        progress += 1;
                    }
                }
            }
            if progress == 0 {
                break;
            }
            delivered += progress;
        }
        DRIVING.with(|d| d.set(false));
        delivered
    }

    fn next_wake(&self) -> Option<Instant> {
        self.live()
            .iter()
            .filter_map(|s| s.core.lock().next_wake())
            .chain(self.scheduler.next_due())
            .min()
    }

    fn close(&self, drain: Duration) -> CloseReport {
        if self.closed.swap(true, Ordering::AcqRel) {
            return CloseReport::default();
        }
        let mut report = CloseReport::default();
        for (message, subscription) in self.scheduler.close() {
            report.undelivered.push(Undelivered {
                subscription,
                message,
            });
        }
        let subs = self.live();
        let drain_until = self.clock.now() + drain;
        for sub in &subs {
            sub.begin_drain(Some(drain_until));
        }
        if self.executor.is_manual() {
            self.run_until_idle();
        } else {
            self.executor.wait_stopped(Instant::now() + drain);
        }
        for sub in &subs {
            for message in sub.close() {
                report.undelivered.push(Undelivered {
                    subscription: Some(sub.id),
                    message,
                });
            }
        }
        report.unjoined = self.executor.join(Instant::now() + JOIN_GRACE);
        // Stop stream pumps, write durable positions, close stream logs (src/stream).
        self.streams.close();
        if let Some(timer) = self.timer.lock().take()
            && timer.thread().id() != std::thread::current().id()
        {
            let _ = timer.join();
        }
        let mut reg = self.registry.write();
        reg.all.clear();
        reg.router = TopicTrie::default();
        report
    }
}

impl ClockWaiter for BrokerInner {
    fn time_moved(&self) {
        for sub in self.live() {
            sub.wake_all();
        }
        self.scheduler.wake();
        if let Some(inbox) = self.inbox.get() {
            inbox.wake();
        }
    }
}

impl Drop for BrokerInner {
    fn drop(&mut self) {
        let _ = self.close(Duration::ZERO);
    }
}
