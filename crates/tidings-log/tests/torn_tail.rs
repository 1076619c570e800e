//! R-LOG-2: cut the last segment at every byte inside its last 3 records (and zero- or
//! garbage-fill instead of cutting): recovery keeps exactly the whole records before the cut and
//! reports the truncation.

mod common;

use common::{assert_intact, fill, frame_bounds, read_all, sim_open, sim_segments, small_config};
use tidings_log::testing::SimStorage;
use tidings_log::{Fsync, Log, LogConfig};

fn config() -> LogConfig {
    small_config().fsync(Fsync::Never)
}

/// A closed multi-segment log whose last segment holds at least 3 records.
fn build() -> (SimStorage, std::path::PathBuf, Vec<u8>, u64) {
    let sim = SimStorage::new();
    let (log, _) = sim_open(&sim, config()).unwrap();
    fill(&log, 12);
    loop {
        // After the sync: until its seal is done, a new last segment is not under its name.
        log.sync().unwrap();
        let last = sim_segments(&sim).pop().unwrap();
        if frame_bounds(&sim.read_file(&last).unwrap()).len() > 3 {
            break;
        }
        fill(&log, 1);
    }
    let end = log.end_offset();
    drop(log);
    let last = sim_segments(&sim).pop().unwrap();
    let bytes = sim.read_file(&last).unwrap();
    assert!(sim_segments(&sim).len() >= 3);
    (sim, last, bytes, end)
}

#[test]
fn every_cut_in_the_last_three_records() {
    let (sim, last, bytes, end) = build();
    let bounds = frame_bounds(&bytes);
    let n = bounds.len() - 1; // records in the last segment
    assert_eq!(*bounds.last().unwrap(), bytes.len() as u64);
    let first_cut = bounds[n - 3];
    let mut cases = 0;
    for cut in first_cut..bytes.len() as u64 {
        // Whole records before the cut.
        let kept = bounds.iter().take_while(|&&b| b <= cut).count() - 1;
        let rec_start = bounds[kept];
        let expected_end = end - (n - kept) as u64;
        for fill_byte in [None, Some(0u8), Some(0xff)] {
            let s = sim.fork();
            let mut b = bytes[..cut as usize].to_vec();
            if let Some(f) = fill_byte {
                b.resize(bytes.len(), f);
            }
            s.write_file(&last, &b);
            let (log, report) =
                sim_open(&s, config()).unwrap_or_else(|e| panic!("cut {cut} {fill_byte:?}: {e}"));
            let all = read_all(&log);
            all.iter().for_each(assert_intact);
            assert_eq!(log.end_offset(), expected_end, "cut {cut} {fill_byte:?}"); // R-LOG-2
            let dropped = b.len() as u64 - rec_start;
            match &report.truncated {
                None => assert_eq!(
                    dropped, 0,
                    "cut {cut} {fill_byte:?}: truncation not reported"
                ),
                Some(t) => {
                    // R-LOG-2: the torn tail is reported with file, byte offset and size.
                    assert_eq!(
                        (&t.path, t.byte_offset, t.bytes_dropped),
                        (&last, rec_start, dropped),
                        "cut {cut} {fill_byte:?}"
                    );
                }
            }
            assert_eq!(s.read_file(&last).unwrap().len() as u64, rec_start);
            cases += 1;
        }
    }
    assert!(cases > 100);
}

#[test]
fn torn_tail_on_the_real_file_system() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, _) = Log::open(tmp.path(), config()).unwrap();
    fill(&log, 20);
    let end = log.end_offset();
    drop(log);
    let mut segs: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segs.sort();
    let last = segs.pop().unwrap();
    let bytes = std::fs::read(&last).unwrap();
    let bounds = frame_bounds(&bytes);
    let n = bounds.len() - 1;
    assert!(n >= 2);
    for cut in (bounds[n - 2]..bytes.len() as u64).step_by(7) {
        std::fs::write(&last, &bytes[..cut as usize]).unwrap();
        let (log, report) = Log::open(tmp.path(), config()).unwrap();
        let kept = bounds.iter().take_while(|&&b| b <= cut).count() - 1;
        assert_eq!(log.end_offset(), end - (n - kept) as u64); // R-LOG-2
        assert_eq!(report.truncated.is_some(), cut != bounds[kept]);
        read_all(&log).iter().for_each(assert_intact);
    }
}
