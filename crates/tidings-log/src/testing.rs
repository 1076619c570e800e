//! Test support usable from any crate's tests: the fault-injecting in-memory
//! [`SimStorage`], its [`CrashMode`]s, and a small seeded [`TestRng`].
//!
//! ```
//! use std::path::Path;
//! use std::sync::Arc;
//! use tidings_log::testing::{CrashMode, SimStorage};
//! use tidings_log::{Fsync, Log, LogConfig, Record};
//!
//! let sim = SimStorage::new();
//! let cfg = LogConfig::new().fsync(Fsync::Always);
//! let (log, _) = Log::open_with_storage(Arc::new(sim.clone()), Path::new("/s"), cfg.clone()).unwrap();
//! let acked = log.append(&Record::new(1, "durable")).unwrap();
//! drop(log);
//! sim.power_cut(CrashMode::DropUnsynced);
//! let (log, _) = Log::open_with_storage(Arc::new(sim), Path::new("/s"), cfg).unwrap();
//! assert_eq!(log.read(acked, 1).unwrap()[0].payload, "durable");
//! ```

pub use crate::storage::sim::{CrashMode, SimOp, SimStorage};

/// SplitMix64: a tiny deterministic generator for seeded tests (not for cryptography).
#[derive(Debug, Clone)]
pub struct TestRng(u64);

impl TestRng {
    /// A generator with this seed.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }
}
