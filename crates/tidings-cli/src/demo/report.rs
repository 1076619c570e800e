//! The demo's report after close: the per-subscription accounting and DLQ tables and the
//! close report.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use tidings::{CloseReport, DeadLetter, Refusal, Subscription, SubscriptionStats};

use crate::table::{self, Align, Style};

pub(super) fn refusal_name(r: Refusal) -> &'static str {
    match r {
        Refusal::Filtered => "filtered",
        Refusal::Overflow => "overflow",
        Refusal::Closed => "closed",
        _ => "other",
    }
}

/// `"0"`, or `"12 (a 10, b 2)"` listing the non-zero counts.
pub(super) fn join_counts<'a>(counts: impl IntoIterator<Item = (&'a str, u64)>) -> String {
    let parts: Vec<(&str, u64)> = counts.into_iter().filter(|(_, n)| *n > 0).collect();
    let total: u64 = parts.iter().map(|(_, n)| n).sum();
    if parts.is_empty() {
        return "0".to_owned();
    }
    let list: Vec<String> = parts.iter().map(|(k, n)| format!("{k} {n}")).collect();
    format!("{total} ({})", list.join(", "))
}

// ---------------------------------------------------------------------------------------
// Output.

pub(super) fn stats_table(stats: &[(&Subscription, SubscriptionStats)]) -> String {
    let headers = [
        "subscription",
        "pattern",
        "offered",
        "accepted",
        "refused",
        "delivered",
        "dead-lettered",
        "queued",
        "in-flight",
        "attempts",
        "failures",
        "dlq",
        "conserved",
    ];
    // Text columns left-aligned, counts right-aligned.
    let (l, r) = (Align::Left, Align::Right);
    let align = [l, l, r, r, l, r, l, r, r, r, r, r, l];
    let rows: Vec<Vec<String>> = stats
        .iter()
        .map(|(sub, st)| {
            let r = &st.refused;
            let d = &st.dead_lettered;
            vec![
                sub.name().to_owned(),
                sub.pattern().as_str().to_owned(),
                st.offered.to_string(),
                st.accepted.to_string(),
                join_counts([
                    ("filtered", r.filtered),
                    ("overflow", r.overflow),
                    ("closed", r.closed),
                ]),
                st.delivered.to_string(),
                join_counts([
                    ("retries_exhausted", d.retries_exhausted),
                    ("rejected", d.rejected),
                    ("expired", d.expired),
                    ("dropped_oldest", d.dropped_oldest),
                    ("shutdown", d.shutdown),
                ]),
                st.queued.to_string(),
                st.in_flight.to_string(),
                st.attempts.to_string(),
                st.failures.to_string(),
                st.dlq_len.to_string(),
                if st.is_conserved() { "yes" } else { "NO" }.to_owned(),
            ]
        })
        .collect();
    table::render(Style::REPORT, &headers, &align, &rows)
}

pub(super) fn dlq_table(subs: &[&Subscription]) -> String {
    let mut rows = Vec::new();
    for sub in subs {
        let mut by_reason: BTreeMap<&'static str, (usize, Option<DeadLetter>)> = BTreeMap::new();
        for entry in sub.dead_letters() {
            let slot = by_reason.entry(entry.reason.name()).or_default();
            slot.0 += 1;
            let better = slot.1.as_ref().is_none_or(|e| e.last_error().is_none())
                && entry.last_error().is_some();
            if slot.1.is_none() || better {
                slot.1 = Some(entry);
            }
        }
        if by_reason.is_empty() {
            rows.push(vec![
                sub.name().to_owned(),
                "-".into(),
                "0".into(),
                String::new(),
            ]);
        }
        for (reason, (count, example)) in by_reason {
            rows.push(vec![
                sub.name().to_owned(),
                reason.to_owned(),
                count.to_string(),
                example.map(|e| describe(&e)).unwrap_or_default(),
            ]);
        }
    }
    table::render(
        Style::REPORT,
        &["subscription", "reason", "entries", "example (last error)"],
        &[Align::Left, Align::Left, Align::Right, Align::Left],
        &rows,
    )
}

pub(super) fn describe(e: &DeadLetter) -> String {
    let m = &e.message;
    let mut s = m.topic().as_str().to_owned();
    if let Some(n) = m.header("order") {
        let _ = write!(s, " order {n}");
    }
    let _ = write!(s, ", {} attempt(s)", e.attempts);
    if let Some(err) = e.last_error() {
        let _ = write!(s, ": {err}");
    }
    s
}

pub(super) fn close_summary(report: &CloseReport, subs: &[&Subscription]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  clean: {}; undelivered: {}; unjoined threads: {}",
        if report.is_clean() { "yes" } else { "no" },
        report.undelivered.len(),
        report.unjoined.len()
    );
    for u in &report.undelivered {
        let whose = match u.subscription {
            None => "still scheduled (delayed); never offered, dropped by close".to_owned(),
            Some(id) => {
                let name = subs
                    .iter()
                    .find(|s| s.id() == id)
                    .map_or_else(|| id.to_string(), |s| s.name().to_owned());
                format!("queued for {name}")
            }
        };
        let _ = writeln!(
            out,
            "  - {} id {}: {whose}",
            u.message.topic().as_str(),
            u.message.id()
        );
    }
    // The stats say whether a handler could really have been running: with nothing in flight
    // anywhere, an unjoined thread was only late to exit after its dispatcher loop ended.
    let idle = subs.iter().all(|s| s.stats().in_flight == 0);
    for t in &report.unjoined {
        if idle {
            let _ = writeln!(
                out,
                "  - thread {t} reported unjoined with nothing in flight: it had left its \
                 dispatch loop but not yet exited when close checked it (it exits on its own)"
            );
        } else {
            let _ = writeln!(out, "  - thread {t} was still running a handler");
        }
    }
    out
}
