//! # tidings-bench
//!
//! Benchmarks tidings against baselines that do the same work, and reports medians.
//!
//! ```text
//! tidings-bench [--quick] [--json PATH] [--plot DIR] [--markdown PATH] [--list] [FILTER]
//! ```
//!
//! * Every case runs tidings and its baselines **interleaved** (A B C, B C A, C A B, …) for
//!   several rounds and reports the median of each, so drift (thermal, page cache, noisy
//!   neighbours) hits all of them alike.
//! * `--quick` keeps the whole run under a minute on two cores; the full run stays under
//!   fifteen minutes.
//! * `FILTER` is a substring of case names (`fanout`, `latency/p99`, `log/append`, …).
//! * `--json PATH` writes `{"cases":[{"name","unit","higher_is_better","tidings",
//!   "baselines":{..},"notes"}]}`. A case that could not run for tidings (its driver is not
//!   built, the log feature is off) is still emitted, with `"tidings": null` and the reason in
//!   `notes`; a baseline that could not run is left out of `baselines` and explained in
//!   `notes`. Case names are stable across versions.
//! * `--plot DIR` writes hand-written SVG charts (see [`plot`]).
//! * `--markdown PATH` writes a BENCHMARKS.md skeleton: machine, command, tables, charts and
//!   an analysis placeholder per case family.
//! * `tidings-bench soak [--secs N] [--json PATH] [--plot DIR]` runs a mixed workload with
//!   kills and restarts for N seconds and checks R-LIM-3: memory, threads, descriptors and
//!   the server's objects flat after a warm-up, nothing acknowledged lost, every effect once
//!   (`tidings-bench soak --help`).
//!
//! The library is what `tidings bench` calls: [`BenchArgs`] is a clap `Args`/`Parser`, and
//! [`run`] / [`main_with_args`] do the work. The bytes-per-subscription figures need the
//! counting allocator installed in the *binary* (see [`alloc::CountingAlloc`]).
//!
//! # Features
//! - `log` (default): the `log/*` cases measure tidings' durable log; pulls in
//!   `tidings-log`. Without it those cases are still emitted, with `"tidings": null`, and
//!   their raw-file baselines still run. No public item depends on it.
// The counting allocator (`alloc`) implements `GlobalAlloc`, which is unsafe by nature;
// every other module is safe code.
#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod alloc;
mod alloc_publish;
mod env;
mod fanout;
mod harness;
mod jetstream;
mod keyed_group;
mod latency;
mod logbench;
mod matching;
mod output;
mod perkey;
pub mod plot;
mod scale;
mod soak;
mod transport;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use serde::Serialize;

pub use env::{DRIVERS, DriverKind};

/// Command-line arguments of `tidings-bench` (and of `tidings bench`).
#[derive(Debug, Clone, Default, Parser)]
#[command(
    name = "tidings-bench",
    about = "Benchmark tidings against baselines (interleaved rounds, medians)"
)]
#[non_exhaustive]
pub struct BenchArgs {
    /// Small counts and 3 rounds: the whole run finishes in under a minute on 2 cores.
    #[arg(long)]
    pub quick: bool,
    /// Write the results as JSON to PATH.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Write SVG charts into DIR (created if missing).
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Write a BENCHMARKS.md skeleton (machine, command, tables, charts) to PATH.
    #[arg(long, value_name = "PATH")]
    pub markdown: Option<PathBuf>,
    /// Print the case names and exit without running anything.
    #[arg(long)]
    pub list: bool,
    /// Run only cases whose name contains this substring.
    #[arg(value_name = "FILTER")]
    pub filter: Option<String>,
}

/// One benchmark result: the medians of tidings and of each baseline for one case.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Case {
    /// Stable case name, e.g. `fanout/n=16/pool`.
    pub name: String,
    /// Unit of every value (`deliveries/s`, `us`, `ns/match`, `records/s`, `bytes/sub`, …).
    pub unit: String,
    /// Whether a larger value is better.
    pub higher_is_better: bool,
    /// Median for tidings; `None` (JSON `null`) when tidings could not run this case, with
    /// the reason in `notes`.
    pub tidings: Option<f64>,
    /// Median for each baseline that ran, by stable baseline name.
    pub baselines: BTreeMap<String, f64>,
    /// Parameters, losses, anomalies and skip reasons.
    pub notes: String,
}

impl Case {
    pub(crate) fn new(name: impl Into<String>, unit: &str, higher_is_better: bool) -> Self {
        Self {
            name: name.into(),
            unit: unit.to_owned(),
            higher_is_better,
            tidings: None,
            baselines: BTreeMap::new(),
            notes: String::new(),
        }
    }

    pub(crate) fn note(&mut self, text: impl AsRef<str>) {
        let text = text.as_ref();
        if text.is_empty() {
            return;
        }
        if !self.notes.is_empty() {
            self.notes.push_str("; ");
        }
        self.notes.push_str(text);
    }
}

