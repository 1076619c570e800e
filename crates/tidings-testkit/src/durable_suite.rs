//! The durable cases of the suite: each function is one test, run under every driver
//! ([`DriverUnderTest`], R-EXE-1) against every durable backend ([`DurableTarget`], R-DIST-2).
//!
//! Each case works on a fresh store and a [`ManualClock`] of its own under every driver, so
//! a retry or a message timestamp moves only when the case moves time: a handler held in
//! a one-hour backoff stays held under the threaded drivers too, and the cases assert exact
//! positions, lists and counters, never timings. Waits are bounded (see [`DriverUnderTest::settle`]).
//! Only the public API is used. SPEC ids are named beside the assertions that prove them.
//!
//! # One set-up
//! Every case is one call of the private `case` fixture: it skips a backend that lacks a
//! capability the case needs (naming it), builds the case's rig (a fresh store, its manual
//! clock, a broker with the stream open), runs the case's body, and closes the broker the
//! body ends with, checking nothing was left behind (R-CORE-6). A case body holds only what
//! differs: its messages, its subscriptions and its assertions.
//!
//! # Handler kinds (R-EXE-3)
//! Every case subscribes through the rig (`Rig::subscribe`, or `Rig::subscribe_any` with a
//! handler the rig made), which gives the handler the kind the driver asks for
//! ([`DriverUnderTest::async_handlers`]): a sync handler, or the same function inside an
//! async handler that yields to the runtime first. The
//! `tokio_async` run of [`durable_conformance!`](crate::durable_conformance) makes every
//! assertion of every case — order, retry in place, dead-lettering, the commit rules,
//! conservation, restarts — hold for async handlers on the backend under test, including
//! the decorated one of [`durable_dedup_store`].

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use tidings::*;

use crate::Capabilities;
use crate::driver::DriverUnderTest;
use crate::durable::{CaseOutcome, DurableStore, DurableTarget};
use crate::helpers::text;

/// The stream every case uses, capturing `suite.#`.
const STREAM: &str = "suite";
/// Longer than any case runs: a retry waiting this long waits until the case moves time.
const HOLD: Duration = Duration::from_secs(3600);

