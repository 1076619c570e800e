//! The demo's orders and what each subscriber does with them: which order fails, which loses
//! its acknowledgement, the gate that holds `gated`, the business step behind `dedup`.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use tidings::{Handler, HandlerError, Message, MessageBuilder, MessageId};

use super::{PATIENCE, lock};

// The orders and what each subscriber does with them.

pub(super) fn region(n: u32) -> &'static str {
    ["eu", "us", "apac"][(n % 3) as usize]
}

pub(super) fn order_message(n: u32) -> MessageBuilder {
    let customer = format!("customer-{:02}", n % 17);
    let cents = 1_000 + (n * 137) % 9_000;
    let amount = format!("{}.{:02}", cents / 100, cents % 100);
    Message::to(format!("orders.{}", region(n)))
        .key(&customer)
        .header("order", n.to_string())
        .header("region", region(n))
        .header("amount", amount.clone())
        .header("currency", "EUR")
        .payload(format!(
            r#"{{"order":{n},"customer":"{customer}","amount":"{amount}"}}"#
        ))
}

pub(super) fn order_no(m: &Message) -> Result<u32, HandlerError> {
    m.header("order")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| HandlerError::reject("no numeric `order` header"))
}

/// What `flaky` does with order `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FlakyPlan {
    /// Succeeds at once.
    Ok,
    /// Fails the first attempt, succeeds on the retry.
    FailOnce,
    /// Fails every attempt: retried, then dead-lettered `retries_exhausted`.
    AlwaysFail,
    /// A non-retryable error: dead-lettered `rejected` at once.
    Reject,
}

pub(super) fn flaky_plan(n: u32) -> FlakyPlan {
    if n % 100 == 42 {
        FlakyPlan::Reject
    } else if n % 20 == 7 {
        FlakyPlan::AlwaysFail
    } else if n % 25 == 3 {
        FlakyPlan::FailOnce
    } else {
        FlakyPlan::Ok
    }
}

/// `dedup` only takes EU orders; of those, these lose their acknowledgement once.
pub(super) fn ack_lost(n: u32) -> bool {
    region(n) == "eu" && n % 10 == 3
}

/// Holds the first message `gated` receives until opened.
#[derive(Default)]
pub(super) struct Gate {
    /// (a handler is holding, the gate is open)
    state: Mutex<(bool, bool)>,
    changed: Condvar,
}

impl Gate {
    /// Called by the handler: the first call waits until the gate opens (at most `PATIENCE`).
    pub(super) fn hold(&self) {
        let mut s = lock(&self.state);
        if s.0 {
            return;
        }
        s.0 = true;
        self.changed.notify_all();
        let _unused = self
            .changed
            .wait_timeout_while(s, PATIENCE, |s| !s.1)
            .unwrap_or_else(PoisonError::into_inner);
    }
    pub(super) fn wait_held(&self, timeout: Duration) -> bool {
        let s = lock(&self.state);
        let (s, _) = self
            .changed
            .wait_timeout_while(s, timeout, |s| !s.0)
            .unwrap_or_else(PoisonError::into_inner);
        s.0
    }
    pub(super) fn open(&self) {
        lock(&self.state).1 = true;
        self.changed.notify_all();
    }
}

/// Remembers which message ids were seen once (for "fail the first time" behaviours).
#[derive(Default)]
pub(super) struct FirstTime(Mutex<HashSet<MessageId>>);

impl FirstTime {
    pub(super) fn check(&self, id: MessageId) -> bool {
        lock(&self.0).insert(id)
    }
}

/// The business step behind `dedup`: counts its runs per order ("charge the card, write the
/// ledger"), so the checks can see that a redriven duplicate did not run it again.
pub(super) struct ChargeOrder(pub(super) Arc<Mutex<BTreeMap<u32, u32>>>);

impl Handler for ChargeOrder {
    fn handle(&self, m: &Message) -> Result<(), HandlerError> {
        let n = order_no(m)?;
        *lock(&self.0).entry(n).or_default() += 1;
        Ok(())
    }
}
