//! `perkey/failing=1%/{thread,pool,tokio}`: one subscription with
//! `Concurrency::PerKey { max_in_flight: 4 }` over 1,000 keys, where the handler fails every
//! message of 1% of the keys (10 keys). Those keys park their message for a retry an hour
//! away, and every later message of theirs waits behind it (R-ORD-4); the parked keys must
//! not slow the others. The value is the deliveries per second of the *healthy* keys; the
//! baseline `no-failures` is the same subscription with a handler that never fails, counted
//! the same way (healthy keys only, although it also delivers the 1%).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tidings::{
    Broker, Concurrency, Driver, HandlerError, Message, Overflow, Retry, SubscribeOptions,
    Subscription,
};

use crate::env::{DRIVERS, DriverKind, Env};
use crate::fanout::{BLOCK_TIMEOUT, PAYLOAD_64};
use crate::harness::{Contender, Tally, interleave};
use crate::{Case, Filter, Plan};

/// Distinct keys; message `i` of a run has key `i % KEYS`.
const KEYS: u64 = 1_000;
/// Keys whose index is a multiple of this fail (1%).
const FAIL_EVERY: u64 = 100;
/// Handler calls in flight at once.
const MAX_IN_FLIGHT: usize = 4;
/// Retry delay of a failed message: longer than any run, so a failing key stays parked.
const PARK: Duration = Duration::from_secs(3600);
/// Longest a round may take.
const ROUND_TIMEOUT: Duration = Duration::from_secs(60);
const TOPIC: &str = "bench.perkey.updated";

pub(crate) fn case_names() -> Vec<String> {
    DRIVERS.iter().map(|d| name(*d)).collect()
}

fn name(d: DriverKind) -> String {
    format!("perkey/failing=1%/{}", d.label())
}

fn failing(i: u64) -> bool {
    (i % KEYS).is_multiple_of(FAIL_EVERY)
}

struct PerKeySystem {
    broker: Broker,
    sub: Subscription,
    tally: Arc<Tally>,
    keys: Vec<Bytes>,
    /// Messages published so far (the next message's index).
    published: u64,
    /// Healthy-key messages published so far.
    healthy: u64,
}

impl PerKeySystem {
    /// `capacity` must hold every failing key's backlog of the whole run (they never drain).
    fn start(driver: Driver, fail: bool, capacity: usize) -> Result<Self, String> {
        let broker = Broker::builder()
            .driver(driver)
            .build()
            .map_err(|e| e.to_string())?;
        let tally = Arc::new(Tally::new());
        let count = AtomicU64::new(0);
        let t = tally.clone();
        let opts = SubscribeOptions::new()
            .name("perkey")
            .capacity(capacity)
            .overflow(Overflow::Block {
                timeout: BLOCK_TIMEOUT,
            })
            .retry(Retry::fixed(PARK, 2))
            .concurrency(Concurrency::PerKey {
                max_in_flight: MAX_IN_FLIGHT,
            });
        let sub = broker
            .subscribe(TOPIC, opts, move |m: &Message| {
                let bad = m
                    .key()
                    .and_then(|k| std::str::from_utf8(k).ok())
                    .and_then(|k| k.parse::<u64>().ok())
                    .is_some_and(failing);
                if bad {
                    if fail {
                        return Err(HandlerError::retry("failing key"));
                    }
                    return Ok(());
                }
                let before = count.fetch_add(1, Ordering::Relaxed);
                t.hit(before, before + 1);
                Ok::<(), HandlerError>(())
            })
            .map_err(|e| e.to_string())?;
        let keys = (0..KEYS).map(|k| Bytes::from(k.to_string())).collect();
        Ok(Self {
            broker,
            sub,
            tally,
            keys,
            published: 0,
            healthy: 0,
        })
    }