/// Everything one run produced.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// One entry per case, in run order.
    pub cases: Vec<Case>,
}

/// Why a run failed as a whole (individual case failures are reported in `notes`).
#[derive(Debug)]
#[non_exhaustive]
pub enum BenchError {
    /// Bad command line.
    Args(String),
    /// Writing an output file failed.
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
    /// Setting up the benchmark environment failed.
    Setup(String),
    /// Writing to standard output failed ([`BenchError::is_closed_output`]: its reader went
    /// away, as in `tidings-bench --list | head -3`).
    Stdout(std::io::Error),
    /// `tidings-bench soak` ran and a check failed (R-LIM-3): the reasons, one per line.
    Soak(String),
}

impl BenchError {
    /// Whether standard output was closed by its reader: nothing is wrong with the run, and
    /// a command-line tool ends quietly, as when a pipe's reader has read enough.
    #[must_use]
    pub fn is_closed_output(&self) -> bool {
        matches!(self, BenchError::Stdout(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

/// Write `text` to standard output, reporting a failure instead of panicking as `print!`
/// does (a closed pipe is not a bug).
fn say(text: std::fmt::Arguments<'_>) -> Result<(), BenchError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_fmt(text)
        .and_then(|()| out.flush())
        .map_err(BenchError::Stdout)
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchError::Args(e) => f.write_str(e),
            BenchError::Io { path, error } => write!(f, "{}: {error}", path.display()),
            BenchError::Setup(e) => write!(f, "benchmark setup failed: {e}"),
            BenchError::Stdout(e) => write!(f, "writing to standard output: {e}"),
            BenchError::Soak(e) => write!(f, "soak failed (R-LIM-3):\n{e}"),
        }
    }
}

impl std::error::Error for BenchError {}

/// Counts and durations for one run mode.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub quick: bool,
    /// Interleaved rounds per case (the median is over these).
    pub rounds: usize,
    /// Most deliveries per round in a fan-out or scale case (messages = this / n).
    pub fanout_deliveries: u64,
    /// Fewest messages per round, whatever the system's speed.
    pub fanout_min_msgs: u64,
    /// Each system's message count is cut so a round takes about this long at the rate its
    /// warm-up round showed (slow systems get fewer messages, never fewer than the minimum).
    pub round_secs: f64,
    /// Offered rate and duration of one latency round.
    pub latency_rate: u64,
    pub latency_secs: f64,
    /// Deliveries per round in a scale case.
    pub scale_deliveries: u64,
    /// Wall time one matching round aims at.
    pub match_round_secs: f64,
    /// Records per round for the non-fsync log appends.
    pub log_records: u64,
    /// Records per round with an fsync per record.
    pub log_sync_records: u64,
    /// Records per publisher per round in the 64-publisher case.
    pub log_records_per_publisher: u64,
    /// Records read per `log/read` round.
    pub log_read_records: u64,
}

impl Plan {
    pub(crate) fn new(quick: bool) -> Self {
        if quick {
            Self {
                quick,
                rounds: 3,
                fanout_deliveries: 150_000,
                fanout_min_msgs: 100,
                round_secs: 0.15,
                latency_rate: 20_000,
                latency_secs: 0.4,
                scale_deliveries: 200_000,
                match_round_secs: 0.08,
                log_records: 200_000,
                log_sync_records: 1_000,
                log_records_per_publisher: 32,
                log_read_records: 200_000,
            }
        } else {
            Self {
                quick,
                rounds: 7,
                fanout_deliveries: 2_000_000,
                fanout_min_msgs: 1_000,
                round_secs: 1.0,
                latency_rate: 20_000,
                latency_secs: 3.0,
                scale_deliveries: 2_000_000,
                match_round_secs: 0.5,
                log_records: 1_000_000,
                log_sync_records: 3_000,
                log_records_per_publisher: 100,
                log_read_records: 1_000_000,
            }
        }
    }
}

/// Decides which cases run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filter(Option<String>);

impl Filter {
    pub(crate) fn wants(&self, name: &str) -> bool {
        self.0.as_deref().is_none_or(|f| name.contains(f))
    }
    pub(crate) fn wants_any<'a>(&self, mut names: impl Iterator<Item = &'a str>) -> bool {
        names.any(|n| self.wants(n))
    }
}

/// Every case name this version can emit, in run order.
#[must_use]
pub fn case_names() -> Vec<String> {
    let mut names = Vec::new();
    names.extend(fanout::case_names());
    names.extend(latency::case_names());
    names.extend(scale::case_names());
    names.extend(alloc_publish::case_names());
    names.extend(perkey::case_names());
    names.extend(matching::case_names());
    names.extend(logbench::case_names());
    names.extend(jetstream::case_names());
    names.extend(keyed_group::case_names());
    names.extend(transport::case_names());
    names
}