/// What a case needs beyond what every backend has: the capability, and what a backend
/// without it cannot do (the reason the case is skipped there).
type Need = (fn(&Capabilities) -> bool, &'static str);

/// Every case's set-up and tear-down, one piece. A backend without a capability the case
/// `needs` skips it, naming the capability. Otherwise: a [`Rig`] (a fresh store, a manual
/// clock of the case's own), a broker on the store with the stream open, then `body` with
/// the rig, its label for failure messages, and the broker. The body hands back the broker
/// it ends with (a restart makes a new one); its subscriptions are dropped as it returns,
/// and that broker is then closed with nothing left behind (R-CORE-6). A case that could
/// not make some checks without a capability ([`Rig::unchecked`]) is reported skipped,
/// naming them.
fn case(
    driver: &dyn DriverUnderTest,
    durable: &dyn DurableTarget,
    needs: &[Need],
    body: impl FnOnce(&Rig<'_>, &str, Broker) -> Broker,
) -> CaseOutcome {
    let caps = durable.caps();
    if let Some((_, lacking)) = needs.iter().find(|(has, _)| !has(&caps)) {
        return CaseOutcome::Skipped(format!("{}: {lacking}", durable.name()));
    }
    let rig = Rig::new(driver, durable);
    let broker = body(&rig, &rig.label, rig.start());
    rig.close_clean(broker);
    let unchecked = std::mem::take(&mut *rig.unchecked.lock());
    if unchecked.is_empty() {
        CaseOutcome::Ran
    } else {
        CaseOutcome::Skipped(format!(
            "{}: not checked without {}",
            durable.name(),
            unchecked.join(", ")
        ))
    }
}

/// One case's setting: a driver, a durable store, a manual clock.
struct Rig<'a> {
    driver: &'a dyn DriverUnderTest,
    store: Box<dyn DurableStore>,
    caps: Capabilities,
    clock: ManualClock,
    label: String,
    /// The capabilities whose checks the case could not make (see [`case`]).
    unchecked: Mutex<Vec<&'static str>>,
}

impl<'a> Rig<'a> {
    fn new(driver: &'a dyn DriverUnderTest, durable: &dyn DurableTarget) -> Self {
        Self {
            driver,
            store: durable.open(),
            caps: durable.caps(),
            clock: ManualClock::new(),
            label: format!("{}/{}", driver.name(), durable.name()),
            unchecked: Mutex::default(),
        }
    }

    /// The case could not check what needs `capability`: it runs the rest, and reports a
    /// skip naming it.
    fn unchecked(&self, capability: &'static str) {
        self.unchecked.lock().push(capability);
    }

    /// A broker on the store (a new one after a restart) with the stream opened.
    fn start(&self) -> Broker {
        let broker = self
            .store
            .attach(self.driver.builder().clock(self.clock.clone()))
            .build()
            .expect("valid configuration");
        self.store
            .create_stream(&broker, STREAM, &["suite.#"])
            .unwrap_or_else(|e| panic!("[{}] create the stream: {e}", self.label));
        broker
    }

    /// Close `broker` (every thread or task it started joined, R-CORE-6) and start a new
    /// one on the same store.
    fn restart(&self, broker: Broker) -> Broker {
        let report = broker.close(Duration::from_secs(10));
        assert!(report.unjoined.is_empty(), "[{}] {report:?}", self.label); // R-CORE-6
        drop(broker);
        self.start()
    }

    /// Close `broker` with nothing left behind: no message undelivered, every thread or
    /// task joined (R-CORE-6).
    fn close_clean(&self, broker: Broker) {
        let report = broker.close(Duration::from_secs(10));
        assert!(report.is_clean(), "[{}] {report:?}", self.label); // R-CORE-6
    }

    /// The offset of the `k`-th message appended to the stream.
    fn off(&self, k: u64) -> u64 {
        self.caps.first_offset + k
    }

    /// Make progress without moving time until `cond` holds (bounded).
    /// The committed position right after a subscribe or seek that set it to `expected`:
    /// exactly that under the manual driver; under a live driver the feeder may already
    /// have delivered and committed more, so at least `expected` and at most `end` (the
    /// case then proves where it resumed by what its handler receives).
    fn assert_position(&self, committed: u64, expected: u64, end: u64, what: &str) {
        if self.driver.is_manual() {
            assert_eq!(committed, expected, "[{}] {what}", self.label); // R-LOG-3, R-LOG-4
        } else {
            assert!(
                (expected..=end).contains(&committed),
                "[{}] {what}: committed {committed}, expected {expected}..={end}",
                self.label
            ); // R-LOG-3, R-LOG-4
        }
    }

    fn settle(&self, broker: &Broker, what: &str, mut cond: impl FnMut() -> bool) {
        self.driver
            .settle(broker, &format!("[{}] {what}", self.label), &mut cond);
    }

    /// Make progress, moving the manual clock on, until `cond` holds (bounded): under the
    /// manual driver by jumping to each next wake-up, under the others by advancing the
    /// clock a second per poll, so retries fall due whenever they were scheduled.
    fn settle_in_time(&self, broker: &Broker, what: &str, mut cond: impl FnMut() -> bool) {
        let clock = self.clock.clone();
        let manual = self.driver.is_manual();
        self.driver
            .settle(broker, &format!("[{}] {what}", self.label), &mut || {
                if cond() {
                    return true;
                }
                if !manual {
                    clock.advance(Duration::from_secs(1));
                }
                false
            });
    }

    /// Publish to `topic`; the stream must capture it.
    fn publish(&self, broker: &Broker, message: MessageBuilder) {
        let report = broker
            .publish(message)
            .unwrap_or_else(|e| panic!("[{}] publish: {e}", self.label));
        assert_eq!(report.streams, [STREAM], "[{}]", self.label); // R-LOG-1
    }

    /// `f` as the kind of handler this run subscribes (R-EXE-3): as it is, or — when the
    /// driver runs the cases with async handlers — inside an async handler that yields to
    /// the runtime before calling it, so every delivery is a future suspended at least once.
    fn handler(
        &self,
        f: impl Fn(&Message) -> Result<(), HandlerError> + Send + Sync + 'static,
    ) -> AnyHandler {
        #[cfg(feature = "tokio")]
        if self.driver.async_handlers() {
            return asynchronous(f).into_handler();
        }
        f.into_handler()
    }

    /// [`Deduplicating::with_store`] around `seen`'s handler, of the kind this run
    /// subscribes (a decorated handler is either kind, R-EXE-3), and how many ids it has
    /// skipped so far.
    fn deduplicating(
        &self,
        seen: &Seen,
        store: &Arc<dyn DedupStore>,
    ) -> (AnyHandler, Box<dyn Fn() -> u64>) {
        #[cfg(feature = "tokio")]
        if self.driver.async_handlers() {
            return deduplicating(asynchronous(seen.handler()), store);
        }
        deduplicating(seen.handler(), store)
    }

    /// Subscribe `f` (as [`Rig::handler`] makes it) to `spec`.
    fn try_subscribe(
        &self,
        broker: &Broker,
        spec: DurableSpec,
        options: SubscribeOptions,
        f: impl Fn(&Message) -> Result<(), HandlerError> + Send + Sync + 'static,
    ) -> Result<DurableSubscription, StreamError> {
        broker.subscribe(spec, options, self.handler(f))
    }

    /// [`Rig::try_subscribe`], which must succeed.
    fn subscribe(
        &self,
        broker: &Broker,
        spec: DurableSpec,
        options: SubscribeOptions,
        f: impl Fn(&Message) -> Result<(), HandlerError> + Send + Sync + 'static,
    ) -> DurableSubscription {
        self.subscribe_any(broker, spec, options, self.handler(f))
    }

    /// Subscribe `handler`, already of the kind this run subscribes (from [`Rig::handler`]
    /// or [`Rig::deduplicating`]), to `spec`; it must succeed.
    fn subscribe_any(
        &self,
        broker: &Broker,
        spec: DurableSpec,
        options: SubscribeOptions,
        handler: AnyHandler,
    ) -> DurableSubscription {
        broker
            .subscribe(spec, options, handler)
            .unwrap_or_else(|e| panic!("[{}] subscribe: {e}", self.label))
    }

    /// Publish `suite.orders` messages `m{i}` keyed `k{i % 4}` for `range`.
    fn publish_range(&self, broker: &Broker, range: std::ops::Range<u64>) {
        for i in range {
            self.publish(
                broker,
                Message::to("suite.orders")
                    .key(format!("k{}", i % 4))
                    .payload(format!("m{i}")),
            );
        }
    }
}

/// `f` inside an async handler that yields to the runtime before calling it: every
/// delivery is a future suspended at least once, so the tokio driver's async path runs
/// (its await, its report after it), not a future that is ready at once.
#[cfg(feature = "tokio")]
fn asynchronous(
    f: impl Fn(&Message) -> Result<(), HandlerError> + Send + Sync + 'static,
) -> impl AsyncHandler {
    let f = Arc::new(f);
    move |m: Arc<Message>| {
        let f = Arc::clone(&f);
        async move {
            tokio::task::yield_now().await;
            f(&m)
        }
    }
}

/// [`Deduplicating::with_store`] around `handler` (sync or async), subscribable, and how
/// many ids it has skipped so far.
fn deduplicating<H, K>(
    handler: H,
    store: &Arc<dyn DedupStore>,
) -> (AnyHandler, Box<dyn Fn() -> u64>)
where
    H: Send + Sync + 'static,
    K: ?Sized,
    Arc<Deduplicating<H, dyn DedupStore>>: IntoHandler<K>,
{
    let dedup = Arc::new(Deduplicating::with_store(handler, Arc::clone(store)));
    (
        Arc::clone(&dedup).into_handler(),
        Box::new(move || dedup.skipped()),
    )
}

/// The spec of the durable subscription `name` on the suite's stream, from its earliest
/// message unless a start is given.
fn spec(name: impl Into<String>) -> DurableSpec {
    DurableSpec::new(STREAM).name(name)
}

/// Records `(offset, payload)` of every handler call that succeeded, in order.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(u64, String)>>>);

impl Seen {
    fn record(&self, m: &Message) {
        let offset = m.offset().expect("durable messages carry their offset");
        self.0.lock().push((offset, text(m)));
    }
    fn handler(&self) -> impl Fn(&Message) -> Result<(), HandlerError> + Send + Sync + 'static {
        let me = self.clone();
        move |m: &Message| {
            me.record(m);
            Ok(())
        }
    }
    /// Fails the first attempt of the message `payload` (retryably, so it waits for its
    /// retry) and records every success.
    fn holding_first(
        &self,
        payload: &'static str,
    ) -> impl Fn(&Message) -> Result<(), HandlerError> + Send + Sync + 'static {
        let me = self.clone();
        let failed = AtomicBool::new(false);
        move |m: &Message| {
            if text(m) == payload && !failed.swap(true, Ordering::SeqCst) {
                return Err(HandlerError::retry("held"));
            }
            me.record(m);
            Ok(())
        }
    }
    fn len(&self) -> usize {
        self.0.lock().len()
    }
    fn payloads(&self) -> Vec<String> {
        self.0.lock().iter().map(|(_, p)| p.clone()).collect()
    }
    fn offsets(&self) -> Vec<u64> {
        self.0.lock().iter().map(|(o, _)| *o).collect()
    }
}

