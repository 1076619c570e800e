//! The stdout table and the BENCHMARKS.md skeleton.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::{Case, Report};

/// 1.23M, 45.6k, 789, 12.3, 0.456.
pub(crate) fn fmt_value(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.2}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), fmt_value)
}

/// "1.7x better" / "0.4x (worse)" of tidings against a baseline, by the case's direction.
fn ratio(case: &Case, baseline: f64) -> Option<f64> {
    let t = case.tidings?;
    if t <= 0.0 || baseline <= 0.0 {
        return None;
    }
    Some(if case.higher_is_better {
        t / baseline
    } else {
        baseline / t
    })
}

/// The stdout table: one line per case, then the notes.
pub(crate) fn table(report: &Report) -> String {
    let mut s = String::new();
    let w = report
        .cases
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(10)
        .max(10);
    let _ = writeln!(
        s,
        "\n{:<w$}  {:<13} {:>9}  baselines (tidings speed-up vs each: >1 = tidings better)",
        "case", "unit", "tidings"
    );
    let _ = writeln!(s, "{}", "-".repeat(w + 90));
    for c in &report.cases {
        let bl: Vec<String> = c
            .baselines
            .iter()
            .map(|(n, v)| match ratio(c, *v) {
                Some(r) => format!("{n}={} ({r:.2}x)", fmt_value(*v)),
                None => format!("{n}={}", fmt_value(*v)),
            })
            .collect();
        let _ = writeln!(
            s,
            "{:<w$}  {:<13} {:>9}  {}",
            c.name,
            c.unit,
            opt(c.tidings),
            bl.join("  ")
        );
    }
    let _ = writeln!(s, "\nnotes:");
    for c in &report.cases {
        if !c.notes.is_empty() {
            let _ = writeln!(s, "  {}: {}", c.name, c.notes);
        }
    }
    s
}

/// Case families, in report order, with the heading and the analysis prompt for each.
const FAMILIES: [(&str, &str, &str); 10] = [
    (
        "fanout",
        "Fan-out",
        "How delivery rate scales with subscriber count per driver; where tidings pays for its \
         per-subscription queue, counters and dispatcher versus a bare channel per subscriber; \
         tokio-broadcast's losses; qubit-event-bus.",
    ),
    (
        "latency",
        "Latency",
        "Publish-to-handler percentiles at the offered rate, per driver, against a bare crossbeam \
         channel; where the tail comes from (wake-ups, scheduling).",
    ),
    (
        "scale",
        "Scale",
        "Delivery rate and heap bytes per idle subscription at 1,000 and 100,000 subscriptions.",
    ),
    (
        "perkey",
        "Per-key concurrency",
        "Deliveries per second of healthy keys while 1% of keys fail and stay parked for a retry, \
         against the same subscription with no failures.",
    ),
    (
        "match",
        "Topic matching",
        "Trie cost per match against the exact-match floor and a linear scan; how it grows with \
         wildcard patterns.",
    ),
    (
        "log",
        "Durable log",
        "Append throughput by fsync policy against raw writes and raw fdatasync; how much group \
         commit recovers with many publishers; read throughput against a raw sequential read.",
    ),
    (
        "jetstream",
        "JetStream backend",
        "The JetStream backend against raw async-nats doing the same work on one local \
         nats-server: publish with acknowledgement, consume, and both through the broker.",
    ),
    (
        "jetstream-default",
        "JetStream backend, the server's default sync",
        "The same JetStream cases on a server with its default sync, where the disk no longer \
         hides tidings' own cost.",
    ),
    (
        "alloc",
        "Allocations per publish",
        "Heap allocations per published-and-delivered message in steady state on a cached \
         route, counted on every thread.",
    ),
    (
        "transport",
        "NATS transport",
        "Buffered subscriptions across brokers over core NATS against raw async-nats core \
         publish and subscribe; the losses of both sides.",
    ),
];

/// The 1-minute load average: other work on the machine skews every number.
pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

pub(crate) fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| format!(", {:.1} GiB RAM", kb / 1024.0 / 1024.0))
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|k| format!(", Linux {}", k.trim()))
        .unwrap_or_default();
    format!("{cpu}, {nproc} logical CPUs (nproc){mem}{kernel}")
}

