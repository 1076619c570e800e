//! `alloc/publish/{manual,thread,pool}`: heap allocations per message published to one
//! subscription and delivered, in steady state on a cached route (the target is 0).
//!
//! Counted by [`crate::alloc::CountingAlloc`] on every thread (publisher, dispatcher,
//! workers) over whole rounds, after a warm-up round has filled the route cache, the
//! message pool and the queue's storage. The payload is a static slice, so a count above 0
//! is tidings' own: a topic copied to the heap (over 22 bytes; this one is 11, held inside
//! the builder), a message allocation not recycled, a tracing span, a queue growing. No
//! baseline: the figure is absolute.
//!
//! A round publishes a burst the size of the queue and then waits for it to drain. That is
//! the manual driver's only steady state (it delivers only in `run_until_idle`), and under
//! the threaded drivers it is the worst case of any steady state: at most a queue's worth of
//! messages is in flight, and all of them come back to the message pool before the next
//! burst, which the pool keeps (src/message_pool.rs sizes it by the largest queue).

use std::time::Duration;

use bytes::Bytes;
use tidings::{Broker, Driver, HandlerError, Message, SubscribeOptions};

use crate::alloc::{CountingAlloc, Window};
use crate::harness::median;
use crate::{Case, Filter, Plan};

/// Messages per round (the subscription's queue holds them all, so nothing waits).
const MESSAGES: usize = 4096;
const TOPIC: &str = "bench.alloc";
const PAYLOAD: &[u8] = b"0123456789abcdef";

const DRIVERS: [&str; 3] = ["manual", "thread", "pool"];

pub(crate) fn case_names() -> Vec<String> {
    DRIVERS
        .iter()
        .map(|d| format!("alloc/publish/{d}"))
        .collect()
}

fn driver(label: &str) -> Driver {
    match label {
        "manual" => Driver::Manual,
        "pool" => Driver::Pool { workers: 1 },
        _ => Driver::Thread,
    }
}

/// One round: publish [`MESSAGES`] and wait until every one was delivered.
fn round(broker: &Broker, manual: bool) -> Result<(), String> {
    for _ in 0..MESSAGES {
        broker
            .publish(Message::to(TOPIC).payload(Bytes::from_static(PAYLOAD)))
            .map_err(|e| format!("publish: {e}"))?;
    }
    if manual {
        broker.run_until_idle();
    } else if !broker.wait_idle(Duration::from_secs(30)) {
        return Err("not delivered within 30 s".to_owned());
    }
    Ok(())
}

fn measure(label: &str, rounds: usize) -> Result<f64, String> {
    let broker = Broker::builder()
        .driver(driver(label))
        .build()
        .map_err(|e| e.to_string())?;
    let _sub = broker
        .subscribe(
            TOPIC,
            SubscribeOptions::new().capacity(MESSAGES),
            |_: &Message| Ok::<(), HandlerError>(()),
        )
        .map_err(|e| e.to_string())?;
    let manual = label == "manual";
    round(&broker, manual)?; // warm-up: route cache, message pool, queue storage
    let mut per_message = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let w = Window::open();
        round(&broker, manual)?;
        per_message.push(w.allocations() as f64 / MESSAGES as f64);
    }
    broker.close(Duration::from_secs(5));
    median(&per_message).ok_or_else(|| "no rounds".to_owned())
}

pub(crate) fn run(plan: &Plan, filter: &Filter) -> Vec<Case> {
    let mut cases = Vec::new();
    for label in DRIVERS {
        let name = format!("alloc/publish/{label}");
        if !filter.wants(&name) {
            continue;
        }
        let mut case = Case::new(name, "allocs/msg", false);
        case.note(format!(
            "{MESSAGES} messages per round, 1 subscription, static 16 B payload; target 0"
        ));
        if !CountingAlloc::installed() {
            case.note("the counting allocator is not installed in this binary");
        } else {
            match measure(label, plan.rounds) {
                Ok(v) => case.tidings = Some(v),
                Err(e) => case.note(e),
            }
        }
        cases.push(case);
    }
    cases
}
