//! The run of one target: corpus, mutation loop, checks, and what a failure leaves behind.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use crate::alloc;
use crate::mutate::mutate;
use crate::panics;
use crate::rng::{Rng, fnv1a};

/// Seconds each target runs for when `TIDINGS_FUZZ_SECS` is not set.
pub const DEFAULT_SECS: f64 = 4.0;
/// Seconds one input may run before it counts as a hang, when `TIDINGS_FUZZ_HANG_SECS` is
/// not set. Generous: a decoder takes microseconds, and a loaded machine must not turn a
/// slow input into a false hang.
pub const DEFAULT_HANG_SECS: f64 = 20.0;

/// What one call of a target observed: a label of its result (which error, or success and
/// its shape), folded to a number. An input that produces an outcome the run has not seen
/// joins the live corpus, so mutation reaches past the first error a decoder returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Outcome(u64);

impl Outcome {
    /// The outcome labelled `label` (an error's text or kind, "ok", a status code …).
    pub fn of(label: impl Hash) -> Self {
        let mut h = DefaultHasher::new();
        label.hash(&mut h);
        Self(h.finish())
    }
}

/// A fuzz target: its name, how to replay it, its seeds, and its bounds. See the crate docs.
#[must_use = "a target does nothing until `run`"]
pub struct Target {
    name: &'static str,
    cargo_args: &'static str,
    seeds: Vec<Vec<u8>>,
    dictionary: Vec<Vec<u8>>,
    max_len: usize,
    alloc_bound: Option<fn(usize) -> usize>,
    hang: Option<Duration>,
}

/// What a finished run did.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Inputs executed (kept corpus included).
    pub execs: u64,
    /// Wall-clock seconds.
    pub secs: f64,
    /// Entries in the live corpus at the end (seeds, kept files, new outcomes).
    pub corpus: usize,
    /// Distinct outcomes seen.
    pub outcomes: usize,
    /// The largest peak of heap bytes one input reached (0 when not measured).
    pub max_peak: usize,
    /// Whether allocations were measured (the crate installed [`crate::TrackingAlloc`] and
    /// the target states a bound).
    pub alloc_measured: bool,
}

enum Failure {
    Panic(String),
    Alloc {
        peak: usize,
        largest: usize,
        bound: usize,
    },
}

enum Done {
    Finished(Report),
    Failed(Failure, Vec<u8>, u64),
}

#[derive(Clone)]
struct Settings {
    seed: u64,
    secs: f64,
    max_execs: Option<u64>,
    hang: Duration,
    grow: bool,
    replay: Option<PathBuf>,
}

fn env_f64(name: &str) -> Option<f64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

impl Settings {
    fn from_env(name: &str) -> Self {
        let seed = match std::env::var("TIDINGS_FUZZ_SEED")
            .ok()
            .as_deref()
            .map(str::trim)
        {
            Some("random") => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64),
            Some(s) => s.parse().unwrap_or_else(|_| fnv1a(s.as_bytes())),
            // Fixed per target: `cargo test` runs the same inputs every time (as many as the
            // budget allows).
            None => fnv1a(name.as_bytes()),
        };
        Self {
            seed,
            secs: env_f64("TIDINGS_FUZZ_SECS")
                .unwrap_or(DEFAULT_SECS)
                .max(0.0),
            max_execs: std::env::var("TIDINGS_FUZZ_EXECS")
                .ok()
                .and_then(|v| v.trim().parse().ok()),
            hang: Duration::from_secs_f64(
                env_f64("TIDINGS_FUZZ_HANG_SECS")
                    .unwrap_or(DEFAULT_HANG_SECS)
                    .max(0.1),
            ),
            grow: std::env::var_os("TIDINGS_FUZZ_GROW").is_some_and(|v| v == "1"),
            replay: std::env::var_os("TIDINGS_FUZZ_REPLAY")
                .filter(|v| !v.is_empty())
                .map(|p| workspace().join(p)),
        }
    }
}

/// The workspace root (this crate lives in `crates/tidings-fuzz`).
fn workspace() -> PathBuf {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    ws.canonicalize().unwrap_or(ws)
}

/// `<workspace>/fuzz/corpus/<name>`: the kept corpus, committed.
#[must_use]
pub fn corpus_dir(name: &str) -> PathBuf {
    workspace().join("fuzz/corpus").join(name)
}

/// `<workspace>/target/fuzz-failures/<name>`: failing inputs, never committed.
fn failure_dir(name: &str) -> PathBuf {
    workspace().join("target/fuzz-failures").join(name)
}

fn shown(p: &Path) -> String {
    p.strip_prefix(workspace())
        .map_or_else(|_| p.display().to_string(), |r| r.display().to_string())
}

