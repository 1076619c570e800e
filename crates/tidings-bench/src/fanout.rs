//! `fanout/n={1,4,16,256}/{thread,pool,tokio}`: one publisher, N subscribers, 64-byte
//! payloads, no-op handlers; deliveries per second until all N×M are delivered.
//!
//! `fanout/publishers=4/n={1,16}/{thread,pool,tokio}`: the same with 4 publisher threads
//! sharing the M messages, against crossbeam-per-subscriber with 4 publisher threads.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_utils::CachePadded;
use tidings::{Broker, Driver, HandlerError, Message, Overflow, SubscribeOptions, Subscription};

use crate::env::{DRIVERS, Env};
use crate::harness::{Contender, Tally, interleave, median};
use crate::{Case, Filter, Plan};

/// Subscriber counts.
pub const NS: [u64; 4] = [1, 4, 16, 256];
/// Subscriber counts of the multi-publisher cases.
const MULTI_NS: [u64; 2] = [1, 16];
/// Publisher threads of the multi-publisher cases.
const MULTI_PUBLISHERS: u64 = 4;
/// Topic every fan-out message goes to.
const TOPIC: &str = "bench.fanout.created";
/// tidings queue capacity per subscription (with `Overflow::Block`, so nothing is lost).
pub(crate) const TIDINGS_CAPACITY: usize = 1024;
/// Longest a publisher may block on a full tidings queue.
pub(crate) const BLOCK_TIMEOUT: Duration = Duration::from_secs(60);
/// Capacity of each crossbeam channel and of the tokio broadcast ring.
const CHANNEL_CAPACITY: usize = 1024;
/// Longest one round may take before it is declared stuck.
const ROUND_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) static PAYLOAD_64: [u8; 64] = [0xAB; 64];

pub(crate) fn case_names() -> Vec<String> {
    let single = NS.iter().flat_map(|n| {
        DRIVERS
            .iter()
            .map(move |d| format!("fanout/n={n}/{}", d.label()))
    });
    single.chain(multi_names_all()).collect()
}

fn multi_name(n: u64, d: crate::env::DriverKind) -> String {
    format!("fanout/publishers={MULTI_PUBLISHERS}/n={n}/{}", d.label())
}

fn multi_names_all() -> impl Iterator<Item = String> {
    MULTI_NS
        .iter()
        .flat_map(|&n| DRIVERS.iter().map(move |&d| multi_name(n, d)))
}

/// One system under test in a fan-out comparison.
/// A named system, or why it could not be set up.
pub(crate) type Named = (String, Result<Box<dyn FanoutSystem>, String>);

pub(crate) trait FanoutSystem {
    /// Publish `m` messages and wait until every subscriber has seen all of them; returns
    /// deliveries per second.
    fn round(&mut self, m: u64) -> Result<f64, String>;
    /// Verify counters, tear down, and say anything worth noting.
    fn finish(self: Box<Self>, env: &Env) -> String;
}

pub(crate) fn run(plan: &Plan, env: &Env, filter: &Filter) -> Vec<Case> {
    let mut cases = Vec::new();
    for n in NS {
        let names: Vec<String> = DRIVERS
            .iter()
            .map(|d| format!("fanout/n={n}/{}", d.label()))
            .collect();
        if !filter.wants_any(names.iter().map(String::as_str)) {
            continue;
        }
        let m = plan.fanout_min_msgs.max(plan.fanout_deliveries / n);
        cases.extend(run_group(plan, env, filter, n, m, &names));
    }
    for n in MULTI_NS {
        let names: Vec<String> = DRIVERS.iter().map(|&d| multi_name(n, d)).collect();
        if !filter.wants_any(names.iter().map(String::as_str)) {
            continue;
        }
        let m = plan.fanout_min_msgs.max(plan.fanout_deliveries / n);
        cases.extend(run_multi_group(plan, env, filter, n, m, &names));
    }
    cases
}

