//! `scale/subs={1000,100000}/{pool,tokio}`: many subscriptions on one topic.
//!
//! Two numbers per driver and count: deliveries per second when every subscription gets
//! every message (`scale/subs=S/D`), and the heap bytes one idle subscription costs
//! (`scale/subs=S/D/bytes-per-sub`), counted by [`crate::alloc::CountingAlloc`] as the net
//! live-byte growth while the S subscriptions were created — not estimated. Thread stacks
//! are not heap and are not counted, which is why the thread driver is not a scale case.

use std::time::{Duration, Instant};

use crate::alloc::{CountingAlloc, Window};
use crate::env::{DriverKind, Env};
use crate::fanout::{
    BLOCK_TIMEOUT, BroadcastFanout, FanoutSystem, TIDINGS_CAPACITY, TidingsFanout,
};
use crate::harness::{Contender, interleave};
use crate::{Case, Filter, Plan};

/// Subscription counts.
const SUBS: [u64; 2] = [1_000, 100_000];
/// Drivers that can hold this many subscriptions (one entry each, like [`crate::DRIVERS`]).
const SCALE_DRIVERS: [DriverKind; 2] = [DriverKind::Pool, DriverKind::Tokio];

pub(crate) fn case_names() -> Vec<String> {
    let mut v = Vec::new();
    for s in SUBS {
        for d in SCALE_DRIVERS {
            v.push(format!("scale/subs={s}/{}", d.label()));
            v.push(format!("scale/subs={s}/{}/bytes-per-sub", d.label()));
        }
    }
    v
}

/// A named system with its bytes per subscription, or why it could not be set up.
type Measured = (String, Result<(Box<dyn FanoutSystem>, Option<f64>), String>);

/// Set a system up inside an allocation window; returns it and its bytes per subscription.
fn measured<T>(
    subs: u64,
    setup: impl FnOnce() -> Result<T, String>,
) -> Result<(T, Option<f64>), String> {
    let w = Window::open();
    let sys = setup()?;
    // Let workers and tasks settle (first polls, lazily allocated state): until the live
    // heap stops shrinking (tasks that are still ending), for at most two seconds.
    std::thread::sleep(Duration::from_millis(50));
    let settle_until = Instant::now() + Duration::from_secs(2);
    let mut net = w.net();
    while Instant::now() < settle_until {
        std::thread::sleep(Duration::from_millis(20));
        let now = w.net();
        if now >= net {
            break;
        }
        net = now;
    }
    drop(w);
    let per = CountingAlloc::installed().then_some(net as f64 / subs as f64);
    Ok((sys, per))
}

pub(crate) fn run(plan: &Plan, env: &Env, filter: &Filter) -> Vec<Case> {
    let mut cases = Vec::new();
    let counting = CountingAlloc::installed();
    for s in SUBS {
        let names: Vec<(DriverKind, String, String)> = SCALE_DRIVERS
            .iter()
            .map(|d| {
                (
                    *d,
                    format!("scale/subs={s}/{}", d.label()),
                    format!("scale/subs={s}/{}/bytes-per-sub", d.label()),
                )
            })
            .filter(|(_, a, b)| filter.wants(a) || filter.wants(b))
            .collect();
        if names.is_empty() {
            continue;
        }
        let m = (plan.scale_deliveries / s).max(2);
        let mut systems: Vec<Measured> = Vec::new();
        for (d, _, _) in &names {
            let sys = d.build(env).and_then(|driver| {
                measured(s, || TidingsFanout::start(driver, s, false))
                    .map(|(t, b)| (Box::new(t) as Box<dyn FanoutSystem>, b))
            });
            systems.push((format!("tidings/{}", d.label()), sys));
        }
        let ring = (m as usize).max(16);
        let bc = measured(s, || Ok(BroadcastFanout::start(env, s, ring)))
            .map(|(t, b)| (Box::new(t) as Box<dyn FanoutSystem>, b));
        systems.push(("tokio-broadcast".into(), bc));

        let outcomes = {
            let mut contenders: Vec<Contender<'_>> = systems
                .iter_mut()
                .filter_map(|(name, sys)| {
                    let (sys, _) = sys.as_mut().ok()?;
                    // One untimed warm-up round (first touches, lazily grown queues).
                    let warm = sys.round(1.max(m / 4));
                    Some(Contender::new(name.clone(), move || {
                        warm.clone()?;
                        sys.round(m)
                    }))
                })
                .collect();
            interleave(plan.rounds, &mut contenders)
        };
        let mut notes = vec![format!(
            "{s} subscriptions on one topic, {m} msgs per round (every sub gets every msg), 64-byte payload, \
             no-op handlers, {} rounds interleaved; tidings: capacity {TIDINGS_CAPACITY}, Overflow::Block{{{}s}}; \
             tokio-broadcast: one receiver task per sub, ring of {ring} (lossless at this M)",
            plan.rounds,
            BLOCK_TIMEOUT.as_secs()
        )];
        let mut bytes = Vec::new();
        for (name, sys) in systems {
            match sys {
                Ok((sys, b)) => {
                    bytes.push((name.clone(), b));
                    let n = sys.finish(env);
                    if !n.is_empty() {
                        notes.push(format!("{name}: {n}"));
                    }
                }
                Err(e) => notes.push(format!("{name} skipped: {e}")),
            }
        }
        for o in &outcomes {
            if let Some(e) = &o.error {
                notes.push(format!("{} FAILED: {e}", o.name));
            }
        }
        if !counting {
            notes.push(
                "bytes per sub not measured: the counting allocator is not this binary's global allocator"
                    .into(),
            );
        }
        for (d, rate_name, bytes_name) in names {
            let label = format!("tidings/{}", d.label());
            if filter.wants(&rate_name) {
                let mut case = Case::new(rate_name, "deliveries/s", true);
                case.tidings = outcomes
                    .iter()
                    .find(|o| o.name == label)
                    .and_then(|o| o.median());
                for o in outcomes.iter().filter(|o| !o.name.starts_with("tidings/")) {
                    if let Some(v) = o.median() {
                        case.baselines.insert(o.name.clone(), v);
                    }
                }
                for n in notes
                    .iter()
                    .filter(|n| !n.starts_with("tidings/") || n.starts_with(&label))
                {
                    case.note(n);
                }
                cases.push(case);
            }
            if filter.wants(&bytes_name) {
                let mut case = Case::new(bytes_name, "bytes/sub", false);
                case.tidings = bytes
                    .iter()
                    .find(|(n, _)| *n == label)
                    .and_then(|(_, b)| *b);
                for (n, b) in &bytes {
                    if !n.starts_with("tidings/")
                        && let Some(b) = b
                    {
                        case.baselines.insert(n.clone(), *b);
                    }
                }
                case.note(format!(
                    "net heap bytes live after creating {s} idle subscriptions (handler closure, queue, \
                     counters, routing entry; tokio-broadcast: receiver + spawned task), / {s}; one \
                     measurement, not a median; thread stacks are not heap"
                ));
                for n in notes
                    .iter()
                    .filter(|n| n.contains("skipped") || n.contains("counting allocator"))
                {
                    if !n.starts_with("tidings/") || n.starts_with(&label) {
                        case.note(n);
                    }
                }
                cases.push(case);
            }
        }
    }
    cases
}