fn names(range: std::ops::Range<u64>) -> Vec<String> {
    range.map(|i| format!("m{i}")).collect()
}

fn dlq_payloads(d: &DurableSubscription) -> Vec<String> {
    d.durable_dead_letters()
        .expect("the durable DLQ reads")
        .iter()
        .map(|e| text(&e.message))
        .collect()
}

/// Resume after a restart at the committed position (R-LOG-3): a message held in retry
/// keeps the commit below it while later keys finish; after the restart the subscription
/// starts exactly at the commit, nothing is lost, and the only duplicates are messages
/// finished above the commit.
pub fn resume_after_restart(b: &dyn DriverUnderTest, d: &dyn DurableTarget) -> CaseOutcome {
    case(b, d, &[], |rig, l, broker| {
        rig.publish_range(&broker, 0..20);
        let opts = || {
            SubscribeOptions::new()
                .capacity(32)
                .concurrency(Concurrency::PerKey { max_in_flight: 4 })
                .retry(Retry::fixed(HOLD, 1_000))
        };
        let run1 = Seen::default();
        let r1 = run1.clone();
        let sub = rig.subscribe(&broker, spec("resume"), opts(), move |m: &Message| {
            if text(m) == "m8" {
                return Err(HandlerError::retry("held"));
            }
            r1.record(m);
            Ok(())
        });
        // m8 (key k0) waits an hour to retry; m12 and m16 (k0) wait behind it (R-ORD-3); every
        // other key finishes. The commit stops at m8, the lowest unfinished.
        let finished: Vec<u64> = (0..20).filter(|i| ![8, 12, 16].contains(i)).collect();
        rig.settle(
            &broker,
            "all but key k0 from m8 finished, commit at m8",
            || run1.len() == finished.len() && sub.committed() == rig.off(8),
        );
        assert_eq!(sub.stats().failures, 1, "[{l}]");
        assert_eq!(sub.lag(), 12, "[{l}]"); // R-BP-3
        let mut got = run1.offsets();
        got.sort_unstable();
        let want: Vec<u64> = finished.iter().map(|&i| rig.off(i)).collect();
        assert_eq!(got, want, "[{l}]");
        drop(sub);
        let broker = rig.restart(broker);

        // The same name resumes at the commit; its start position is ignored (R-LOG-3).
        let run2 = Seen::default();
        let sub = rig.subscribe(
            &broker,
            spec("resume").start(StartAt::Latest),
            opts(),
            run2.handler(),
        );
        rig.assert_position(
            sub.committed(),
            rig.off(8),
            rig.off(20),
            "resumed elsewhere",
        );
        // A low-watermark commit redelivers every offset from it on; a commit per message
        // only the unfinished (m8, m12, m16).
        let rest: Vec<u64> = if rig.caps.contiguous_commit {
            (8..20).map(|i| rig.off(i)).collect()
        } else {
            [8, 12, 16].iter().map(|&i| rig.off(i)).collect()
        };
        rig.settle(&broker, "the rest after restart", || {
            run2.len() == rest.len() && sub.committed() == rig.off(20)
        });
        let mut again = run2.offsets();
        again.sort_unstable();
        // Exactly those: nothing below the commit twice (R-LOG-3) ...
        assert_eq!(again, rest, "[{l}]");
        // ... nothing lost: both runs together handled every message (R-LOG-3) ...
        let all: BTreeSet<u64> = run1.offsets().into_iter().chain(again).collect();
        assert_eq!(all.len(), 20, "[{l}] a message was lost"); // R-LOG-3
        // ... and the duplicates are only messages finished above the commit (R-LOG-3).
        let dup: BTreeSet<u64> = run1
            .offsets()
            .into_iter()
            .filter(|o| rest.contains(o))
            .collect();
        assert!(dup.iter().all(|&o| o > rig.off(8)), "[{l}] {dup:?}");
        // Per-key order holds in the second run (R-ORD-3).
        let mut per_key: HashMap<u64, Vec<u64>> = HashMap::new();
        for o in run2.offsets() {
            per_key.entry(o % 4).or_default().push(o);
        }
        for (k, v) in &per_key {
            assert!(v.is_sorted(), "[{l}] key {k} out of order: {v:?}"); // R-ORD-3
        }
        assert_eq!(sub.lag(), 0, "[{l}]"); // R-BP-3
        assert!(sub.stats().is_conserved(), "[{l}]"); // R-DEL-6
        broker
    })
}

/// Replay by offset (R-LOG-4): new subscriptions from `Offset`, `Earliest` and `Latest`,
/// then `seek` to an offset, the latest and the earliest; a position outside the stream is
/// a typed error that changes nothing.
pub fn replay_by_offset(b: &dyn DriverUnderTest, d: &dyn DurableTarget) -> CaseOutcome {
    case(b, d, &[], |rig, l, broker| {
        rig.publish_range(&broker, 0..10);
        let sub = |name: &str, at: StartAt, seen: &Seen| {
            rig.subscribe(
                &broker,
                spec(name).start(at),
                Default::default(),
                seen.handler(),
            )
        };
        let (early, mid, late) = (Seen::default(), Seen::default(), Seen::default());
        let e = sub("from-earliest", StartAt::Earliest, &early);
        let m = sub("from-offset", StartAt::Offset(rig.off(4)), &mid);
        let t = sub("from-latest", StartAt::Latest, &late);
        assert_eq!(t.committed(), rig.off(10), "[{l}]"); // R-LOG-4: latest is the end
        assert!(matches!(
            rig.try_subscribe(
                &broker,
                spec("too-far").start(StartAt::Offset(rig.off(11))),
                Default::default(),
                |_: &Message| Ok(())
            ),
            Err(StreamError::BeyondEnd { .. })
        )); // R-LOG-4
        rig.settle(&broker, "replayed from earliest and offset", || {
            early.len() == 10 && mid.len() == 6 && m.committed() == rig.off(10)
        });
        rig.publish_range(&broker, 10..12);
        rig.settle(&broker, "new messages reach all three", || {
            early.len() == 12 && mid.len() == 8 && late.len() == 2
        });
        assert_eq!(early.payloads(), names(0..12), "[{l}]"); // R-LOG-4, R-LOG-3
        assert_eq!(mid.payloads(), names(4..12), "[{l}]"); // R-LOG-4
        assert_eq!(late.payloads(), names(10..12), "[{l}]"); // R-LOG-4
        let off: Vec<u64> = (4..12).map(|i| rig.off(i)).collect();
        assert_eq!(mid.offsets(), off, "[{l}]"); // R-LOG-4: offsets are the stream's

        // seek to an offset: everything from it again, and the commit moves with it.
        rig.settle(&broker, "earliest committed to the end", || {
            e.committed() == rig.off(12)
        });
        assert_eq!(e.seek(StartAt::Offset(rig.off(3))).unwrap(), rig.off(3)); // R-LOG-4
        rig.assert_position(e.committed(), rig.off(3), rig.off(12), "committed at once");
        rig.settle(&broker, "replayed after seek to offset", || {
            early.len() == 21 && e.committed() == rig.off(12)
        });
        assert_eq!(early.payloads()[12..], names(3..12), "[{l}]"); // R-LOG-4
        // A seek outside the stream is refused and moves nothing.
        assert!(matches!(
            e.seek(StartAt::Offset(rig.off(13))),
            Err(StreamError::BeyondEnd { .. })
        )); // R-LOG-4
        assert_eq!(e.committed(), rig.off(12), "[{l}]");
        // seek to the latest: only what is published from now on.
        assert_eq!(e.seek(StartAt::Latest).unwrap(), rig.off(12)); // R-LOG-4
        rig.publish_range(&broker, 12..13);
        rig.settle(&broker, "after seek to latest", || early.len() == 22);
        // seek to the earliest: everything again.
        assert_eq!(e.seek(StartAt::Earliest).unwrap(), rig.off(0)); // R-LOG-4
        rig.settle(&broker, "after seek to earliest", || {
            early.len() == 35 && e.committed() == rig.off(13)
        });
        assert_eq!(
            early.payloads()[21..],
            names(12..13)
                .into_iter()
                .chain(names(0..13))
                .collect::<Vec<_>>(),
            "[{l}]"
        ); // R-LOG-4
        for s in [&e, &m, &t] {
            rig.settle(&broker, "every subscription caught up", || {
                s.committed() == rig.off(13)
            });
            assert_eq!(s.lag(), 0, "[{l}]"); // R-BP-3
            assert!(s.stats().is_conserved(), "[{l}]"); // R-DEL-6
        }
        broker
    })
}

