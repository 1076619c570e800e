//! Sparse offset index and time index of one segment (see the [index layout](crate#index-files)).
//!
//! Both live in memory for every segment. The files are a cache written when a segment is sealed:
//! on open they are used only if they pass every check (magic, version, CRC-32C, base offset,
//! covered segment length equal to the segment's actual length, entries ordered and in range);
//! otherwise the segment is scanned and the files rewritten. The active segment's indexes are
//! always rebuilt by the recovery scan.
//!
//! # Time index semantics
//!
//! An entry `(m, o)` means "the largest timestamp among the segment's records up to and
//! including offset `o` is `m`". Entries are added at offset-index points, only when `m` grew, so
//! `m` is strictly increasing even when record timestamps are not. The first record *at or after*
//! time `t` is the first record, in offset order, whose own timestamp is `>= t` — the point where
//! the running maximum first reaches `t` — so every record before the last entry with `m < t` can
//! be skipped.

use crate::record::u64_at;
use crate::segment::{FileKind, HEADER_LEN};

const OFFSET_MAGIC: [u8; 8] = *b"TDNGIDX\0";
const TIME_MAGIC: [u8; 8] = *b"TDNGTIX\0";
const INDEX_VERSION: u16 = 1;
const INDEX_HEADER: usize = 48;
const ENTRY: usize = 16;

/// The in-memory indexes of one segment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SegmentIndex {
    /// `(offset, byte position)`, strictly increasing in both.
    pub(crate) offsets: Vec<(u64, u64)>,
    /// `(running max timestamp, offset)`, strictly increasing in both.
    pub(crate) times: Vec<(u64, u64)>,
}

impl SegmentIndex {
    /// The last indexed record at or before `offset`, or the first record of the segment.
    pub(crate) fn floor(&self, base: u64, offset: u64) -> (u64, u64) {
        let i = self.offsets.partition_point(|&(o, _)| o <= offset);
        if i == 0 {
            (base, HEADER_LEN)
        } else {
            self.offsets[i - 1]
        }
    }

    /// The first offset that can hold a record with timestamp `>= t`.
    pub(crate) fn time_floor(&self, base: u64, t: u64) -> u64 {
        let i = self.times.partition_point(|&(m, _)| m < t);
        if i == 0 {
            base
        } else {
            self.times[i - 1].1 + 1
        }
    }
}

/// Builds index entries as records go by, identically for the writer and for a recovery scan.
#[derive(Debug, Clone)]
pub(crate) struct IndexBuilder {
    interval: u64,
    bytes_since: u64,
    running_max: Option<u64>,
    last_time_entry: Option<u64>,
}

impl IndexBuilder {
    pub(crate) fn new(interval: u32) -> Self {
        Self {
            interval: u64::from(interval),
            bytes_since: 0,
            running_max: None,
            last_time_entry: None,
        }
    }

    /// Returns the entries to add before the record `(offset, position, len, timestamp)`.
    pub(crate) fn on_record(
        &mut self,
        offset: u64,
        pos: u64,
        len: u64,
        ts: u64,
    ) -> Option<IndexPoint> {
        let mut point = None;
        if self.bytes_since >= self.interval && pos > HEADER_LEN {
            let time = match self.running_max {
                Some(m) if self.last_time_entry.is_none_or(|l| m > l) => {
                    self.last_time_entry = Some(m);
                    Some((m, offset - 1))
                }
                _ => None,
            };
            point = Some(IndexPoint {
                offset: (offset, pos),
                time,
            });
            self.bytes_since = 0;
        }
        self.bytes_since += len;
        self.running_max = Some(self.running_max.map_or(ts, |m| m.max(ts)));
        point
    }
}

/// Entries produced by [`IndexBuilder::on_record`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct IndexPoint {
    pub(crate) offset: (u64, u64),
    pub(crate) time: Option<(u64, u64)>,
}

