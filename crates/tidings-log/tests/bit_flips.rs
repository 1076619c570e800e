//! R-LOG-2, R-LIM-2: flip one bit at 10,000 seeded random positions of a closed multi-segment log
//! (segments and index files). Every flip is detected, precisely:
//!
//! * in an index file: open succeeds, reports the index as rebuilt, reads are unchanged;
//! * in a segment header: open fails with `BadHeader`/`UnsupportedVersion` naming the file;
//! * in the last record of the last segment: open truncates exactly that record and reports it
//!   (indistinguishable from a torn write);
//! * in any other record: open fails with `Corrupt { path, byte_offset }` naming the file and the
//!   start of the damaged record (with `verify_on_open`; without it, the open succeeds, the
//!   read of that record fails with the same path and offset, every record before it is read,
//!   and `next_readable` goes on past exactly that record, through `Log::read` and through
//!   the lending `Log::reader` alike) and no file is modified;
//!
//! and `tools::verify` reports every flip with its file (and record offset for records).

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use common::{DIR, assert_intact, fill, frame_bounds, lend_all, read_all, sim_open, small_config};
use tidings_log::testing::{SimStorage, TestRng};
use tidings_log::tools::{ProblemKind, verify_with_storage};
use tidings_log::{Fsync, LogConfig, OpenError, ReadError, StoredRecord};

fn config(verify_on_open: bool) -> LogConfig {
    small_config()
        .fsync(Fsync::Never)
        .segment_bytes(400)
        .verify_on_open(verify_on_open)
}

fn read_until_error(log: &tidings_log::Log) -> Result<Vec<StoredRecord>, ReadError> {
    let mut out = Vec::new();
    let mut next = log.start_offset();
    loop {
        let batch = log.read(next, 7)?;
        if batch.is_empty() {
            return Ok(out);
        }
        next = batch.last().unwrap().offset + 1;
        out.extend(batch);
    }
}

/// Reads the whole log in batches of `batch`, going on past damaged records with
/// `next_readable`: the records read, and the offsets skipped.
fn read_past_damage(log: &tidings_log::Log, batch: usize) -> (Vec<StoredRecord>, Vec<u64>) {
    let (mut out, mut skipped) = (Vec::new(), Vec::new());
    let mut next = log.start_offset();
    loop {
        match log.read(next, batch) {
            Ok(b) if b.is_empty() => return (out, skipped),
            Ok(b) => {
                next = b.last().unwrap().offset + 1;
                out.extend(b);
            }
            Err(ReadError::Corrupt { offset, .. }) => {
                assert_eq!(
                    offset, next,
                    "the failed read names the record it started at"
                );
                let after = log.next_readable(next).unwrap();
                assert!(after > next, "next_readable moves past the damage");
                skipped.extend(next..after);
                next = after;
            }
            Err(e) => panic!("read: {e}"),
        }
    }
}

/// [`read_past_damage`] through the lending reader: on a damaged record it fails at that
/// record (and again if asked again), and `next_readable` then `seek` go on past it.
fn lend_past_damage(log: &tidings_log::Log) -> (Vec<StoredRecord>, Vec<u64>) {
    let (mut out, mut skipped) = (Vec::new(), Vec::new());
    let mut reader = log.reader(log.start_offset());
    loop {
        let at = reader.position();
        match reader.next() {
            Ok(None) => return (out, skipped),
            Ok(Some(r)) => out.push(r.to_stored()),
            Err(ReadError::Corrupt { offset, .. }) => {
                assert_eq!(offset, at, "the reader fails at the record it stands at");
                assert!(
                    matches!(reader.next(), Err(ReadError::Corrupt { offset: o, .. }) if o == at),
                    "the reader stays at the damaged record"
                );
                let after = log.next_readable(at).unwrap();
                assert!(after > at, "next_readable moves past the damage");
                skipped.extend(at..after);
                reader.seek(after);
            }
            Err(e) => panic!("reader: {e}"),
        }
    }
}

/// The index in `original` of the first record of segment `path`.
fn first_index(original: &[StoredRecord], path: &std::path::Path) -> usize {
    let base: u64 = path
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .unwrap();
    original.iter().position(|o| o.offset == base).unwrap()
}

