//! Index files are a checked cache: missing, truncated, garbage or stale index files are rebuilt
//! from their segment on open, and reads are the same.

mod common;

use std::path::{Path, PathBuf};

use common::{fill, read_all};
use tidings_log::tools::verify;
use tidings_log::{Fsync, Log, LogConfig};

fn config() -> LogConfig {
    LogConfig::new()
        .fsync(Fsync::Never)
        .segment_bytes(600)
        .index_interval_bytes(80)
}

fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

#[test]
fn damaged_index_files_are_rebuilt_and_reads_are_the_same() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, _) = Log::open(tmp.path(), config()).unwrap();
    fill(&log, 80);
    let records = read_all(&log);
    let times: Vec<u64> = (0..1800)
        .step_by(7)
        .map(|t| log.offset_for_time(t).unwrap())
        .collect();
    drop(log);
    let idx = files(tmp.path(), "idx");
    let tix = files(tmp.path(), "tix");
    assert!(idx.len() >= 4, "{idx:?}");
    let originals: Vec<Vec<u8>> = idx
        .iter()
        .chain(&tix)
        .map(|p| std::fs::read(p).unwrap())
        .collect();

    std::fs::remove_file(&idx[0]).unwrap(); // missing
    std::fs::write(
        &tix[1],
        b"garbage garbage garbage garbage garbage garbage garbage",
    )
    .unwrap(); // garbage
    let b = std::fs::read(&idx[2]).unwrap();
    std::fs::write(&idx[2], &b[..b.len() / 2]).unwrap(); // truncated
    std::fs::copy(&tix[0], &tix[3]).unwrap(); // stale: another segment's index
    assert!(!verify(tmp.path()).unwrap().is_ok());

    let (log, report) = Log::open(tmp.path(), config()).unwrap();
    for p in [&idx[0], &tix[1], &idx[2], &tix[3]] {
        assert!(
            report.rebuilt_indexes.contains(p),
            "{p:?} not rebuilt: {report}"
        );
    }
    assert_eq!(read_all(&log), records);
    let again: Vec<u64> = (0..1800)
        .step_by(7)
        .map(|t| log.offset_for_time(t).unwrap())
        .collect();
    assert_eq!(again, times);
    drop(log);
    // The rewritten files are identical to the ones written at roll time.
    let now: Vec<Vec<u8>> = idx
        .iter()
        .chain(&tix)
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    assert_eq!(now, originals);
    assert!(verify(tmp.path()).unwrap().is_ok());
    let (_, report) = Log::open(tmp.path(), config()).unwrap();
    assert!(report.is_clean(), "{report}");
}

#[test]
fn index_interval_change_is_harmless() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, _) = Log::open(tmp.path(), config()).unwrap();
    fill(&log, 50);
    let records = read_all(&log);
    drop(log);
    let (log, _) = Log::open(tmp.path(), config().index_interval_bytes(7)).unwrap();
    assert_eq!(read_all(&log), records);
    fill(&log, 10);
    drop(log);
    assert!(verify(tmp.path()).unwrap().is_ok());
}
