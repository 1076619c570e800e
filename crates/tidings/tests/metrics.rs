//! Metrics read back through a recorder equal the snapshot (R-OPS-2).
#![cfg(feature = "metrics")]

mod support;

use std::collections::BTreeMap;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};

type Labels = BTreeMap<String, String>;

fn read(recorder: &DebuggingRecorder) -> Vec<(String, Labels, DebugValue)> {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let k = key.key();
            let labels = k
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            (k.name().to_owned(), labels, value)
        })
        .collect()
}

fn find<'a>(
    all: &'a [(String, Labels, DebugValue)],
    name: &str,
    labels: &[(&str, &str)],
) -> &'a DebugValue {
    let matches: Vec<_> = all
        .iter()
        .filter(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .collect();
    assert_eq!(matches.len(), 1, "{name} {labels:?}: {matches:?}");
    &matches[0].2
}

fn counter(all: &[(String, Labels, DebugValue)], name: &str, labels: &[(&str, &str)]) -> u64 {
    match find(all, name, labels) {
        DebugValue::Counter(n) => *n,
        other => panic!("{name} is not a counter: {other:?}"),
    }
}

fn gauge(all: &[(String, Labels, DebugValue)], name: &str, labels: &[(&str, &str)]) -> f64 {
    match find(all, name, labels) {
        DebugValue::Gauge(g) => g.into_inner(),
        other => panic!("{name} is not a gauge: {other:?}"),
    }
}

#[test]
fn exported_metrics_equal_the_snapshot_after_a_scripted_run() {
    let dir = tempfile::tempdir().unwrap();
    let recorder = DebuggingRecorder::new();
    let (sc, snap) = metrics::with_local_recorder(&recorder, || {
        let sc = support::scenario::start(dir.path());
        sc.step_queue();
        sc.step_run();
        sc.step_retry();
        let snap = sc.broker.export_metrics();
        (sc, snap)
    });
    let all = read(&recorder);
    assert_eq!(snap, sc.broker.snapshot(), "nothing moved since the export");
    for s in &snap.subscriptions {
        let c = &s.counters;
        let l = [
            ("subscription", s.name.as_str()),
            ("messaging.system", "tidings"),
        ];
        // OpenTelemetry messaging names (R-OPS-2), equal to the snapshot.
        assert_eq!(
            counter(&all, "messaging.client.sent.messages", &l),
            c.offered
        ); // R-OPS-2
        assert_eq!(
            counter(&all, "messaging.client.consumed.messages", &l),
            c.attempts
        ); // R-OPS-2
        assert_eq!(
            counter(&all, "tidings.subscription.accepted", &l),
            c.accepted
        ); // R-OPS-2
        assert_eq!(
            counter(&all, "tidings.subscription.delivered", &l),
            c.delivered
        ); // R-OPS-2
        assert_eq!(
            counter(&all, "tidings.subscription.redelivered", &l),
            c.redelivered
        ); // R-OPS-2
        for (reason, n) in &c.dead_lettered {
            let lr = [l[0], ("reason", reason.as_str())];
            assert_eq!(counter(&all, "tidings.subscription.dead_lettered", &lr), *n); // R-OPS-2
        }
        for (reason, n) in &c.refused {
            let lr = [l[0], ("reason", reason.as_str())];
            assert_eq!(counter(&all, "tidings.subscription.refused", &lr), *n); // R-OPS-2
        }
        assert_eq!(
            gauge(&all, "tidings.subscription.depth", &l),
            c.queued as f64
        ); // R-OPS-2
        assert_eq!(
            gauge(&all, "tidings.subscription.in_flight", &l),
            c.in_flight as f64
        ); // R-OPS-2
        for reason in ["overflow", "rejected", "retries_exhausted"] {
            let n = s.dead_letters.by_reason.get(reason).copied().unwrap_or(0);
            let lr = [l[0], ("reason", reason)];
            assert_eq!(gauge(&all, "tidings.subscription.dlq.size", &lr), n as f64); // R-OPS-2
        }
        if let Some(d) = &s.durable {
            assert_eq!(gauge(&all, "tidings.subscription.lag", &l), d.lag as f64); // R-OPS-2
            assert_eq!(
                gauge(&all, "tidings.subscription.committed", &l),
                d.committed as f64
            );
        }
    }
    // Non-trivial values, so the equalities above mean something.
    let billing = snap.subscription_named("billing").unwrap();
    assert_eq!(billing.counters.dead_lettered["retries_exhausted"], 1);
    assert_eq!(
        gauge(
            &all,
            "tidings.subscription.dlq.size",
            &[("subscription", "billing"), ("reason", "overflow")]
        ),
        1.0
    );
    // One processing-time sample per handler call (R-OPS-2).
    match find(
        &all,
        "messaging.process.duration",
        &[("subscription", "billing")],
    ) {
        DebugValue::Histogram(samples) => {
            assert_eq!(samples.len() as u64, billing.counters.attempts); // R-OPS-2
            assert!(samples.iter().all(|s| s.into_inner() >= 0.0));
        }
        other => panic!("not a histogram: {other:?}"),
    }
    let orders = &snap.streams[0];
    let ls = [("stream", "orders")];
    assert_eq!(
        gauge(&all, "tidings.stream.records", &ls),
        orders.records as f64
    ); // R-OPS-2
    assert_eq!(
        gauge(&all, "tidings.stream.bytes", &ls),
        orders.bytes as f64
    );
    assert_eq!(
        gauge(&all, "tidings.stream.segments", &ls),
        orders.segments as f64
    );
}