#[test]
fn ten_thousand_bit_flips_are_all_detected() {
    let flips: u64 = std::env::var("TIDINGS_BITFLIPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let base = SimStorage::new();
    let (log, _) = sim_open(&base, config(false)).unwrap();
    fill(&log, 16);
    let original = read_all(&log);
    drop(log);
    let files: BTreeMap<PathBuf, Vec<u8>> = base.snapshot();
    let segs: Vec<PathBuf> = files
        .keys()
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .cloned()
        .collect();
    assert!(segs.len() >= 3, "need a multi-segment log, got {segs:?}");
    let idx_count = files
        .keys()
        .filter(|p| p.extension().is_some_and(|e| e != "seg"))
        .count();
    assert_eq!(
        idx_count,
        2 * (segs.len() - 1),
        "sealed segments have index files"
    );
    let total_bits: u64 = files.values().map(|b| b.len() as u64 * 8).sum();
    let last_seg = segs.last().unwrap().clone();
    let mut rng = TestRng::new(0xb17f_11b5);
    let mut counts = BTreeMap::<&str, u64>::new();
    for i in 0..flips {
        // Pick a bit uniformly over all bytes of all files.
        let mut bit = rng.below(total_bits);
        let (path, bytes) = files
            .iter()
            .find(|(_, b)| {
                let n = b.len() as u64 * 8;
                if bit < n {
                    true
                } else {
                    bit -= n;
                    false
                }
            })
            .unwrap();
        let byte = bit / 8;
        let verify_on_open = i % 2 == 0;
        let sim = base.fork();
        assert!(sim.flip_bit(path, bit));
        let flipped = sim.snapshot();
        let what = format!("flip #{i}: {} byte {byte} bit {}", path.display(), bit % 8);
        let report = verify_with_storage(&sim, std::path::Path::new(DIR)).unwrap();
        assert_eq!(sim.snapshot(), flipped, "{what}: verify modified files");
        let opened = sim_open(&sim, config(verify_on_open));
        let is_seg = path.extension().is_some_and(|e| e == "seg");
        if !is_seg {
            // Index file: rebuilt, reads unchanged.
            let (log, rep) = opened.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(rep.rebuilt_indexes.contains(path), "{what}: {rep}");
            assert_eq!(read_all(&log), original, "{what}");
            assert_eq!(lend_all(&log), original, "{what}");
            assert!(
                report
                    .problems
                    .iter()
                    .any(|p| p.kind == ProblemKind::BadIndex),
                "{what}: {report}"
            );
            *counts.entry("index").or_default() += 1;
            continue;
        }
        if byte < 32 {
            // R-LIM-2: a bad header is reported with its path.
            match opened {
                Err(
                    OpenError::BadHeader { path: p, .. }
                    | OpenError::UnsupportedVersion { path: p, .. },
                ) => {
                    assert_eq!(&p, path, "{what}")
                }
                other => panic!("{what}: expected a header error, got {other:?}"),
            }
            assert_eq!(sim.snapshot(), flipped, "{what}: files modified");
            assert!(
                report
                    .problems
                    .iter()
                    .any(|p| p.kind == ProblemKind::BadHeader && &p.path == path),
                "{what}: {report}"
            );
            *counts.entry("header").or_default() += 1;
            continue;
        }
        let bounds = frame_bounds(bytes);
        let r = bounds.iter().rposition(|&s| s <= byte).unwrap();
        let rec_start = bounds[r];
        let is_last_record = *path == last_seg && r == bounds.len() - 2;
        let reported = report.problems.iter().any(|p| {
            &p.path == path
                && p.byte_offset == Some(rec_start)
                && matches!(p.kind, ProblemKind::Corrupt | ProblemKind::TornTail)
        });
        assert!(reported, "{what}: verify did not report it: {report}"); // R-LIM-2
        if is_last_record {
            // R-LOG-2: a damaged last record is a torn tail: exactly that record is dropped.
            let (log, rep) = opened.unwrap_or_else(|e| panic!("{what}: {e}"));
            let t = rep
                .truncated
                .as_ref()
                .unwrap_or_else(|| panic!("{what}: no truncation reported"));
            assert_eq!(
                (&t.path, t.byte_offset, t.bytes_dropped),
                (path, rec_start, bytes.len() as u64 - rec_start),
                "{what}"
            );
            assert_eq!(read_all(&log), original[..original.len() - 1], "{what}");
            assert_eq!(lend_all(&log), original[..original.len() - 1], "{what}");
            *counts.entry("torn tail").or_default() += 1;
            continue;
        }
        match opened {
            Err(OpenError::Corrupt {
                path: p,
                byte_offset,
                ..
            }) => {
                // R-LOG-2, R-LIM-2: corruption in the middle names file and offset ...
                assert_eq!((&p, byte_offset), (path, rec_start), "{what}");
                // ... and nothing was truncated or deleted.
                assert_eq!(sim.snapshot(), flipped, "{what}: files modified");
                *counts.entry("corrupt on open").or_default() += 1;
            }
            Ok((log, rep)) => {
                // Only a sealed segment whose (valid) index files were trusted, without
                // verify_on_open; the read of the damaged record must fail.
                assert!(
                    !verify_on_open && *path != last_seg,
                    "{what}: open accepted corruption: {rep}"
                );
                match read_until_error(&log) {
                    Err(ReadError::Corrupt {
                        path: p,
                        byte_offset,
                        ..
                    }) => assert_eq!((&p, byte_offset), (path, rec_start), "{what}"),
                    other => panic!(
                        "{what}: read did not detect the flip: {:?}",
                        other.map(|v| v.len())
                    ),
                }
                for rec in log.read(log.start_offset(), 1).unwrap_or_default() {
                    assert_intact(&rec);
                }
                // R-LIM-2, R-DEL-6: the damage costs only itself. Reading on past it
                // (`next_readable`) skips exactly the damaged record, and every other record
                // reads back unchanged, the ones before it in the same batch.
                let bad = original[first_index(&original, path) + r].offset;
                let (read, skipped) = read_past_damage(&log, 64);
                assert_eq!(skipped, vec![bad], "{what}");
                let others: Vec<StoredRecord> = original
                    .iter()
                    .filter(|o| o.offset != bad)
                    .cloned()
                    .collect();
                assert_eq!(read, others, "{what}");
                // The same through the lending reader.
                let (lent, lent_skipped) = lend_past_damage(&log);
                assert_eq!(lent_skipped, vec![bad], "{what}");
                assert_eq!(lent, others, "{what}");
                drop(log);
                *counts.entry("corrupt on read").or_default() += 1;
            }
            Err(e) => panic!("{what}: unexpected error {e}"),
        }
    }
    eprintln!("bit flips: {counts:?}");
    assert!(
        counts.len() >= 5,
        "every category should be hit: {counts:?}"
    );
}