/// Replay by time (R-LOG-4): messages published a second apart on the manual clock; a
/// subscription or a `seek` at a time starts at the first message at or after it.
/// Needs [`Capabilities::manual_time`].
pub fn replay_by_time(b: &dyn DriverUnderTest, d: &dyn DurableTarget) -> CaseOutcome {
    let needs: &[Need] = &[(
        |c| c.manual_time,
        "stored messages are not stamped with the broker's clock (manual_time)",
    )];
    case(b, d, needs, |rig, l, broker| {
        let before = rig.clock.wall();
        let mut at = Vec::new();
        for i in 0..10 {
            rig.clock.advance(Duration::from_secs(1));
            at.push(rig.clock.wall());
            rig.publish_range(&broker, i..i + 1);
        }
        let sub = |name: &str, when: SystemTime, seen: &Seen| {
            rig.subscribe(
                &broker,
                spec(name).start(StartAt::Time(when)),
                Default::default(),
                seen.handler(),
            )
        };
        let (exact, between) = (Seen::default(), Seen::default());
        let (first, after) = (Seen::default(), Seen::default());
        let a = sub("at-t5", at[5], &exact);
        let bt = sub(
            "between-t5-t6",
            at[5] + Duration::from_millis(500),
            &between,
        );
        let c = sub("before-all", before, &first);
        let z = sub("after-all", at[9] + Duration::from_secs(1), &after);
        assert_eq!(z.committed(), rig.off(10), "[{l}]"); // R-LOG-4: past the last is the end
        rig.settle(&broker, "replayed by time", || {
            exact.len() == 5 && between.len() == 4 && first.len() == 10
        });
        assert_eq!(exact.payloads(), names(5..10), "[{l}]"); // R-LOG-4: at or after
        assert_eq!(between.payloads(), names(6..10), "[{l}]"); // R-LOG-4
        assert_eq!(first.payloads(), names(0..10), "[{l}]"); // R-LOG-4
        rig.settle(&broker, "committed to the end", || {
            c.committed() == rig.off(10)
        });
        // seek by time: from the first message at or after t2, again.
        assert_eq!(c.seek(StartAt::Time(at[2])).unwrap(), rig.off(2)); // R-LOG-4
        rig.settle(&broker, "replayed after seek by time", || first.len() == 18);
        assert_eq!(first.payloads()[10..], names(2..10), "[{l}]"); // R-LOG-4
        rig.clock.advance(Duration::from_secs(1));
        rig.publish_range(&broker, 10..11);
        rig.settle(&broker, "a later message reaches the one after all", || {
            after.len() == 1
        });
        assert_eq!(after.payloads(), names(10..11), "[{l}]"); // R-LOG-4
        for s in [&a, &bt, &c, &z] {
            rig.settle(&broker, "every subscription caught up", || {
                s.committed() == rig.off(11)
            });
            assert!(s.stats().is_conserved(), "[{l}]"); // R-DEL-6
        }
        broker
    })
}

