//! R-LIM-2: every parser a file can reach — record frames (in memory and streamed), segment
//! headers, the interrupted-roll check, index and time-index files, file names, the scan and its
//! resync search — given arbitrary or mutated bytes returns a typed result, never panics.
//! `TIDINGS_LONG=1` runs many more cases.

use std::path::Path;

use proptest::prelude::*;

use crate::index::{self, SealedInfo, SegmentIndex};
use crate::record::{Frame, Record, check_frame, decode, encode_into};
use crate::scan::{check_streaming, is_interrupted_roll_file, resync, scan};
use crate::segment::{HEADER_LEN, check_header, classify, header_bytes, is_interrupted_roll};
use crate::storage::sim::SimStorage;
use crate::storage::{OpenMode, Storage, StorageFile};

fn cases() -> u32 {
    if std::env::var_os("TIDINGS_LONG").is_some_and(|v| v == "1") {
        20_000
    } else {
        256
    }
}

/// `bytes` as a file on a fresh `SimStorage`.
fn as_file(bytes: &[u8]) -> Box<dyn StorageFile> {
    let sim = SimStorage::new();
    let p = Path::new("/f");
    sim.write_file(p, bytes);
    sim.open(p, OpenMode::Read).unwrap()
}

/// Mostly well-formed frames, then mutated: bytes flipped, inserted, cut, the CRC recomputed or
/// not, so that both the checksum and the structure checks are reached.
fn frame_bytes() -> impl Strategy<Value = Vec<u8>> {
    let record = (
        any::<u64>(),
        proptest::option::of(prop::collection::vec(any::<u8>(), 0..20)),
        prop::collection::vec(
            ("[a-z]{0,4}", prop::collection::vec(any::<u8>(), 0..8)),
            0..4,
        ),
        prop::collection::vec(any::<u8>(), 0..64),
    );
    let edits = prop::collection::vec((any::<usize>(), any::<u8>(), 0u8..4), 0..4);
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..200),
        (
            prop_oneof![0u64..6, any::<u64>()],
            record,
            edits,
            any::<bool>()
        )
            .prop_map(|(offset, (ts, key, headers, payload), edits, fix_crc)| {
                let mut r = Record::new(ts, payload);
                r.key = key.map(Into::into);
                r.headers = headers.into_iter().map(|(n, v)| (n, v.into())).collect();
                let mut b = Vec::new();
                encode_into(&mut b, offset, &r);
                for (at, v, kind) in edits {
                    let at = at % (b.len() + 1);
                    match kind {
                        0 if at < b.len() => b[at] ^= v | 1,
                        1 => b.insert(at, v),
                        2 => b.truncate(at),
                        _ if at < b.len() => b[at] = v,
                        _ => {}
                    }
                }
                if fix_crc && b.len() >= 8 {
                    let body_len = (b.len() - 8) as u32;
                    b[..4].copy_from_slice(&body_len.to_le_bytes());
                    let crc = crc32c::crc32c_append(crc32c::crc32c(&b[..4]), &b[8..]);
                    b[4..8].copy_from_slice(&crc.to_le_bytes());
                }
                b
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    /// Record decoder: check, decode and the streamed check agree and never panic.
    #[test]
    fn frames(bytes in frame_bytes()) {
        let frame = check_frame(&bytes);
        if let Frame::Good { len, offset, timestamp_ms } = frame {
            let rec = decode(&bytes::Bytes::copy_from_slice(&bytes[..len]));
            prop_assert!(rec.is_ok(), "{:?}", rec);
            let rec = rec.unwrap();
            prop_assert_eq!((rec.offset, rec.timestamp_ms), (offset, timestamp_ms));
        }
        let _ = decode(&bytes::Bytes::copy_from_slice(&bytes));
        // The streamed check (records larger than the scan window) says exactly the same.
        if bytes.len() >= 8 {
            let body_len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
            if (crate::record::MIN_BODY..=bytes.len() - 8).contains(&body_len) {
                let len = 8 + body_len;
                let streamed = check_streaming(&*as_file(&bytes), 0, len).unwrap();
                prop_assert_eq!(streamed, check_frame(&bytes[..len]));
            }
        }
    }

    /// Segment header and interrupted-roll check (in memory and streamed).
    #[test]
    fn segment_headers(
        mut bytes in prop::collection::vec(any::<u8>(), 0..80),
        base in any::<u64>(),
        from_valid in any::<bool>(),
        flip in any::<usize>(),
    ) {
        if from_valid {
            let h = header_bytes(base);
            for (i, b) in h.iter().enumerate() {
                if i < bytes.len() { bytes[i] = *b; }
            }
            if !bytes.is_empty() { let n = bytes.len(); bytes[flip % n] ^= 1; }
        }
        let _ = check_header(&bytes, base);
        let mem = is_interrupted_roll(&bytes, base);
        let streamed = is_interrupted_roll_file(&*as_file(&bytes), bytes.len() as u64, base).unwrap();
        if bytes.len() >= HEADER_LEN as usize || !mem {
            prop_assert_eq!(streamed, mem);
        }
    }

    /// Index and time-index files: arbitrary bytes, or valid files mutated.
    #[test]
    fn index_files(
        a in prop::collection::vec(any::<u8>(), 0..200),
        b in prop::collection::vec(any::<u8>(), 0..200),
        entries in prop::collection::vec((any::<u64>(), any::<u64>()), 0..6),
        base in 0u64..1000,
        seg_len in 0u64..100_000,
        mutate in proptest::option::of((any::<usize>(), any::<u8>(), any::<bool>())),
    ) {
        let _ = index::decode_files(base, seg_len, &a, &b);
        let info = SealedInfo { covered_len: seg_len, end: base + entries.len() as u64, max_ts: 99 };
        let idx = SegmentIndex { offsets: entries.clone(), times: entries };
        let (mut fo, mut ft) = index::encode_files(base, &info, &idx);
        if let Some((at, v, which)) = mutate {
            let f = if which { &mut fo } else { &mut ft };
            let n = f.len();
            f[at % n] ^= v;
            f.truncate(at % (n + 1) + n / 2);
        }
        let _ = index::decode_files(base, seg_len, &fo, &ft);
        let _ = index::decode_files(base, seg_len, &ft, &fo);
    }

    /// File names.
    #[test]
    fn names(name in any::<String>(), digits in "[0-9]{18,22}\\.(seg|idx|tix|tmp)") {
        let _ = classify(&name);
        let _ = classify(&digits);
    }

    /// Scan and resync over a segment: valid records, then arbitrary or mutated bytes.
    #[test]
    fn segment_scan(
        good in 0u64..4,
        tail in prop::collection::vec(frame_bytes(), 0..4),
        junk in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut bytes = header_bytes(0).to_vec();
        for o in 0..good {
            encode_into(&mut bytes, o, &Record::new(o, vec![o as u8; 10]));
        }
        for t in tail {
            bytes.extend_from_slice(&t);
        }
        bytes.extend_from_slice(&junk);
        let file = as_file(&bytes);
        let len = bytes.len() as u64;
        let sc = scan(&*file, len, HEADER_LEN, 0, 100, &mut |_| true).unwrap();
        prop_assert!(sc.end >= good && sc.valid_len <= len);
        for at in [HEADER_LEN, sc.valid_len, len.saturating_sub(1)] {
            if at < len {
                let _ = resync(&*file, len, at, sc.end).unwrap();
            }
        }
    }
}

/// A valid frame of the next offset starting inside the damaged record's own 8-byte prefix: not
/// evidence (it cannot end that record), and no arithmetic underflow. R-LIM-2
#[test]
fn candidate_inside_the_damaged_prefix() {
    let mut bytes = header_bytes(0).to_vec();
    encode_into(&mut bytes, 0, &Record::new(1, vec![1; 10]));
    let p = bytes.len();
    bytes.extend_from_slice(&500u32.to_le_bytes()); // a claimed length, in range
    encode_into(&mut bytes, 2, &Record::new(2, vec![2; 10])); // offset expected + 1, at p + 4
    let len = bytes.len() as u64;
    let file = as_file(&bytes);
    let sc = scan(&*file, len, HEADER_LEN, 0, 100, &mut |_| true).unwrap();
    let d = sc.damage.expect("damage at p");
    assert_eq!((sc.end, d.pos), (1, p as u64));
    assert_eq!(d.resync, None); // R-LOG-2: inside the claimed extent, no evidence: torn tail
}
