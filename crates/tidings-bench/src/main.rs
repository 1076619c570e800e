//! tidings-bench binary.
fn main() {}
