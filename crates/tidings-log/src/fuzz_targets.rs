//! R-SEC-2 fuzz targets for the bytes of a log directory: record frames, index files, and a
//! whole directory opened through [`Log::open`]. The engine is `tidings-fuzz` (README,
//! "Fuzzing"); each `fuzz_<target>` test runs for `TIDINGS_FUZZ_SECS` seconds over the kept
//! corpus `fuzz/corpus/<target>/` and its mutations, and fails on a panic, a hang or an
//! allocation beyond the stated bound. (`fuzz.rs` beside this one holds the older
//! generator-based checks of the same parsers, R-LIM-2.)

use std::path::Path;

use bytes::Bytes;
use tidings_fuzz::fields::{int, join};
use tidings_fuzz::{Fields, Outcome, Target};

use crate::index::{self, SealedInfo, SegmentIndex};
use crate::record::{Frame, Record, check_frame, decode, encode_into};
use crate::scan::check_streaming;
use crate::segment::{FileKind, file_name};
use crate::storage::sim::SimStorage;
use crate::storage::{OpenMode, Storage};
use crate::{Fsync, Log, LogConfig, OpenError};

/// Measures allocations of the fuzz worker thread (test builds only; see `tidings-fuzz`).
#[global_allocator]
static FUZZ_ALLOC: tidings_fuzz::TrackingAlloc = tidings_fuzz::TrackingAlloc;

const CARGO: &str = "-p tidings-log --lib";

/// The first word of a value's `Debug`: an error's variant, without its paths and numbers
/// (which would make every input's outcome new).
fn kind(debug: &impl std::fmt::Debug) -> String {
    let s = format!("{debug:?}");
    s.split(|c: char| !c.is_alphanumeric() && c != '_')
        .next()
        .unwrap_or("")
        .to_owned()
}

fn sample_records() -> Vec<Record> {
    vec![
        Record::new(1, &b""[..]),
        Record::new(1_700_000_000_000, &b"payload"[..]).with_key(&b"k"[..]),
        Record::new(u64::MAX, vec![0xff; 40])
            .with_header("tidings-msg", &b"\x01\x00\x01"[..])
            .with_header("", &b""[..])
            .with_header("h\u{e9}", vec![0; 3]),
    ]
}

fn frame_of(offset: u64, r: &Record) -> Vec<u8> {
    let mut b = Vec::new();
    encode_into(&mut b, offset, r);
    b
}

/// A record frame. The first byte is a mode: odd means "fix the length prefix and the
/// checksum after mutation", so the body's structure checks are reached and not only the
/// checksum; even leaves the bytes as they are.
#[test]
fn fuzz_log_frame() {
    // R-SEC-2
    let seeds: Vec<Vec<u8>> = sample_records()
        .iter()
        .enumerate()
        .flat_map(|(i, r)| {
            let f = frame_of(i as u64 * 1000, r);
            [[&[1u8][..], &f].concat(), [&[0u8][..], &f].concat()]
        })
        .collect();
    Target::new("log_frame", CARGO)
        .seeds(seeds)
        .dictionary([&b"tidings-msg"[..], &[0xff, 0xff, 0xff, 0x7f], &[0; 4]])
        // A frame is decoded in place: the record's parts are slices of the frame. What
        // may be allocated is the header list and names (bounded by the frame) and the
        // re-encoding for the round trip.
        .alloc_bound(|len| 4096 + 8 * len)
        .run(|data| {
            let (mode, frame) = data.split_first().unwrap_or((&0, &[]));
            let mut frame = frame.to_vec();
            if mode & 1 == 1 && frame.len() >= 8 {
                let body_len = (frame.len() - 8) as u32;
                frame[..4].copy_from_slice(&body_len.to_le_bytes());
                let crc = crc32c::crc32c_append(crc32c::crc32c(&frame[..4]), &frame[8..]);
                frame[4..8].copy_from_slice(&crc.to_le_bytes());
            }
            let checked = check_frame(&frame);
            // The streamed check (records larger than the scan window) says the same.
            if let Frame::Good { len, .. } | Frame::Incomplete { need: len } = checked
                && len <= frame.len()
                && len >= 8
            {
                let sim = SimStorage::new();
                sim.write_file(Path::new("/f"), &frame);
                let file = sim.open(Path::new("/f"), OpenMode::Read).expect("sim file");
                let streamed = check_streaming(&*file, 0, len).expect("sim read");
                assert_eq!(
                    streamed,
                    check_frame(&frame[..len]),
                    "streamed check differs"
                );
            }
            match checked {
                Frame::Good {
                    len,
                    offset,
                    timestamp_ms,
                } => {
                    let rec = decode(&Bytes::copy_from_slice(&frame[..len]))
                        .expect("a frame check_frame accepts decodes");
                    assert_eq!((rec.offset, rec.timestamp_ms), (offset, timestamp_ms));
                    // Round trip: the format is canonical.
                    assert_eq!(
                        frame_of(offset, &rec.to_record()),
                        &frame[..len],
                        "re-encoding a decoded frame changes it"
                    );
                    Outcome::of(("good", rec.key.is_some(), rec.headers.len().min(3)))
                }
                Frame::Incomplete { .. } => Outcome::of("incomplete"),
                Frame::Bad(why) => Outcome::of(why),
            }
        });
}

