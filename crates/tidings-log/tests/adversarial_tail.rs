//! R-LOG-2, R-LIM-2: payloads are user data, so a record's payload may hold
//! bytes that are valid frames of the log's own format. A torn tail whose payload embeds such
//! frames is still a torn tail (truncated, the records before it kept); damage in the middle of
//! the log is still refused, never silently truncated.

mod common;

use std::path::PathBuf;

use common::{frame_bounds, record_for, sim_open, sim_segments};
use proptest::prelude::*;
use tidings_log::testing::SimStorage;
use tidings_log::{Fsync, LogConfig, OpenError, Record, StoredRecord};

fn config() -> LogConfig {
    LogConfig::new().fsync(Fsync::Never)
}

/// The frames, exactly as the log writes them, of `record_for(o)` for `o` in `from..to`: taken
/// from a scratch log, so they are valid in the on-disk format by construction.
fn real_frames(from: u64, to: u64) -> Vec<Vec<u8>> {
    let sim = SimStorage::new();
    let (log, _) = sim_open(&sim, config()).unwrap();
    for o in 0..to {
        assert_eq!(log.append(&record_for(o)).unwrap(), o);
    }
    drop(log);
    let bytes = sim.read_file(&sim_segments(&sim)[0]).unwrap();
    let b = frame_bounds(&bytes);
    (from..to)
        .map(|o| bytes[b[o as usize] as usize..b[o as usize + 1] as usize].to_vec())
        .collect()
}

/// A single-segment log holding `normal` records `record_for(0..normal)`, then one record per
/// payload in `tail`. Returns the storage, the segment path, its bytes and the frame bounds.
fn build(normal: u64, tail: &[Vec<u8>]) -> (SimStorage, PathBuf, Vec<u8>, Vec<u64>) {
    let sim = SimStorage::new();
    let (log, _) = sim_open(&sim, config()).unwrap();
    for o in 0..normal {
        log.append(&record_for(o)).unwrap();
    }
    for p in tail {
        log.append(&Record::new(7, p.clone())).unwrap();
    }
    drop(log);
    let segs = sim_segments(&sim);
    assert_eq!(segs.len(), 1);
    let bytes = sim.read_file(&segs[0]).unwrap();
    let bounds = frame_bounds(&bytes);
    assert_eq!(bounds.len() as u64, normal + tail.len() as u64 + 1);
    (sim, segs[0].clone(), bytes, bounds)
}

fn all_records(log: &tidings_log::Log) -> Vec<StoredRecord> {
    log.read(log.start_offset(), usize::MAX).unwrap()
}

/// The reproducer: 5 records, then a 200 KB record whose payload embeds, at
/// byte 64, valid frames for offsets 5-7; the segment is cut 200, 4096 and 100,000 bytes into
/// that record.
#[test]
fn torn_record_embedding_valid_frames_is_a_torn_tail() {
    let mut payload = vec![0x5a; 200_000];
    let mut at = 64;
    for f in real_frames(5, 8) {
        payload[at..at + f.len()].copy_from_slice(&f);
        at += f.len();
    }
    let (sim, seg, bytes, bounds) = build(5, &[payload]);
    let start = bounds[5];
    for cut in [200, 4096, 100_000] {
        for zero_fill in [false, true] {
            let s = sim.fork();
            let mut b = bytes[..(start + cut) as usize].to_vec();
            if zero_fill {
                b.resize(bytes.len(), 0);
            }
            s.write_file(&seg, &b);
            let (log, report) = sim_open(&s, config())
                .unwrap_or_else(|e| panic!("cut {cut} zero_fill {zero_fill}: {e}"));
            // R-LOG-2: the torn record is cut off, records 0-4 are kept.
            let t = report.truncated.as_ref().expect("truncation reported");
            assert_eq!((&t.path, t.byte_offset), (&seg, start), "cut {cut}");
            assert_eq!(log.end_offset(), 5, "cut {cut}"); // R-LOG-2
            let recs = all_records(&log);
            assert_eq!(recs.len(), 5);
            for r in &recs {
                assert_eq!(r.to_record(), record_for(r.offset)); // R-LOG-2
            }
        }
    }
}

/// Damage to the length field of a record in the middle of the log whose payload embeds valid
/// frames: still refused (R-LIM-2), never a truncation.
#[test]
fn damaged_length_before_valid_records_is_refused() {
    let mut payload = vec![0x11; 5_000];
    let f = real_frames(5, 8).concat();
    payload[64..64 + f.len()].copy_from_slice(&f);
    let (sim, seg, bytes, bounds) = build(5, &[payload, b"after".to_vec(), b"last".to_vec()]);
    let p = bounds[5] as usize;
    for bit in 0..30 {
        let s = sim.fork();
        let mut b = bytes.clone();
        let len = u32::from_le_bytes(b[p..p + 4].try_into().unwrap()) ^ (1 << bit);
        b[p..p + 4].copy_from_slice(&len.to_le_bytes());
        s.write_file(&seg, &b);
        match sim_open(&s, config()) {
            Err(OpenError::Corrupt {
                path, byte_offset, ..
            }) => assert_eq!((path, byte_offset), (seg.clone(), p as u64), "bit {bit}"), // R-LIM-2
            other => panic!(
                "bit {bit}: expected Corrupt, got {:?}",
                other.map(|(_, r)| r)
            ),
        }
        assert_eq!(s.read_file(&seg).unwrap(), b, "bit {bit}: file modified");
    }
}

