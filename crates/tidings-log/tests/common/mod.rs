//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use tidings_log::testing::SimStorage;
use tidings_log::{Log, LogConfig, OpenError, Record, RecoveryReport, StoredRecord};

/// The directory used on `SimStorage`.
pub const DIR: &str = "/stream";

/// Payload derived from the offset, of varying length, so any record can be checked.
pub fn payload_for(offset: u64) -> Vec<u8> {
    let len = (offset.wrapping_mul(7919) % 97) as usize + 1;
    (0..len)
        .map(|i| (offset as u8).wrapping_mul(31).wrapping_add(i as u8))
        .collect()
}

/// Slightly non-monotonic timestamps.
pub fn ts_for(offset: u64) -> u64 {
    1_000 + offset * 10 - (offset % 3) * 7
}

/// The record that must sit at `offset`.
pub fn record_for(offset: u64) -> Record {
    let mut r =
        Record::new(ts_for(offset), payload_for(offset)).with_header("n", offset.to_string());
    if offset.is_multiple_of(2) {
        r = r.with_key(offset.to_le_bytes().to_vec());
    }
    r
}

/// Asserts the record is exactly the one written at its offset.
pub fn assert_intact(r: &StoredRecord) {
    assert_eq!(
        r.to_record(),
        record_for(r.offset),
        "record at offset {} differs",
        r.offset
    );
}

/// Appends `record_for(next)` `n` times.
pub fn fill(log: &Log, n: u64) {
    for _ in 0..n {
        let off = log.next_offset();
        assert_eq!(log.append(&record_for(off)).unwrap(), off);
    }
}

/// Every retained record, checked to be contiguous from the start offset.
pub fn read_all(log: &Log) -> Vec<StoredRecord> {
    let mut out = Vec::new();
    let mut next = log.start_offset();
    loop {
        let batch = log.read(next, 1000).unwrap();
        if batch.is_empty() {
            break;
        }
        for r in &batch {
            assert_eq!(r.offset, next, "offsets must be contiguous");
            next += 1;
        }
        out.extend(batch);
    }
    assert_eq!(next, log.end_offset());
    out
}

/// [`read_all`] through the lending reader (`Log::reader`), each record copied out.
pub fn lend_all(log: &Log) -> Vec<StoredRecord> {
    let mut out = Vec::new();
    let mut next = log.start_offset();
    let mut reader = log.reader(next);
    while let Some(r) = reader.next().unwrap() {
        assert_eq!(r.offset, next, "offsets must be contiguous");
        out.push(r.to_stored());
        next += 1;
    }
    assert_eq!((next, reader.position()), (log.end_offset(), next));
    out
}

pub fn sim_open(sim: &SimStorage, cfg: LogConfig) -> Result<(Log, RecoveryReport), OpenError> {
    Log::open_with_storage(Arc::new(sim.clone()), Path::new(DIR), cfg)
}

pub fn small_config() -> LogConfig {
    LogConfig::new()
        .segment_bytes(512)
        .index_interval_bytes(100)
}

/// Byte positions where records start in a segment file (header is 32 bytes), plus the end.
pub fn frame_bounds(bytes: &[u8]) -> Vec<u64> {
    let mut out = Vec::new();
    let mut pos = 32usize;
    while pos + 8 <= bytes.len() {
        out.push(pos as u64);
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        pos += 8 + len;
    }
    out.push(pos as u64);
    out
}

/// Segment paths of a `SimStorage` directory, oldest first.
pub fn sim_segments(sim: &SimStorage) -> Vec<std::path::PathBuf> {
    sim.snapshot()
        .into_keys()
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect()
}