/// The two index files of a sealed segment: fields `[base, segment length, offset index,
/// time index]`.
#[test]
fn fuzz_log_index() {
    // R-SEC-2
    let seeds = [0usize, 1, 5].map(|n| {
        let base = 100u64;
        let offsets: Vec<(u64, u64)> = (0..n as u64).map(|i| (base + i * 3, 64 + i * 90)).collect();
        let times: Vec<(u64, u64)> = (0..n as u64).map(|i| (1000 + i, base + i * 3)).collect();
        let info = SealedInfo {
            covered_len: 64 + n as u64 * 90,
            end: base + n as u64 * 3 + 1,
            max_ts: 1000 + n as u64,
        };
        let (fo, ft) = index::encode_files(base, &info, &SegmentIndex { offsets, times });
        join([
            &base.to_le_bytes()[..],
            &info.covered_len.to_le_bytes(),
            &fo,
            &ft,
        ])
    });
    Target::new("log_index", CARGO)
        .seeds(seeds)
        // Entries are read only from files no longer than `max_file_len(segment)`.
        .alloc_bound(|len| 4096 + 8 * len)
        .run(|data| {
            let mut f = Fields::new(data);
            let base = int(f.next_or_empty());
            let seg_len = int(f.next_or_empty());
            let (fo, ft) = (f.next_or_empty(), f.next_or_empty());
            match index::decode_files(base, seg_len, fo, ft) {
                Ok((info, idx)) => {
                    // Round trip: what decodes, re-encoded, decodes to the same.
                    let (fo2, ft2) = index::encode_files(base, &info, &idx);
                    let again = index::decode_files(base, seg_len, &fo2, &ft2)
                        .expect("re-encoded index files decode");
                    assert_eq!(again.0, info);
                    assert_eq!(again.1.offsets, idx.offsets);
                    assert_eq!(again.1.times, idx.times);
                    Outcome::of(("ok", idx.offsets.len().min(3)))
                }
                Err(fault) => Outcome::of((format!("{:?}", fault.file), fault.reason)),
            }
        });
}

/// The file names a directory input can create: a log file of one of the three kinds at a
/// base offset, an unpublished segment, a leftover temporary file or a foreign file. Never
/// a path: nothing is written outside the test's directory.
fn dir_entry_name(field: &[u8]) -> String {
    let (k, rest) = field.split_first().unwrap_or((&0, &[]));
    let base = int(rest) % 100_000;
    match k % 6 {
        0 => file_name(base, FileKind::Segment),
        1 => file_name(base, FileKind::OffsetIndex),
        2 => file_name(base, FileKind::TimeIndex),
        3 => format!("{}.tmp", file_name(base, FileKind::Segment)),
        4 => format!("{base}.tmp"),
        _ => "notes.txt".to_owned(),
    }
}

fn name_field(name: &str) -> Vec<u8> {
    let (stem, ext) = name.split_once('.').expect("a log file name");
    let k: u8 = match ext {
        "seg" => 0,
        "idx" => 1,
        "tix" => 2,
        _ => 5,
    };
    let base: u64 = stem.parse().unwrap_or(0);
    [&[k][..], &base.to_le_bytes()].concat()
}

fn small_config() -> LogConfig {
    LogConfig {
        segment_bytes: 400,
        fsync: Fsync::Never,
        index_interval_bytes: 64,
        ..LogConfig::default()
    }
}