fn cases() -> u32 {
    if std::env::var_os("TIDINGS_LONG").is_some_and(|v| v == "1") {
        2_000
    } else {
        48
    }
}

/// A payload of `len` bytes of `fill`, with copies of `frames` (or their prefixes) at `spots`.
fn adversarial(
    len: usize,
    fill: u8,
    frames: &[Vec<u8>],
    spots: &[(usize, usize, bool)],
) -> Vec<u8> {
    let mut p = vec![fill; len];
    for &(at, which, whole) in spots {
        let f = &frames[which % frames.len()];
        let n = if whole { f.len() } else { f.len() / 2 };
        let at = at % len.max(1);
        let n = n.min(len - at);
        p[at..at + n].copy_from_slice(&f[..n]);
    }
    p
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    /// Random valid log, adversarial payloads, random cut point (optionally zero-filled back to
    /// the old length): open succeeds and keeps exactly the records wholly before the cut.
    #[test]
    fn any_cut_keeps_exactly_the_whole_records(
        normal in 0u64..6,
        sizes in prop::collection::vec(0usize..3_000, 1..4),
        fill in any::<u8>(),
        spots in prop::collection::vec((any::<usize>(), any::<usize>(), any::<bool>()), 0..6),
        cut_frac in 0.0f64..1.0,
        zero_fill in any::<bool>(),
    ) {
        let frames = real_frames(normal, normal + 4);
        let tail: Vec<Vec<u8>> = sizes.iter().map(|&n| adversarial(n, fill, &frames, &spots)).collect();
        let (sim, seg, bytes, bounds) = build(normal, &tail);
        let cut = 32 + ((bytes.len() - 32) as f64 * cut_frac) as usize;
        let mut b = bytes[..cut].to_vec();
        if zero_fill {
            b.resize(bytes.len(), 0);
        }
        sim.write_file(&seg, &b);
        let mut kept = bounds.iter().take_while(|&&x| x as usize <= cut).count() as u64 - 1;
        // Zero-filling may restore a cut record whose cut-off bytes were all zeros.
        if let Some(w) = bounds.get(kept as usize..kept as usize + 2)
            && b.get(w[0] as usize..w[1] as usize) == Some(&bytes[w[0] as usize..w[1] as usize])
        {
            kept += 1;
        }
        let (log, report) = sim_open(&sim, config())
            .map_err(|e| TestCaseError::fail(format!("cut {cut}: {e}")))?;
        prop_assert_eq!(log.end_offset(), kept); // R-LOG-2
        let recs = all_records(&log);
        prop_assert_eq!(recs.len() as u64, kept);
        for r in &recs {
            let want = if r.offset < normal {
                record_for(r.offset)
            } else {
                Record::new(7, tail[(r.offset - normal) as usize].clone())
            };
            prop_assert_eq!(r.to_record(), want); // R-LOG-2
        }
        let torn = bounds[kept as usize] as usize != b.len();
        prop_assert_eq!(report.truncated.is_some(), torn); // R-LOG-2
    }

    /// Same logs, no cut: one damaged byte in any record but the last is refused with the
    /// damaged record's position (R-LIM-2), the file untouched; in the last record it is a torn
    /// tail that drops exactly that record (R-LOG-2).
    #[test]
    fn damage_before_the_last_record_is_refused(
        normal in 0u64..6,
        sizes in prop::collection::vec(0usize..3_000, 2..5),
        fill in any::<u8>(),
        spots in prop::collection::vec((any::<usize>(), any::<usize>(), any::<bool>()), 0..6),
        at_frac in 0.0f64..1.0,
        xor in 1u8..=255,
    ) {
        let frames = real_frames(normal, normal + 4);
        let tail: Vec<Vec<u8>> = sizes.iter().map(|&n| adversarial(n, fill, &frames, &spots)).collect();
        let (sim, seg, mut bytes, bounds) = build(normal, &tail);
        let at = 32 + ((bytes.len() - 32) as f64 * at_frac) as usize;
        bytes[at] ^= xor;
        sim.write_file(&seg, &bytes);
        let rec = bounds.iter().rposition(|&s| s as usize <= at).unwrap();
        let last = rec == bounds.len() - 2;
        match sim_open(&sim, config()) {
            Ok((log, report)) => {
                prop_assert!(last, "byte {} of record {}: open accepted mid-log damage: {}", at, rec, report);
                prop_assert_eq!(log.end_offset(), rec as u64); // R-LOG-2
                prop_assert_eq!(report.truncated.map(|t| t.byte_offset), Some(bounds[rec]));
            }
            Err(OpenError::Corrupt { path, byte_offset, .. }) => {
                prop_assert!(!last, "byte {}: the last record's damage is a torn tail", at);
                prop_assert_eq!((path, byte_offset), (seg.clone(), bounds[rec])); // R-LIM-2
                prop_assert_eq!(sim.read_file(&seg).unwrap(), bytes); // R-LOG-2: untouched
            }
            Err(e) => prop_assert!(false, "unexpected error {}", e),
        }
    }
}
