//! The soak's flatness verdict (R-LIM-3): after a warm-up, a least-squares line through
//! each sampled series; a series fails when its slope is over its bound per hour **and**
//! the rise the line makes over the measured window is over its absolute bound.
//!
//! Why two bounds: a short run's slope is mostly noise (a 1 MiB step inside 96 seconds reads
//! as 37 MiB/hour), so the absolute rise keeps the two-minute CI run from failing on an
//! allocator's step; on an hour's run the window is long enough that the slope bound is the
//! one that binds (8 MiB/hour over 48 minutes is a 6.4 MiB rise).
//!
//! A series that is a high-water mark by nature (a Go program's OS threads: its runtime
//! starts one when every thread is blocked in a system call and never ends it) steps up
//! once in a while and never down, so a slope says nothing about it; it is held to a
//! ceiling instead, which a leak crosses and a runtime's pool does not.

use serde::Serialize;

/// A series' bounds: growth over both `per_hour` and `rise` fails it, and so does any
/// sample after the warm-up over `ceiling`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct Bound {
    /// Largest least-squares slope, in the series' unit per hour.
    pub per_hour: f64,
    /// Largest rise of the fitted line over the measured window, in the series' unit.
    pub rise: f64,
    /// Largest value after the warm-up (infinite for series judged by their trend).
    pub ceiling: f64,
}

impl Bound {
    /// Judged by its trend: a slope over `per_hour` together with a rise over `rise`.
    pub(crate) const fn trend(per_hour: f64, rise: f64) -> Self {
        Self {
            per_hour,
            rise,
            ceiling: f64::INFINITY,
        }
    }

    /// Judged by a ceiling only (a high-water mark; see the module docs).
    pub(crate) const fn ceiling(ceiling: f64) -> Self {
        Self {
            per_hour: f64::INFINITY,
            rise: f64::INFINITY,
            ceiling,
        }
    }
}

/// What one series did after the warm-up.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Flatness {
    /// Least-squares slope, unit per hour.
    pub slope_per_hour: f64,
    /// The fitted line's rise over the measured window (slope × window).
    pub rise: f64,
    /// Smallest and largest sample after the warm-up.
    pub min: f64,
    pub max: f64,
    /// Samples the fit used.
    pub samples: usize,
    /// The bound it was held to.
    pub bound: Bound,
    /// False when both the slope and the rise were over their bounds, or a sample was
    /// over the ceiling.
    pub flat: bool,
}

/// The least-squares slope of `points` (`(seconds, value)`), in value per second; `None`
/// with fewer than two distinct times.
pub(crate) fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mean_t = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_v = points.iter().map(|p| p.1).sum::<f64>() / n;
    let (mut num, mut den) = (0.0, 0.0);
    for (t, v) in points {
        num += (t - mean_t) * (v - mean_v);
        den += (t - mean_t) * (t - mean_t);
    }
    (den > 0.0).then(|| num / den)
}