impl IndexPoint {
    pub(crate) fn apply(self, index: &mut SegmentIndex) {
        index.offsets.push(self.offset);
        if let Some(t) = self.time {
            index.times.push(t);
        }
    }
}

/// What the index files say about their (sealed) segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SealedInfo {
    pub(crate) covered_len: u64,
    pub(crate) end: u64,
    pub(crate) max_ts: u64,
}

fn encode(magic: [u8; 8], base: u64, info: &SealedInfo, entries: &[(u64, u64)]) -> Vec<u8> {
    let mut b = Vec::with_capacity(INDEX_HEADER + entries.len() * ENTRY + 4);
    b.extend_from_slice(&magic);
    b.extend_from_slice(&INDEX_VERSION.to_le_bytes());
    b.extend_from_slice(&[0, 0]);
    b.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for v in [base, info.covered_len, info.end, info.max_ts] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    for &(x, y) in entries {
        b.extend_from_slice(&x.to_le_bytes());
        b.extend_from_slice(&y.to_le_bytes());
    }
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// Encodes the offset index file and the time index file of a sealed segment.
pub(crate) fn encode_files(
    base: u64,
    info: &SealedInfo,
    index: &SegmentIndex,
) -> (Vec<u8>, Vec<u8>) {
    (
        encode(OFFSET_MAGIC, base, info, &index.offsets),
        encode(TIME_MAGIC, base, info, &index.times),
    )
}

type Entries = Vec<(u64, u64)>;

fn decode(magic: [u8; 8], bytes: &[u8], base: u64) -> Result<(SealedInfo, Entries), &'static str> {
    if bytes.len() < INDEX_HEADER + 4 {
        return Err("index file too short");
    }
    if bytes[..8] != magic {
        return Err("bad index magic");
    }
    if u16::from_le_bytes([bytes[8], bytes[9]]) != INDEX_VERSION {
        return Err("unsupported index version");
    }
    let body = &bytes[..bytes.len() - 4];
    if crc32c::crc32c(body) != crate::record::u32_at(bytes, bytes.len() - 4) {
        return Err("index checksum mismatch");
    }
    let count = crate::record::u32_at(bytes, 12) as usize;
    if INDEX_HEADER + count * ENTRY != body.len() {
        return Err("index entry count does not match its length");
    }
    if u64_at(bytes, 16) != base {
        return Err("index base offset does not match its segment");
    }
    let info = SealedInfo {
        covered_len: u64_at(bytes, 24),
        end: u64_at(bytes, 32),
        max_ts: u64_at(bytes, 40),
    };
    let entries = (0..count)
        .map(|i| {
            let at = INDEX_HEADER + i * ENTRY;
            (u64_at(bytes, at), u64_at(bytes, at + 8))
        })
        .collect();
    Ok((info, entries))
}

fn strictly_increasing(v: impl Iterator<Item = u64>) -> bool {
    let mut prev = None;
    v.into_iter().all(|x| {
        let ok = prev.is_none_or(|p| x > p);
        prev = Some(x);
        ok
    })
}

/// Largest index file that can belong to a segment of `segment_len` bytes (at most one entry
/// per record): anything longer is not read at all, so a huge foreign or damaged index file
/// costs no memory. Recovery then rebuilds it from the segment.
pub(crate) fn max_file_len(segment_len: u64) -> u64 {
    let records = segment_len.saturating_sub(HEADER_LEN) / crate::record::MIN_FRAME as u64 + 1;
    (INDEX_HEADER as u64 + 4).saturating_add(records.saturating_mul(ENTRY as u64))
}

/// Which index file failed a check, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IndexFault {
    /// The file at fault ([`FileKind::OffsetIndex`] or [`FileKind::TimeIndex`]).
    pub(crate) file: FileKind,
    /// What check failed.
    pub(crate) reason: &'static str,
}

