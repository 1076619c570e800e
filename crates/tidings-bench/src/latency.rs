//! `latency/{p50,p99,p99.9}/{thread,pool,tokio}`: publish-to-handler latency at a fixed
//! offered rate, measured from each message's *intended* send time, so a publisher that
//! falls behind (coordinated omission) shows up as latency instead of hiding it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use tidings::{Broker, Driver, HandlerError, Message, Overflow, SubscribeOptions, Subscription};

use crate::env::{DRIVERS, DriverKind, Env};
use crate::fanout::{BLOCK_TIMEOUT, TIDINGS_CAPACITY};
use crate::harness::{Contender, Tally, interleave, median};
use crate::{Case, Filter, Plan};

const TOPIC: &str = "bench.latency.tick";
/// Percentiles reported, with their case-name labels.
const PERCENTILES: [(&str, f64); 3] = [("p50", 50.0), ("p99", 99.0), ("p99.9", 99.9)];

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

fn now_ns() -> u64 {
    EPOCH.elapsed().as_nanos() as u64
}

pub(crate) fn case_names() -> Vec<String> {
    DRIVERS
        .iter()
        .flat_map(|d| {
            PERCENTILES
                .iter()
                .map(move |(p, _)| format!("latency/{p}/{}", d.label()))
        })
        .collect()
}

type Hist = Arc<Mutex<Histogram<u64>>>;

fn new_hist() -> Hist {
    // 1 ns .. 120 s, 3 significant digits.
    Arc::new(Mutex::new(
        Histogram::new_with_bounds(1, 120_000_000_000, 3).expect("valid histogram bounds"),
    ))
}

/// Record the latency of a message whose payload starts with its intended send time.
fn record(hist: &Hist, payload: &[u8]) {
    let mut b = [0u8; 8];
    b.copy_from_slice(&payload[..8]);
    let intended = u64::from_le_bytes(b);
    let lat = now_ns().saturating_sub(intended).max(1);
    hist.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .saturating_record(lat);
}

/// Publish `count` messages at `rate`/s; message i is due at start + i/rate and carries that
/// intended time. Returns how far behind schedule the last publish ran.
fn paced(
    rate: u64,
    count: u64,
    mut publish: impl FnMut(Bytes) -> Result<(), String>,
) -> Result<Duration, String> {
    let period = 1e9 / rate as f64;
    let start = now_ns() + 1_000_000;
    let mut behind = 0;
    for i in 0..count {
        let due = start + (i as f64 * period) as u64;
        loop {
            let now = now_ns();
            if now >= due {
                behind = now - due;
                break;
            }
            let left = due - now;
            if left > 300_000 {
                std::thread::sleep(Duration::from_nanos(left - 200_000));
            } else {
                // Yield rather than spin: a consumer woken onto this CPU (wake-affine) would
                // otherwise wait for the publisher's time slice to end — milliseconds.
                std::thread::yield_now();
            }
        }
        let mut buf = [0u8; 64];
        buf[..8].copy_from_slice(&due.to_le_bytes());
        publish(Bytes::copy_from_slice(&buf))?;
    }
    Ok(Duration::from_nanos(behind))
}

trait LatencySystem {
    /// One paced run; the histogram is reset first.
    fn run(&mut self, rate: u64, count: u64) -> Result<Duration, String>;
    fn hist(&self) -> &Hist;
    fn finish(self: Box<Self>) -> String;
}

/// Per-round percentiles (µs) of one system: [p50, p99, p99.9, max].
#[derive(Default)]
struct Rounds(Vec<[f64; 4]>);

fn round_of(
    sys: &mut dyn LatencySystem,
    rate: u64,
    count: u64,
    rounds: &mut Rounds,
) -> Result<f64, String> {
    sys.hist()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .reset();
    sys.run(rate, count)?;
    let h = sys.hist().lock().unwrap_or_else(PoisonError::into_inner);
    if h.len() != count {
        return Err(format!("recorded {} of {count} latencies", h.len()));
    }
    let us = |q: f64| h.value_at_percentile(q) as f64 / 1000.0;
    let row = [us(50.0), us(99.0), us(99.9), h.max() as f64 / 1000.0];
    rounds.0.push(row);
    Ok(row[1])
}

