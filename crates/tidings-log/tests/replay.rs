//! R-LOG-4: replay by offset, by time (first record at or after), from the earliest and the
//! latest; retention removes only whole old segments (by size and by age), and a read before the
//! start gets `OutOfRetention` with the earliest offset.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{assert_intact, fill, read_all, record_for, ts_for};
use tidings_log::{Fsync, Log, LogConfig, ReadError, Record, Retention};

fn config(retention: Retention) -> LogConfig {
    LogConfig::new()
        .fsync(Fsync::Never)
        .segment_bytes(512)
        .index_interval_bytes(64)
        .retention(retention)
}

fn segment_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

fn base_of(p: &std::path::Path) -> u64 {
    p.file_stem().unwrap().to_str().unwrap().parse().unwrap()
}

#[test]
fn read_by_offset_earliest_and_latest() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, report) = Log::open(tmp.path(), config(Retention::default())).unwrap();
    assert!(report.created);
    fill(&log, 100);
    assert!(segment_files(tmp.path()).len() > 5);
    // R-LOG-4: seek to an offset (across segment boundaries).
    for from in [0, 1, 17, 37, 63, 99] {
        let got = log.read(from, 9).unwrap();
        assert_eq!(got.len(), 9.min(100 - from as usize));
        for (i, r) in got.iter().enumerate() {
            assert_eq!(r.offset, from + i as u64);
            assert_intact(r);
        }
    }
    // R-LOG-4: earliest retained and latest.
    assert_eq!(log.start_offset(), 0);
    assert_eq!(log.end_offset(), 100);
    assert!(log.read(log.end_offset(), 10).unwrap().is_empty());
    assert!(matches!(
        log.read(101, 1),
        Err(ReadError::BeyondEnd {
            requested: 101,
            end: 100
        })
    ));
    assert!(log.read(5, 0).unwrap().is_empty());
    // Same answers after a reopen (indexes from files).
    drop(log);
    let (log, report) = Log::open(tmp.path(), config(Retention::default())).unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(read_all(&log).len(), 100);
}

#[test]
fn read_by_time_first_record_at_or_after() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, _) = Log::open(tmp.path(), config(Retention::default())).unwrap();
    fill(&log, 120);
    let ts: Vec<u64> = (0..120).map(ts_for).collect();
    let check = |log: &Log| {
        for t in 0..=ts.iter().max().unwrap() + 20 {
            // R-LOG-4: the first record, in offset order, whose timestamp is >= t.
            let want = ts.iter().position(|&x| x >= t).map_or(120, |p| p as u64);
            assert_eq!(log.offset_for_time(t).unwrap(), want, "t = {t}");
        }
    };
    check(&log);
    drop(log);
    let (log, _) = Log::open(tmp.path(), config(Retention::default())).unwrap();
    check(&log);
}

#[test]
fn time_lookup_with_out_of_order_timestamps() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, _) = Log::open(tmp.path(), config(Retention::default())).unwrap();
    // A late record (5) after later ones: "at or after 4" is offset 3 (ts 6), the first >= 4.
    for (i, t) in [1u64, 2, 3, 6, 5, 7, 4, 9].iter().enumerate() {
        assert_eq!(
            log.append(&Record::new(*t, vec![0u8; 90])).unwrap(),
            i as u64
        );
    }
    assert_eq!(log.offset_for_time(4).unwrap(), 3);
    assert_eq!(log.offset_for_time(5).unwrap(), 3);
    assert_eq!(log.offset_for_time(7).unwrap(), 5);
    assert_eq!(log.offset_for_time(8).unwrap(), 7);
    assert_eq!(log.offset_for_time(10).unwrap(), 8);
}

