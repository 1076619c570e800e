//! Recovery of unpublished segments (`<base>.seg.tmp`), which a crash during an asynchronous
//! roll leaves behind (recovery rule 6). Each test writes a log, then turns the directory into
//! what a crash at a chosen point would have left: the last segments renamed back to their
//! temporary names (their index files gone, as before their seal), the segment before them
//! complete (a process kill: the page cache survives) or torn (a power cut), a header or record
//! damaged. R-LOG-2: the open adopts exactly the unpublished segments that continue a complete
//! log, recovers a prefix of what was written with every record intact, never reads a removed
//! file's bytes as records, and leaves no temporary file.

mod common;

use std::path::{Path, PathBuf};

use common::{assert_intact, fill, read_all, sim_open, sim_segments};
use tidings_log::testing::{CrashMode, SimStorage};
use tidings_log::tools::verify_with_storage;
use tidings_log::{Fsync, Log, LogConfig};

fn config() -> LogConfig {
    LogConfig::new()
        .fsync(Fsync::Always)
        .segment_bytes(512)
        .index_interval_bytes(100)
}

/// A closed log of `n` records in several segments; returns its segment paths, oldest first.
fn written(sim: &SimStorage, n: u64) -> Vec<PathBuf> {
    let (log, _) = sim_open(sim, config()).unwrap();
    fill(&log, n);
    log.close().unwrap();
    let segs = sim_segments(sim);
    assert!(segs.len() >= 4, "need several segments, got {}", segs.len());
    segs
}

fn tmp_of(seg: &Path) -> PathBuf {
    let mut p = seg.as_os_str().to_owned();
    p.push(".tmp");
    PathBuf::from(p)
}

fn base_of(seg: &Path) -> u64 {
    let name = seg.file_name().unwrap().to_str().unwrap();
    name[..20].parse().unwrap()
}

/// Moves `seg` back to its temporary name and removes its index files, as before its seal.
fn unpublish(sim: &SimStorage, seg: &Path) -> PathBuf {
    let bytes = sim.read_file(seg).unwrap();
    let tmp = tmp_of(seg);
    sim.write_file(&tmp, &bytes);
    assert!(sim.delete_file(seg));
    for ext in ["idx", "tix"] {
        sim.delete_file(&seg.with_extension(ext));
    }
    tmp
}

/// Cuts `bytes` off the end of `path`.
fn shorten(sim: &SimStorage, path: &Path, bytes: usize) {
    let mut data = sim.read_file(path).unwrap();
    data.truncate(data.len() - bytes);
    sim.write_file(path, &data);
}

fn leftover_tmps(sim: &SimStorage) -> Vec<PathBuf> {
    sim.snapshot()
        .into_keys()
        .filter(|p| p.to_string_lossy().ends_with(".tmp"))
        .collect()
}

/// Opens, checks the invariants every recovery keeps, returns the log's end offset.
fn reopen(sim: &SimStorage) -> (Log, tidings_log::RecoveryReport) {
    let (log, report) = sim_open(sim, config()).unwrap_or_else(|e| panic!("open failed: {e}"));
    read_all(&log).iter().for_each(assert_intact);
    assert!(leftover_tmps(sim).is_empty(), "{report}");
    (log, report)
}

#[test]
fn a_killed_roll_keeps_every_record() {
    // One pending seal, then a chain of three: every unpublished segment continues a complete
    // log, so every one is adopted, in order, and nothing is lost.
    for pending in [1, 3] {
        let sim = SimStorage::new();
        let segs = written(&sim, 120);
        let n = segs.len();
        let tmps: Vec<PathBuf> = segs[n - pending..]
            .iter()
            .map(|s| unpublish(&sim, s))
            .collect();
        assert_eq!(tmps.len(), pending);
        let (log, report) = reopen(&sim);
        assert_eq!(log.end_offset(), 120, "{report}");
        assert_eq!(report.adopted_segments, segs[n - pending..].to_vec());
        assert!(!report.is_clean());
        assert_eq!(sim_segments(&sim), segs);
        // The segment before the first adopted one is sealed now: its index files are back.
        let sealed = &segs[n - pending - 1];
        assert!(sim.read_file(&sealed.with_extension("idx")).is_some());
        // The adopted log takes appends, and the next open has nothing to repair.
        fill(&log, 30);
        log.close().unwrap();
        let (log, report) = reopen(&sim);
        assert!(report.is_clean(), "{report}");
        assert_eq!(read_all(&log).len(), 150);
    }
}

#[test]
fn a_torn_predecessor_drops_the_unpublished_segments() {
    // A power cut took the end of the segment before them: their records would follow a hole.
    let sim = SimStorage::new();
    let segs = written(&sim, 120);
    let n = segs.len();
    let t1 = unpublish(&sim, &segs[n - 2]);
    let t2 = unpublish(&sim, &segs[n - 1]);
    shorten(&sim, &segs[n - 3], 5);
    let (log, report) = reopen(&sim);
    assert!(report.adopted_segments.is_empty(), "{report}");
    assert!(report.removed_files.contains(&t1) && report.removed_files.contains(&t2));
    assert!(report.truncated.is_some());
    assert!(log.end_offset() < base_of(&segs[n - 2]));
}

