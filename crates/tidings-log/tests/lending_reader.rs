//! R-LOG-4: the lending reader (`Log::reader`) returns exactly what `Log::read` returns, from
//! any position, across segments, while the writer appends into the segment it reads, and it
//! follows the tail. Damaged records: `bit_flips.rs` (the reader fails at exactly the damaged
//! record and goes on past it after `next_readable`).

mod common;

use common::{assert_intact, fill, lend_all, read_all, record_for, sim_open, small_config};
use tidings_log::testing::{SimStorage, TestRng};
use tidings_log::{Fsync, Log, LogConfig, ReadError, Retention};

#[test]
fn lends_what_read_returns_from_every_position() {
    let sim = SimStorage::new();
    let (log, _) = sim_open(&sim, small_config().fsync(Fsync::Never)).unwrap();
    fill(&log, 60);
    log.sync().unwrap();
    let all = read_all(&log);
    assert_eq!(lend_all(&log), all); // R-LOG-4
    for from in 0..=all.len() as u64 {
        let mut reader = log.reader(from);
        let mut got = Vec::new();
        while let Some(r) = reader.next().unwrap() {
            got.push(r.to_stored());
        }
        assert_eq!(got, all[from as usize..], "from {from}");
    }
    // The headers and key as lent, without copying.
    let mut reader = log.reader(2);
    let r = reader.next().unwrap().unwrap();
    let want = record_for(2);
    assert_eq!(r.key, want.key.as_deref());
    assert_eq!(
        r.headers().collect::<Vec<_>>(),
        vec![("n", &b"2"[..])],
        "headers lent in order"
    );
    assert_eq!(r.payload, &want.payload[..]);
}

#[test]
fn follows_the_tail_and_reads_between_appends() {
    // A small write buffer: the reader often needs bytes the writer still holds, and reads a
    // segment whose end moves while it reads.
    let tmp = tempfile::tempdir().unwrap();
    let cfg = LogConfig::new()
        .fsync(Fsync::Never)
        .segment_bytes(200 << 10)
        .write_buffer_bytes(4 << 10);
    let (log, _) = Log::open(tmp.path(), cfg).unwrap();
    let mut rng = TestRng::new(11);
    let mut reader = log.reader(0);
    let mut next = 0u64;
    for round in 0..150 {
        fill(
            &log,
            if round % 10 == 0 {
                3_000
            } else {
                1 + rng.below(120)
            },
        );
        // Stop anywhere, now and then, as a consumer taking a batch would.
        let take = if rng.below(2) == 0 {
            u64::MAX
        } else {
            rng.below(500)
        };
        let mut taken = 0;
        while taken < take {
            let Some(r) = reader.next().unwrap() else {
                break;
            };
            assert_eq!(
                r.offset, next,
                "offsets contiguous from where the reader began"
            );
            assert_intact(&r.to_stored()); // R-LOG-4: the record appended at this offset
            next += 1;
            taken += 1;
        }
        assert_eq!(reader.position(), next);
    }
    while let Some(r) = reader.next().unwrap() {
        assert_eq!(r.offset, next);
        next += 1;
    }
    assert_eq!(next, log.end_offset());
    assert!(
        next > 40_000,
        "the run spans many segments ({next} records)"
    );
    // At the end: nothing, until more is appended.
    assert!(reader.next().unwrap().is_none());
    fill(&log, 1);
    assert_eq!(reader.next().unwrap().map(|r| r.offset), Some(next));
}

#[test]
fn seek_and_positions_out_of_range() {
    let sim = SimStorage::new();
    let cfg = small_config()
        .fsync(Fsync::Never)
        .retention(Retention::new().max_bytes(1_500));
    let (log, _) = sim_open(&sim, cfg).unwrap();
    fill(&log, 40);
    log.apply_retention(0).unwrap();
    let end = log.end_offset();
    let mut reader = log.reader(end + 1);
    assert!(matches!(
        reader.next(),
        Err(ReadError::BeyondEnd { requested, .. }) if requested == end + 1
    ));
    reader.seek(end - 3);
    assert_eq!(reader.next().unwrap().map(|r| r.offset), Some(end - 3));
    let start = log.start_offset();
    assert!(start > 0, "retention removed the first segments");
    let mut reader = log.reader(start - 1);
    assert!(matches!(
        reader.next(),
        Err(ReadError::OutOfRetention { requested, earliest }) if requested == start - 1 && earliest == start
    ));
    reader.seek(start);
    assert_eq!(reader.next().unwrap().map(|r| r.offset), Some(start));
}