#[test]
fn retention_by_size_removes_whole_old_segments_only() {
    let tmp = tempfile::tempdir().unwrap();
    let max = 2000;
    // Written without a policy (retention also runs after every roll, see below), then
    // reopened with one and applied explicitly.
    let (log, _) = Log::open(tmp.path(), config(Retention::default())).unwrap();
    fill(&log, 100);
    drop(log);
    let (log, _) = Log::open(tmp.path(), config(Retention::new().max_bytes(max))).unwrap();
    let before = segment_files(tmp.path());
    let sizes: Vec<u64> = before
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .collect();
    let rep = log.apply_retention(0).unwrap();
    let after = segment_files(tmp.path());
    assert!(!rep.removed.is_empty());
    // R-LOG-4: only a prefix of whole segments went; the rest are untouched.
    assert_eq!(after, before[rep.removed.len()..]);
    for r in &rep.removed {
        assert!(!r.path.exists());
    }
    let retained: u64 = sizes[rep.removed.len()..].iter().sum();
    assert!(retained <= max, "retained {retained}");
    assert!(
        retained + sizes[rep.removed.len() - 1] > max,
        "removed one segment too many"
    );
    assert_eq!(log.start_offset(), base_of(&after[0]));
    assert_eq!(rep.start_offset, log.start_offset());
    // R-LOG-4: a read before the start names the earliest offset.
    match log.read(0, 1) {
        Err(ReadError::OutOfRetention {
            requested: 0,
            earliest,
        }) => assert_eq!(earliest, log.start_offset()),
        other => panic!("{other:?}"),
    }
    assert_eq!(log.offset_for_time(0).unwrap(), log.start_offset());
    let rest = read_all(&log);
    rest.iter().for_each(assert_intact);
    assert_eq!(rest.len() as u64, 100 - log.start_offset());
    // The active segment is never removed, whatever the limit.
    drop(log);
    let (log, _) = Log::open(tmp.path(), config(Retention::new().max_bytes(1))).unwrap();
    log.apply_retention(0).unwrap();
    assert_eq!(segment_files(tmp.path()).len(), 1);
    assert_eq!(log.end_offset(), 100);
    let start = log.start_offset();
    fill(&log, 1);
    assert_eq!(log.read(start, 100).unwrap().len() as u64, 101 - start);
    drop(log);
    let (log, _) = Log::open(tmp.path(), config(Retention::default())).unwrap();
    assert_eq!(log.start_offset(), start);
}

#[test]
fn retention_by_age() {
    let tmp = tempfile::tempdir().unwrap();
    let age = Duration::from_secs(1);
    let (log, _) = Log::open(tmp.path(), config(Retention::default())).unwrap();
    for i in 0..30 {
        log.append(&Record::new(1_000 + i, vec![1u8; 60])).unwrap();
    }
    for i in 0..30 {
        log.append(&Record::new(100_000 + i, vec![2u8; 60]))
            .unwrap();
    }
    drop(log);
    let (log, _) = Log::open(tmp.path(), config(Retention::new().max_age(age))).unwrap();
    let now = 100_500;
    let rep = log.apply_retention(now).unwrap();
    assert!(!rep.removed.is_empty());
    // R-LOG-4: every removed segment held only records older than max_age ...
    for r in &rep.removed {
        assert!(r.end_offset <= 30, "{rep}");
    }
    // ... and the first retained one still holds a record that is not.
    let first = log.read(log.start_offset(), 100).unwrap();
    assert!(first.iter().any(|r| r.timestamp_ms + 1000 >= now));
    assert!(log.start_offset() <= 30);
    // Nothing else expires; far in the future everything but the active segment goes.
    assert!(log.apply_retention(now).unwrap().removed.is_empty());
    log.apply_retention(u64::MAX).unwrap();
    assert_eq!(segment_files(tmp.path()).len(), 1);
    assert_eq!(log.end_offset(), 60);
    let _ = record_for(0);
}

#[test]
fn retention_runs_after_every_roll() {
    // R-LOG-1: a log with a size policy stays within it while appending, without anyone
    // calling apply_retention; only whole old segments go.
    let tmp = tempfile::tempdir().unwrap();
    let max = 2000;
    let (log, _) = Log::open(tmp.path(), config(Retention::new().max_bytes(max))).unwrap();
    fill(&log, 200);
    log.sync().unwrap();
    let files = segment_files(tmp.path());
    let sealed: u64 = files[..files.len() - 1]
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(sealed <= max, "sealed segments hold {sealed} bytes");
    assert!(log.start_offset() > 0);
    assert_eq!(log.start_offset(), base_of(&files[0]));
    assert_eq!(log.retention_error(), None);
    let rest = read_all(&log);
    rest.iter().for_each(assert_intact);
    assert_eq!(rest.len() as u64, 200 - log.start_offset());

    // An age policy judges age against the newest record appended: old segments go once a
    // record far newer rolls the log.
    let tmp = tempfile::tempdir().unwrap();
    let (log, _) = Log::open(
        tmp.path(),
        config(Retention::new().max_age(Duration::from_secs(1))),
    )
    .unwrap();
    for i in 0..30 {
        log.append(&Record::new(1_000 + i, vec![1u8; 60])).unwrap();
    }
    assert_eq!(log.start_offset(), 0, "nothing is old yet");
    for i in 0..30 {
        log.append(&Record::new(100_000 + i, vec![2u8; 60]))
            .unwrap();
    }
    assert!(log.start_offset() > 0 && log.start_offset() <= 30);
    let first = log.read(log.start_offset(), 100).unwrap();
    assert!(first.iter().any(|r| r.timestamp_ms >= 99_000));
}
