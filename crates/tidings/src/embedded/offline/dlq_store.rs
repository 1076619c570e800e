//! Everything the offline tools know about a durable dead-letter log's representation, in
//! one place: which entries are present, how one decodes, what record redrives it, and how
//! entries are durably removed. All of it is `embedded::dlq_record` and `embedded::codec`: a
//! removal is a removal record appended to the dead-letter log itself.

use std::collections::BTreeMap;

use tidings_log::{Log, Record, StoredRecord, tools};

use crate::durable::StreamError;
use crate::embedded::codec;
use crate::embedded::dlq_record::{self, DlqRecord};
use crate::message::Message;

/// A dead-letter entry decoded for display.
#[derive(Debug)]
pub(crate) struct Decoded {
    /// The original message, without dead-letter metadata.
    pub(crate) message: Message,
    /// Why it was dead-lettered.
    pub(crate) reason: crate::dlq::DeadLetterReason,
    /// Handler attempts made.
    pub(crate) attempts: u32,
    /// The message's offset in its stream.
    pub(crate) stream_offset: Option<u64>,
}

/// Decode one entry record.
pub(crate) fn decode(r: &StoredRecord) -> Result<Decoded, &'static str> {
    match dlq_record::decode_any(r.clone())? {
        DlqRecord::Entry(message, meta) => Ok(Decoded {
            message: *message,
            reason: meta.reason,
            attempts: meta.attempts,
            stream_offset: Some(meta.offset),
        }),
        DlqRecord::Removed(_) => Err("a removal record, not an entry"),
    }
}

/// The stream record that redrives entry `r` of durable subscription `durable`: a copy
/// only that subscription delivers.
pub(crate) fn redrive_record(r: &StoredRecord, durable: &str) -> Record {
    match decode(r) {
        Ok(d) => codec::encode_for(&d.message, durable),
        // `present` only returns records that decoded as entries.
        Err(_) => r.to_record(),
    }
}

/// Replay records: entries minus removals, oldest first.
fn present(
    records: Vec<StoredRecord>,
    dir: &std::path::Path,
) -> Result<Vec<StoredRecord>, StreamError> {
    let mut entries = BTreeMap::new();
    for r in records {
        let at = r.offset;
        match dlq_record::decode_any(r.clone()).map_err(|reason| StreamError::Decode {
            dir: dir.to_path_buf(),
            offset: at,
            reason,
        })? {
            DlqRecord::Entry(..) => {
                entries.insert(at, r);
            }
            DlqRecord::Removed(gone) => {
                for g in gone {
                    entries.remove(&g);
                }
            }
        }
    }
    Ok(entries.into_values().collect())
}

/// The present (not removed) entries of the log in `dlq_dir`, oldest first, read-only and
/// without the lock. None when the log does not exist.
pub(crate) fn read_present(dlq_dir: &std::path::Path) -> Result<Vec<StoredRecord>, String> {
    if !dlq_dir.is_dir() {
        return Ok(Vec::new());
    }
    let all = tools::dump(dlq_dir, 0, usize::MAX).map_err(|e| e.to_string())?;
    present(all, dlq_dir).map_err(|e| e.to_string())
}

/// The present entries of an open (locked) dead-letter log, oldest first.
pub(crate) fn log_present(dlq: &Log) -> Result<Vec<StoredRecord>, StreamError> {
    let dir = dlq.dir();
    let mut all = Vec::new();
    let mut from = dlq.start_offset();
    loop {
        let recs = dlq
            .read(from, 1024)
            .map_err(|source| StreamError::read(dir.to_path_buf(), source))?;
        let Some(last) = recs.last() else { break };
        from = last.offset + 1;
        all.extend(recs);
    }
    present(all, dir)
}

/// Durably remove these entries from an open (locked) dead-letter log (opened with
/// `Fsync::Always`, so the removal record is synced when this returns).
pub(crate) fn mark_removed(dlq: &Log, ids: &[u64]) -> Result<(), StreamError> {
    dlq.append(&dlq_record::encode_removal(ids))
        .map(drop)
        .map_err(|source| StreamError::append(dlq.dir().to_path_buf(), source))
}
