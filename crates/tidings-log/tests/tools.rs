//! The offline tools: inspect, verify, dump (read-only, `Display` for a CLI).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{fill, read_all};
use tidings_log::tools::{ProblemKind, dump, inspect, verify};
use tidings_log::{Fsync, Log, LogConfig};

fn config() -> LogConfig {
    LogConfig::new().fsync(Fsync::Never).segment_bytes(700)
}

fn dir_bytes(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            let b = std::fs::read(&p).unwrap();
            (p, b)
        })
        .collect()
}

#[test]
fn inspect_verify_dump_on_a_healthy_log() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, _) = Log::open(tmp.path(), config()).unwrap();
    fill(&log, 60);
    let all = read_all(&log);
    drop(log);
    let before = dir_bytes(tmp.path());

    let ins = inspect(tmp.path()).unwrap();
    assert_eq!(ins.records(), 60);
    assert_eq!((ins.start_offset(), ins.end_offset()), (0, 60));
    assert!(ins.segments.len() > 3);
    let shown = ins.to_string();
    assert!(
        shown.contains("offsets 0..60") && shown.contains("00000000000000000000.seg"),
        "{shown}"
    );

    let v = verify(tmp.path()).unwrap();
    assert!(v.is_ok(), "{v}");
    assert!(v.to_string().starts_with("OK:"), "{v}");
    assert_eq!(v.records, 60);

    assert_eq!(dump(tmp.path(), 0, 1000).unwrap(), all);
    assert_eq!(dump(tmp.path(), 17, 5).unwrap(), all[17..22]);
    assert!(dump(tmp.path(), 60, 5).unwrap().is_empty());
    assert!(all[3].to_string().starts_with("offset=3 ts="));
    assert_eq!(
        dir_bytes(tmp.path()),
        before,
        "tools must not modify the log"
    );
}

#[test]
fn verify_reports_every_problem_with_path_and_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, _) = Log::open(tmp.path(), config()).unwrap();
    fill(&log, 60);
    drop(log);
    let mut segs: Vec<_> = dir_bytes(tmp.path())
        .into_iter()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    // Two corrupt records in one sealed segment, one in another, and a torn tail.
    let (p0, mut b0) = segs.remove(0);
    let f0 = common::frame_bounds(&b0);
    b0[f0[0] as usize + 12] ^= 1;
    b0[f0[2] as usize + 20] ^= 4;
    std::fs::write(&p0, &b0).unwrap();
    let (p1, mut b1) = segs.remove(0);
    let f1 = common::frame_bounds(&b1);
    b1[f1[1] as usize + 9] ^= 0x80;
    std::fs::write(&p1, &b1).unwrap();
    let (pl, bl) = segs.pop().unwrap();
    std::fs::write(&pl, &bl[..bl.len() - 3]).unwrap();
    std::fs::write(tmp.path().join("x.seg"), b"").unwrap();

    let v = verify(tmp.path()).unwrap();
    let found: Vec<_> = v
        .problems
        .iter()
        .map(|p| (p.kind, p.path.clone(), p.byte_offset))
        .collect();
    assert!(
        found.contains(&(ProblemKind::Corrupt, p0.clone(), Some(f0[0]))),
        "{v}"
    );
    assert!(
        found.contains(&(ProblemKind::Corrupt, p0.clone(), Some(f0[2]))),
        "{v}"
    );
    assert!(
        found.contains(&(ProblemKind::Corrupt, p1.clone(), Some(f1[1]))),
        "{v}"
    );
    let last_start = *common::frame_bounds(&bl).iter().rev().nth(1).unwrap();
    assert!(
        found.contains(&(ProblemKind::TornTail, pl.clone(), Some(last_start))),
        "{v}"
    );
    assert!(
        found
            .iter()
            .any(|(k, p, _)| *k == ProblemKind::BadName && p.ends_with("x.seg")),
        "{v}"
    );
    assert!(v.prevents_open());
    let shown = v.to_string();
    assert!(
        shown.starts_with("CORRUPT") && shown.contains(&p0.display().to_string()),
        "{shown}"
    );
    assert!(matches!(
        dump(tmp.path(), 0, 10),
        Err(tidings_log::ToolError::Corrupt { .. })
    ));
    let ins = inspect(tmp.path()).unwrap();
    assert!(ins.segments[0].problem.is_some());
}

/// A damaged time index (`.tix`) is reported under its own name, not under the
/// offset index's; a damaged offset index under the `.idx` name.
#[test]
fn verify_names_the_damaged_index_file() {
    for (ext, other) in [("tix", "idx"), ("idx", "tix")] {
        let tmp = tempfile::tempdir().unwrap();
        let (log, _) = Log::open(tmp.path(), config()).unwrap();
        fill(&log, 60);
        drop(log);
        let victim = tmp.path().join(format!("{:020}.{ext}", 0));
        let mut b = std::fs::read(&victim).unwrap();
        b[0] ^= 0xff; // bad magic
        std::fs::write(&victim, &b).unwrap();
        let v = verify(tmp.path()).unwrap();
        let bad: Vec<_> = v
            .problems
            .iter()
            .filter(|p| p.kind == ProblemKind::BadIndex)
            .collect();
        // R-LIM-2: the report names the damaged file.
        assert_eq!(bad.len(), 1, "{v}");
        assert_eq!(bad[0].path, victim, "{v}");
        assert!(
            !v.to_string().contains(&format!("{:020}.{other}", 0)),
            "{v}"
        );
    }
}

#[test]
fn verify_reports_progress_once_per_segment() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, _) = Log::open(tmp.path(), config()).unwrap();
    fill(&log, 60);
    drop(log);
    let mut calls = Vec::new();
    let rep = tidings_log::tools::verify_with_progress(
        &tidings_log::FsStorage,
        tmp.path(),
        &mut |done, total| calls.push((done, total)),
    )
    .unwrap();
    assert!(rep.segments > 1, "the test wants several segments");
    let total = rep.segments as u64;
    let expected: Vec<_> = (1..=total).map(|d| (d, total)).collect();
    assert_eq!(calls, expected);
}
