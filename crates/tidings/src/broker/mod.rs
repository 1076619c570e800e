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
//!
//! # Layout
//! The whole public surface of [`Broker`] and [`BrokerBuilder`] is in this folder, one file
//! per concept:
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | `Broker`, `BrokerBuilder`, `WeakBroker`; request, the subscription registry |
//! | `subscribe.rs` | the one `subscribe` (every target, every handler kind): its targets, its handler check |
//! | `publish.rs` | the publish path: validate, append to streams, route or schedule; dead-letter forwarding |
//! | `durable.rs` | choosing the durable backend; streams, durable subscriptions, durable dedup stores |
//! | `idle.rs` | the manual driver's drive-to-idle (`run_until_idle`, `settle`'s next wake-up) |
//! | `close.rs` | `close` and its report |
//! | `async.rs` | the async methods (feature `tokio`) |
//! | `transport.rs` | the transport option and its publish / subscribe / close hooks (src/transport) |
//!
//! The admin actions and the snapshot (`crate::ops`) add `impl Broker` blocks of their own.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use parking_lot::{Condvar, Mutex, RwLock};

use crate::clock::{Clock, ClockWaiter, ManualClock, SystemClock, deadline_after};
use crate::driver::{Driver, Executor, executor_for};
use crate::error::{ConfigError, PublishError, SubscribeError};
use crate::limits::Limits;
use crate::message::{IdGenerator, Message, MessageBuilder};
use crate::options::SubscribeOptions;
use crate::report::{CloseReport, PublishReport};
use crate::request::{Inbox, RequestError};
use crate::route_cache::RouteCache;
use crate::scheduler::Scheduler;
use crate::subscription::Subscription;
use crate::subscription::handle::SubscriptionId;
use crate::subscription::shell::{HandlerKind, ShellEnv, SubscriptionShell};
use crate::topic::Pattern;
use crate::topic::trie::TopicTrie;

#[cfg(feature = "tokio")]
mod r#async;
mod by_id;
mod close;
mod durable;
mod idle;
mod publish;
mod subscribe;
mod transport;

use by_id::ById;
use publish::refuse_reserved_headers;
pub use subscribe::SubscribeTarget;

#[derive(Default)]
struct Registry {
    /// Every change calls [`RouteCache::invalidate`] on the broker's `routes` before the
    /// registry lock is released.
    router: TopicTrie<Arc<SubscriptionShell>>,
    /// The user's subscriptions: listed, counted against `max_subscriptions`, removable.
    all: ById,
    /// tidings' own subscriptions (the reply inbox): run and closed like the others, but
    /// not listed, not counted, not removable by id.
    internal: ById,
    /// With a transport: each routed subscription's receiving end (src/broker/transport.rs).
    remote: BTreeMap<SubscriptionId, Box<dyn crate::transport::TransportSubscription>>,
}

/// Where `close` is: the first caller does the work; others wait for its report.
enum CloseState {
    Open,
    Running(ThreadId),
    Done(CloseReport),
}

/// Builds a [`Broker`].
#[must_use]
pub struct BrokerBuilder {
    clock: Arc<dyn Clock>,
    driver: Driver,
    limits: Limits,
    /// The clock when it is a [`ManualClock`], so [`Broker::settle`] can move it.
    manual_clock: Option<ManualClock>,
    /// Where durable streams live (`BrokerBuilder::data_dir`, `durable_backend`:
    /// src/broker/durable.rs).
    durable: durable::DurableChoice,
    /// Where buffered publishes go (`BrokerBuilder::transport`); `None`: in-process.
    transport: Option<Arc<dyn crate::transport::Transport>>,
}

