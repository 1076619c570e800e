//! `tidings log inspect|verify|dump DIR`: read-only tools for a durable stream directory.
//!
//! They call [`tidings_log::tools`], which opens files read-only and never repairs anything,
//! so they are safe on a log another process has open (SPEC R-LIM-2: bad files are reported
//! with their path and byte offset, never a panic).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use tidings_log::ToolError;
use tidings_log::tools;

use crate::{EXIT_PROBLEM, EXIT_USAGE};

/// Arguments of `tidings log`.
#[derive(Debug, Args)]
pub(crate) struct LogCommand {
    #[command(subcommand)]
    tool: LogTool,
}

#[derive(Debug, Subcommand)]
enum LogTool {
    /// Describe every segment: offsets, record counts, timestamps, index state.
    #[command(after_help = "Example:\n  tidings log inspect /tmp/tidings-demo/streams/orders")]
    Inspect {
        /// The stream directory.
        dir: PathBuf,
    },
    /// Check every record, header, index and segment boundary. Exits 1 when any problem is
    /// found (even one `Log::open` would repair).
    #[command(after_help = "Example:\n  tidings log verify /tmp/tidings-demo/streams/orders")]
    Verify {
        /// The stream directory.
        dir: PathBuf,
    },
    /// Print records, one per line. Exits 1 at a corrupt record (a torn tail just ends the
    /// output, as `Log::open` would truncate it).
    #[command(
        after_help = "Example:\n  tidings log dump /tmp/tidings-demo/streams/orders --from 10 --max 5"
    )]
    Dump {
        /// The stream directory.
        dir: PathBuf,
        /// First offset to print (or the earliest retained, if later).
        #[arg(long, value_name = "N", default_value_t = 0)]
        from: u64,
        /// Most records to print.
        #[arg(long, value_name = "N", default_value_t = 100)]
        max: usize,
    },
}

/// Run one log tool and map its outcome to an exit code (see the crate docs).
pub(crate) fn run(cmd: &LogCommand) -> ExitCode {
    let (name, dir) = match &cmd.tool {
        LogTool::Inspect { dir } => ("inspect", dir),
        LogTool::Verify { dir } => ("verify", dir),
        LogTool::Dump { dir, .. } => ("dump", dir),
    };
    if let Err(why) = check_dir(dir) {
        eprintln!("tidings log {name}: {}: {why}", dir.display());
        return ExitCode::from(EXIT_USAGE);
    }
    let outcome = match &cmd.tool {
        LogTool::Inspect { dir } => tools::inspect(dir).map(|report| {
            out!("{report}");
            ExitCode::SUCCESS
        }),
        LogTool::Verify { dir } => {
            // A bar on a terminal, a plain line per tenth otherwise (long logs).
            let mut bar = crate::progress::Progress::new(format!("verify {}", dir.display()));
            tools::verify_with_progress(&tidings_log::FsStorage, dir, &mut |done, total| {
                bar.update(done, total)
            })
        }
        .map(|report| {
            outln!("{report}");
            if report.is_ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_PROBLEM)
            }
        }),
        LogTool::Dump { dir, from, max } => tools::dump(dir, *from, *max).map(|records| {
            for r in &records {
                outln!("{r}");
            }
            outln!(
                "{} record(s) from offset {from} (at most {max})",
                records.len()
            );
            ExitCode::SUCCESS
        }),
    };
    outcome.unwrap_or_else(|e| {
        eprintln!("tidings log {name}: {e}");
        ExitCode::from(exit_code_for(&e))
    })
}

/// A clear message for a path that cannot be a stream directory.
fn check_dir(dir: &Path) -> Result<(), String> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err("not a directory (expected a stream directory of .seg files)".to_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err("no such directory".to_owned()),
        Err(e) => Err(format!("cannot read: {e}")),
    }
}

/// Damaged data is a finding (1); an I/O failure means the tool could not run (2).
fn exit_code_for(e: &ToolError) -> u8 {
    match e {
        ToolError::Io { .. } => EXIT_USAGE,
        _ => EXIT_PROBLEM,
    }
}
