//! The fuzz engine behind tidings' R-SEC-2 targets, on the stable toolchain.
//!
//! R-SEC-2: every decoder of bytes from outside the process (a record a foreign producer
//! published, a header, a file in a data dir, an HTTP request, a CLI argument) returns a
//! typed error on any input — no panic, no hang, no allocation beyond a stated bound — and
//! has a fuzz target run in CI with a time budget and a kept corpus. This crate is that
//! engine; the targets are `#[test]` functions named `fuzz_<target>` in the crates that own
//! the decoders (unit tests, so they reach crate-private decoders without widening any
//! public API). The project README's "Fuzzing" section lists them.
//!
//! # How a target runs
//! [`Target::run`] takes a check — decode one input, assert the target's properties, return
//! an [`Outcome`] label — and:
//!
//! 1. loads the corpus: the target's seeds (made by the real encoders, every run, so they
//!    follow the format) and the kept corpus `fuzz/corpus/<target>/` (committed: malformed
//!    inputs worth keeping, regressions); every entry runs first, unmutated;
//! 2. until the time budget ends, picks an entry, [mutates](mutate::mutate) it (bit flips,
//!    interesting bytes, inserts, deletes, block copies, splices, truncation, integer and
//!    length-field tweaks, dictionary tokens) and runs the check on it;
//! 3. keeps an input whose outcome is new in the live corpus — cheap feedback without
//!    compiler instrumentation, which the stable toolchain lacks: it steers mutation past the
//!    first error a decoder returns, toward the next check;
//! 4. fails the test on the first failure: a panic (caught with `catch_unwind` on the
//!    worker thread), a hang (a watchdog on the test thread sees one input run past the hang
//!    limit), or an allocation beyond the target's bound (measured by [`TrackingAlloc`] on
//!    the worker thread when the crate installs it). The input is saved under
//!    `target/fuzz-failures/<target>/`, and the report prints it and the one command that
//!    replays it.
//!
//! A run is a function of its seed (printed first): the same seed runs the same inputs in
//! the same order; the budget only decides how many.
//!
//! # Environment
//! | variable | meaning | default |
//! |---|---|---|
//! | `TIDINGS_FUZZ_SECS` | seconds per target | 4 |
//! | `TIDINGS_FUZZ_EXECS` | stop after this many inputs instead (deterministic length) | — |
//! | `TIDINGS_FUZZ_SEED` | a number, or `random` | fixed per target |
//! | `TIDINGS_FUZZ_HANG_SECS` | one input longer than this is a hang | 20 |
//! | `TIDINGS_FUZZ_REPLAY` | run only this file (path from the workspace root) | — |
//! | `TIDINGS_FUZZ_GROW` | `1`: write inputs with new outcomes into the kept corpus | — |
//!
//! # Structured inputs
//! A decoder that takes more than bytes (a record with headers, an argument list) reads its
//! input with [`Fields`] and writes its seeds with [`fields::join`]; see [`fields`].

mod alloc;
mod engine;
pub mod fields;
pub mod mutate;
mod panics;
pub mod rng;
mod tmp;

pub use alloc::{HARD_CAP, Measured, TrackingAlloc};
pub use engine::{DEFAULT_HANG_SECS, DEFAULT_SECS, Outcome, Report, Target, corpus_dir};
pub use fields::Fields;
pub use panics::{PanicWatch, watch};
pub use tmp::scratch_dir;

// The engine's own tests measure allocations too.
#[cfg(test)]
#[global_allocator]
static TEST_ALLOC: TrackingAlloc = TrackingAlloc;
