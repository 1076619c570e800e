//! Property test: the manual driver against a small reference model (R-DEL-6, R-ORD-1,
//! R-DEL-1, R-DEL-4, R-BP-1, R-CORE-6). Random interleavings of publish, subscribe,
//! unsubscribe, dispatch steps and clock advances; handler outcomes ok / fail k times /
//! reject / panic. Same deliveries in the same order, same DLQ entries, exact counters.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use proptest::prelude::*;
use tidings::*;
use tidings_testkit::helpers::{manual, text};

const TOPICS: [&str; 2] = ["a", "b"];
const CAPACITY: usize = 3;
const MAX_ATTEMPTS: u32 = 3;
const BACKOFF: Duration = Duration::from_millis(1);

#[derive(Debug, Clone, Copy)]
struct Behaviour {
    fail_k: u32,
    reject: bool,
    panic: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Ok,
    Fail,
    Reject,
    Panic,
}

impl Behaviour {
    /// Outcome of attempt `attempt` (1-based) on message number `n`.
    fn outcome(self, n: u32, attempt: u32) -> Outcome {
        match n % 4 {
            1 if attempt <= self.fail_k => Outcome::Fail,
            2 if self.reject => Outcome::Reject,
            3 if self.panic => Outcome::Panic,
            _ => Outcome::Ok,
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Publish(usize),
    Subscribe(usize, Behaviour),
    Unsubscribe(usize),
    Step,
    Advance,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..2usize).prop_map(Op::Publish),
        2 => (0..2usize, 0..5u32, any::<bool>(), any::<bool>())
            .prop_map(|(t, k, r, p)| Op::Subscribe(t, Behaviour { fail_k: k, reject: r, panic: p })),
        1 => (0..8usize).prop_map(Op::Unsubscribe),
        2 => Just(Op::Step),
        2 => Just(Op::Advance),
    ]
}

/// The reference model of one subscription.
#[derive(Default)]
struct ModelSub {
    topic: usize,
    behaviour: Option<Behaviour>,
    open: bool,
    queue: VecDeque<u32>,
    /// Head message waiting to retry: (message, attempts so far, due at ms).
    parked: Option<(u32, u32, u64)>,
    delivered: Vec<u32>,
    dlq: Vec<(u32, String, u32)>,
    offered: u64,
    refused_overflow: u64,
    refused_closed: u64,
}

impl ModelSub {
    fn offer(&mut self, n: u32) {
        self.offered += 1;
        if !self.open {
            self.refused_closed += 1;
        } else if self.queue.len() >= CAPACITY {
            self.refused_overflow += 1;
            self.dlq.push((n, "overflow".into(), 0));
        } else {
            self.queue.push_back(n);
        }
    }

    fn step(&mut self, now: u64) {
        let b = self.behaviour.unwrap();
        loop {
            let (n, done) = match self.parked {
                Some((_, _, due)) if due > now => return,
                Some((n, a, _)) => {
                    self.parked = None;
                    (n, a)
                }
                None => match self.queue.pop_front() {
                    Some(n) => (n, 0),
                    None => return,
                },
            };
            let attempt = done + 1;
            match b.outcome(n, attempt) {
                Outcome::Ok => self.delivered.push(n),
                Outcome::Reject => self.dlq.push((n, "rejected".into(), attempt)),
                Outcome::Fail | Outcome::Panic if attempt < MAX_ATTEMPTS => {
                    self.parked = Some((n, attempt, now + 1));
                    return;
                }
                Outcome::Fail | Outcome::Panic => {
                    self.dlq.push((n, "retries_exhausted".into(), attempt));
                }
            }
        }
    }

    fn close(&mut self) {
        self.open = false;
        if let Some((n, a, _)) = self.parked.take() {
            self.dlq.push((n, "shutdown".into(), a));
        }
        while let Some(n) = self.queue.pop_front() {
            self.dlq.push((n, "shutdown".into(), 0));
        }
    }
}