/// `fanout/publishers=4/n=N/*`: tidings per driver and crossbeam-per-subscriber, each fed
/// by [`MULTI_PUBLISHERS`] threads that share the round's messages.
fn run_multi_group(
    plan: &Plan,
    env: &Env,
    filter: &Filter,
    n: u64,
    m: u64,
    names: &[String],
) -> Vec<Case> {
    let p = MULTI_PUBLISHERS;
    let mut systems: Vec<Named> = Vec::new();
    for (d, name) in DRIVERS.iter().zip(names) {
        if filter.wants(name) {
            let sys = d
                .build(env)
                .and_then(|driver| TidingsFanout::start(driver, n, true))
                .map(|s| Box::new(s.publishers(p)) as Box<dyn FanoutSystem>);
            systems.push((format!("tidings/{}", d.label()), sys));
        }
    }
    systems.push((
        "crossbeam-per-subscriber".into(),
        Ok(Box::new(CrossbeamFanout::start(n).publishers(p))),
    ));
    let (outcomes, counts) = sized_rounds(plan, n, m, &mut systems);
    let mut sys_notes = Vec::new();
    for (name, sys) in systems {
        match sys {
            Ok(sys) => {
                let note = sys.finish(env);
                if !note.is_empty() {
                    sys_notes.push(format!("{name}: {note}"));
                }
            }
            Err(e) => sys_notes.push(format!("{name} skipped: {e}")),
        }
    }
    for o in &outcomes {
        if let Some(e) = &o.error {
            sys_notes.push(format!("{} FAILED: {e}", o.name));
        }
    }
    let common = format!(
        "msgs per round x {n} subs: {counts} (sized from a warm-up round to ~{:.2} s, capped at {m}), \
         {p} publisher threads sharing each round's messages (started per round, inside the timing), \
         64-byte payload, no-op handlers, {} rounds interleaved; tidings: capacity {TIDINGS_CAPACITY}, \
         Overflow::Block{{60s}} (lossless), AtLeastOnce; crossbeam: bounded({CHANNEL_CAPACITY}) + 1 \
         thread per sub, every publisher sends to every channel",
        plan.round_secs, plan.rounds
    );
    let mut cases = Vec::new();
    for (d, name) in DRIVERS.iter().zip(names) {
        if !filter.wants(name) {
            continue;
        }
        let mut case = Case::new(name.clone(), "deliveries/s", true);
        let label = format!("tidings/{}", d.label());
        match outcomes.iter().find(|o| o.name == label) {
            Some(o) => case.tidings = o.median(),
            None => case.note("tidings skipped: setup failed"),
        }
        for o in outcomes.iter().filter(|o| !o.name.starts_with("tidings/")) {
            if let Some(v) = o.median() {
                case.baselines.insert(o.name.clone(), v);
            }
        }
        case.note(&common);
        for s in &sys_notes {
            if !s.starts_with("tidings/") || s.starts_with(&label) {
                case.note(s);
            }
        }
        cases.push(case);
    }
    cases
}

/// Split `m` messages among `publishers` threads (the first ones take the remainder).
fn share(m: u64, publishers: u64, i: u64) -> u64 {
    m / publishers + u64::from(i < m % publishers)
}

