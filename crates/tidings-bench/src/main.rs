//! `tidings-bench`: see the library docs, or run with `--help`.
#![forbid(unsafe_code)]

/// Counts live heap bytes for the `scale/*/bytes-per-sub` cases.
#[global_allocator]
static ALLOC: tidings_bench::alloc::CountingAlloc = tidings_bench::alloc::CountingAlloc;

fn main() {
    if let Err(e) = tidings_bench::main_with_args(std::env::args()) {
        match e {
            // The reader of our output has read enough (`--list | head`): not a failure.
            e if e.is_closed_output() => {}
            // clap's own text (help, version, usage errors) is already formatted.
            tidings_bench::BenchError::Args(text) => {
                eprint!("{text}");
                std::process::exit(2);
            }
            other => {
                eprintln!("tidings-bench: {other}");
                std::process::exit(1);
            }
        }
    }
}
