//! R-LOG-4: read chunks are reused once no record refers to them; records still held are never
//! overwritten by a later read.

mod common;

use common::{assert_intact, fill};
use tidings_log::{Fsync, Log, LogConfig};

#[test]
fn records_held_across_reads_stay_intact() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = LogConfig {
        fsync: Fsync::Never,
        ..LogConfig::default()
    };
    let (log, _) = Log::open(tmp.path(), cfg).unwrap();
    fill(&log, 6_000); // several 64 KiB read chunks
    log.sync().unwrap();
    let mut held = Vec::new();
    for round in 0..20u64 {
        let from = (round * 997) % 5_000;
        let batch = log.read(from, 1_000).unwrap();
        assert_eq!(batch.first().map(|r| r.offset), Some(from));
        for r in &batch {
            assert_intact(r); // R-LOG-4
        }
        if round % 3 == 0 {
            held.push(batch); // keep some batches alive while later reads reuse chunks
        }
        for b in &held {
            for r in b {
                assert_intact(r); // R-LOG-4: a held record is never overwritten
            }
        }
    }
}
