//! `tidings`: the command line of the tidings broker.
//!
//! ```text
//! tidings demo                         a guided order-pipeline scenario on the real broker
//! tidings demo --admin 127.0.0.1:8080  ... then keep it up with the dashboard (Ctrl-C stops)
//! tidings bench [--quick] [FILTER] ..  the benchmarks (same options as `tidings-bench`)
//! tidings log inspect DIR              describe the segments of a stream directory
//! tidings log verify DIR               check every record; exit 1 when problems are found
//! tidings log dump DIR [--from N] [--max N]
//! tidings stream ls|info NAME -d DATA_DIR [--json]
//! tidings consumer ls STREAM | info STREAM NAME -d DATA_DIR [--json]
//! tidings consumer seek STREAM NAME --offset N|--time T|--earliest|--latest -d DATA_DIR
//! tidings dlq ls [STREAM] | show STREAM NAME -d DATA_DIR [--json]
//! tidings dlq redrive|purge STREAM NAME --all|--entry ID.. -d DATA_DIR [--json]
//! ```
//!
//! The `stream`, `consumer` and `dlq` commands work on a broker's data directory offline
//! (see [`tidings::embedded::offline`]): reads run beside a live broker and show what is on disk;
//! writes refuse (exit 2) while a broker holds the stream's lock.
//!
//! Exit codes: 0 success; 1 the command ran and found a problem (a failed verification, a
//! corrupt record, a broken demo invariant, a failed benchmark run); 2 the command could not
//! run (bad arguments, missing or unreadable paths).

/// `println!` that ignores a closed standard output: `tidings … | head` must not panic. The
/// command still runs to its end; what it prints after the reader left is dropped.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// `print!` that ignores a closed standard output (see `outln!`).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout().lock(), $($arg)*);
    }};
}

mod bench;
mod datadir;
mod demo;
mod durable_demo;
#[cfg(test)]
mod fuzz_targets;
mod log;
mod progress;
mod table;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Counts live heap bytes so `tidings bench` can report bytes per subscription.
#[global_allocator]
static A: tidings_bench::alloc::CountingAlloc = tidings_bench::alloc::CountingAlloc;

/// Exit code: the command ran and found a problem.
pub(crate) const EXIT_PROBLEM: u8 = 1;
/// Exit code: the command could not run (usage, missing path, I/O).
pub(crate) const EXIT_USAGE: u8 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "tidings",
    version = tidings::VERSION,
    about = "The tidings in-process pub-sub broker: demo, benchmarks, log and data-dir tools",
    after_help = "Exit codes: 0 success; 1 a problem was found; 2 the command could not run."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run an order-pipeline scenario on the real broker (thread driver, system clock) and
    /// print per-subscription accounting.
    #[command(after_help = "Example:\n  tidings demo --orders 200 --admin 127.0.0.1:8080")]
    Demo(demo::DemoArgs),
    /// Benchmark tidings against baselines (interleaved rounds, medians).
    #[command(after_help = "Example:\n  tidings bench --quick --json target/bench-quick.json")]
    Bench(bench::BenchCommand),
    /// Offline tools for a durable stream directory (read-only).
    #[command(after_help = "Example:\n  tidings log verify /tmp/tidings-demo/streams/orders")]
    Log(log::LogCommand),
    /// Offline: the streams of a data directory.
    #[command(after_help = "Example:\n  tidings stream ls -d /tmp/tidings-demo")]
    Stream(datadir::StreamCommand),
    /// Offline: durable subscriptions (consumers) of a stream; move their position.
    #[command(
        after_help = "Example:\n  tidings consumer seek orders billing --earliest -d /tmp/tidings-demo"
    )]
    Consumer(datadir::ConsumerCommand),
    /// Offline: durable dead-letter queues; show, redrive, purge.
    #[command(after_help = "Example:\n  tidings dlq show orders fraud -d /tmp/tidings-demo")]
    Dlq(datadir::DlqCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Demo(args) => demo::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Log(args) => log::run(&args),
        Command::Stream(args) => datadir::run_stream(&args),
        Command::Consumer(args) => datadir::run_consumer(&args),
        Command::Dlq(args) => datadir::run_dlq(&args),
    }
}