/// The BENCHMARKS.md skeleton.
pub(crate) fn markdown(
    report: &Report,
    command: &str,
    wall: Duration,
    load: &str,
    charts: &[String],
    chart_dir: Option<&Path>,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Benchmarks\n");
    let _ = writeln!(
        s,
        "Generated by `tidings-bench` (crate `crates/tidings-bench`). Every case runs tidings and its \
         baselines interleaved over several rounds (A B C, B C A, …) and reports the **median** of each; \
         `(Nx)` is tidings relative to that baseline in the case's direction (>1 = tidings better).\n"
    );
    let _ = writeln!(s, "* **Machine:** {}", machine());
    let _ = writeln!(s, "* **Command:** `{command}`");
    let _ = writeln!(s, "* **Wall time:** {:.0} s", wall.as_secs_f64());
    let _ = writeln!(
        s,
        "* **Load average (1 min):** {load} — anything else running skews the numbers"
    );
    let _ = writeln!(
        s,
        "* **Skipped values** are `-` here and `null` in the JSON; the notes say why.\n"
    );
    if !charts.is_empty() {
        let dir = chart_dir
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        let _ = writeln!(s, "Charts:\n");
        for c in charts {
            let _ = writeln!(s, "* [`{c}`]({dir}/{c})");
        }
        let _ = writeln!(s);
    }
    for (prefix, title, prompt) in FAMILIES {
        let cases: Vec<&Case> = report
            .cases
            .iter()
            .filter(|c| c.name.split('/').next() == Some(prefix))
            .collect();
        if cases.is_empty() {
            continue;
        }
        let _ = writeln!(s, "## {title}\n");
        let _ = writeln!(
            s,
            "<!-- ANALYSIS({prefix}): {prompt} -->\n_Analysis to be written._\n"
        );
        for c in charts.iter().filter(|c| c.starts_with(prefix)) {
            let dir = chart_dir
                .map(|d| format!("{}/", d.display()))
                .unwrap_or_default();
            let _ = writeln!(s, "![{c}]({dir}{c})\n");
        }
        let baselines: BTreeSet<&str> = cases
            .iter()
            .flat_map(|c| c.baselines.keys().map(String::as_str))
            .collect();
        let _ = write!(s, "| case | unit | tidings |");
        for b in &baselines {
            let _ = write!(s, " {b} |");
        }
        let _ = write!(s, "\n|---|---|---:|");
        for _ in &baselines {
            let _ = write!(s, "---:|");
        }
        let _ = writeln!(s);
        for c in &cases {
            let _ = write!(s, "| `{}` | {} | {} |", c.name, c.unit, opt(c.tidings));
            for b in &baselines {
                match c.baselines.get(*b) {
                    Some(v) => match ratio(c, *v) {
                        Some(r) => {
                            let _ = write!(s, " {} ({r:.2}x) |", fmt_value(*v));
                        }
                        None => {
                            let _ = write!(s, " {} |", fmt_value(*v));
                        }
                    },
                    None => {
                        let _ = write!(s, " - |");
                    }
                }
            }
            let _ = writeln!(s);
        }
        let _ = writeln!(s, "\n<details><summary>Notes</summary>\n");
        for c in &cases {
            let _ = writeln!(s, "* `{}`: {}", c.name, c.notes.replace('|', "\\|"));
        }
        let _ = writeln!(s, "\n</details>\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::{FAMILIES, fmt_value};

    /// A case whose first name part has no section would be missing from BENCHMARKS.md.
    #[test]
    fn every_case_has_a_section_in_the_markdown() {
        for name in crate::case_names() {
            let prefix = name.split('/').next().unwrap_or_default();
            assert!(
                FAMILIES.iter().any(|(p, _, _)| *p == prefix),
                "no BENCHMARKS.md section for {name}"
            );
        }
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_value(1_234_567.0), "1.23M");
        assert_eq!(fmt_value(45_600.0), "45.6k");
        assert_eq!(fmt_value(789.2), "789");
        assert_eq!(fmt_value(1.234), "1.23");
    }
}