fn run_group(
    plan: &Plan,
    env: &Env,
    filter: &Filter,
    n: u64,
    m: u64,
    names: &[String],
) -> Vec<Case> {
    // Set every system up first (setup is not timed), then interleave their rounds.
    let mut systems: Vec<Named> = Vec::new();
    for (d, name) in DRIVERS.iter().zip(names) {
        if filter.wants(name) {
            let sys = d
                .build(env)
                .and_then(|driver| TidingsFanout::start(driver, n, true))
                .map(|s| Box::new(s) as Box<dyn FanoutSystem>);
            systems.push((format!("tidings/{}", d.label()), sys));
        }
    }
    systems.push((
        "crossbeam-per-subscriber".into(),
        Ok(Box::new(CrossbeamFanout::start(n))),
    ));
    systems.push((
        "tokio-broadcast".into(),
        Ok(Box::new(BroadcastFanout::start(env, n, CHANNEL_CAPACITY))),
    ));
    systems.push((
        "qubit-event-bus".into(),
        QubitFanout::start(n, m).map(|s| Box::new(s) as Box<dyn FanoutSystem>),
    ));

    let (outcomes, counts) = sized_rounds(plan, n, m, &mut systems);

    let mut sys_notes = Vec::new();
    for (name, sys) in systems {
        match sys {
            Ok(sys) => {
                let note = sys.finish(env);
                if !note.is_empty() {
                    sys_notes.push(format!("{name}: {note}"));
                }
            }
            Err(e) => sys_notes.push(format!("{name} skipped: {e}")),
        }
    }
    for o in &outcomes {
        if let Some(e) = &o.error {
            sys_notes.push(format!("{} FAILED: {e}", o.name));
        }
    }

    let common = format!(
        "msgs per round x {n} subs: {counts} (sized from a warm-up round to ~{:.2} s, capped at {m}), 64-byte payload, no-op handlers, {} rounds interleaved, \
         publisher = 1 thread; tidings: capacity {TIDINGS_CAPACITY}, Overflow::Block{{60s}} (lossless), \
         AtLeastOnce; crossbeam: bounded({CHANNEL_CAPACITY}) + 1 thread per sub, blocking send; \
         tokio-broadcast: capacity {CHANNEL_CAPACITY}, 1 task per sub on a {}-worker runtime, \
         rate counts only messages actually received; qubit-event-bus: sync EventBus::local, \
         queue_capacity = msgs per round (it has no blocking overflow policy: a full queue rejects)",
        plan.round_secs, plan.rounds, env.cores
    );
    let mut cases = Vec::new();
    for (d, name) in DRIVERS.iter().zip(names) {
        if !filter.wants(name) {
            continue;
        }
        let mut case = Case::new(name.clone(), "deliveries/s", true);
        let label = format!("tidings/{}", d.label());
        match outcomes.iter().find(|o| o.name == label) {
            Some(o) => case.tidings = o.median(),
            None => {
                let why = d.build(env).err().unwrap_or_else(|| "setup failed".into());
                case.note(format!("tidings skipped: {why}"));
            }
        }
        for o in outcomes.iter().filter(|o| !o.name.starts_with("tidings/")) {
            if let Some(v) = o.median() {
                case.baselines.insert(o.name.clone(), v);
            }
        }
        case.note(&common);
        for s in &sys_notes {
            if !s.starts_with("tidings/") || s.starts_with(&label) {
                case.note(s);
            }
        }
        cases.push(case);
    }
    cases
}

/// Warm each system up with a short round, size its rounds from the rate it showed (about
/// `plan.round_secs`, between `plan.fanout_min_msgs` and `max_msgs` messages), then run the
/// interleaved rounds. Returns the outcomes and a "name=msgs" summary.
pub(crate) fn sized_rounds(
    plan: &Plan,
    n: u64,
    max_msgs: u64,
    systems: &mut [Named],
) -> (Vec<crate::harness::ContenderRun>, String) {
    let mut counts = Vec::new();
    let mut contenders: Vec<Contender<'_>> = Vec::new();
    for (name, sys) in systems.iter_mut() {
        let Ok(sys) = sys.as_mut() else { continue };
        let warm = (max_msgs / 20).max(plan.fanout_min_msgs.min(max_msgs));
        let msgs = if crate::harness::system_enabled(name) {
            match sys.round(warm) {
                Ok(rate) => ((rate * plan.round_secs / n as f64) as u64)
                    .clamp(plan.fanout_min_msgs.min(max_msgs), max_msgs),
                Err(e) => {
                    let e = format!("warm-up: {e}");
                    contenders.push(Contender::new(name.clone(), move || Err(e.clone())));
                    continue;
                }
            }
        } else {
            max_msgs
        };
        counts.push(format!("{name}={msgs}"));
        contenders.push(Contender::new(name.clone(), move || sys.round(msgs)));
    }
    let outcomes = interleave(plan.rounds, &mut contenders);
    (outcomes, counts.join(" "))
}

