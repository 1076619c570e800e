//! The soak's curves, drawn by the bench's own line chart ([`crate::plot::line_chart`]):
//! `soak_memory.svg` (RSS), `soak_threads_fds.svg` and `soak_server.svg` (streams,
//! consumers, buckets), time along x.

use crate::plot::{Chart, Series, line_chart};

use super::{SERIES, Sample};

/// Most points per curve: longer runs are thinned to every k-th sample (the JSON keeps all).
const MAX_POINTS: usize = 120;
/// Labelled ticks along x.
const LABELS: usize = 8;

fn time_label(t: f64, total: f64) -> String {
    if total >= 600.0 {
        format!("{:.0} min", t / 60.0)
    } else {
        format!("{t:.0} s")
    }
}

/// `(file name, svg)` for each chart.
pub(crate) fn charts(samples: &[Sample], warmup_secs: f64) -> Vec<(String, String)> {
    let step = samples.len().div_ceil(MAX_POINTS).max(1);
    let kept: Vec<&Sample> = samples.iter().step_by(step).collect();
    let total = kept.last().map_or(0.0, |s| s.t);
    let every = kept.len().div_ceil(LABELS).max(1);
    let categories: Vec<String> = kept
        .iter()
        .enumerate()
        .map(|(i, s)| {
            if i % every == 0 {
                time_label(s.t, total)
            } else {
                String::new()
            }
        })
        .collect();
    let series = |names: &[&str]| -> Vec<Series> {
        names
            .iter()
            .filter_map(|name| {
                let i = SERIES.iter().position(|s| s.name == *name)?;
                Some(Series {
                    // The unit is the chart's y label: the legend column is narrow.
                    name: SERIES[i].name.to_owned(),
                    values: kept.iter().map(|s| s.values[i]).collect(),
                })
            })
            .collect()
    };
    let x_label = format!(
        "time since start (first {} are warm-up, left out of the fit)",
        time_label(warmup_secs, total)
    );
    let mut out = Vec::new();
    for (file, title, y_label, names) in [
        (
            "soak_memory.svg",
            "Soak: resident memory",
            "MiB",
            &["soak RSS", "nats-server RSS", "workers RSS"][..],
        ),
        (
            "soak_threads_fds.svg",
            "Soak: threads and open file descriptors",
            "count",
            &[
                "soak threads",
                "soak fds",
                "nats-server threads",
                "nats-server fds",
                "workers threads",
                "workers fds",
            ][..],
        ),
        (
            "soak_server.svg",
            "Soak: JetStream objects on the server",
            "count",
            &["streams", "consumers", "KV buckets"][..],
        ),
    ] {
        let chart = Chart {
            title,
            y_label,
            x_label: &x_label,
            categories: &categories,
            log_y: false,
        };
        out.push((file.to_owned(), line_chart(&chart, &series(names))));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_runs_are_thinned_and_labelled() {
        let samples: Vec<Sample> = (0..720)
            .map(|i| Sample {
                t: f64::from(i) * 5.0,
                values: vec![Some(1.0); SERIES.len()],
            })
            .collect();
        let charts = charts(&samples, 720.0);
        assert_eq!(charts.len(), 3);
        let (_, memory) = &charts[0];
        // Three RSS curves, at most MAX_POINTS points each.
        assert!(memory.matches("<circle").count() <= 3 * MAX_POINTS);
        assert!(memory.contains("12 min"), "warm-up label");
    }
}