/// R-LIM-3: judge one series. `points` are `(seconds since start, value)`; those before
/// `warmup_secs` are left out. `None` when fewer than two samples remain (nothing to judge:
/// the caller reports that as a failure of the run, never as flat).
pub(crate) fn judge(points: &[(f64, f64)], warmup_secs: f64, bound: Bound) -> Option<Flatness> {
    let kept: Vec<(f64, f64)> = points
        .iter()
        .copied()
        .filter(|(t, v)| *t >= warmup_secs && v.is_finite())
        .collect();
    let per_sec = slope(&kept)?;
    let window = kept.last()?.0 - kept.first()?.0;
    let slope_per_hour = per_sec * 3600.0;
    let rise = per_sec * window;
    let max = kept.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let flat = !(slope_per_hour > bound.per_hour && rise > bound.rise) && max <= bound.ceiling;
    Some(Flatness {
        slope_per_hour,
        rise,
        min: kept.iter().map(|p| p.1).fold(f64::INFINITY, f64::min),
        max,
        samples: kept.len(),
        bound,
        flat,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const RSS: Bound = Bound::trend(8.0, 4.0);

    /// One sample every 5 s for `secs`, `f(t)` at each.
    fn series(secs: u32, f: impl Fn(f64) -> f64) -> Vec<(f64, f64)> {
        (0..=secs / 5)
            .map(|i| {
                let t = f64::from(i * 5);
                (t, f(t))
            })
            .collect()
    }

    // R-LIM-3: the verdict math on synthetic series.
    #[test]
    fn slope_of_a_line_is_exact() {
        let s = slope(&series(600, |t| 3.0 + 0.5 * t)).unwrap();
        assert!((s - 0.5).abs() < 1e-12, "{s}");
        assert_eq!(slope(&[(1.0, 2.0)]), None);
        assert_eq!(slope(&[(1.0, 2.0), (1.0, 3.0)]), None, "one time only");
    }

    // R-LIM-3
    #[test]
    fn a_steady_leak_fails_and_a_warm_up_ramp_does_not() {
        // An hour at 100 MiB plus 12 MiB/hour: over both bounds.
        let leak = series(3600, |t| 100.0 + 12.0 * t / 3600.0);
        let v = judge(&leak, 720.0, RSS).unwrap();
        assert!(!v.flat, "{v:?}");
        assert!((v.slope_per_hour - 12.0).abs() < 1e-9, "{v:?}");
        assert!((v.rise - 12.0 * 2880.0 / 3600.0).abs() < 1e-9, "{v:?}");

        // A ramp of 50 MiB during the first 10 minutes, flat (with a sawtooth of ±1 MiB)
        // after: the warm-up (first 20 %) hides the ramp.
        let warm = series(3600, |t| {
            let saw = if (t as u64 / 5).is_multiple_of(2) {
                1.0
            } else {
                -1.0
            };
            100.0 + 50.0 * (t / 600.0).min(1.0) + saw
        });
        let v = judge(&warm, 720.0, RSS).unwrap();
        assert!(v.flat, "{v:?}");
        assert!(v.slope_per_hour.abs() < 0.1, "{v:?}");
        assert_eq!((v.min, v.max), (149.0, 151.0));
        // Without the warm-up the ramp is a trend.
        assert!(!judge(&warm, 0.0, RSS).unwrap().flat);
    }

    // R-LIM-3
    #[test]
    fn a_short_run_needs_both_bounds_exceeded() {
        // Two minutes, one 1 MiB step in the middle: a steep slope (tens of MiB/hour)
        // but a rise under the absolute bound, so flat.
        let step = series(120, |t| if t < 60.0 { 50.0 } else { 51.0 });
        let v = judge(&step, 24.0, RSS).unwrap();
        assert!(
            v.slope_per_hour > RSS.per_hour && v.rise < RSS.rise,
            "{v:?}"
        );
        assert!(v.flat);
        // The same two minutes losing 10 MiB a minute: both over, not flat.
        let leak = series(120, |t| 50.0 + 10.0 * t / 60.0);
        assert!(!judge(&leak, 24.0, RSS).unwrap().flat);
        // Counts that must not move: one object more in the last two samples (a member
        // joining) is a fitted rise of about half an object, under one.
        let objects = Bound::trend(1.0, 1.0);
        let one_more = series(120, |t| if t < 115.0 { 3.0 } else { 4.0 });
        let v = judge(&one_more, 24.0, objects).unwrap();
        assert!(v.rise < 1.0 && v.flat, "{v:?}");
        let climbing = series(120, |t| 3.0 + (t / 30.0).floor());
        assert!(!judge(&climbing, 24.0, objects).unwrap().flat);
    }

    // R-LIM-3: a Go server's threads in a two-minute CI run stepped 11 → 19 at 90 s (its
    // runtime starting threads for a burst of blocking calls) and stayed: a fitted rise
    // of 10.8 that the trend bound called a leak. Held to a ceiling, that step is flat; a
    // count that keeps climbing crosses it.
    #[test]
    fn a_high_water_mark_is_held_to_its_ceiling() {
        let threads = Bound::ceiling(64.0);
        let step = series(120, |t| if t < 90.0 { 11.0 } else { 19.0 });
        let v = judge(&step, 24.0, threads).unwrap();
        assert!(v.rise > 2.0 && v.flat, "{v:?}");
        assert!(!judge(&step, 24.0, Bound::trend(2.0, 2.0)).unwrap().flat);
        let leak = series(3600, |t| 20.0 + (t / 60.0).floor());
        let v = judge(&leak, 720.0, threads).unwrap();
        assert!(!v.flat && v.max > 64.0, "{v:?}");
    }

    // R-LIM-3: too few samples is no verdict, never a pass.
    #[test]
    fn nothing_to_judge_is_none() {
        assert_eq!(judge(&series(10, |_| 1.0), 10.0, RSS), None);
        assert_eq!(judge(&[], 0.0, RSS), None);
    }
}