/// Decodes and checks both index files of a sealed segment against its actual length. Each file
/// is checked on its own first, so a fault names the file that has it; when both are valid on
/// their own but disagree, the time index is blamed (the offset index is the one checked first).
pub(crate) fn decode_files(
    base: u64,
    segment_len: u64,
    offset_file: &[u8],
    time_file: &[u8],
) -> Result<(SealedInfo, SegmentIndex), IndexFault> {
    let fault = |file| move |reason| IndexFault { file, reason };
    let (info, offsets) = decode(OFFSET_MAGIC, offset_file, base)
        .and_then(|(info, offsets)| check_info(base, segment_len, info).map(|i| (i, offsets)))
        .map_err(fault(FileKind::OffsetIndex))?;
    let (tinfo, times) = decode(TIME_MAGIC, time_file, base)
        .and_then(|(info, times)| check_info(base, segment_len, info).map(|i| (i, times)))
        .map_err(fault(FileKind::TimeIndex))?;
    let offsets_ok = strictly_increasing(offsets.iter().map(|e| e.0))
        && strictly_increasing(offsets.iter().map(|e| e.1))
        && offsets
            .iter()
            .all(|&(o, p)| o > base && o < info.end && p > HEADER_LEN && p < segment_len);
    if !offsets_ok {
        return Err(fault(FileKind::OffsetIndex)(
            "index entries out of order or out of range",
        ));
    }
    if info != tinfo {
        return Err(fault(FileKind::TimeIndex)(
            "time index disagrees with the offset index",
        ));
    }
    let times_ok = strictly_increasing(times.iter().map(|e| e.0))
        && strictly_increasing(times.iter().map(|e| e.1))
        && times
            .iter()
            .all(|&(m, o)| m <= info.max_ts && o >= base && o < info.end);
    if !times_ok {
        return Err(fault(FileKind::TimeIndex)(
            "index entries out of order or out of range",
        ));
    }
    Ok((info, SegmentIndex { offsets, times }))
}

/// Checks one index file's header fields against the segment it covers.
fn check_info(base: u64, segment_len: u64, info: SealedInfo) -> Result<SealedInfo, &'static str> {
    if info.covered_len != segment_len {
        return Err("index is stale (segment length differs)");
    }
    if info.end < base || (info.end == base) != (segment_len == HEADER_LEN) {
        return Err("index end offset is inconsistent");
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_and_lookups() {
        let mut b = IndexBuilder::new(100);
        let mut idx = SegmentIndex::default();
        let mut pos = HEADER_LEN;
        // Timestamps non-monotonic: 10, 5, 30, 20, 40, ...
        let ts = [10, 5, 30, 20, 40, 35, 50, 45, 60, 55];
        for (i, &t) in ts.iter().enumerate() {
            if let Some(p) = b.on_record(i as u64, pos, 60, t) {
                p.apply(&mut idx);
            }
            pos += 60;
        }
        assert_eq!(idx.floor(0, 0), (0, HEADER_LEN));
        let (o, p) = idx.floor(0, 5);
        assert!(o <= 5 && p == HEADER_LEN + 60 * o);
        assert!(!idx.times.is_empty());
        // The lookup never skips the first record whose timestamp is >= t.
        for t in 0..70 {
            let first = ts.iter().position(|&x| x >= t).unwrap_or(ts.len()) as u64;
            assert!(idx.time_floor(0, t) <= first, "t={t}");
        }
        let info = SealedInfo {
            covered_len: pos,
            end: 10,
            max_ts: 60,
        };
        let (fo, ft) = encode_files(0, &info, &idx);
        assert_eq!(
            decode_files(0, pos, &fo, &ft),
            Ok((info.clone(), idx.clone()))
        );
        assert!(decode_files(0, pos + 1, &fo, &ft).is_err());
        assert!(decode_files(1, pos, &fo, &ft).is_err());
        for i in 0..fo.len() * 8 {
            let mut bad = fo.clone();
            bad[i / 8] ^= 1 << (i % 8);
            assert!(decode_files(0, pos, &bad, &ft).is_err(), "flip {i}");
        }
    }
}