impl BrokerBuilder {
    /// Use this clock for every time decision (R-TIME-3). Default: the system clock.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.manual_clock = (&clock as &dyn Any).downcast_ref::<ManualClock>().cloned();
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
        let (backend, data_dir) = self.durable.build()?;
        let transport = match self.transport {
            None => None,
            Some(transport) => Some(transport::Attached {
                carries_appends: transport::carries_appends(&*transport, backend.as_deref())?,
                transport,
            }),
        };
        let executor = executor_for(&self.driver, &self.clock)?;
        let inner = Arc::new_cyclic(|weak| BrokerInner {
            registry: CachePadded::new(RwLock::new(Registry::default())),
            routes: RouteCache::default(),
            executor,
            clock: self.clock.clone(),
            limits: self.limits,
            ids: CachePadded::new(IdGenerator::new()),
            next_sub: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            weak: weak.clone(),
            scheduler: Arc::new(Scheduler::default()),
            inbox: OnceLock::new(),
            inbox_init: Mutex::new(()),
            close_state: Mutex::new(CloseState::Open),
            close_done: Condvar::new(),
            manual_clock: self.manual_clock,
            durables: Arc::new(crate::durable::Durables::new(backend, data_dir)),
            driver_name: crate::driver::driver_name(&self.driver),
            transport,
            shell_env: Arc::new(ShellEnv {
                clock: self.clock.clone(),
                dead_letter_sink: BrokerInner::dead_letter_sink(weak.clone()),
            }),
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
///
/// # Methods by concern
/// Every public method, by what it is for (a test, `tests/broker_map.rs`, keeps this
/// table complete and fails on a method missing from it or a name it lists that does not
/// exist). One verb has one name: [`subscribe`](Broker::subscribe) takes every target (a
/// pattern or a durable stream) and every kind of handler (sync, async, typed, decorated).
///
/// | concern | methods |
/// |---|---|
/// | making one, handles | [`builder`](Broker::builder), [`new`](Broker::new), [`downgrade`](Broker::downgrade), [`clock`](Broker::clock) |
/// | publishing | [`publish`](Broker::publish), [`publish_async`](Broker::publish_async), [`scheduled`](Broker::scheduled) |
/// | subscribing | [`subscribe`](Broker::subscribe), [`unsubscribe`](Broker::unsubscribe), [`subscriptions`](Broker::subscriptions) |
/// | request–reply | [`request`](Broker::request), [`request_async`](Broker::request_async), [`pending_requests`](Broker::pending_requests), [`late_replies`](Broker::late_replies) |
/// | durable streams | [`create_stream`](Broker::create_stream), [`stream`](Broker::stream), [`streams`](Broker::streams), [`durable_dedup_store`](Broker::durable_dedup_store), [`data_dir`](Broker::data_dir), [`embedded_backend`](Broker::embedded_backend), [`durable_backend_name`](Broker::durable_backend_name) |
/// | driving and waiting (tests) | [`run_until_idle`](Broker::run_until_idle), [`settle`](Broker::settle), [`wait_idle`](Broker::wait_idle), [`next_wake`](Broker::next_wake) |
/// | closing | [`close`](Broker::close), [`close_async`](Broker::close_async), [`is_closed`](Broker::is_closed) |
/// | operating (snapshot, metrics, admin actions) | [`snapshot`](Broker::snapshot), [`export_metrics`](Broker::export_metrics), [`dead_letter_page`](Broker::dead_letter_page), [`redrive_dead_letters`](Broker::redrive_dead_letters), [`purge_dead_letters`](Broker::purge_dead_letters), [`seek_subscription`](Broker::seek_subscription) |
///
/// `publish_async`, `request_async` and `close_async` need the feature `tokio` (as do async
/// handlers); `export_metrics` the feature `metrics`.
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
    /// Read-locked by every publish, and `ids` is incremented by every publish: each on a
    /// cache line of its own, so that concurrent publishers' atomic writes to them do not
    /// also evict the fields every publish only reads (limits, clock, flags) from the
    /// others' caches.
    registry: CachePadded<RwLock<Registry>>,
    /// Topic → the router's matches (src/route_cache.rs): read by a publish without the
    /// registry lock; filled under its read lock, emptied under its write lock. Sharded by
    /// publisher thread, each shard on cache lines of its own.
    routes: RouteCache,
    pub(crate) executor: Box<dyn Executor>,
    pub(crate) clock: Arc<dyn Clock>,
    limits: Limits,
    ids: CachePadded<IdGenerator>,
    next_sub: AtomicU64,
    closed: AtomicBool,
    weak: Weak<BrokerInner>,
    scheduler: Arc<Scheduler>,
    inbox: OnceLock<Arc<Inbox>>,
    /// Serialises the inbox's creation (one internal subscription, never a losing twin).
    inbox_init: Mutex<()>,
    close_state: Mutex<CloseState>,
    /// Signalled when the first `close` stored its report.
    close_done: Condvar,
    manual_clock: Option<ManualClock>,
    /// Durable streams and durable subscriptions (src/durable).
    pub(crate) durables: Arc<crate::durable::Durables>,
    /// The driver's name, for the snapshot (src/ops/snapshot.rs).
    pub(crate) driver_name: &'static str,
    /// Where buffered publishes go; `None`: the in-process router (src/broker/transport.rs).
    transport: Option<transport::Attached>,
    /// What its subscriptions share: the clock and the dead-letter sink.
    shell_env: Arc<ShellEnv>,
}

impl Broker {
    /// A builder with the system clock, thread driver and default limits.
    pub fn builder() -> BrokerBuilder {
        BrokerBuilder {
            clock: Arc::new(SystemClock),
            driver: Driver::Thread,
            limits: Limits::default(),
            manual_clock: None,
            durable: Default::default(),
            transport: None,
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

    /// Publish a message (see the module docs for the contract).
    ///
    /// Header names starting with `tidings-` are reserved for tidings' own metadata (the
    /// dead-letter headers such as [`DLQ_REASON_HEADER`](crate::DLQ_REASON_HEADER)), so that nobody can forge it.
    ///
    /// # Errors
    /// Invalid topic, limits exceeded, a reserved header name
    /// ([`PublishError::ReservedHeader`]), or the broker is closed: nothing was offered.
    pub fn publish(
        &self,
        message: impl Into<MessageBuilder>,
    ) -> Result<PublishReport, PublishError> {
        let mut message = message.into();
        refuse_reserved_headers(&message)?;
        self.inner.publish_builder(&mut message)
    }

    /// Send a request and wait for its reply (R-PAT-1).
    ///
    /// Publishes `message` with `reply_to` set to this broker's shared reply inbox and a
    /// fresh correlation id, then waits up to `timeout` (on the broker's clock) for the
    /// reply carrying that id. Responders answer with [`Message::reply`]. A timeout too
    /// large to be a deadline (`Duration::MAX`) means "no timeout": wait until the reply
    /// comes or the broker closes (R-LIM-1).
    ///
    /// Under the manual driver the request is delivered in this thread by
    /// `run_until_idle`, and the reply must exist by the time that returns. That holds from
    /// inside a handler too (R-EXE-5): the nested `run_until_idle` delivers the request and
    /// its reply, except to a subscription whose handler is running up the stack (it cannot
    /// run twice at once), so a request to a handler's own subscription returns `Timeout`.
    ///
    /// With a [transport](BrokerBuilder::transport) the request and its reply travel over
    /// it, to and from any broker on it; under the manual driver this then delivers
    /// (`run_until_idle`) until the reply arrives or `timeout` passes in real time.
    ///
    /// # Errors
    /// `NoResponders` at once when no subscription accepted the request (with a transport:
    /// when the transport reports that nobody subscribes to its topic); `Timeout` when
    /// no reply came in time; `Closed` when the broker is closed or closes while the
    /// request waits (close wakes it at once). The outstanding entry is removed either way.
    pub fn request(
        &self,
        message: impl Into<MessageBuilder>,
        timeout: Duration,
    ) -> Result<Arc<Message>, RequestError> {
        let inner = &self.inner;
        let message = message.into();
        refuse_reserved_headers(&message)?;
        if inner.closed.load(Ordering::Acquire) {
            return Err(RequestError::Closed);
        }
        let inbox = inner.inbox()?;
        let id = inbox.register();
        let mut request = message
            .reply_to(inner.reply_topic(&inbox, &id))
            .correlation_id(id.clone());
        let deadline = deadline_after(inner.clock.now(), timeout);
        let report = match inner.publish_builder(&mut request) {
            Ok(r) => r,
            Err(e) => {
                inbox.forget(&id);
                return Err(match e {
                    PublishError::Closed => RequestError::Closed,
                    e => e.into(),
                });
            }
        };
        // With a transport nobody is counted at publish: the transport reports no
        // responders through the inbox instead.
        if !report.scheduled && report.accepted == 0 && !inner.has_transport() {
            inbox.forget(&id);
            return Err(RequestError::NoResponders);
        }
        // Where the caller's thread delivers, it delivers until the reply is there.
        let mut reply = None;
        let delivered_here = inner.executor.run_on_caller(&mut || {
            reply = inner.run_until_reply(&inbox, &id, timeout);
            0
        });
        if delivered_here.is_none() {
            return inbox.wait(&id, deadline, inner.clock.as_ref());
        }
        inbox.forget(&id);
        match reply {
            Some(r) => r,
            None if inbox.is_closed() => Err(RequestError::Closed),
            None => Err(RequestError::Timeout),
        }
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
    /// thread, until nothing is left to do now (R-EXE-2). Returns the number of steps made
    /// (handler calls, and the steps of the broker's services that did something: releasing
    /// due delayed messages, moving durable records, applying retention). Does nothing
    /// (returns 0) under other drivers.
    ///
    /// # Re-entrancy (R-EXE-5)
    /// Called from inside a handler it is running (directly, or through
    /// [`request`](Broker::request) or [`close`](Broker::close)), it nests: it delivers
    /// everything deliverable now, except to the dispatcher slots whose handlers are
    /// running up the stack (one dispatcher per subscription, R-CORE-3), and returns.
    /// Nesting deeper than 16 levels returns 0 at once. While it runs, an offer into a full
    /// `Overflow::Block` queue made on this thread does not wait (nothing else would make
    /// room): it is refused as `Overflow` and dead-lettered, like `Reject`.
    pub fn run_until_idle(&self) -> usize {
        self.inner.run_until_idle()
    }

    /// Manual driver: run until nothing is scheduled (R-EXE-2): deliver everything
    /// deliverable, then jump the broker's [`ManualClock`] to the next wake-up (a retry, a
    /// delayed message) and deliver again, until there is no next wake-up. Returns the
    /// steps made, as [`run_until_idle`](Broker::run_until_idle) counts them.
    ///
    /// With a clock that is not a `ManualClock` it cannot move time: it runs until idle
    /// once. Under the other drivers it does nothing and returns 0 (use
    /// [`wait_idle`](Broker::wait_idle)). A retry policy that never gives up keeps it
    /// running for as long as the handler keeps failing.
    pub fn settle(&self) -> usize {
        let inner = &self.inner;
        inner
            .executor
            .run_on_caller(&mut || inner.settle_here())
            .unwrap_or(0)
    }

    /// Wait until the broker is idle: every queue empty, no handler call running or retry
    /// waiting, no delayed message scheduled. True when it got there, false when `timeout`
    /// (real time; `Duration::MAX` = no limit) passed first.
    ///
    /// For the live drivers (thread, pool, tokio): a test publishes, then asserts after
    /// `wait_idle`. Under the manual driver it runs [`run_until_idle`](Broker::run_until_idle)
    /// once and reports whether that left the broker idle (it never waits). Records a
    /// durable subscription has not read from its stream yet are not counted (its lag is in
    /// its stats). It polls (with a short, growing pause) rather than being notified;
    /// do not call it from inside a handler, whose own message keeps the broker busy.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let inner = &self.inner;
        // Where the caller's thread delivers, waiting would wait forever: deliver instead.
        if inner
            .executor
            .run_on_caller(&mut || inner.run_until_idle())
            .is_some()
        {
            return inner.is_idle();
        }
        let deadline = deadline_after(Instant::now(), timeout);
        let mut pause = Duration::from_micros(50);
        loop {
            if inner.is_idle() {
                return true;
            }
            let now = Instant::now();
            let left = match deadline {
                Some(d) if now >= d => return false,
                Some(d) => d - now,
                None => pause,
            };
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }

    /// The earliest time something is scheduled to happen (a retry, a delayed message), so
    /// a test can advance a manual clock straight to it.
    #[must_use]
    pub fn next_wake(&self) -> Option<Instant> {
        self.inner.next_wake()
    }

    /// Ids of the user's live subscriptions, ascending. tidings' own internal
    /// subscriptions (the reply inbox of [`request`](Broker::request)) are not listed.
    #[must_use]
    pub fn subscriptions(&self) -> Vec<SubscriptionId> {
        self.inner.registry.read().all.keys().copied().collect()
    }

    /// Close the broker (R-CORE-6): refuse new publishes and subscriptions; wake every
    /// pending [`request`](Broker::request) with [`RequestError::Closed`]; cancel delayed
    /// messages; let dispatchers deliver what is queued until `drain` has passed
    /// (`Duration::MAX`: until the queues are empty) — a message a handler deferred
    /// ([`HandlerError::defer_until`](crate::HandlerError::defer_until)) counts as queued and is delivered when due; abandon
    /// retry waits at once; then
    /// close every queue (waking blocked publishers, which get `Refusal::Closed`), wait up
    /// to 5 s more for handler calls still running, join every thread, and report what was
    /// left.
    ///
    /// The report lists exactly the messages dead-lettered as `Shutdown` (kept in the DLQs
    /// when `keep_shutdown`), including those whose handler was running when close began
    /// and then failed retryably. A handler still running when close returns (named in
    /// `unjoined`, or the handler that called close) is outside the report.
    ///
    /// A second call, concurrent or later, waits for the first to finish and returns the
    /// same report. The exception is a call made from inside the closing thread's own
    /// drain (a handler the manual driver runs during close): it cannot wait for itself
    /// and returns an empty report at once.
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
    /// owner (a durable subscription's feeder, src/durable/feeder.rs).
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
        let pattern = if routed {
            // Publishes recycle as many messages as this queue holds (src/message_pool.rs).
            crate::message_pool::expect_queue(options.capacity);
            self.shared_pattern(pattern)
        } else {
            pattern
        };
        self.register(pattern, &options, handler, routed, false)
    }

    /// `pattern`, or an equal one a routed subscription already holds: the subscriptions
    /// of one pattern (a fan-out) share one copy of its text instead of one each.
    fn shared_pattern(&self, pattern: Pattern) -> Pattern {
        let reg = self.registry.read();
        match reg.router.first(&pattern) {
            Some(sub) if sub.pattern == pattern => sub.pattern.clone(),
            _ => pattern,
        }
    }

    /// Create and start a subscription; `internal` ones (tidings' own, e.g. the reply
    /// inbox) are neither listed nor counted against `max_subscriptions` nor removable.
    fn register(
        &self,
        pattern: Pattern,
        options: &SubscribeOptions,
        handler: HandlerKind,
        routed: bool,
        internal: bool,
    ) -> Result<Subscription, SubscribeError> {
        let id = SubscriptionId(self.next_sub.fetch_add(1, Ordering::Relaxed));
        let shared = SubscriptionShell::new(
            id,
            pattern.clone(),
            options,
            handler,
            self.shell_env.clone(),
        );
        // With a transport, a routed subscription receives through it, not the router.
        let remote = routed && self.has_transport();
        let routed = routed && !remote;
        let evicted;
        {
            let mut reg = self.registry.write();
            // Checked again under the lock: close sets the flag before it lists the live
            // subscriptions, so a subscription registered here is either refused or seen
            // (and closed and joined) by close.
            if self.closed.load(Ordering::Acquire) {
                return Err(SubscribeError::Closed);
            }
            if !internal && reg.all.len() >= self.limits.max_subscriptions {
                return Err(SubscribeError::TooManySubscriptions {
                    limit: self.limits.max_subscriptions,
                });
            }
            self.executor.start(&shared)?;
            if routed {
                reg.router.insert(&pattern, id.0, shared.clone());
            }
            // Publishes that start after this returns must see the new subscription.
            evicted = routed.then(|| self.routes.invalidate());
            let map = if internal {
                &mut reg.internal
            } else {
                &mut reg.all
            };
            map.insert(shared.clone());
        }
        drop(evicted);
        if remote {
            // The one internal subscription is the reply inbox.
            self.open_remote(&shared, internal)?;
        }
        Ok(Subscription {
            shared,
            broker: self.weak.clone(),
            attached: !internal,
        })
    }

    /// How a subscription publishes its dead letters to its dead-letter topic (R-DEL-4).
    /// The sink every subscription's dead letters are forwarded through when it has a
    /// dead-letter topic (R-DEL-4).
    fn dead_letter_sink(weak: Weak<BrokerInner>) -> crate::subscription::shell::DeadLetterSink {
        Arc::new(move |topic, entry, name| {
            weak.upgrade()
                .is_some_and(|b| b.forward_dead_letter(topic, entry, name).is_ok())
        })
    }

    /// Only the user's subscriptions can be removed by id; internal ones end at close.
    pub(crate) fn unsubscribe(&self, id: SubscriptionId) -> Option<Vec<Arc<Message>>> {
        let (shared, evicted, remote) = {
            let mut reg = self.registry.write();
            let shared = reg.all.remove(&id)?;
            reg.router.remove(&shared.pattern, id.0);
            let remote = reg.remote.remove(&id);
            // Publishes that start after this returns must not see it (R-CORE-6).
            (shared, self.routes.invalidate(), remote)
        };
        self.close_remote(remote);
        // Cached routes may hold the last references to other removed subscriptions:
        // dropped here, outside the registry lock.
        drop(evicted);
        Some(shared.close())
    }

    /// The shared reply inbox, created on first use (R-PAT-1). Its subscription is
    /// internal: not listed, not counted against `max_subscriptions`, not removable.
    fn inbox(&self) -> Result<Arc<Inbox>, RequestError> {
        if let Some(i) = self.inbox.get() {
            return Ok(i.clone());
        }
        let _creating = self.inbox_init.lock();
        if let Some(i) = self.inbox.get() {
            return Ok(i.clone());
        }
        let inbox = Arc::new(Inbox::new(self.inbox_nonce()));
        let handler_inbox = inbox.clone();
        let options = SubscribeOptions::new()
            .name("reply-inbox")
            .capacity(1 << 16)
            .retry(crate::retry::Retry::None);
        let pattern = Pattern::new(&self.inbox_pattern(&inbox))
            .map_err(|e| RequestError::Inbox(e.to_string()))?;
        if self.closed.load(Ordering::Acquire) {
            return Err(RequestError::Closed);
        }
        let handler = HandlerKind::Sync(Arc::new(move |m: &Message| handler_inbox.accept(m)));
        // `attached: false`: dropping the handle leaves the subscription running.
        let _sub = self
            .register(pattern, &options, handler, true, true)
            .map_err(|e| match e {
                SubscribeError::Closed => RequestError::Closed,
                e => RequestError::Inbox(e.to_string()),
            })?;
        let _ = self.inbox.set(inbox.clone());
        // A close that began meanwhile may have missed this inbox: close it ourselves.
        if self.closed.load(Ordering::Acquire) {
            inbox.close();
        }
        Ok(inbox)
    }

    /// Every live subscription, the internal ones included, in id order.
    pub(crate) fn live(&self) -> Vec<Arc<SubscriptionShell>> {
        let reg = self.registry.read();
        let mut subs: Vec<Arc<SubscriptionShell>> = reg
            .all
            .values()
            .chain(reg.internal.values())
            .cloned()
            .collect();
        subs.sort_by_key(|s| s.id);
        subs
    }

    /// The user's subscriptions (not the internal reply inbox), in id order: what the
    /// snapshot shows and the admin actions may touch.
    pub(crate) fn user_subscriptions(&self) -> Vec<Arc<SubscriptionShell>> {
        self.registry.read().all.values().cloned().collect()
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

impl crate::subscription::handle::Registry for BrokerInner {
    fn unsubscribe(&self, id: SubscriptionId) -> Option<Vec<Arc<Message>>> {
        BrokerInner::unsubscribe(self, id)
    }
}