#[test]
fn a_predecessor_missing_whole_records_drops_them() {
    // The cut fell exactly on a record boundary: no torn tail, but the log ends before the
    // unpublished segment's base.
    let sim = SimStorage::new();
    let segs = written(&sim, 120);
    let n = segs.len();
    let t = unpublish(&sim, &segs[n - 1]);
    let prev = &segs[n - 2];
    let bounds = common::frame_bounds(&sim.read_file(prev).unwrap());
    let last_frame = (bounds[bounds.len() - 1] - bounds[bounds.len() - 2]) as usize;
    shorten(&sim, prev, last_frame);
    let (log, report) = reopen(&sim);
    assert!(report.truncated.is_none(), "{report}");
    assert_eq!(report.removed_files, vec![t]);
    assert_eq!(log.end_offset(), base_of(&segs[n - 1]) - 1);
}

#[test]
fn a_torn_header_drops_it_and_every_later_one() {
    for byte in [0u64, 17, 31] {
        let sim = SimStorage::new();
        let segs = written(&sim, 120);
        let n = segs.len();
        let t1 = unpublish(&sim, &segs[n - 2]);
        let t2 = unpublish(&sim, &segs[n - 1]);
        assert!(sim.flip_bit(&t1, byte * 8 + 3));
        let (log, report) = reopen(&sim);
        assert!(report.adopted_segments.is_empty(), "{report}");
        assert!(report.removed_files.contains(&t1) && report.removed_files.contains(&t2));
        assert_eq!(log.end_offset(), base_of(&segs[n - 2]));
    }
}

#[test]
fn damage_inside_an_adopted_segment_is_a_torn_tail() {
    // Nothing in an unpublished segment was reported durable: a bad record in its middle cuts
    // it there (with every later unpublished segment) instead of refusing to open, which a
    // sealed segment's damage would.
    let sim = SimStorage::new();
    let segs = written(&sim, 120);
    let n = segs.len();
    let t1 = unpublish(&sim, &segs[n - 2]);
    let t2 = unpublish(&sim, &segs[n - 1]);
    let bounds = common::frame_bounds(&sim.read_file(&t1).unwrap());
    assert!(bounds.len() > 3);
    // A payload bit of the second record.
    assert!(sim.flip_bit(&t1, (bounds[1] + 20) * 8));
    let (log, report) = reopen(&sim);
    assert_eq!(
        report.adopted_segments,
        vec![segs[n - 2].clone()],
        "{report}"
    );
    let cut = report.truncated.as_ref().expect("truncated");
    assert_eq!(cut.path, segs[n - 2]);
    assert_eq!(cut.byte_offset, bounds[1]);
    assert!(report.removed_files.contains(&t2));
    assert_eq!(log.end_offset(), base_of(&segs[n - 2]) + 1);
}

#[test]
fn a_segment_that_does_not_continue_the_log_is_dropped() {
    // Intact, with a valid header for its name, but its base is not where the log ends (here
    // the whole segment before it is gone): never read as records.
    let sim = SimStorage::new();
    let segs = written(&sim, 120);
    let n = segs.len();
    let t = unpublish(&sim, &segs[n - 1]);
    unpublish(&sim, &segs[n - 2]);
    assert!(sim.delete_file(&tmp_of(&segs[n - 2])));
    let (log, report) = reopen(&sim);
    assert!(report.adopted_segments.is_empty(), "{report}");
    assert_eq!(report.removed_files, vec![t]);
    assert_eq!(log.end_offset(), base_of(&segs[n - 2]));
}

#[test]
fn a_crash_during_adoption_loses_nothing() {
    // Every data byte here is durable (written under `Always`): whatever point of the adoption
    // a power cut interrupts, the next open recovers every record.
    let probe = SimStorage::new();
    let segs = written(&probe, 120);
    let n = segs.len();
    for s in &segs[n - 2..] {
        unpublish(&probe, s);
    }
    let before = probe.op_count();
    drop(reopen(&probe));
    let ops = probe.op_count() - before;
    for at in 0..ops {
        for mode in [CrashMode::DropUnsynced, CrashMode::ZeroFillUnsynced] {
            let sim = SimStorage::new();
            let segs = written(&sim, 120);
            for s in &segs[n - 2..] {
                unpublish(&sim, s);
            }
            sim.crash_after(at);
            let _ = sim_open(&sim, config());
            sim.power_cut(mode);
            let (log, report) = reopen(&sim);
            assert_eq!(
                log.end_offset(),
                120,
                "crash at op {at}, {mode:?}: {report}"
            );
        }
    }
}

#[test]
fn verify_names_an_unpublished_segment() {
    let sim = SimStorage::new();
    let segs = written(&sim, 120);
    let t = unpublish(&sim, segs.last().unwrap());
    let rep = verify_with_storage(&sim, Path::new(common::DIR)).unwrap();
    let text = format!("{rep:?}");
    assert!(text.contains(&*t.to_string_lossy()), "{text}");
    assert!(text.contains("not yet published"), "{text}");
}
