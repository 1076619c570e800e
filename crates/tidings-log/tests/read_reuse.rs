//! R-LOG-4: read chunks are reused once no record refers to them; records still held are never
//! overwritten by a later read.

mod common;

use common::{assert_intact, fill};
use tidings_log::{Fsync, Log, LogConfig};

#[test]
fn records_held_across_reads_stay_intact() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = LogConfig::new().fsync(Fsync::Never);
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

/// R-LOG-4: a read that starts where the previous one stopped is served from the rest of that
/// read's last chunk. Interleaved with appends into the same (active) segment, over rolls, and
/// with batches ending anywhere in a chunk, every read returns exactly the records appended at
/// those offsets: a remembered chunk never stands in for bytes it does not hold.
#[test]
fn sequential_reads_between_appends_return_exactly_what_was_appended() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = LogConfig::new()
        .fsync(Fsync::Never)
        .segment_bytes(200 << 10)
        .write_buffer_bytes(4 << 10);
    let (log, _) = Log::open(tmp.path(), cfg).unwrap();
    let mut rng = tidings_log::testing::TestRng::new(7);
    let mut next = 0u64;
    // Some batches are held for a while, so their chunks stay remembered (not reusable) while
    // the reads move on into later segments.
    let mut held = std::collections::VecDeque::new();
    for round in 0..200 {
        // Mostly small appends (reads catch up with the writer: partial chunks), now and then
        // a large one (whole chunks, remembered and reused by the next reads).
        fill_more(
            &log,
            if round % 10 == 0 {
                3_000
            } else {
                1 + rng.below(120)
            },
        );
        while next < log.end_offset() {
            let batch = log.read(next, 1 + rng.below(700) as usize).unwrap();
            assert!(!batch.is_empty());
            for r in &batch {
                assert_eq!(
                    r.offset, next,
                    "offsets contiguous from where the read began"
                );
                assert_intact(r); // R-LOG-4: the record appended at this offset
                next += 1;
            }
            if rng.below(3) == 0 {
                held.push_back(batch);
                if held.len() > 6 {
                    held.pop_front();
                }
            }
        }
    }
    assert!(
        next > 50_000,
        "the run spans many segments ({next} records)"
    );
}

fn fill_more(log: &Log, n: u64) {
    for _ in 0..n {
        let offset = log.next_offset();
        assert_eq!(log.append(&common::record_for(offset)).unwrap(), offset);
    }
}