/// The kept corpus, in file-name order (so a run is a function of its seed).
fn load_dir(dir: &Path) -> Vec<Vec<u8>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    paths.iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

/// Writes `data` as `<dir>/<fnv64 hex>`; returns the path.
fn save(dir: &Path, data: &[u8]) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("{:016x}", fnv1a(data)));
    if !path.exists() {
        std::fs::write(&path, data)?;
    }
    Ok(path)
}

fn preview(data: &[u8]) -> String {
    let head: String = data.iter().take(48).map(|b| format!("{b:02x}")).collect();
    let text: String = data
        .iter()
        .take(48)
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                '.'
            }
        })
        .collect();
    let more = if data.len() > 48 { " …" } else { "" };
    format!("{head}{more}  |{text}|")
}

impl Target {
    /// A target called `name`, replayed with `cargo test <cargo_args> fuzz_<name>` (for
    /// example `"-p tidings-log --lib"`). Its test function is named `fuzz_<name>`.
    pub fn new(name: &'static str, cargo_args: &'static str) -> Self {
        Self {
            name,
            cargo_args,
            seeds: Vec::new(),
            dictionary: Vec::new(),
            max_len: 4096,
            alloc_bound: None,
            hang: None,
        }
    }

    /// The hang limit when `TIDINGS_FUZZ_HANG_SECS` is not set (default
    /// [`DEFAULT_HANG_SECS`]).
    pub fn hang_limit(mut self, limit: Duration) -> Self {
        self.hang = Some(limit);
        self
    }

    /// Seed inputs made by the real encoders (run first, every time, beside the kept corpus).
    pub fn seeds<T: Into<Vec<u8>>>(mut self, seeds: impl IntoIterator<Item = T>) -> Self {
        self.seeds.extend(seeds.into_iter().map(Into::into));
        self
    }

    /// Tokens the mutator inserts (header names, separators, methods, flags).
    pub fn dictionary<T: AsRef<[u8]>>(mut self, tokens: impl IntoIterator<Item = T>) -> Self {
        self.dictionary
            .extend(tokens.into_iter().map(|t| t.as_ref().to_vec()));
        self
    }

    /// Longest input generated (default 4096 bytes).
    pub fn max_len(mut self, n: usize) -> Self {
        self.max_len = n.max(1);
        self
    }

    /// The allocation bound: the highest live heap bytes one input of `len` bytes may reach
    /// on the calling thread. Checked when the crate installed [`crate::TrackingAlloc`].
    pub fn alloc_bound(mut self, bound: fn(usize) -> usize) -> Self {
        self.alloc_bound = Some(bound);
        self
    }