// ---------------------------------------------------------------------------------------
// tidings

pub(crate) struct TidingsFanout {
    broker: Broker,
    subs: Vec<Subscription>,
    tally: Arc<Tally>,
    per_sub: u64,
    refused: u64,
    n: u64,
    /// Publisher threads per round (1 = the calling thread).
    publishers: u64,
}

impl TidingsFanout {
    /// Publish from `p` threads per round instead of the calling thread.
    fn publishers(mut self, p: u64) -> Self {
        self.publishers = p.max(1);
        self
    }

    /// `padded`: give each subscriber's counter its own cache line (fan-out); the scale
    /// cases use a plain counter so the handler's footprint stays minimal.
    pub(crate) fn start(driver: Driver, n: u64, padded: bool) -> Result<Self, String> {
        let broker = Broker::builder()
            .driver(driver)
            .build()
            .map_err(|e| e.to_string())?;
        let tally = Arc::new(Tally::new());
        let mut subs = Vec::new();
        for i in 0..n {
            let t = tally.clone();
            let opts = SubscribeOptions::new()
                .name(format!("fanout-{i}"))
                .capacity(TIDINGS_CAPACITY)
                .overflow(Overflow::Block {
                    timeout: BLOCK_TIMEOUT,
                });
            let sub = if padded {
                let count = CachePadded::new(AtomicU64::new(0));
                broker.subscribe(TOPIC, opts, move |_m: &Message| {
                    let before = count.fetch_add(1, Ordering::Relaxed);
                    t.hit(before, before + 1);
                    Ok::<(), HandlerError>(())
                })
            } else {
                let count = AtomicU64::new(0);
                broker.subscribe(TOPIC, opts, move |_m: &Message| {
                    let before = count.fetch_add(1, Ordering::Relaxed);
                    t.hit(before, before + 1);
                    Ok::<(), HandlerError>(())
                })
            }
            .map_err(|e| e.to_string())?;
            subs.push(sub);
        }
        Ok(Self {
            broker,
            subs,
            tally,
            per_sub: 0,
            refused: 0,
            n,
            publishers: 1,
        })
    }

    /// Publish `m` messages from `self.publishers` threads; returns the refusals.
    fn publish_many(&self, m: u64) -> Result<u64, String> {
        let payload = Bytes::from_static(&PAYLOAD_64);
        let one = |count: u64| -> Result<u64, String> {
            let mut refused = 0;
            for _ in 0..count {
                let report = self
                    .broker
                    .publish(Message::to(TOPIC).payload(payload.clone()))
                    .map_err(|e| e.to_string())?;
                refused += report.refused.len() as u64;
            }
            Ok(refused)
        };
        if self.publishers == 1 {
            return one(m);
        }
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..self.publishers)
                .map(|i| {
                    let count = share(m, self.publishers, i);
                    s.spawn(move || one(count))
                })
                .collect();
            let mut refused = 0;
            for h in handles {
                refused += h.join().map_err(|_| "publisher panicked".to_string())??;
            }
            Ok(refused)
        })
    }
}

impl FanoutSystem for TidingsFanout {
    fn round(&mut self, m: u64) -> Result<f64, String> {
        self.per_sub += m;
        self.tally.arm(self.per_sub, self.n as usize);
        let start = Instant::now();
        self.refused += self.publish_many(m)?;
        if !self.tally.wait(ROUND_TIMEOUT) {
            let delivered: u64 = self.subs.iter().map(|s| s.stats().delivered).sum();
            return Err(format!(
                "stuck: {} of {} subscribers incomplete after {ROUND_TIMEOUT:?}; delivered {delivered} of {}; refused {}; first stats {:?}",
                self.tally.remaining(),
                self.n,
                self.per_sub * self.n,
                self.refused,
                self.subs.first().map(Subscription::stats)
            ));
        }
        Ok((self.n * m) as f64 / start.elapsed().as_secs_f64())
    }

