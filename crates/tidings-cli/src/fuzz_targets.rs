//! R-SEC-2 fuzz target for the command line: arbitrary argument lists (any bytes, not only
//! UTF-8, as a shell can pass them) through the real `clap` definitions of every command,
//! and every argument through `--time`'s parser. The engine is `tidings-fuzz` (README,
//! "Fuzzing"); `fuzz_cli_args` runs for `TIDINGS_FUZZ_SECS` over the kept corpus
//! `fuzz/corpus/cli_args/` and its mutations, and fails on a panic or a hang.
//!
//! Parsing is what is fuzzed, not running the commands: a parsed command would print to
//! the terminal, start a demo or a benchmark. What the offline commands read from a data
//! dir is fuzzed where it is decoded (the `tidings` and `tidings-log` crates' targets).
//! The allocation bound is not measured here: this binary's global allocator is the
//! benchmarks' counting one.
//!
//! Input: the arguments after `tidings`, separated by NUL bytes (which no real argument
//! contains).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::UNIX_EPOCH;

use clap::Parser;
use tidings_fuzz::{Outcome, Target};

use crate::Cli;
use crate::datadir::{format_time, parse_time};

#[test]
fn fuzz_cli_args() {
    // R-SEC-2
    let lines = [
        "demo",
        "demo --orders 200 --admin 127.0.0.1:8080",
        "bench --quick --json target/bench-quick.json",
        "log inspect /tmp/x/streams/orders",
        "log verify /tmp/x/streams/orders",
        "log dump /tmp/x/streams/orders --from 3 --max 10",
        "stream ls -d /tmp/x --json",
        "stream info orders -d /tmp/x",
        "consumer ls orders -d /tmp/x",
        "consumer info orders billing -d /tmp/x --json",
        "consumer seek orders billing --offset 18446744073709551615 -d /tmp/x",
        "consumer seek orders billing --time 2026-12-02T17:00:00.250Z -d /tmp/x",
        "consumer seek orders billing --time 1700000000000 -d /tmp/x",
        "consumer seek orders billing --earliest -d /tmp/x",
        "dlq ls -d /tmp/x",
        "dlq show orders fraud -d /tmp/x --json",
        "dlq redrive orders fraud --entry 1 --entry 2 -d /tmp/x",
        "dlq purge orders fraud --all -d /tmp/x",
        "--help",
        "consumer seek --help",
    ];
    let seeds = lines.map(|l| l.replace(' ', "\0").into_bytes());
    Target::new("cli_args", "-p tidings-cli --bin tidings")
        .seeds(seeds)
        .dictionary([
            "\0",
            "-d",
            "--json",
            "--time",
            "--offset",
            "--entry",
            "--all",
            "--from",
            "--max",
            "--earliest",
            "--latest",
            "--help",
            "-h",
            "--",
            "=",
            "stream",
            "consumer",
            "dlq",
            "log",
            "seek",
            "redrive",
            "purge",
            "info",
            "ls",
            "show",
            "+01:00",
            "T",
            "Z",
            "99999999999999999999",
            "\u{e9}",
            "\u{ff}",
        ])
        .max_len(1024)
        .run(|data| {
            let args = data.split(|&b| b == 0).map(OsStr::from_bytes);
            let parsed = Cli::try_parse_from(std::iter::once(OsStr::new("tidings")).chain(args));
            // `--time`'s parser on every argument: a value, or a message; what it accepts
            // formats and parses back to the same millisecond.
            for arg in data.split(|&b| b == 0) {
                let Ok(text) = std::str::from_utf8(arg) else {
                    continue;
                };
                if let Ok(t) = parse_time(text) {
                    let ms = t
                        .duration_since(UNIX_EPOCH)
                        .expect("not before 1970")
                        .as_millis();
                    if let Ok(ms) = u64::try_from(ms) {
                        let shown = format_time(ms);
                        if !shown.ends_with("after the epoch") {
                            assert_eq!(parse_time(&shown), Ok(t), "{text:?} shown as {shown}");
                        }
                    }
                }
            }
            match parsed {
                Ok(cli) => {
                    // The first word of the command's Debug: which command was parsed.
                    let debug = format!("{:?}", cli.command);
                    Outcome::of(debug.split(['(', ' ']).next().map(str::to_owned))
                }
                Err(e) => {
                    // Rendering the message (usage, suggestions) must not fail either.
                    let _ = e.render().to_string();
                    Outcome::of(format!("{:?}", e.kind()))
                }
            }
        });
}