fn handler(b: Behaviour, log: Arc<Mutex<Vec<u32>>>) -> impl Handler {
    let attempts: Mutex<HashMap<u32, u32>> = Mutex::default();
    move |m: &Message| {
        let n: u32 = text(m).parse().unwrap();
        let attempt = {
            let mut a = attempts.lock();
            let e = a.entry(n).or_insert(0);
            *e += 1;
            *e
        };
        match b.outcome(n, attempt) {
            Outcome::Ok => {
                log.lock().push(n);
                Ok(())
            }
            Outcome::Fail => Err(HandlerError::retry(format!("fail {n}"))),
            Outcome::Reject => Err(HandlerError::reject(format!("reject {n}"))),
            Outcome::Panic => panic!("panic {n}"),
        }
    }
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let (broker, clock) = manual();
    let mut model: Vec<ModelSub> = Vec::new();
    let mut real: Vec<(Subscription, Arc<Mutex<Vec<u32>>>)> = Vec::new();
    let mut now_ms = 0u64;
    let mut next_msg = 0u32;
    for op in ops {
        match op {
            Op::Publish(t) => {
                let n = next_msg;
                next_msg += 1;
                broker
                    .publish(Message::to(TOPICS[t]).payload(n.to_string()))
                    .unwrap();
                for m in model.iter_mut().filter(|m| m.topic == t && m.open) {
                    m.offer(n);
                }
            }
            Op::Subscribe(t, b) => {
                let log = Arc::default();
                let opts = SubscribeOptions::new()
                    .capacity(CAPACITY)
                    .retry(Retry::fixed(BACKOFF, MAX_ATTEMPTS));
                let sub = broker
                    .subscribe(TOPICS[t], opts, handler(b, Arc::clone(&log)))
                    .unwrap();
                real.push((sub, log));
                model.push(ModelSub {
                    topic: t,
                    behaviour: Some(b),
                    open: true,
                    ..Default::default()
                });
            }
            Op::Unsubscribe(i) => {
                if let Some((sub, _)) = real.get(i) {
                    broker.unsubscribe(sub.id());
                    model[i].close();
                }
            }
            Op::Step => {
                broker.run_until_idle();
                for m in model.iter_mut().filter(|m| m.open) {
                    m.step(now_ms);
                }
            }
            Op::Advance => {
                clock.advance(BACKOFF);
                now_ms += 1;
            }
        }
    }
    // Drive everything to the end.
    loop {
        broker.run_until_idle();
        for m in model.iter_mut().filter(|m| m.open) {
            m.step(now_ms);
        }
        if broker.next_wake().is_none() {
            break;
        }
        clock.advance(BACKOFF);
        now_ms += 1;
    }
    for (i, ((sub, log), m)) in real.iter().zip(&model).enumerate() {
        prop_assert_eq!(&*log.lock(), &m.delivered, "deliveries of sub {}", i);
        let dlq: Vec<(u32, String, u32)> = sub
            .dead_letters()
            .iter()
            .map(|d| {
                (
                    text(&d.message).parse().unwrap(),
                    d.reason.name().to_owned(),
                    d.attempts,
                )
            })
            .collect();
        prop_assert_eq!(&dlq, &m.dlq, "DLQ of sub {}", i);
        let s = sub.stats();
        prop_assert!(s.is_conserved(), "sub {} not conserved: {:?}", i, s); // R-DEL-6
        prop_assert_eq!(s.offered, m.offered);
        prop_assert_eq!(s.refused.overflow, m.refused_overflow);
        prop_assert_eq!(s.refused.closed, m.refused_closed);
        prop_assert_eq!(s.delivered, m.delivered.len() as u64);
        prop_assert_eq!(s.queued + s.in_flight, 0);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    // R-DEL-6, R-DEL-1, R-DEL-4, R-ORD-1, R-BP-1, R-CORE-6, R-EXE-2
    #[test]
    fn manual_driver_matches_reference_model(ops in prop::collection::vec(op(), 1..60)) {
        run(ops)?;
    }
}
