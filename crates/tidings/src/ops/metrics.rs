//! Metrics through the `metrics` facade (feature `metrics`, R-OPS-2, R-BP-3).
//!
//! # Contract
//! [`Broker::export_metrics`](crate::Broker::export_metrics) takes one
//! [`snapshot`](crate::Broker::snapshot) and writes it to the installed recorder: counters
//! are set to the snapshot's absolute values (`Counter::absolute`), gauges to its current
//! values, so what a scrape shows **equals** the snapshot taken at that moment. Call it on
//! every scrape (the `tidings-admin` crate does) or from a timer. The only metric recorded
//! on the delivery path is the processing-time histogram, once per handler call, and only
//! with this feature on; publish records nothing.
//!
//! # Names
//! OpenTelemetry messaging conventions where they exist, `tidings.*` otherwise. Every
//! subscription metric has the labels `subscription` (its name) and `subscription_id`;
//! `messaging.system` is `tidings`.
//!
//! | name | kind | value |
//! |---|---|---|
//! | `messaging.client.sent.messages` | counter | messages offered to the subscription (`offered`) |
//! | `messaging.client.consumed.messages` | counter | handler calls made (`attempts`, retries included) |
//! | `messaging.process.duration` | histogram, seconds | one sample per handler call |
//! | `tidings.subscription.accepted` | counter | offers that entered the queue |
//! | `tidings.subscription.refused` | counter, label `reason` | offers refused: `filtered`, `overflow`, `closed` |
//! | `tidings.subscription.delivered` | counter | handler successes |
//! | `tidings.subscription.dead_lettered` | counter, label `reason` | accepted messages that left without success |
//! | `tidings.subscription.redelivered` | counter | failed calls followed by another attempt |
//! | `tidings.subscription.released` | counter | messages handed back unstarted by a keyed group's start gate |
//! | `tidings.subscription.failures` | counter | failed handler calls |
//! | `tidings.subscription.depth` | gauge | messages queued |
//! | `tidings.subscription.in_flight` | gauge | messages taken and not finished |
//! | `tidings.subscription.oldest_age` | gauge, seconds | age of the oldest queued message (0 when empty) |
//! | `tidings.subscription.blocked_publishers` | gauge | publishers waiting under `Overflow::Block` |
//! | `tidings.subscription.dlq.size` | gauge, label `reason` | DLQ entries by reason |
//! | `tidings.subscription.lag` | gauge | durable only: `end_offset - committed` |
//! | `tidings.subscription.committed` | gauge | durable only: committed offset |
//! | `tidings.stream.records` | gauge, label `stream` | records retained |
//! | `tidings.stream.bytes` | gauge, label `stream` | bytes of segment files |
//! | `tidings.stream.segments` | gauge, label `stream` | segment files |
//! | `tidings.broker.scheduled` | gauge | delayed messages waiting |
//!
//! A subscription that was unsubscribed keeps its last exported values in the recorder
//! (the facade has no "forget"); exporters usually expire idle series.

use metrics::{Label, counter, gauge};

use crate::broker::Broker;

use super::snapshot::{BrokerSnapshot, SubscriptionSnapshot};

/// `messaging.client.sent.messages`.
pub const SENT_MESSAGES: &str = "messaging.client.sent.messages";
/// `messaging.client.consumed.messages`.
pub const CONSUMED_MESSAGES: &str = "messaging.client.consumed.messages";
pub use crate::telemetry::PROCESS_DURATION;

impl Broker {
    /// Write a fresh [`snapshot`](Broker::snapshot) to the installed `metrics` recorder
    /// (R-OPS-2) and return it: counters are set to its absolute values and gauges to its
    /// current ones, so the recorder then holds exactly the snapshot's figures. See
    /// [`crate::ops::metrics`] for the names and labels.
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn export_metrics(&self) -> BrokerSnapshot {
        let snapshot = self.snapshot();
        for sub in &snapshot.subscriptions {
            export_subscription(sub);
        }
        for s in &snapshot.streams {
            let labels = vec![
                Label::new("messaging.system", "tidings"),
                Label::new("stream", s.name.clone()),
            ];
            gauge!("tidings.stream.records", labels.clone()).set(s.records as f64);
            gauge!("tidings.stream.bytes", labels.clone()).set(s.bytes as f64);
            gauge!("tidings.stream.segments", labels).set(s.segments as f64);
        }
        gauge!("tidings.broker.scheduled", "messaging.system" => "tidings")
            .set(snapshot.scheduled as f64);
        snapshot
    }
}

fn export_subscription(sub: &SubscriptionSnapshot) {
    let base = vec![
        Label::new("messaging.system", "tidings"),
        Label::new("subscription", sub.name.clone()),
        Label::new("subscription_id", sub.id.to_string()),
    ];
    let with = |name: &'static str, value: &str| {
        let mut l = base.clone();
        l.push(Label::new(name, value.to_owned()));
        l
    };
    let c = &sub.counters;
    counter!(SENT_MESSAGES, base.clone()).absolute(c.offered);
    counter!(CONSUMED_MESSAGES, base.clone()).absolute(c.attempts);
    counter!("tidings.subscription.accepted", base.clone()).absolute(c.accepted);
    counter!("tidings.subscription.delivered", base.clone()).absolute(c.delivered);
    counter!("tidings.subscription.redelivered", base.clone()).absolute(c.redelivered);
    counter!("tidings.subscription.failures", base.clone()).absolute(c.failures);
    counter!("tidings.subscription.released", base.clone()).absolute(c.released);
    for (reason, n) in &c.refused {
        counter!("tidings.subscription.refused", with("reason", reason)).absolute(*n);
    }
    for (reason, n) in &c.dead_lettered {
        counter!("tidings.subscription.dead_lettered", with("reason", reason)).absolute(*n);
    }
    gauge!("tidings.subscription.depth", base.clone()).set(c.queued as f64);
    gauge!("tidings.subscription.in_flight", base.clone()).set(c.in_flight as f64);
    gauge!("tidings.subscription.blocked_publishers", base.clone())
        .set(c.blocked_publishers as f64);
    gauge!("tidings.subscription.oldest_age", base.clone())
        .set(sub.oldest_age_ms.map_or(0.0, |ms| ms as f64 / 1000.0));
    for reason in [
        "retries_exhausted",
        "rejected",
        "expired",
        "overflow",
        "dropped_oldest",
        "shutdown",
    ] {
        let n = sub.dead_letters.by_reason.get(reason).copied().unwrap_or(0);
        gauge!("tidings.subscription.dlq.size", with("reason", reason)).set(n as f64);
    }
    if let Some(d) = &sub.durable {
        let mut l = base.clone();
        l.push(Label::new("stream", d.stream.clone()));
        gauge!("tidings.subscription.lag", l.clone()).set(d.lag as f64);
        gauge!("tidings.subscription.committed", l).set(d.committed as f64);
    }
}