    fn finish(self: Box<Self>, _env: &Env) -> String {
        let mut notes = Vec::new();
        if self.refused > 0 {
            notes.push(format!("{} refusals", self.refused));
        }
        // The tally counts a message when its handler runs; the delivery is booked when the
        // handler has returned, a moment later. Give the last ones that moment (bounded).
        let settle_by = Instant::now() + Duration::from_secs(10);
        let bad = loop {
            let bad: Vec<_> = self
                .subs
                .iter()
                .map(Subscription::stats)
                .filter(|s| s.delivered != self.per_sub || !s.is_conserved())
                .collect();
            if bad.is_empty() || Instant::now() >= settle_by {
                break bad;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        if let Some(s) = bad.first() {
            notes.push(format!(
                "{} subscriptions off their counts (expected {} delivered), e.g. {s:?}",
                bad.len(),
                self.per_sub
            ));
        }
        let t = Instant::now();
        let report = self.broker.close(Duration::from_secs(5));
        let took = t.elapsed();
        if !report.is_clean() {
            notes.push(format!(
                "close not clean: {} undelivered, unjoined {:?}",
                report.undelivered.len(),
                report.unjoined
            ));
        }
        if took > Duration::from_millis(500) {
            notes.push(format!("close took {took:?}"));
        }
        drop(self.subs);
        notes.join(", ")
    }
}

// ---------------------------------------------------------------------------------------
// crossbeam: one bounded channel and one consumer thread per subscriber, Arc'd messages

struct Msg {
    #[allow(dead_code)]
    payload: Bytes,
    #[allow(dead_code)]
    seq: u64,
}

struct CrossbeamFanout {
    txs: Vec<crossbeam_channel::Sender<Arc<Msg>>>,
    threads: Vec<JoinHandle<()>>,
    tally: Arc<Tally>,
    per_sub: u64,
    seq: u64,
    /// Publisher threads per round (1 = the calling thread).
    publishers: u64,
}

impl CrossbeamFanout {
    /// Publish from `p` threads per round instead of the calling thread.
    fn publishers(mut self, p: u64) -> Self {
        self.publishers = p.max(1);
        self
    }

    /// Send `count` messages to every channel, numbered from `seq`.
    fn send_all(&self, count: u64, seq: u64) -> Result<(), String> {
        let payload = Bytes::from_static(&PAYLOAD_64);
        for k in 0..count {
            let msg = Arc::new(Msg {
                payload: payload.clone(),
                seq: seq + k,
            });
            for tx in &self.txs {
                tx.send(msg.clone()).map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    fn start(n: u64) -> Self {
        let tally = Arc::new(Tally::new());
        let mut txs = Vec::new();
        let mut threads = Vec::new();
        for i in 0..n {
            let (tx, rx) = crossbeam_channel::bounded::<Arc<Msg>>(CHANNEL_CAPACITY);
            let t = tally.clone();
            let h = std::thread::Builder::new()
                .name(format!("xbeam-{i}"))
                .spawn(move || {
                    let mut count = 0u64;
                    while let Ok(m) = rx.recv() {
                        std::hint::black_box(&m);
                        count += 1;
                        t.hit(count - 1, count);
                    }
                })
                .expect("spawn crossbeam consumer");
            txs.push(tx);
            threads.push(h);
        }
        Self {
            txs,
            threads,
            tally,
            per_sub: 0,
            seq: 0,
            publishers: 1,
        }
    }
}

impl FanoutSystem for CrossbeamFanout {
    fn round(&mut self, m: u64) -> Result<f64, String> {
        self.per_sub += m;
        self.tally.arm(self.per_sub, self.txs.len());
        let start = Instant::now();
        let seq = self.seq;
        self.seq += m;
        if self.publishers == 1 {
            self.send_all(m, seq)?;
        } else {
            let this = &*self;
            std::thread::scope(|s| -> Result<(), String> {
                let mut first = seq;
                let handles: Vec<_> = (0..this.publishers)
                    .map(|i| {
                        let count = share(m, this.publishers, i);
                        let from = first;
                        first += count;
                        s.spawn(move || this.send_all(count, from))
                    })
                    .collect();
                for h in handles {
                    h.join().map_err(|_| "publisher panicked".to_string())??;
                }
                Ok(())
            })?;
        }
        if !self.tally.wait(ROUND_TIMEOUT) {
            return Err(format!(
                "stuck: {} subscribers incomplete",
                self.tally.remaining()
            ));
        }
        Ok((self.txs.len() as u64 * m) as f64 / start.elapsed().as_secs_f64())
    }

    fn finish(self: Box<Self>, _env: &Env) -> String {
        drop(self.txs);
        for h in self.threads {
            let _ = h.join();
        }
        String::new()
    }
}

// ---------------------------------------------------------------------------------------
// tokio::sync::broadcast: one ring, one receiver task per subscriber

pub(crate) struct BroadcastFanout {
    tx: Option<tokio::sync::broadcast::Sender<Arc<Msg>>>,
    tally: Arc<Tally>,
    lagged: Arc<AtomicU64>,
    lost_per_round: Vec<f64>,
    per_sub: u64,
    n: u64,
    seq: u64,
}

impl BroadcastFanout {
    pub(crate) fn start(env: &Env, n: u64, capacity: usize) -> Self {
        let (tx, _) = tokio::sync::broadcast::channel::<Arc<Msg>>(capacity);
        let tally = Arc::new(Tally::new());
        let lagged = Arc::new(AtomicU64::new(0));
        for _ in 0..n {
            let mut rx = tx.subscribe();
            let t = tally.clone();
            let lag = lagged.clone();
            env.tokio.spawn(async move {
                use tokio::sync::broadcast::error::RecvError;
                let mut seen = 0u64;
                loop {
                    match rx.recv().await {
                        Ok(m) => {
                            std::hint::black_box(&m);
                            seen += 1;
                            t.hit(seen - 1, seen);
                        }
                        Err(RecvError::Lagged(k)) => {
                            lag.fetch_add(k, Ordering::Relaxed);
                            seen += k;
                            t.hit(seen - k, seen);
                        }
                        Err(RecvError::Closed) => break,
                    }
                }
            });
        }
        // Let every receiver task reach its first `recv` before the first round.
        std::thread::sleep(Duration::from_millis(20));
        Self {
            tx: Some(tx),
            tally,
            lagged,
            lost_per_round: Vec::new(),
            per_sub: 0,
            n,
            seq: 0,
        }
    }
}

impl FanoutSystem for BroadcastFanout {
    fn round(&mut self, m: u64) -> Result<f64, String> {
        let Some(tx) = &self.tx else {
            return Err("closed".into());
        };
        self.per_sub += m;
        self.tally.arm(self.per_sub, self.n as usize);
        let lag0 = self.lagged.load(Ordering::SeqCst);
        let payload = Bytes::from_static(&PAYLOAD_64);
        let start = Instant::now();
        for _ in 0..m {
            self.seq += 1;
            let msg = Arc::new(Msg {
                payload: payload.clone(),
                seq: self.seq,
            });
            tx.send(msg).map_err(|e| e.to_string())?;
        }
        if !self.tally.wait(ROUND_TIMEOUT) {
            return Err(format!(
                "stuck: {} receivers incomplete",
                self.tally.remaining()
            ));
        }
        let elapsed = start.elapsed().as_secs_f64();
        let lost = self.lagged.load(Ordering::SeqCst) - lag0;
        self.lost_per_round.push(lost as f64);
        Ok((self.n * m - lost) as f64 / elapsed)
    }

    fn finish(mut self: Box<Self>, _env: &Env) -> String {
        self.tx = None;
        let total = self.n * self.per_sub;
        let lost = self.lagged.load(Ordering::SeqCst);
        let med = median(&self.lost_per_round).unwrap_or(0.0);
        format!(
            "Lagged losses {lost} of {total} deliveries ({:.2}%), median {med:.0} per round",
            100.0 * lost as f64 / total.max(1) as f64
        )
    }
}

// ---------------------------------------------------------------------------------------
// qubit-event-bus 0.20: synchronous local provider

struct QubitFanout {
    bus: Option<qubit_event_bus::EventBus>,
    topic: qubit_event_bus::model::Topic<Bytes>,
    subs: Vec<qubit_event_bus::Subscription>,
    tally: Arc<Tally>,
    per_sub: u64,
    rejected: u64,
    n: u64,
}

impl QubitFanout {
    fn start(n: u64, m: u64) -> Result<Self, String> {
        use qubit_event_bus::EventBus;
        use qubit_event_bus::local::LocalEventBusConfig;
        use qubit_event_bus::model::{Delivery, SubscribeRequest, Topic};

        let config = LocalEventBusConfig::new()
            .queue_capacity(m as usize)
            .max_total_outstanding((n * m) as usize);
        let bus = EventBus::local(config).map_err(|e| e.to_string())?;
        let topic = Topic::<Bytes>::new(TOPIC).map_err(|e| e.to_string())?;
        let tally = Arc::new(Tally::new());
        let mut subs = Vec::new();
        for i in 0..n {
            let count = CachePadded::new(AtomicU64::new(0));
            let t = tally.clone();
            let req = SubscribeRequest::new(&format!("fanout-{i}"), topic.clone())
                .map_err(|e| e.to_string())?;
            let sub = bus
                .subscribe(req, move |d: Delivery<Bytes>| {
                    std::hint::black_box(d.payload());
                    let before = count.fetch_add(1, Ordering::Relaxed);
                    t.hit(before, before + 1);
                })
                .map_err(|e| e.to_string())?;
            subs.push(sub);
        }
        Ok(Self {
            bus: Some(bus),
            topic,
            subs,
            tally,
            per_sub: 0,
            rejected: 0,
            n,
        })
    }
}

impl FanoutSystem for QubitFanout {
    fn round(&mut self, m: u64) -> Result<f64, String> {
        use qubit_event_bus::model::PublishRequest;
        let Some(bus) = &self.bus else {
            return Err("closed".into());
        };
        self.per_sub += m;
        self.tally.arm(self.per_sub, self.n as usize);
        let payload = Bytes::from_static(&PAYLOAD_64);
        let start = Instant::now();
        for _ in 0..m {
            let req = PublishRequest::new(self.topic.clone(), payload.clone())
                .map_err(|e| e.to_string())?;
            let receipt = bus.publish(req).map_err(|e| e.to_string())?;
            if let Some(s) = receipt.admission_summary() {
                self.rejected += s.rejected as u64;
            }
        }
        if !self.tally.wait(ROUND_TIMEOUT) {
            return Err(format!(
                "stuck: {} subscribers incomplete; {} rejected admissions",
                self.tally.remaining(),
                self.rejected
            ));
        }
        Ok((self.n * m) as f64 / start.elapsed().as_secs_f64())
    }

    fn finish(mut self: Box<Self>, env: &Env) -> String {
        let note = if self.rejected > 0 {
            format!("{} rejected admissions", self.rejected)
        } else {
            String::new()
        };
        // Its synchronous shutdown takes ~25 ms per subscription (sleeping, not spinning):
        // do it in the background.
        if let Some(bus) = self.bus.take() {
            let subs = std::mem::take(&mut self.subs);
            env.in_background(move || {
                let _ = bus.shutdown(qubit_event_bus::spi::ShutdownMode::Immediate);
                drop(subs);
            });
        }
        note
    }
}