pub(crate) fn run(plan: &Plan, env: &Env, filter: &Filter) -> Vec<Case> {
    LazyLock::force(&EPOCH);
    let mut cases = Vec::new();
    for d in DRIVERS {
        let names: Vec<String> = PERCENTILES
            .iter()
            .map(|(p, _)| format!("latency/{p}/{}", d.label()))
            .collect();
        if !filter.wants_any(names.iter().map(String::as_str)) {
            continue;
        }
        cases.extend(run_driver(plan, env, d, &names));
    }
    cases
}

fn run_driver(plan: &Plan, env: &Env, d: DriverKind, names: &[String]) -> Vec<Case> {
    let rate = plan.latency_rate;
    let count = (rate as f64 * plan.latency_secs) as u64;
    let tidings = d.build(env).and_then(TidingsLatency::start);
    let mut xbeam: Box<dyn LatencySystem> = Box::new(CrossbeamLatency::start());
    let mut t_rounds = Rounds::default();
    let mut x_rounds = Rounds::default();
    let mut tidings = tidings.map(|t| Box::new(t) as Box<dyn LatencySystem>);
    let outcomes = {
        let mut contenders = Vec::new();
        if let Ok(t) = tidings.as_mut() {
            let r = &mut t_rounds;
            contenders.push(Contender::new("tidings", move || {
                round_of(t.as_mut(), rate, count, r)
            }));
        }
        let r = &mut x_rounds;
        let x = &mut xbeam;
        contenders.push(Contender::new("crossbeam-per-subscriber", move || {
            round_of(x.as_mut(), rate, count, r)
        }));
        interleave(plan.rounds, &mut contenders)
    };
    let mut notes = vec![format!(
        "offered {rate} msg/s for {:.1} s ({count} msgs) per round, 1 subscriber, {} rounds interleaved, \
         median of per-round percentiles; latency from intended send time (coordinated-omission safe); \
         tidings capacity {TIDINGS_CAPACITY}, Overflow::Block; crossbeam: bounded(1024) + 1 consumer thread",
        plan.latency_secs, plan.rounds
    )];
    let max_of = |r: &Rounds| median(&r.0.iter().map(|x| x[3]).collect::<Vec<_>>());
    if let Some(m) = max_of(&t_rounds) {
        notes.push(format!("tidings median max {m:.0} us"));
    }
    if let Some(m) = max_of(&x_rounds) {
        notes.push(format!("crossbeam median max {m:.0} us"));
    }
    match tidings {
        Ok(t) => {
            let n = t.finish();
            if !n.is_empty() {
                notes.push(format!("tidings: {n}"));
            }
        }
        Err(e) => notes.push(format!("tidings skipped: {e}")),
    }
    let n = xbeam.finish();
    if !n.is_empty() {
        notes.push(format!("crossbeam: {n}"));
    }
    for o in &outcomes {
        if let Some(e) = &o.error {
            notes.push(format!("{} FAILED: {e}", o.name));
        }
    }
    let t_ok = outcomes
        .iter()
        .any(|o| o.name == "tidings" && o.error.is_none());
    let x_ok = outcomes
        .iter()
        .any(|o| o.name == "crossbeam-per-subscriber" && o.error.is_none());
    PERCENTILES
        .iter()
        .enumerate()
        .zip(names)
        .map(|((i, _), name)| {
            let mut case = Case::new(name.clone(), "us", false);
            if t_ok {
                case.tidings = median(&t_rounds.0.iter().map(|x| x[i]).collect::<Vec<_>>());
            }
            if x_ok && let Some(v) = median(&x_rounds.0.iter().map(|x| x[i]).collect::<Vec<_>>()) {
                case.baselines.insert("crossbeam-per-subscriber".into(), v);
            }
            for n in &notes {
                case.note(n);
            }
            case
        })
        .collect()
}

struct TidingsLatency {
    broker: Broker,
    sub: Subscription,
    hist: Hist,
    tally: Arc<Tally>,
    total: u64,
    refused: u64,
}