/// The durable DLQ keeps reasons (R-DEL-4): a rejected message is dead-lettered after one
/// attempt with `Rejected`, a failing one after its retries with `RetriesExhausted` and the
/// attempts and last error; the commit passes both (R-LOG-3); the entries survive a
/// restart and are not redelivered.
pub fn durable_dlq_reasons(b: &dyn DriverUnderTest, d: &dyn DurableTarget) -> CaseOutcome {
    case(b, d, &[], |rig, l, broker| {
        for p in ["ok-0", "rej-1", "dead-2", "ok-3", "rej-4"] {
            rig.publish(&broker, Message::to("suite.orders").payload(p));
        }
        let expired = Message::to("suite.orders")
            .payload("exp-5")
            .expires_at(SystemTime::UNIX_EPOCH);
        rig.publish(&broker, expired);
        let seen = Seen::default();
        let tries: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
        let (s, t) = (seen.clone(), tries.clone());
        let handler = move |m: &Message| {
            let p = text(m);
            let n = {
                let mut t = t.lock();
                let n = t.entry(p.clone()).or_insert(0);
                *n += 1;
                *n
            };
            if p.starts_with("rej") {
                return Err(HandlerError::reject("bad input"));
            }
            if p.starts_with("dead") {
                return Err(HandlerError::retry(format!("down {n}")));
            }
            s.record(m);
            Ok(())
        };
        let sub = rig.subscribe(
            &broker,
            spec("dlq"),
            SubscribeOptions::new().retry(Retry::fixed(Duration::from_secs(1), 3)),
            handler,
        );
        rig.settle_in_time(&broker, "two delivered, four dead-lettered", || {
            let st = sub.stats();
            st.delivered == 2
                && st.dead_lettered.rejected == 2
                && st.dead_lettered.retries_exhausted == 1
                && st.dead_lettered.expired == 1
                && sub.committed() == rig.off(6)
        });
        let rejected = DeadLetterReason::Rejected {
            error: "bad input".into(),
        };
        let exhausted = DeadLetterReason::RetriesExhausted {
            attempts: 3,
            last_error: "down 3".into(),
        };
        let check = |sub: &DurableSubscription| {
            let dl = sub.durable_dead_letters().unwrap();
            let got: Vec<(String, DeadLetterReason, u32, Option<u64>)> = dl
                .iter()
                .map(|e| {
                    (
                        text(&e.message),
                        e.reason.clone(),
                        e.attempts,
                        e.message.offset(),
                    )
                })
                .collect();
            let want = vec![
                ("rej-1".into(), rejected.clone(), 1, Some(rig.off(1))),
                ("dead-2".into(), exhausted.clone(), 3, Some(rig.off(2))),
                ("rej-4".into(), rejected.clone(), 1, Some(rig.off(4))),
                (
                    "exp-5".into(),
                    DeadLetterReason::Expired,
                    0,
                    Some(rig.off(5)),
                ),
            ];
            assert_eq!(got, want, "[{l}]"); // R-DEL-4, R-DEL-1
        };
        check(&sub);
        assert_eq!(tries.lock()["dead-2"], 3, "[{l}]"); // R-DEL-3
        assert_eq!(seen.payloads(), ["ok-0", "ok-3"], "[{l}]");
        assert_eq!(sub.lag(), 0, "[{l}]"); // R-LOG-3: dead-lettered counts as finished
        assert!(sub.stats().is_conserved(), "[{l}]"); // R-DEL-6
        drop(sub);
        let broker = rig.restart(broker);
        let sub = rig.subscribe(&broker, spec("dlq"), Default::default(), seen.handler());
        assert_eq!(sub.committed(), rig.off(6), "[{l}]"); // R-LOG-3: nothing to redeliver
        check(&sub); // R-DEL-4: durable across restarts
        rig.publish(&broker, Message::to("suite.orders").payload("ok-6"));
        rig.settle(&broker, "after restart", || {
            seen.len() == 3 && sub.committed() == rig.off(7)
        });
        assert_eq!(seen.payloads(), ["ok-0", "ok-3", "ok-6"], "[{l}]"); // R-LOG-3
        broker
    })
}

/// Redrive and drain of the durable DLQ (R-DEL-4): the selected entries are appended again
/// for this subscription only, delivered, and leave the DLQ; the rest stays across a
/// restart; one redriven while still refused comes back at its new offset; the drain
/// empties the DLQ durably.
pub fn durable_dlq_redrive_and_drain(
    b: &dyn DriverUnderTest,
    d: &dyn DurableTarget,
) -> CaseOutcome {
    case(b, d, &[], |rig, l, broker| {
        for p in ["bad-0", "ok-1", "bad-2", "bad-3"] {
            rig.publish(&broker, Message::to("suite.orders").payload(p));
        }
        let failing = Arc::new(AtomicBool::new(true));
        let seen = Seen::default();
        let handler = |failing: &Arc<AtomicBool>, seen: &Seen| {
            let (f, s) = (failing.clone(), seen.clone());
            move |m: &Message| {
                if f.load(Ordering::SeqCst) && text(m).starts_with("bad") {
                    return Err(HandlerError::reject("refused"));
                }
                s.record(m);
                Ok(())
            }
        };
        let sub = rig.subscribe(
            &broker,
            spec("redrive"),
            Default::default(),
            handler(&failing, &seen),
        );
        let other_seen = Seen::default();
        let other = rig.subscribe(
            &broker,
            spec("other"),
            Default::default(),
            other_seen.handler(),
        );
        rig.settle(&broker, "three rejected", || {
            sub.stats().dead_lettered.rejected == 3 && sub.committed() == rig.off(4)
        });
        assert_eq!(dlq_payloads(&sub), ["bad-0", "bad-2", "bad-3"], "[{l}]"); // R-DEL-4
        failing.store(false, Ordering::SeqCst);
        let n = sub
            .redrive_durable_dead_letters(|e| text(&e.message) != "bad-3")
            .unwrap();
        assert_eq!(n, 2, "[{l}]"); // R-DEL-4
        assert_eq!(dlq_payloads(&sub), ["bad-3"], "[{l}]"); // R-DEL-4: redriven entries left
        rig.settle(&broker, "redriven delivered", || {
            seen.len() == 3 && sub.committed() == rig.off(6)
        });
        assert_eq!(seen.payloads(), ["ok-1", "bad-0", "bad-2"], "[{l}]"); // R-DEL-4
        // The copies are for this subscription: another one of the stream passes them by.
        rig.settle(&broker, "the other subscription passes the copies", || {
            other.committed() == rig.off(6)
        });
        assert_eq!(other_seen.len(), 4, "[{l}]"); // R-DEL-4
        assert_eq!((sub.lag(), other.lag()), (0, 0), "[{l}]"); // R-BP-3
        assert!(sub.stats().is_conserved(), "[{l}]"); // R-DEL-6
        drop((sub, other));

        let broker = rig.restart(broker);
        let sub = rig.subscribe(
            &broker,
            spec("redrive"),
            Default::default(),
            handler(&failing, &seen),
        );
        assert_eq!(sub.committed(), rig.off(6), "[{l}]"); // R-LOG-3: nothing redelivered
        assert_eq!(dlq_payloads(&sub), ["bad-3"], "[{l}]"); // R-DEL-4: durable
        // Redriven while its handler still refuses it, it comes back, from its new offset.
        failing.store(true, Ordering::SeqCst);
        assert_eq!(
            sub.redrive_durable_dead_letters(|_| true).unwrap(),
            1,
            "[{l}]"
        ); // R-DEL-4
        rig.settle(&broker, "the redriven one dead-lettered again", || {
            sub.stats().dead_lettered.rejected == 1 && sub.committed() == rig.off(7)
        });
        let drained = sub.drain_durable_dead_letters().unwrap();
        let drained: Vec<(String, Option<u64>)> = drained
            .iter()
            .map(|e| (text(&e.message), e.message.offset()))
            .collect();
        assert_eq!(drained, [("bad-3".to_owned(), Some(rig.off(6)))], "[{l}]"); // R-DEL-4
        assert!(dlq_payloads(&sub).is_empty(), "[{l}]"); // R-DEL-4
        drop(sub);
        let broker = rig.restart(broker);
        let sub = rig.subscribe(
            &broker,
            spec("redrive"),
            Default::default(),
            handler(&failing, &seen),
        );
        assert!(dlq_payloads(&sub).is_empty(), "[{l}]"); // R-DEL-4: the drain is durable
        assert_eq!(seen.len(), 3, "[{l}]");
        broker
    })
}