    /// Runs the target for the time budget (or replays one input) and returns the figures.
    /// `check` decodes one input and asserts the target's properties (`assert!` is how a
    /// property fails); it returns the outcome label.
    ///
    /// # Panics
    /// On a failure — a panic in `check`, an input that runs longer than the hang limit, an
    /// allocation beyond the bound — with a report naming the saved input and the one
    /// command that replays it. That is the test's failure.
    pub fn run<F>(mut self, check: F) -> Report
    where
        F: Fn(&[u8]) -> Outcome + Send + 'static,
    {
        let mut settings = Settings::from_env(self.name);
        if let (Some(h), None) = (self.hang, std::env::var_os("TIDINGS_FUZZ_HANG_SECS")) {
            settings.hang = h;
        }
        let dir = corpus_dir(self.name);
        let mut corpus: Vec<Vec<u8>> = self.seeds.clone();
        corpus.extend(load_dir(&dir));
        if corpus.is_empty() {
            corpus.push(Vec::new());
        }
        let replaying = settings.replay.is_some();
        if let Some(path) = &settings.replay {
            let data = std::fs::read(path)
                .unwrap_or_else(|e| panic!("TIDINGS_FUZZ_REPLAY={}: {e}", path.display()));
            corpus = vec![data];
        }
        panics::install();
        let measured = self.alloc_bound.is_some() && alloc::installed();
        eprintln!(
            "R-SEC-2 fuzz `{}`: seed {}, {} s, {} corpus inputs ({}){}",
            self.name,
            settings.seed,
            if replaying { 0.0 } else { settings.secs },
            corpus.len(),
            shown(&dir),
            if measured {
                ", allocation bound checked"
            } else {
                ""
            }
        );
        let progress = Arc::new(AtomicU64::new(0));
        let current = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let worker = Worker {
            name: self.name,
            settings: settings.clone(),
            corpus,
            dictionary: std::mem::take(&mut self.dictionary),
            max_len: self.max_len,
            alloc_bound: self.alloc_bound.filter(|_| measured),
            replaying,
            progress: progress.clone(),
            current: current.clone(),
        };
        std::thread::Builder::new()
            .name(format!("fuzz-{}", self.name))
            .spawn(move || {
                let done = worker.run(&check);
                let _ = tx.send(done);
            })
            .expect("spawn the fuzz worker thread");
        // The watchdog: the worker counts inputs; one count that lasts past the hang limit
        // is a hang (the worker thread is left behind; the test fails).
        let mut last = (u64::MAX, Instant::now());
        let done = loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(done) => break done,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("R-SEC-2 fuzz `{}`: the worker thread died", self.name)
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let n = progress.load(Ordering::Relaxed);
                    if n != last.0 {
                        last = (n, Instant::now());
                    } else if last.1.elapsed() >= settings.hang {
                        let input = current.lock().map(|c| c.clone()).unwrap_or_default();
                        self.fail(
                            &settings,
                            &format!(
                                "hang: one input ran longer than {:.0} s (TIDINGS_FUZZ_HANG_SECS)",
                                settings.hang.as_secs_f64()
                            ),
                            &input,
                            n,
                        );
                    }
                }
            }
        };
        match done {
            Done::Finished(report) => {
                eprintln!(
                    "R-SEC-2 fuzz `{}`: {} execs in {:.1} s ({:.0}/s), {} corpus, {} outcomes{}",
                    self.name,
                    report.execs,
                    report.secs,
                    report.execs as f64 / report.secs.max(1e-9),
                    report.corpus,
                    report.outcomes,
                    if report.alloc_measured {
                        format!(", peak heap per input {} bytes", report.max_peak)
                    } else {
                        String::new()
                    }
                );
                report
            }
            Done::Failed(failure, input, n) => {
                let what = match failure {
                    Failure::Panic(m) => format!("panic: {m}"),
                    Failure::Alloc {
                        peak,
                        largest,
                        bound,
                    } => format!(
                        "allocation beyond the bound: peak {peak} bytes live (largest single \
                         request {largest}) for a {}-byte input; the bound is {bound}",
                        input.len()
                    ),
                };
                self.fail(&settings, &what, &input, n)
            }
        }
    }

    fn fail(&self, settings: &Settings, what: &str, input: &[u8], execs: u64) -> ! {
        let saved = match save(&failure_dir(self.name), input) {
            Ok(p) => shown(&p),
            Err(e) => format!("(could not save: {e})"),
        };
        panic!(
            "\nR-SEC-2 fuzz target `{name}` failed after {execs} inputs (seed {seed}):\n  {what}\n  \
             input ({len} bytes): {preview}\n  saved: {saved}\n  replay: \
             TIDINGS_FUZZ_REPLAY={saved} cargo test {args} --all-features fuzz_{name} -- --nocapture\n  \
             keep it as a regression input: cp {saved} {corpus}/\n",
            name = self.name,
            seed = settings.seed,
            len = input.len(),
            preview = preview(input),
            args = self.cargo_args,
            corpus = shown(&corpus_dir(self.name)),
        )
    }
}

struct Worker {
    name: &'static str,
    settings: Settings,
    corpus: Vec<Vec<u8>>,
    dictionary: Vec<Vec<u8>>,
    max_len: usize,
    alloc_bound: Option<fn(usize) -> usize>,
    replaying: bool,
    progress: Arc<AtomicU64>,
    current: Arc<Mutex<Vec<u8>>>,
}

