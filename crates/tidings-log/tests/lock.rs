//! R-LOG-2: one writing handle per log directory; a second open is refused, not allowed to
//! interleave its appends with the first one's.

use tidings_log::{Log, LogConfig, OpenError, Record};

#[test]
fn a_second_open_of_a_locked_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, report) = Log::open(tmp.path(), LogConfig::default()).unwrap();
    assert!(report.ignored_files.is_empty(), "{report}"); // the LOCK file is the log's own
    log.append(&Record::new(1, b"first".to_vec())).unwrap();
    match Log::open(tmp.path(), LogConfig::default()) {
        Err(OpenError::Locked { path }) => assert_eq!(path, tmp.path().join("LOCK")),
        other => panic!("expected Locked, got {:?}", other.map(|(_, r)| r)),
    }
    // Close releases the lock; the next handle sees everything the first one wrote.
    log.close().unwrap();
    let (again, _) = Log::open(tmp.path(), LogConfig::default()).unwrap();
    assert_eq!(again.end_offset(), 1);
    drop(again);
    drop(log);
    // Dropping releases it too.
    let (third, report) = Log::open(tmp.path(), LogConfig::default()).unwrap();
    assert!(report.ignored_files.is_empty());
    assert_eq!(third.read(0, 10).unwrap()[0].payload, &b"first"[..]);
}