/// A slow durable consumer never overflows (R-BP-2): while its first message waits an hour
/// to retry, publishing goes on, nothing is refused, at most `capacity` messages are
/// outstanding and the lag grows exactly (R-BP-3); once time moves, it catches up in order
/// and the lag reaches 0.
pub fn lag_and_slow_consumer(b: &dyn DriverUnderTest, d: &dyn DurableTarget) -> CaseOutcome {
    const CAPACITY: usize = 4;
    case(b, d, &[], |rig, l, broker| {
        rig.publish_range(&broker, 0..12);
        let seen = Seen::default();
        let sub = rig.subscribe(
            &broker,
            spec("slow"),
            SubscribeOptions::new()
                .capacity(CAPACITY)
                .retry(Retry::fixed(HOLD, 2)),
            seen.holding_first("m0"),
        );
        rig.settle(&broker, "the window is full behind m0", || {
            sub.stats().failures == 1 && sub.outstanding() >= CAPACITY
        });
        assert_eq!(sub.outstanding(), CAPACITY, "[{l}]"); // R-BP-2: the window, no more
        assert_eq!(sub.lag(), 12, "[{l}]"); // R-BP-3
        assert_eq!(sub.committed(), rig.off(0), "[{l}]");
        for i in 12..52 {
            rig.publish_range(&broker, i..i + 1); // never refused, never blocks (R-BP-2)
            assert!(sub.outstanding() <= CAPACITY, "[{l}]"); // R-BP-2
        }
        // The lag is read from the cursor's snapshot, which a remote backend refreshes
        // within its stated bound (`BackendCursor::state`): settled, not read at once.
        rig.settle(&broker, "still held, the lag counting every append", || {
            sub.outstanding() >= CAPACITY && sub.lag() == 52
        });
        assert_eq!(sub.outstanding(), CAPACITY, "[{l}]"); // R-BP-2
        assert_eq!(sub.lag(), 52, "[{l}]"); // R-BP-2, R-BP-3: it only falls behind
        assert_eq!(seen.len(), 0, "[{l}]");
        let st = sub.stats();
        assert_eq!(st.refused, RefusedCounts::default(), "[{l}]"); // R-BP-2: no overflow
        rig.clock.advance(HOLD);
        rig.settle(&broker, "caught up", || {
            seen.len() == 52 && sub.committed() == rig.off(52)
        });
        assert_eq!(seen.payloads(), names(0..52), "[{l}]"); // R-BP-2, R-ORD-1
        assert_eq!(sub.lag(), 0, "[{l}]"); // R-BP-3
        let st = sub.stats();
        assert_eq!(st.refused, RefusedCounts::default(), "[{l}]"); // R-BP-2
        assert_eq!(st.delivered, 52, "[{l}]");
        assert!(st.is_conserved(), "[{l}]"); // R-DEL-6
        broker
    })
}

/// A durable subscription's filter pattern has the AMQP topic semantics (R-RT-1): `*` is
/// one word, `#` zero or more anywhere; messages it filters out are finished (the commit
/// passes them).
pub fn durable_filter(b: &dyn DriverUnderTest, d: &dyn DurableTarget) -> CaseOutcome {
    case(b, d, &[], |rig, l, broker| {
        let topics = [
            "suite.a.x",
            "suite.a.x.y.z",
            "suite.a.b.x",
            "suite.x",
            "suite.b.x.q",
            "suite.end",
            "suite.a.b.end",
            "suite.end.no",
            "suite.a.end",
        ];
        let (star, mid) = (Seen::default(), Seen::default());
        let s1 = rig.subscribe(
            &broker,
            spec("star").filter("suite.*.x.#"),
            Default::default(),
            star.handler(),
        );
        let s2 = rig.subscribe(
            &broker,
            spec("mid").filter("suite.#.end"),
            Default::default(),
            mid.handler(),
        );
        for t in topics {
            rig.publish(&broker, Message::to(t).payload(t));
        }
        assert!(
            broker
                .publish(Message::to("other.a.x"))
                .unwrap()
                .streams
                .is_empty()
        ); // R-LOG-1: not captured
        let n = topics.len() as u64;
        rig.settle(&broker, "both filters passed the whole stream", || {
            s1.committed() == rig.off(n) && s2.committed() == rig.off(n)
        });
        // R-RT-1: `#` matches zero words at the end and in the middle.
        assert_eq!(
            star.payloads(),
            ["suite.a.x", "suite.a.x.y.z", "suite.b.x.q"],
            "[{l}]"
        ); // R-RT-1
        assert_eq!(
            mid.payloads(),
            ["suite.end", "suite.a.b.end", "suite.a.end"],
            "[{l}]"
        ); // R-RT-1
        for s in [&s1, &s2] {
            assert_eq!(s.lag(), 0, "[{l}]"); // R-BP-3
            assert!(s.stats().is_conserved(), "[{l}]"); // R-DEL-6
        }
        broker
    })
}

/// Every field of a message survives the stream (R-CORE-4, R-LOG-1): key, headers,
/// correlation id, payload, the publish time on the manual clock (with
/// [`Capabilities::manual_time`]) and priority (with [`Capabilities::priority`]); its offset
/// is the stream's.
pub fn durable_message_fields(b: &dyn DriverUnderTest, d: &dyn DurableTarget) -> CaseOutcome {
    case(b, d, &[], |rig, l, broker| {
        let mut message = Message::to("suite.fields")
            .key("k-1")
            .header("h", "v")
            .correlation_id("c-1")
            .payload("p");
        if rig.caps.priority {
            message = message.priority(Priority::High);
        }
        rig.publish(&broker, message);
        let got: Arc<Mutex<Option<Message>>> = Arc::default();
        let g = got.clone();
        let _sub = rig.subscribe(
            &broker,
            spec("fields"),
            Default::default(),
            move |m: &Message| {
                *g.lock() = Some(m.clone());
                Ok(())
            },
        );
        rig.settle(&broker, "the message arrived", || got.lock().is_some());
        let m = got.lock().clone().expect("received");
        assert_eq!(m.key(), Some(&b"k-1"[..]), "[{l}]"); // R-CORE-4
        assert_eq!(m.header("h"), Some("v"), "[{l}]"); // R-CORE-4
        assert_eq!(m.correlation_id(), Some("c-1"), "[{l}]"); // R-CORE-4
        assert_eq!(m.payload(), "p", "[{l}]"); // R-CORE-4
        assert_eq!(m.offset(), Some(rig.off(0)), "[{l}]"); // R-LOG-1
        if rig.caps.manual_time {
            assert_eq!(m.timestamp(), rig.clock.wall(), "[{l}]"); // R-CORE-4, R-TIME-3
        } else {
            rig.unchecked("manual_time");
        }
        if rig.caps.priority {
            assert_eq!(m.priority(), Priority::High, "[{l}]"); // R-CORE-4
        } else {
            rig.unchecked("priority");
        }
        broker
    })
}