impl Worker {
    fn run(mut self, check: &dyn Fn(&[u8]) -> Outcome) -> Done {
        let start = Instant::now();
        let deadline = start + Duration::from_secs_f64(self.settings.secs);
        let mut rng = Rng::new(self.settings.seed);
        let mut seen = HashSet::new();
        let mut execs = 0u64;
        let mut max_peak = 0;
        let keep = corpus_dir(self.name);
        let dictionary: Vec<&[u8]> = self.dictionary.iter().map(Vec::as_slice).collect();
        // The kept corpus and the seeds first, as they are: every run re-checks them.
        let fixed = self.corpus.len();
        let mut input = Vec::new();
        loop {
            if execs < fixed as u64 {
                input.clone_from(&self.corpus[execs as usize]);
            } else {
                let out_of_time = match self.settings.max_execs {
                    Some(max) => execs >= max.max(fixed as u64),
                    None => Instant::now() >= deadline,
                };
                if self.replaying || out_of_time {
                    break;
                }
                let i = rng.below(self.corpus.len());
                let j = rng.below(self.corpus.len());
                input.clone_from(&self.corpus[i]);
                mutate(
                    &mut rng,
                    &mut input,
                    &self.corpus[j],
                    &dictionary,
                    self.max_len,
                );
            }
            if let Ok(mut c) = self.current.lock() {
                c.clone_from(&input);
            }
            self.progress.store(execs + 1, Ordering::Relaxed);
            if self.alloc_bound.is_some() {
                alloc::start();
            }
            let result = catch_unwind(AssertUnwindSafe(|| check(&input)));
            let measured = self.alloc_bound.map(|bound| (alloc::stop(), bound));
            execs += 1;
            let outcome = match result {
                Ok(o) => o,
                Err(payload) => {
                    let msg = payload
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "(a non-text panic payload)".to_owned());
                    let at = panics::last_location().unwrap_or_default();
                    return Done::Failed(Failure::Panic(format!("{msg} {at}")), input, execs);
                }
            };
            if let Some((m, bound)) = measured {
                max_peak = max_peak.max(m.peak);
                let bound = bound(input.len());
                if m.peak > bound {
                    return Done::Failed(
                        Failure::Alloc {
                            peak: m.peak,
                            largest: m.largest,
                            bound,
                        },
                        input,
                        execs,
                    );
                }
            }
            if seen.insert(outcome) && execs > fixed as u64 {
                if self.settings.grow {
                    let _ = save(&keep, &input);
                }
                self.corpus.push(input.clone());
            }
        }
        Done::Finished(Report {
            execs,
            secs: start.elapsed().as_secs_f64(),
            corpus: self.corpus.len(),
            outcomes: seen.len(),
            max_peak,
            alloc_measured: self.alloc_bound.is_some(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure_of(f: impl FnOnce() + std::panic::UnwindSafe) -> String {
        let err = catch_unwind(f).expect_err("the run must fail");
        err.downcast_ref::<String>().cloned().unwrap_or_default()
    }

    #[test]
    fn a_panic_is_caught_saved_and_replayable() {
        let report = failure_of(|| {
            let _ = Target::new("engine_selftest_panic", "-p tidings-fuzz --lib")
                .seeds([b"ok".to_vec(), b"BUG".to_vec()])
                .run(|d| {
                    assert!(d != b"BUG", "found the bug");
                    Outcome::of(d.len())
                });
        });
        assert!(report.contains("panic: found the bug"), "{report}");
        assert!(report.contains("src/engine.rs:"), "the place: {report}");
        assert!(
            report.contains("TIDINGS_FUZZ_REPLAY=target/fuzz-failures/engine_selftest_panic/"),
            "{report}"
        );
        let saved = failure_dir("engine_selftest_panic").join(format!("{:016x}", fnv1a(b"BUG")));
        assert_eq!(std::fs::read(saved).unwrap(), b"BUG");
    }

    #[test]
    fn a_hang_is_flagged_by_the_watchdog() {
        let report = failure_of(|| {
            let _ = Target::new("engine_selftest_hang", "-p tidings-fuzz --lib")
                .seeds([b"spin".to_vec()])
                .hang_limit(Duration::from_millis(300))
                .run(|d| {
                    if d == b"spin" {
                        // Parks for good: the abandoned worker thread ends with the process.
                        loop {
                            std::thread::park();
                        }
                    }
                    Outcome::of(0)
                });
        });
        assert!(report.contains("hang: one input ran longer"), "{report}");
        assert!(report.contains("|spin|"), "{report}");
    }

    #[test]
    fn an_allocation_beyond_the_bound_is_reported() {
        let report = failure_of(|| {
            let _ = Target::new("engine_selftest_alloc", "-p tidings-fuzz --lib")
                .seeds([vec![1u8; 8], vec![200u8; 8]])
                .alloc_bound(|len| 1024 + len)
                .run(|d| {
                    // A decoder that trusts a length byte: 200 KiB for the second seed.
                    let v = std::hint::black_box(vec![0u8; usize::from(d[0]) << 10]);
                    Outcome::of(v.len())
                });
        });
        assert!(
            report.contains("allocation beyond the bound: peak 204800"),
            "{report}"
        );
    }

    #[test]
    fn mutation_and_outcome_feedback_reach_a_nested_check() {
        // Three checks in a row, each a distinct outcome: only inputs that pass the first
        // are kept and mutated further, so the third is reached within a few thousand runs.
        let report = failure_of(|| {
            let _ = Target::new("engine_selftest_search", "-p tidings-fuzz --lib")
                .seeds([b"....".to_vec()])
                .run(|d| match d {
                    [b'T', b'I', b'D', ..] => panic!("reached"),
                    [b'T', b'I', ..] => Outcome::of(2),
                    [b'T', ..] => Outcome::of(1),
                    _ => Outcome::of(0),
                });
        });
        assert!(report.contains("panic: reached"), "{report}");
    }

    #[test]
    fn a_clean_run_reports_its_figures() {
        let r = Target::new("engine_selftest_clean", "-p tidings-fuzz --lib")
            .seeds([b"abc".to_vec()])
            .alloc_bound(|len| 4096 + 8 * len)
            .run(|d| Outcome::of(d.first().copied()));
        assert!(r.execs > 1 && r.outcomes > 1 && r.alloc_measured, "{r:?}");
    }
}