/// Run the benchmarks `args` selects, print the table, and write the requested files.
///
/// # Errors
/// Setup or output failures; a case that fails is reported in its `notes` instead.
pub fn run(args: &BenchArgs) -> Result<Report, BenchError> {
    let filter = Filter(args.filter.clone());
    if args.list {
        for name in case_names().iter().filter(|n| filter.wants(n)) {
            say(format_args!("{name}\n"))?;
        }
        return Ok(Report { cases: Vec::new() });
    }
    let plan = Plan::new(args.quick);
    let env = env::Env::new().map_err(BenchError::Setup)?;
    if !alloc::CountingAlloc::installed() {
        eprintln!(
            "note: the counting allocator is not installed; bytes-per-subscription cases will say so"
        );
    }
    let load_before = output::loadavg();
    let started = Instant::now();
    let mut cases = Vec::new();
    let mut progress = |new: Vec<Case>| {
        for c in &new {
            eprintln!(
                "[{:>6.1}s] {:<40} tidings={}",
                started.elapsed().as_secs_f64(),
                c.name,
                c.tidings.map_or("-".to_owned(), output::fmt_value)
            );
        }
        cases.extend(new);
    };
    progress(fanout::run(&plan, &env, &filter));
    progress(latency::run(&plan, &env, &filter));
    progress(scale::run(&plan, &env, &filter));
    progress(alloc_publish::run(&plan, &filter));
    progress(perkey::run(&plan, &env, &filter));
    progress(matching::run(&plan, &filter));
    progress(logbench::run(&plan, &filter));
    progress(jetstream::run(&plan, &filter));
    progress(keyed_group::run(&plan, &filter));
    progress(transport::run(&plan, &filter));
    env.finish();
    let wall = started.elapsed();
    let load = format!("{load_before} before, {} after", output::loadavg());
    let report = Report { cases };

    // A closed standard output is reported only after the requested files are written: a
    // long run's results are not lost because its reader left.
    let printed = say(format_args!(
        "{}wall time: {:.1} s ({} mode, {} rounds per case); load average {load}\n",
        output::table(&report),
        wall.as_secs_f64(),
        if plan.quick { "quick" } else { "full" },
        plan.rounds
    ));
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| BenchError::Setup(format!("serialising JSON: {e}")))?;
        write_file(path, &text)?;
    }
    let mut charts = Vec::new();
    if let Some(dir) = &args.plot {
        std::fs::create_dir_all(dir).map_err(|error| BenchError::Io {
            path: dir.clone(),
            error,
        })?;
        for (file, svg) in plot::charts(&report) {
            write_file(&dir.join(&file), &svg)?;
            charts.push(file);
        }
    }
    if let Some(path) = &args.markdown {
        let md = output::markdown(
            &report,
            &command_line(args),
            wall,
            &load,
            &charts,
            args.plot.as_deref(),
        );
        write_file(path, &md)?;
    }
    printed.map(|()| report)
}

/// Parse `args` (the first item is the program name, as in `std::env::args()`), run, and
/// print. This is the whole binary; `tidings bench` can call it with its own arguments.
///
/// # Errors
/// A bad command line (clap's message) or a failed run. `--help` prints and returns `Ok`.
pub fn main_with_args(args: impl IntoIterator<Item = String>) -> Result<(), BenchError> {
    // A worker process of the keyed-group cases: this binary started again by them.
    if let Some(code) = keyed_group::worker_from_env() {
        std::process::exit(code);
    }
    // A worker process of the soak: this binary started again by it.
    if let Some(code) = soak::worker_from_env() {
        std::process::exit(code);
    }
    let args: Vec<String> = args.into_iter().collect();
    // `tidings-bench soak …`: the long-running mixed workload (its own arguments).
    if args.get(1).is_some_and(|a| a == "soak") {
        return soak::main_with_args(&args[1..]);
    }
    let args = match BenchArgs::try_parse_from(args) {
        Ok(a) => a,
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) =>
        {
            return say(format_args!("{e}"));
        }
        Err(e) => return Err(BenchError::Args(e.to_string())),
    };
    run(&args).map(|_| ())
}

fn write_file(path: &std::path::Path, text: &str) -> Result<(), BenchError> {
    std::fs::write(path, text).map_err(|error| BenchError::Io {
        path: path.to_owned(),
        error,
    })
}

/// The command that reproduces this run.
fn command_line(args: &BenchArgs) -> String {
    let mut cmd = String::from("cargo run --release -p tidings-bench --");
    if args.quick {
        cmd.push_str(" --quick");
    }
    if let Some(p) = &args.json {
        cmd.push_str(&format!(" --json {}", p.display()));
    }
    if let Some(p) = &args.plot {
        cmd.push_str(&format!(" --plot {}", p.display()));
    }
    if let Some(p) = &args.markdown {
        cmd.push_str(&format!(" --markdown {}", p.display()));
    }
    if let Some(f) = &args.filter {
        cmd.push_str(&format!(" {f}"));
    }
    cmd
}