impl TidingsLatency {
    fn start(driver: Driver) -> Result<Self, String> {
        let broker = Broker::builder()
            .driver(driver)
            .build()
            .map_err(|e| e.to_string())?;
        let hist = new_hist();
        let tally = Arc::new(Tally::new());
        let (h, t) = (hist.clone(), tally.clone());
        let count = AtomicU64::new(0);
        let opts = SubscribeOptions::new()
            .name("latency")
            .capacity(TIDINGS_CAPACITY)
            .overflow(Overflow::Block {
                timeout: BLOCK_TIMEOUT,
            });
        let sub = broker
            .subscribe(TOPIC, opts, move |m: &Message| {
                record(&h, m.payload());
                let before = count.fetch_add(1, Ordering::Relaxed);
                t.hit(before, before + 1);
                Ok::<(), HandlerError>(())
            })
            .map_err(|e| e.to_string())?;
        Ok(Self {
            broker,
            sub,
            hist,
            tally,
            total: 0,
            refused: 0,
        })
    }
}

impl LatencySystem for TidingsLatency {
    fn run(&mut self, rate: u64, count: u64) -> Result<Duration, String> {
        self.total += count;
        self.tally.arm(self.total, 1);
        let broker = &self.broker;
        let refused = &mut self.refused;
        let behind = paced(rate, count, |payload| {
            let r = broker
                .publish(Message::to(TOPIC).payload(payload))
                .map_err(|e| e.to_string())?;
            *refused += r.refused.len() as u64;
            Ok(())
        })?;
        if !self.tally.wait(Duration::from_secs(60)) {
            return Err(format!("stuck; stats {:?}", self.sub.stats()));
        }
        Ok(behind)
    }
    fn hist(&self) -> &Hist {
        &self.hist
    }
    fn finish(self: Box<Self>) -> String {
        let s = self.sub.stats();
        let mut notes = Vec::new();
        if self.refused > 0 {
            notes.push(format!("{} refusals", self.refused));
        }
        if s.delivered != self.total || !s.is_conserved() {
            notes.push(format!(
                "counts off: expected {} delivered, stats {s:?}",
                self.total
            ));
        }
        let report = self.broker.close(Duration::from_secs(5));
        if !report.is_clean() {
            notes.push(format!(
                "close not clean: {} undelivered",
                report.undelivered.len()
            ));
        }
        notes.join(", ")
    }
}

struct CrossbeamLatency {
    tx: Option<crossbeam_channel::Sender<Arc<Bytes>>>,
    thread: Option<JoinHandle<()>>,
    hist: Hist,
    tally: Arc<Tally>,
    total: u64,
}

impl CrossbeamLatency {
    fn start() -> Self {
        let (tx, rx) = crossbeam_channel::bounded::<Arc<Bytes>>(1024);
        let hist = new_hist();
        let tally = Arc::new(Tally::new());
        let (h, t) = (hist.clone(), tally.clone());
        let thread = std::thread::Builder::new()
            .name("xbeam-latency".into())
            .spawn(move || {
                let mut n = 0u64;
                while let Ok(m) = rx.recv() {
                    record(&h, &m);
                    n += 1;
                    t.hit(n - 1, n);
                }
            })
            .expect("spawn crossbeam consumer");
        Self {
            tx: Some(tx),
            thread: Some(thread),
            hist,
            tally,
            total: 0,
        }
    }
}

impl LatencySystem for CrossbeamLatency {
    fn run(&mut self, rate: u64, count: u64) -> Result<Duration, String> {
        let Some(tx) = &self.tx else {
            return Err("closed".into());
        };
        self.total += count;
        self.tally.arm(self.total, 1);
        let behind = paced(rate, count, |payload| {
            tx.send(Arc::new(payload)).map_err(|e| e.to_string())
        })?;
        if !self.tally.wait(Duration::from_secs(60)) {
            return Err("stuck".into());
        }
        Ok(behind)
    }
    fn hist(&self) -> &Hist {
        &self.hist
    }
    fn finish(mut self: Box<Self>) -> String {
        self.tx = None;
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
        String::new()
    }
}