/// Real logs, closed, as directory inputs: `[name, content, name, content, …]`.
fn dir_seeds() -> Vec<Vec<u8>> {
    let mut seeds = vec![Vec::new()];
    for n in [1usize, 4, 12] {
        let tmp = tempfile::tempdir().expect("temp dir");
        let (log, _) = Log::open(tmp.path(), small_config()).expect("open");
        for i in 0..n {
            let r = &sample_records()[i % 3];
            log.append(&Record {
                timestamp_ms: i as u64,
                ..r.clone()
            })
            .expect("append");
        }
        log.close().expect("close");
        let mut files: Vec<_> = std::fs::read_dir(tmp.path())
            .expect("list")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".seg") || n.ends_with(".idx") || n.ends_with(".tix"))
            .collect();
        files.sort();
        let mut parts = Vec::new();
        for name in files {
            parts.push(name_field(&name));
            parts.push(std::fs::read(tmp.path().join(&name)).expect("read"));
        }
        seeds.push(join(parts));
    }
    seeds
}

/// A whole stream directory, written into a temporary directory and opened with
/// [`Log::open`] (recovery, index checks, the scan of the last segment), then read end to
/// end: fields `[name, content, name, content, …]` (names from [`dir_entry_name`]).
#[test]
fn fuzz_log_dir() {
    // R-SEC-2, R-LIM-2
    let scratch = tidings_fuzz::scratch_dir("log_dir");
    let dir = scratch.join("stream");
    let report = Target::new("log_dir", CARGO)
        .seeds(dir_seeds())
        .max_len(16 << 10)
        // Opening holds fixed-size buffers (the scan's 256 KiB window, the 256 KiB write
        // buffer, read chunks), whatever a length field claims; the rest is bounded by the
        // files' actual sizes.
        .alloc_bound(|len| (2 << 20) + 16 * len)
        .run(move |data| {
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("create the directory");
            let mut f = Fields::new(data);
            while let Some(name) = f.next() {
                let content = f.next_or_empty();
                std::fs::write(dir.join(dir_entry_name(name)), content).expect("write a file");
            }
            let (log, report) = match Log::open(&dir, small_config()) {
                Ok(opened) => opened,
                Err(e) => {
                    let reason = match &e {
                        OpenError::Corrupt { reason, .. } | OpenError::BadHeader { reason, .. } => {
                            reason
                        }
                        _ => "",
                    };
                    return Outcome::of(("open", kind(&e), reason));
                }
            };
            // What recovery did, in buckets: which repairs ran, not how many bytes.
            let recovered = (
                report.segments.min(4),
                report.created,
                report.truncated.is_some(),
                report.removed_incomplete_segment.is_some(),
                report.rebuilt_indexes.len().min(2),
                report.adopted_segments.len().min(2),
                report.removed_files.len().min(2),
                report.ignored_files.is_empty(),
            );
            let (start, end) = (log.start_offset(), log.end_offset());
            assert!(start <= end, "start {start} after end {end}");
            let mut at = start;
            let mut read_failed = false;
            let mut outcome = Outcome::of(("read all", (end - start).min(4), recovered));
            while at < end {
                match log.read(at, 64) {
                    Ok(records) if records.is_empty() => break,
                    Ok(records) => {
                        for r in &records {
                            assert_eq!(r.offset, at, "records out of order");
                            at += 1;
                        }
                    }
                    Err(e) => {
                        outcome = Outcome::of(("read", kind(&e), recovered));
                        read_failed = true;
                        break;
                    }
                }
            }
            // The lending reader agrees with `read`: the same records, and a failure at the
            // same record with the same error.
            let mut reader = log.reader(start);
            let mut lent = start;
            loop {
                match reader.next() {
                    Ok(Some(r)) => {
                        assert_eq!(r.offset, lent, "lent records out of order");
                        lent += 1;
                    }
                    Ok(None) => {
                        assert!(!read_failed, "the reader read what read could not");
                        assert_eq!(lent, at, "the reader ended elsewhere than read");
                        break;
                    }
                    Err(e) => {
                        assert_eq!(lent, at, "the reader failed elsewhere than read");
                        let read_err = log.read(at, 1).map(|_| ()).unwrap_err();
                        assert_eq!(e.to_string(), read_err.to_string());
                        break;
                    }
                }
            }
            let _ = log.offset_for_time(0);
            let _ = log.offset_for_time(u64::MAX);
            let _ = log.close();
            outcome
        });
    let _ = std::fs::remove_dir_all(&scratch);
    assert!(report.execs > 0);
}
