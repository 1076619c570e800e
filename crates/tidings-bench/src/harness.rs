//! Interleaved rounds, medians, and a completion latch.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

/// One round of one contender: returns the measured value.
pub(crate) type Round<'a> = Box<dyn FnMut() -> Result<f64, String> + 'a>;

/// A contender in an interleaved comparison.
pub(crate) struct Contender<'a> {
    pub name: String,
    pub round: Round<'a>,
}

impl<'a> Contender<'a> {
    pub(crate) fn new(
        name: impl Into<String>,
        round: impl FnMut() -> Result<f64, String> + 'a,
    ) -> Self {
        Self {
            name: name.into(),
            round: Box::new(round),
        }
    }
}

/// What one contender produced over all rounds.
#[derive(Debug, Clone, Default)]
pub(crate) struct ContenderRun {
    pub name: String,
    pub samples: Vec<f64>,
    /// Set when a round failed; later rounds were not run.
    pub error: Option<String>,
}

impl ContenderRun {
    /// Median of the samples, when every round succeeded.
    pub(crate) fn median(&self) -> Option<f64> {
        if self.error.is_some() {
            return None;
        }
        median(&self.samples)
    }
}

/// Median (mean of the two middle values for an even count).
pub(crate) fn median(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

/// Debugging aid: `TIDINGS_BENCH_SYSTEMS=tidings,crossbeam` runs only contenders whose name
/// contains one of the comma-separated words (a profile of one system at a time).
pub(crate) fn system_enabled(name: &str) -> bool {
    match std::env::var("TIDINGS_BENCH_SYSTEMS") {
        Ok(list) if !list.is_empty() => list.split(',').any(|w| name.contains(w.trim())),
        _ => true,
    }
}

/// Run `rounds` rounds; in round `r` the contenders run in order rotated by `r`
/// (A B C, B C A, C A B, …) so no one always goes first or last.
pub(crate) fn interleave(rounds: usize, contenders: &mut [Contender<'_>]) -> Vec<ContenderRun> {
    let mut out: Vec<ContenderRun> = contenders
        .iter()
        .map(|c| ContenderRun {
            name: c.name.clone(),
            ..ContenderRun::default()
        })
        .collect();
    let n = contenders.len();
    for (o, c) in out.iter_mut().zip(contenders.iter()) {
        if !system_enabled(&c.name) {
            o.error = Some("disabled by TIDINGS_BENCH_SYSTEMS".into());
        }
    }
    for r in 0..rounds {
        for k in 0..n {
            let i = (r + k) % n;
            if out[i].error.is_some() {
                continue;
            }
            match (contenders[i].round)() {
                Ok(v) => out[i].samples.push(v),
                Err(e) => out[i].error = Some(e),
            }
        }
    }
    out
}

/// Completion latch for "all N subscribers have reached their target count".
///
/// Each subscriber keeps its own running count and calls [`Tally::hit`] with the count
/// before and after each increment; only the crossing of the target touches shared state, so
/// the latch costs the hot path one relaxed load.
pub(crate) struct Tally {
    target: AtomicU64,
    remaining: AtomicUsize,
    done: Mutex<bool>,
    cv: Condvar,
}

impl Tally {
    pub(crate) fn new() -> Self {
        Self {
            target: AtomicU64::new(u64::MAX),
            remaining: AtomicUsize::new(0),
            done: Mutex::new(false),
            cv: Condvar::new(),
        }
    }

    /// Expect `parties` subscribers to each reach the cumulative count `target`.
    pub(crate) fn arm(&self, target: u64, parties: usize) {
        *self.done.lock().unwrap_or_else(PoisonError::into_inner) = parties == 0;
        self.remaining.store(parties, Ordering::SeqCst);
        self.target.store(target, Ordering::SeqCst);
    }

    /// A subscriber's count went from `before` to `after`.
    #[inline]
    pub(crate) fn hit(&self, before: u64, after: u64) {
        let target = self.target.load(Ordering::Acquire);
        if before < target && after >= target && self.remaining.fetch_sub(1, Ordering::AcqRel) == 1
        {
            *self.done.lock().unwrap_or_else(PoisonError::into_inner) = true;
            self.cv.notify_all();
        }
    }

    /// Wait until every party reached the target; false on timeout.
    pub(crate) fn wait(&self, timeout: Duration) -> bool {
        let guard = self.done.lock().unwrap_or_else(PoisonError::into_inner);
        let (guard, _) = self
            .cv
            .wait_timeout_while(guard, timeout, |done| !*done)
            .unwrap_or_else(PoisonError::into_inner);
        *guard
    }

    /// Parties that have not reached the target yet.
    pub(crate) fn remaining(&self) -> usize {
        self.remaining.load(Ordering::SeqCst)
    }
}

/// Deterministic PRNG (splitmix64) so generated workloads are identical across runs.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n`.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn interleave_rotates() {
        let order = std::cell::RefCell::new(Vec::new());
        let mut cs = vec![
            Contender::new("a", || {
                order.borrow_mut().push('a');
                Ok(1.0)
            }),
            Contender::new("b", || {
                order.borrow_mut().push('b');
                Ok(2.0)
            }),
        ];
        let out = interleave(3, &mut cs);
        drop(cs);
        assert_eq!(order.into_inner(), vec!['a', 'b', 'b', 'a', 'a', 'b']);
        assert_eq!(out[1].median(), Some(2.0));
    }

    #[test]
    fn tally_crossing() {
        let t = Tally::new();
        t.arm(2, 2);
        t.hit(0, 1);
        t.hit(1, 2);
        assert_eq!(t.remaining(), 1);
        t.hit(0, 5);
        assert!(t.wait(Duration::from_millis(10)));
    }
}