/// Many durable subscriptions on one stream, more than any driver has workers, one of them
/// held an hour in retry: every other one receives the whole stream and commits to its end
/// without waiting for the held one (R-EXE-1, R-CORE-1: a durable feeder holds no worker
/// while it waits), and the held one catches up once time moves (R-BP-2).
pub fn many_durables_progress(b: &dyn DriverUnderTest, d: &dyn DurableTarget) -> CaseOutcome {
    const SUBS: usize = 8;
    const N: u64 = 12;
    case(b, d, &[], |rig, l, broker| {
        rig.publish_range(&broker, 0..N / 2);
        let held = Seen::default();
        let slow = rig.subscribe(
            &broker,
            spec("held"),
            SubscribeOptions::new()
                .capacity(2)
                .retry(Retry::fixed(HOLD, 2)),
            held.holding_first("m0"),
        );
        let subs: Vec<(Seen, DurableSubscription)> = (0..SUBS)
            .map(|i| {
                let seen = Seen::default();
                let sub = rig.subscribe(
                    &broker,
                    spec(format!("d{i}")),
                    SubscribeOptions::new().capacity(2),
                    seen.handler(),
                );
                (seen, sub)
            })
            .collect();
        rig.publish_range(&broker, N / 2..N);
        rig.settle(
            &broker,
            "every free subscription has the whole stream",
            || {
                subs.iter()
                    .all(|(seen, sub)| seen.len() == N as usize && sub.committed() == rig.off(N))
            },
        );
        for (seen, sub) in &subs {
            assert_eq!(seen.payloads(), names(0..N), "[{l}]"); // R-EXE-1, R-LOG-3
            assert_eq!(sub.lag(), 0, "[{l}]"); // R-BP-3
        }
        // The held one has not moved past m0, and its window is its capacity (R-BP-2).
        assert_eq!(held.len(), 0, "[{l}]");
        // Its lag from its cursor's snapshot, refreshed within the backend's stated bound.
        rig.settle(&broker, "the held one's lag counts every append", || {
            slow.lag() == N
        });
        assert_eq!(slow.committed(), rig.off(0), "[{l}]");
        assert_eq!(slow.lag(), N, "[{l}]"); // R-BP-3
        assert!(slow.outstanding() <= 2, "[{l}]"); // R-BP-2
        rig.clock.advance(HOLD);
        rig.settle(&broker, "the held one caught up", || {
            held.len() == N as usize && slow.committed() == rig.off(N)
        });
        assert_eq!(held.payloads(), names(0..N), "[{l}]"); // R-ORD-1, R-LOG-3
        assert!(slow.stats().is_conserved(), "[{l}]"); // R-DEL-6
        broker
    })
}

/// A `seek` while messages are outstanding (R-LOG-4): the position and the commit move at
/// once, the messages already offered are still delivered, in order, and they no longer
/// hold the commit back; nothing between them and the new position is read.
pub fn seek_while_outstanding(b: &dyn DriverUnderTest, d: &dyn DurableTarget) -> CaseOutcome {
    const CAPACITY: usize = 4;
    case(b, d, &[], |rig, l, broker| {
        rig.publish_range(&broker, 0..10);
        let seen = Seen::default();
        let sub = rig.subscribe(
            &broker,
            spec("seeker"),
            SubscribeOptions::new()
                .capacity(CAPACITY)
                .retry(Retry::fixed(HOLD, 2)),
            seen.holding_first("m0"),
        );
        rig.settle(&broker, "the window is full behind m0", || {
            sub.stats().failures == 1 && sub.outstanding() >= CAPACITY
        });
        assert_eq!(sub.committed(), rig.off(0), "[{l}]");
        assert_eq!(sub.seek(StartAt::Latest).unwrap(), rig.off(10)); // R-LOG-4
        assert_eq!(
            (sub.committed(), sub.position(), sub.lag()),
            (rig.off(10), rig.off(10), 0),
            "[{l}]"
        ); // R-LOG-4: committed at once
        rig.publish_range(&broker, 10..12);
        rig.clock.advance(HOLD);
        rig.settle(&broker, "the offered ones and the new ones", || {
            seen.len() == CAPACITY + 2 && sub.committed() == rig.off(12)
        });
        let want: Vec<String> = names(0..CAPACITY as u64)
            .into_iter()
            .chain(names(10..12))
            .collect();
        assert_eq!(seen.payloads(), want, "[{l}]"); // R-LOG-4: m4..m9 skipped
        assert_eq!(sub.lag(), 0, "[{l}]"); // R-BP-3
        assert!(sub.stats().is_conserved(), "[{l}]"); // R-DEL-6
        broker
    })
}

/// A delayed message in a stream (R-TIME-2 on a durable source): the messages after it are
/// delivered at once, the delayed one when the manual clock reaches it; until then it holds
/// the commit (the lowest unfinished offset, R-LOG-3), then the commit passes everything.
pub fn delayed_durable_message(b: &dyn DriverUnderTest, d: &dyn DurableTarget) -> CaseOutcome {
    case(b, d, &[], |rig, l, broker| {
        let late = Message::to("suite.orders")
            .payload("late")
            .delay(Duration::from_secs(60));
        rig.publish(&broker, late);
        rig.publish(&broker, Message::to("suite.orders").payload("now"));
        let seen = Seen::default();
        let sub = rig.subscribe(&broker, spec("delayed"), Default::default(), seen.handler());
        rig.settle(&broker, "the immediate one", || {
            seen.len() == 1 && sub.outstanding() == 1
        });
        assert_eq!(seen.payloads(), ["now"], "[{l}]"); // R-TIME-2
        assert_eq!(sub.committed(), rig.off(0), "[{l}]"); // R-LOG-3: held by the delayed one
        rig.clock.advance(Duration::from_secs(60));
        rig.settle(&broker, "the delayed one when due", || {
            seen.len() == 2 && sub.committed() == rig.off(2)
        });
        assert_eq!(seen.payloads(), ["now", "late"], "[{l}]"); // R-TIME-2
        assert_eq!(sub.lag(), 0, "[{l}]"); // R-BP-3
        assert!(sub.stats().is_conserved(), "[{l}]"); // R-DEL-6
        broker
    })
}

