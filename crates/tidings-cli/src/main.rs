//! The `tidings` command line (demo, bench, log tools).
fn main() {}
