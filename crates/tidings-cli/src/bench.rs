//! `tidings bench`: the benchmarks of `tidings-bench`, with the same options.

use std::process::ExitCode;

use clap::Args;
use tidings_bench::BenchArgs;

use crate::EXIT_PROBLEM;

/// Arguments of `tidings bench`: exactly those of the `tidings-bench` binary.
#[derive(Debug, Args)]
pub(crate) struct BenchCommand {
    #[command(flatten)]
    args: BenchArgs,
}

/// Run the selected benchmarks; they print their own table and write the requested files.
pub(crate) fn run(cmd: &BenchCommand) -> ExitCode {
    match tidings_bench::run(&cmd.args) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) if e.is_closed_output() => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tidings bench: {e}");
            ExitCode::from(EXIT_PROBLEM)
        }
    }
}