    fn round(&mut self, m: u64) -> Result<f64, String> {
        let first = self.published;
        let healthy_now = (first..first + m).filter(|i| !failing(*i)).count() as u64;
        self.healthy += healthy_now;
        self.tally.arm(self.healthy, 1);
        let payload = Bytes::from_static(&PAYLOAD_64);
        let start = Instant::now();
        for i in first..first + m {
            let key = self.keys[(i % KEYS) as usize].clone();
            self.broker
                .publish(Message::to(TOPIC).key(key).payload(payload.clone()))
                .map_err(|e| e.to_string())?;
        }
        self.published += m;
        if !self.tally.wait(ROUND_TIMEOUT) {
            return Err(format!(
                "stuck: healthy deliveries short of {}; stats {:?}",
                self.healthy,
                self.sub.stats()
            ));
        }
        Ok(healthy_now as f64 / start.elapsed().as_secs_f64())
    }

    fn finish(self) -> String {
        let stats = self.sub.stats();
        let report = self.broker.close(Duration::ZERO);
        drop(self.sub);
        format!(
            "delivered {}, {} left queued or parked at close",
            stats.delivered,
            report.undelivered.len()
        )
    }
}

pub(crate) fn run(plan: &Plan, env: &Env, filter: &Filter) -> Vec<Case> {
    let mut cases = Vec::new();
    // About a quarter of a second per round at the rates seen on 2 cores (~200k/s).
    let m = if plan.quick {
        40_000
    } else {
        plan.fanout_deliveries / 10
    };
    // Warm-up + rounds, every message of a failing key stays in the queue: room for all.
    let backlog = (m * (plan.rounds as u64 + 1)).div_ceil(FAIL_EVERY) as usize;
    let capacity = (backlog + 1024).next_power_of_two();
    for d in DRIVERS {
        let name = name(d);
        if !filter.wants(&name) {
            continue;
        }
        let mut case = Case::new(name, "deliveries/s", true);
        let built = d.build(env).and_then(|driver| {
            Ok((
                PerKeySystem::start(driver.clone(), true, capacity)?,
                PerKeySystem::start(driver, false, capacity)?,
            ))
        });
        let (mut failing_sys, mut healthy_sys) = match built {
            Ok(s) => s,
            Err(e) => {
                case.note(format!("skipped: {e}"));
                cases.push(case);
                continue;
            }
        };
        let warm = (m / 20).max(plan.fanout_min_msgs);
        let warm_err = failing_sys
            .round(warm)
            .and_then(|_| healthy_sys.round(warm))
            .err();
        let outcomes = {
            let mut cs = vec![
                Contender::new("tidings", || failing_sys.round(m)),
                Contender::new("no-failures", || healthy_sys.round(m)),
            ];
            interleave(plan.rounds, &mut cs)
        };
        for o in &outcomes {
            match (o.name.as_str(), o.median()) {
                ("tidings", v) => case.tidings = v,
                (other, Some(v)) => {
                    case.baselines.insert(other.to_owned(), v);
                }
                (other, None) => case.note(format!("{other} failed: {:?}", o.error)),
            }
            if o.name == "tidings"
                && let Some(e) = &o.error
            {
                case.note(format!("tidings failed: {e}"));
            }
        }
        if let Some(e) = warm_err {
            case.note(format!("warm-up failed: {e}"));
        }
        case.note(format!(
            "{m} msgs per round over {KEYS} keys (round-robin), {} rounds interleaved, 64-byte payload, \
             1 publisher thread; PerKey {{ max_in_flight: {MAX_IN_FLIGHT} }}, capacity {capacity}, \
             Overflow::Block; failing keys (every {FAIL_EVERY}th) fail every attempt and park for a \
             retry {PARK:?} away, their later messages queue behind; value = deliveries/s of the \
             healthy 99% of keys; no-failures = same handler without failures, counted alike",
            plan.rounds
        ));
        case.note(format!("tidings: {}", failing_sys.finish()));
        case.note(format!("no-failures: {}", healthy_sys.finish()));
        cases.push(case);
    }
    cases
}
