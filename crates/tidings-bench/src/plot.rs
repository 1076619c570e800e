//! Hand-written SVG charts: a line chart and a grouped bar chart, linear or log y.
//!
//! [`charts`] turns a report into:
//! * `fanout.svg` — deliveries/s by subscriber count, one line per tidings driver and baseline;
//! * `latency.svg` — p50/p99/p99.9 per driver, tidings against crossbeam (log y);
//! * `log_append.svg` — append records/s by fsync policy, tidings against raw I/O (log y);
//! * `scale.svg` — deliveries/s at 1,000 and 100,000 subscriptions.

use std::fmt::Write as _;

use crate::output::fmt_value;
use crate::{DRIVERS, Report};

const W: f64 = 760.0;
const H: f64 = 440.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

/// One named series of values, one per x category (`None` = not measured).
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// One value per category.
    pub values: Vec<Option<f64>>,
}

/// Axis and title text.
#[derive(Debug, Clone)]
pub struct Chart<'a> {
    /// Title on top.
    pub title: &'a str,
    /// Y axis label.
    pub y_label: &'a str,
    /// X axis label.
    pub x_label: &'a str,
    /// Category labels along x.
    pub categories: &'a [String],
    /// Logarithmic y axis (for values spanning decades).
    pub log_y: bool,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

struct Scale {
    lo: f64,
    hi: f64,
    log: bool,
}

impl Scale {
    fn new(series: &[Series], log: bool) -> Self {
        let vals: Vec<f64> = series
            .iter()
            .flat_map(|s| s.values.iter().flatten().copied())
            .filter(|v| v.is_finite() && (!log || *v > 0.0))
            .collect();
        let max = vals.iter().copied().fold(0.0_f64, f64::max);
        let min = vals.iter().copied().fold(f64::INFINITY, f64::min);
        if log {
            let lo = if min.is_finite() {
                min.log10().floor()
            } else {
                0.0
            };
            let hi = if max > 0.0 {
                max.log10().ceil().max(lo + 1.0)
            } else {
                lo + 1.0
            };
            Self { lo, hi, log }
        } else {
            Self {
                lo: 0.0,
                hi: if max > 0.0 { nice(max * 1.1) } else { 1.0 },
                log,
            }
        }
    }
    fn y(&self, v: f64) -> f64 {
        let f = if self.log {
            (v.max(1e-300).log10() - self.lo) / (self.hi - self.lo)
        } else {
            (v - self.lo) / (self.hi - self.lo)
        };
        H - BOTTOM - f.clamp(0.0, 1.0) * (H - TOP - BOTTOM)
    }
    fn ticks(&self) -> Vec<f64> {
        if self.log {
            (self.lo as i32..=self.hi as i32)
                .map(|e| 10f64.powi(e))
                .collect()
        } else {
            (0..=5).map(|i| self.hi * f64::from(i) / 5.0).collect()
        }
    }
}

/// Short tick labels: 1, 10, 100, 1k, 10k, 100k, 1M, … (others via `fmt_value`).
fn tick(v: f64) -> String {
    for (div, suffix) in [(1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")] {
        let x = v / div;
        if v >= div && (x - x.round()).abs() < 1e-9 {
            return format!("{}{suffix}", x.round());
        }
    }
    fmt_value(v)
}

/// Round up to 1, 2, 2.5 or 5 × 10^k.
fn nice(v: f64) -> f64 {
    let e = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if v <= m * e {
            return m * e;
        }
    }
    10.0 * e
}

fn frame(c: &Chart<'_>, scale: &Scale, series: &[Series]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        (W - RIGHT + LEFT) / 2.0,
        esc(c.title)
    );
    for t in scale.ticks() {
        let y = scale.y(t);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            tick(t)
        );
    }
    let _ = writeln!(
        s,
        r#"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{:.1}" stroke="black"/><line x1="{LEFT}" y1="{0:.1}" x2="{:.1}" y2="{0:.1}" stroke="black"/>"#,
        H - BOTTOM,
        W - RIGHT
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18,{:.1}) rotate(-90)" text-anchor="middle">{}{}</text>"#,
        (H - BOTTOM + TOP) / 2.0,
        esc(c.y_label),
        if scale.log { " (log scale)" } else { "" }
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        (W - RIGHT + LEFT) / 2.0,
        H - 14.0,
        esc(c.x_label)
    );
    for (i, se) in series.iter().enumerate() {
        let y = TOP + 10.0 + 20.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{:.1}" y="{:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            W - RIGHT + 14.0,
            y - 10.0,
            COLORS[i % COLORS.len()],
            W - RIGHT + 32.0,
            y,
            esc(&se.name)
        );
    }
    s
}

