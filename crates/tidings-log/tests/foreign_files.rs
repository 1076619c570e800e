//! R-LIM-2: corrupt or foreign files in a stream directory give a clear typed error naming the
//! path; nothing panics, nothing is modified. Unknown files are ignored and reported.

mod common;

use std::path::{Path, PathBuf};

use common::{DIR, fill, sim_open, sim_segments, small_config};
use tidings_log::testing::SimStorage;
use tidings_log::tools::{inspect_with_storage, verify_with_storage};
use tidings_log::{Fsync, LogConfig, OpenError};

fn config() -> LogConfig {
    small_config().fsync(Fsync::Never)
}

/// A closed log with several segments.
fn healthy() -> SimStorage {
    let sim = SimStorage::new();
    let (log, _) = sim_open(&sim, config()).unwrap();
    fill(&log, 20);
    drop(log);
    assert!(sim_segments(&sim).len() >= 3);
    sim
}

fn p(name: &str) -> PathBuf {
    Path::new(DIR).join(name)
}

/// Opens, expecting an error that names `path`; checks nothing changed and the tools cope.
fn expect_error(sim: &SimStorage, path: &Path) -> OpenError {
    let before = sim.snapshot();
    let err = sim_open(sim, config())
        .map(|_| ())
        .expect_err("open must fail");
    let shown = err.to_string();
    assert!(
        shown.contains(&path.display().to_string()),
        "error {shown:?} does not name {path:?}"
    ); // R-LIM-2
    assert_eq!(sim.snapshot(), before, "failed open modified files");
    // The tools report instead of failing or panicking.
    let v = verify_with_storage(sim, Path::new(DIR)).unwrap();
    assert!(v.prevents_open(), "{v}");
    inspect_with_storage(sim, Path::new(DIR)).unwrap();
    err
}

#[test]
fn bad_magic() {
    let sim = healthy();
    let seg = sim_segments(&sim)[1].clone();
    let mut b = sim.read_file(&seg).unwrap();
    b[..8].copy_from_slice(b"NOTALOG!");
    sim.write_file(&seg, &b);
    assert!(matches!(
        expect_error(&sim, &seg),
        OpenError::BadHeader { .. }
    ));
}

#[test]
fn foreign_file_with_a_segment_name() {
    for which in [0, 2] {
        let sim = healthy();
        let seg = sim_segments(&sim)[which].clone();
        let junk: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        sim.write_file(&seg, &junk);
        assert!(matches!(
            expect_error(&sim, &seg),
            OpenError::BadHeader { .. }
        ));
    }
    // The last segment replaced by a foreign file is not mistaken for an interrupted roll.
    let sim = healthy();
    let last = sim_segments(&sim).pop().unwrap();
    sim.write_file(&last, b"hello, I am a text file");
    assert!(matches!(
        expect_error(&sim, &last),
        OpenError::BadHeader { .. }
    ));
}

#[test]
fn wrong_version() {
    let sim = healthy();
    let seg = sim_segments(&sim)[0].clone();
    let mut b = sim.read_file(&seg).unwrap();
    b[8..10].copy_from_slice(&9u16.to_le_bytes());
    let crc = crc32c_of(&b[..28]);
    b[28..32].copy_from_slice(&crc.to_le_bytes());
    sim.write_file(&seg, &b);
    assert!(matches!(
        expect_error(&sim, &seg),
        OpenError::UnsupportedVersion {
            version: 9,
            supported: 1,
            ..
        }
    ));
}

/// CRC-32C (Castagnoli), bitwise, to forge a header without depending on the crate internals.
fn crc32c_of(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn unparseable_names() {
    for name in [
        "abc.seg",
        "12.idx",
        "0000000000000000000x.tix",
        "99999999999999999999.seg",
    ] {
        let sim = healthy();
        sim.write_file(&p(name), b"whatever");
        assert!(
            matches!(
                expect_error(&sim, &p(name)),
                OpenError::UnparseableName { .. }
            ),
            "{name}"
        );
    }
}

#[test]
fn truncated_header_in_a_sealed_segment() {
    let sim = healthy();
    let seg = sim_segments(&sim)[1].clone();
    let b = sim.read_file(&seg).unwrap();
    sim.write_file(&seg, &b[..10]);
    assert!(matches!(
        expect_error(&sim, &seg),
        OpenError::BadHeader { .. }
    ));
    let sim = healthy();
    sim.write_file(&seg, b"");
    assert!(matches!(
        expect_error(&sim, &seg),
        OpenError::BadHeader { .. }
    ));
}

#[test]
fn directory_with_a_segment_name() {
    let sim = healthy();
    let d = p("00000000000000099999.seg");
    sim.create_dir(&d);
    assert!(matches!(
        expect_error(&sim, &d),
        OpenError::BadHeader { .. }
    ));
}

#[test]
fn missing_middle_segment_is_a_gap() {
    let sim = healthy();
    let seg = sim_segments(&sim)[1].clone();
    sim.delete_file(&seg);
    let next = sim_segments(&sim)[1].clone();
    assert!(matches!(expect_error(&sim, &next), OpenError::Gap { .. }));
}

#[test]
fn renamed_segment_base_mismatch() {
    let sim = healthy();
    let seg = sim_segments(&sim)[0].clone();
    let b = sim.read_file(&seg).unwrap();
    sim.delete_file(&seg);
    let renamed = p("00000000000000000001.seg");
    sim.write_file(&renamed, &b);
    assert!(matches!(
        expect_error(&sim, &renamed),
        OpenError::BadHeader { .. }
    ));
}

#[test]
fn unknown_files_are_ignored_and_leftovers_removed() {
    let sim = healthy();
    sim.write_file(&p("README.txt"), b"notes");
    sim.write_file(&p(".lock"), b"");
    sim.write_file(&p("00000000000000000000.idx.tmp"), b"partial");
    sim.write_file(&p("00000000000000999999.idx"), b"orphan");
    let (log, report) = sim_open(&sim, config()).unwrap();
    assert_eq!(report.ignored_files, vec![p(".lock"), p("README.txt")]);
    assert!(
        report
            .removed_files
            .contains(&p("00000000000000000000.idx.tmp"))
    );
    assert!(
        report
            .removed_files
            .contains(&p("00000000000000999999.idx"))
    );
    assert!(sim.read_file(&p("README.txt")).is_some());
    assert_eq!(log.end_offset(), 20);
    let shown = report.to_string();
    assert!(
        shown.contains("README.txt") && shown.contains("removed leftover"),
        "{shown}"
    );
}

#[test]
fn interrupted_roll_is_removed() {
    let sim = healthy();
    let end = sim_open(&sim, config()).unwrap().0.end_offset();
    let name = format!("{end:020}.seg");
    let header_prefix = {
        // The first 12 bytes of the header the next segment would get.
        let mut h = Vec::from(*b"TDNGSEG\0");
        h.extend_from_slice(&1u16.to_le_bytes());
        h.extend_from_slice(&[0, 0]);
        h
    };
    for content in [Vec::new(), header_prefix, vec![0u8; 700]] {
        let s = sim.fork();
        s.write_file(&p(&name), &content);
        let (log, report) = sim_open(&s, config()).unwrap();
        assert_eq!(report.removed_incomplete_segment, Some(p(&name)));
        assert_eq!(log.end_offset(), end);
        assert!(s.read_file(&p(&name)).is_none());
    }
}