/// Dropping a durable subscription and subscribing again under the same name in the same
/// broker resumes at the commit (R-LOG-3); while one is live, a second is refused with a
/// typed error.
pub fn resubscribe_resumes(b: &dyn DriverUnderTest, d: &dyn DurableTarget) -> CaseOutcome {
    case(b, d, &[], |rig, l, broker| {
        rig.publish_range(&broker, 0..5);
        let seen = Seen::default();
        let subscribe = |at: StartAt| {
            rig.try_subscribe(
                &broker,
                spec("again").start(at),
                Default::default(),
                seen.handler(),
            )
        };
        let sub = subscribe(StartAt::Earliest).unwrap();
        assert!(matches!(
            subscribe(StartAt::Earliest),
            Err(StreamError::DurableInUse { .. })
        ));
        rig.settle(&broker, "the first five", || {
            seen.len() == 5 && sub.committed() == rig.off(5)
        });
        drop(sub);
        rig.publish_range(&broker, 5..8);
        let sub = subscribe(StartAt::Earliest).unwrap();
        // R-LOG-3: its start is ignored; it resumes at the commit.
        rig.assert_position(sub.committed(), rig.off(5), rig.off(8), "resubscribed");
        rig.settle(&broker, "only the new ones", || {
            seen.len() == 8 && sub.committed() == rig.off(8)
        });
        assert_eq!(seen.payloads(), names(0..8), "[{l}]"); // R-LOG-3: none twice, none lost
        assert!(sub.stats().is_conserved(), "[{l}]"); // R-DEL-6
        broker
    })
}

/// A `seek` past messages still outstanding is durable (R-LOG-4, R-LOG-3): after a restart
/// before they finish, the subscription resumes at the sought position, not below it.
pub fn seek_survives_restart(b: &dyn DriverUnderTest, d: &dyn DurableTarget) -> CaseOutcome {
    case(b, d, &[], |rig, l, broker| {
        rig.publish_range(&broker, 0..10);
        let sub = rig.subscribe(
            &broker,
            spec("seek-restart"),
            SubscribeOptions::new()
                .capacity(4)
                .retry(Retry::fixed(HOLD, 2)),
            |_m: &Message| Err(HandlerError::retry("held")),
        );
        rig.settle(&broker, "m0 held", || sub.stats().failures == 1);
        assert_eq!(sub.seek(StartAt::Offset(rig.off(7))).unwrap(), rig.off(7)); // R-LOG-4
        drop(sub);
        let broker = rig.restart(broker);
        let seen = Seen::default();
        let sub = rig.subscribe(
            &broker,
            spec("seek-restart"),
            Default::default(),
            seen.handler(),
        );
        rig.assert_position(
            sub.committed(),
            rig.off(7),
            rig.off(10),
            "the sought position",
        );
        rig.settle(&broker, "from the sought position", || {
            seen.len() == 3 && sub.committed() == rig.off(10)
        });
        assert_eq!(seen.payloads(), names(7..10), "[{l}]"); // R-LOG-4
        broker
    })
}

/// A durable dedup store (R-DEL-5 "durable") remembers what [`Deduplicating`] recorded
/// across a broker restart and across subscriptions: a second durable subscription
/// replaying the stream through the reopened store skips every id the first one handled,
/// and handles a new message once.
pub fn durable_dedup_store(b: &dyn DriverUnderTest, d: &dyn DurableTarget) -> CaseOutcome {
    let needs: &[Need] = &[(|c| c.dedup_store, "no durable dedup store (dedup_store)")];
    case(b, d, needs, |rig, l, broker| {
        rig.publish_range(&broker, 0..3);
        let store = broker
            .durable_dedup_store("suite-dedup", 100)
            .unwrap_or_else(|e| panic!("[{l}] open the dedup store: {e}"));
        let first = Seen::default();
        let (handler, skipped) = rig.deduplicating(&first, &store);
        let sub = rig.subscribe_any(
            &broker,
            spec("dedup-first"),
            SubscribeOptions::default(),
            handler,
        );
        rig.settle(&broker, "the first three handled", || first.len() == 3);
        rig.settle(&broker, "the first three finished", || {
            sub.stats().delivered == 3 && sub.outstanding() == 0
        });
        assert_eq!(first.payloads(), names(0..3), "[{l}]");
        assert_eq!(skipped(), 0, "[{l}]");
        drop(sub);
        drop((skipped, store));
        // R-DEL-5: the ids outlive the broker.
        let broker = rig.restart(broker);
        let store = broker
            .durable_dedup_store("suite-dedup", 100)
            .unwrap_or_else(|e| panic!("[{l}] reopen the dedup store: {e}"));
        let second = Seen::default();
        let (handler, skipped) = rig.deduplicating(&second, &store);
        let sub = rig.subscribe_any(
            &broker,
            spec("dedup-second").start(StartAt::Earliest),
            SubscribeOptions::default(),
            handler,
        );
        rig.settle(&broker, "the replay skipped", || skipped() == 3);
        rig.publish_range(&broker, 3..4);
        rig.settle(&broker, "the new message handled", || second.len() == 1);
        rig.settle(&broker, "all four finished", || {
            sub.stats().delivered == 4 && sub.outstanding() == 0
        });
        assert_eq!(second.payloads(), names(3..4), "[{l}]"); // R-DEL-5: none twice
        assert_eq!(skipped(), 3, "[{l}]");
        assert!(sub.stats().is_conserved(), "[{l}]"); // R-DEL-6
        drop(sub);
        drop((skipped, store));
        broker
    })
}

/// Run `case` under `driver` on `durable` and report a skip on stderr (visible with
/// `--nocapture` and in every failure's output).
pub fn run(
    name: &str,
    case: DurableCaseFn,
    driver: &dyn DriverUnderTest,
    durable: &dyn DurableTarget,
) -> CaseOutcome {
    let outcome = match durable.unavailable() {
        Some(why) => CaseOutcome::Skipped(why),
        None => case(driver, durable),
    };
    if let CaseOutcome::Skipped(why) = &outcome {
        eprintln!(
            "SKIPPED durable case {name} [{}/{}]: {why}",
            driver.name(),
            durable.name()
        );
    }
    outcome
}

/// The body of one durable case.
pub type DurableCaseFn = fn(&dyn DriverUnderTest, &dyn DurableTarget) -> CaseOutcome;

/// One durable case: its name and body.
pub type DurableCase = (&'static str, DurableCaseFn);

/// Every durable case, by name.
pub const ALL: &[DurableCase] = &[
    ("resume_after_restart", resume_after_restart),
    ("replay_by_offset", replay_by_offset),
    ("replay_by_time", replay_by_time),
    ("durable_dlq_reasons", durable_dlq_reasons),
    (
        "durable_dlq_redrive_and_drain",
        durable_dlq_redrive_and_drain,
    ),
    ("lag_and_slow_consumer", lag_and_slow_consumer),
    ("durable_filter", durable_filter),
    ("durable_message_fields", durable_message_fields),
    ("many_durables_progress", many_durables_progress),
    ("seek_while_outstanding", seek_while_outstanding),
    ("delayed_durable_message", delayed_durable_message),
    ("resubscribe_resumes", resubscribe_resumes),
    ("seek_survives_restart", seek_survives_restart),
    ("durable_dedup_store", durable_dedup_store),
];