fn x_of(i: usize, n: usize) -> f64 {
    let span = W - RIGHT - LEFT;
    LEFT + span * (i as f64 + 0.5) / n.max(1) as f64
}

fn x_labels(s: &mut String, cats: &[String]) {
    for (i, c) in cats.iter().enumerate() {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            x_of(i, cats.len()),
            H - BOTTOM + 18.0,
            esc(c)
        );
    }
}

/// A line chart with one point per category; gaps where a value is missing.
#[must_use]
pub fn line_chart(c: &Chart<'_>, series: &[Series]) -> String {
    let scale = Scale::new(series, c.log_y);
    let mut s = frame(c, &scale, series);
    x_labels(&mut s, c.categories);
    let n = c.categories.len();
    for (k, se) in series.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let mut path = String::new();
        let mut pen_down = false;
        for (i, v) in se.values.iter().enumerate() {
            match v {
                Some(v) => {
                    let _ = write!(
                        path,
                        "{}{:.1},{:.1} ",
                        if pen_down { "L" } else { "M" },
                        x_of(i, n),
                        scale.y(*v)
                    );
                    pen_down = true;
                    let _ = writeln!(
                        s,
                        r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{color}"><title>{}: {}</title></circle>"#,
                        x_of(i, n),
                        scale.y(*v),
                        esc(&se.name),
                        fmt_value(*v)
                    );
                }
                None => pen_down = false,
            }
        }
        if !path.is_empty() {
            let _ = writeln!(
                s,
                r#"<path d="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
                path.trim_end()
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

/// Grouped bars: one group per category, one bar per series.
#[must_use]
pub fn bar_chart(c: &Chart<'_>, series: &[Series]) -> String {
    let scale = Scale::new(series, c.log_y);
    let mut s = frame(c, &scale, series);
    x_labels(&mut s, c.categories);
    let n = c.categories.len();
    let group = (W - RIGHT - LEFT) / n.max(1) as f64 * 0.8;
    let bar = group / series.len().max(1) as f64;
    let base = H - BOTTOM;
    for (k, se) in series.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        for (i, v) in se.values.iter().enumerate() {
            let Some(v) = v else { continue };
            let x = x_of(i, n) - group / 2.0 + bar * k as f64;
            let y = scale.y(*v);
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{color}"><title>{}: {}</title></rect>"#,
                (bar - 1.0).max(1.0),
                (base - y).max(0.0),
                esc(&se.name),
                fmt_value(*v)
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

fn value(report: &Report, case: &str, who: &str) -> Option<f64> {
    let c = report.cases.iter().find(|c| c.name == case)?;
    if who == "tidings" {
        c.tidings
    } else {
        c.baselines.get(who).copied()
    }
}

/// Baseline names appearing in cases whose name starts with `prefix`, in first-seen order.
fn baselines_of(report: &Report, prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for c in report.cases.iter().filter(|c| c.name.starts_with(prefix)) {
        for b in c.baselines.keys() {
            if !v.contains(b) {
                v.push(b.clone());
            }
        }
    }
    v
}

/// Build every chart the report has data for: `(file name, svg)`.
#[must_use]
pub fn charts(report: &Report) -> Vec<(String, String)> {
    let mut out = Vec::new();

    // Fan-out scaling.
    let ns = crate::fanout::NS;
    let cats: Vec<String> = ns.iter().map(|n| format!("n={n}")).collect();
    let mut series = Vec::new();
    for d in DRIVERS {
        let values: Vec<Option<f64>> = ns
            .iter()
            .map(|n| value(report, &format!("fanout/n={n}/{}", d.label()), "tidings"))
            .collect();
        if values.iter().any(Option::is_some) {
            series.push(Series {
                name: format!("tidings/{}", d.label()),
                values,
            });
        }
    }
    for b in baselines_of(report, "fanout/") {
        let values = ns
            .iter()
            .map(|n| {
                DRIVERS
                    .iter()
                    .find_map(|d| value(report, &format!("fanout/n={n}/{}", d.label()), &b))
            })
            .collect();
        series.push(Series { name: b, values });
    }
    if !series.is_empty() {
        let chart = Chart {
            title: "Fan-out: deliveries/s by subscriber count (1 publisher, 64 B)",
            y_label: "deliveries/s",
            x_label: "subscribers",
            categories: &cats,
            log_y: true,
        };
        out.push(("fanout.svg".to_owned(), line_chart(&chart, &series)));
    }

    // Latency percentiles.
    let mut cats = Vec::new();
    let mut t = Vec::new();
    let mut x = Vec::new();
    for d in DRIVERS {
        for p in ["p50", "p99", "p99.9"] {
            let name = format!("latency/{p}/{}", d.label());
            let tv = value(report, &name, "tidings");
            let xv = value(report, &name, "crossbeam-per-subscriber");
            if tv.is_some() || xv.is_some() {
                cats.push(format!("{} {p}", d.label()));
                t.push(tv);
                x.push(xv);
            }
        }
    }
    if !cats.is_empty() {
        let series = vec![
            Series {
                name: "tidings".into(),
                values: t,
            },
            Series {
                name: "crossbeam".into(),
                values: x,
            },
        ];
        let chart = Chart {
            title: "Publish-to-handler latency at a fixed offered rate",
            y_label: "microseconds",
            x_label: "driver, percentile",
            categories: &cats,
            log_y: true,
        };
        out.push(("latency.svg".to_owned(), bar_chart(&chart, &series)));
    }

    // Log appends by fsync policy.
    let cases = [
        ("never", "log/append/never"),
        ("interval", "log/append/interval"),
        ("always", "log/append/always"),
        ("always, 64 pub", "log/append/always/publishers=64"),
    ];
    let present: Vec<_> = cases
        .iter()
        .filter(|(_, n)| report.cases.iter().any(|c| c.name == *n))
        .collect();
    if !present.is_empty() {
        let cats: Vec<String> = present.iter().map(|(l, _)| (*l).to_owned()).collect();
        let mut who = vec!["tidings".to_owned()];
        who.extend(baselines_of(report, "log/append"));
        let series: Vec<Series> = who
            .iter()
            .map(|w| Series {
                name: w.clone(),
                values: present.iter().map(|(_, n)| value(report, n, w)).collect(),
            })
            .collect();
        let chart = Chart {
            title: "Log append throughput by fsync policy (256 B records)",
            y_label: "records/s",
            x_label: "fsync policy",
            categories: &cats,
            log_y: true,
        };
        out.push(("log_append.svg".to_owned(), bar_chart(&chart, &series)));
    }

    // Scale.
    let mut cats = Vec::new();
    let mut names = Vec::new();
    for s in ["1000", "100000"] {
        for d in ["pool", "tokio"] {
            let n = format!("scale/subs={s}/{d}");
            if report.cases.iter().any(|c| c.name == n) {
                cats.push(format!("{s} {d}"));
                names.push(n);
            }
        }
    }
    if !names.is_empty() {
        let mut who = vec!["tidings".to_owned()];
        who.extend(baselines_of(report, "scale/"));
        let series: Vec<Series> = who
            .iter()
            .map(|w| Series {
                name: w.clone(),
                values: names.iter().map(|n| value(report, n, w)).collect(),
            })
            .collect();
        let chart = Chart {
            title: "Scale: deliveries/s with many subscriptions",
            y_label: "deliveries/s",
            x_label: "subscriptions, driver",
            categories: &cats,
            log_y: true,
        };
        out.push(("scale.svg".to_owned(), bar_chart(&chart, &series)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_is_well_formed_enough() {
        let cats = vec!["a".to_owned(), "b".to_owned()];
        let c = Chart {
            title: "t <x>",
            y_label: "y",
            x_label: "x",
            categories: &cats,
            log_y: true,
        };
        let series = vec![Series {
            name: "s".into(),
            values: vec![Some(10.0), None],
        }];
        let svg = bar_chart(&c, &series);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("t &lt;x&gt;"));
        let svg = line_chart(&c, &series);
        assert_eq!(svg.matches("<circle").count(), 1);
    }
}
