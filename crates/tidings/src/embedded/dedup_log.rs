//! A durable [`DedupStore`] kept in an embedded log (R-DEL-5 "durable with the log").
//!
//! `<data_dir>/dedup/<name>/` is a `tidings-log` whose records each hold one processed
//! message id (payload: the id, 16 bytes little-endian; no key, no header), appended with
//! `Fsync::Always` before [`DedupStore::record`] returns. Opening replays the retained
//! records into an in-memory window of the most recent `capacity` ids; size retention
//! removes old segments once the log holds well over `capacity` ids.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tidings_log::{Fsync, Log, LogConfig, Record, Retention, Storage};

use crate::dedup::{DedupStore, InMemoryDedupStore};
use crate::message::MessageId;

use crate::durable::StreamError;

/// Segment size of a dedup log.
const SEGMENT_BYTES: u64 = 1 << 20;
/// Bound on the encoded size of one id record, for the retention budget.
const RECORD_BUDGET: u64 = 128;

/// A [`DedupStore`] that survives restarts: every recorded id is appended — and synced —
/// to an embedded log before `record` returns, and reopening the store remembers it again
/// (R-DEL-5). Open one with [`Broker::durable_dedup_store`](crate::Broker::durable_dedup_store)
/// and wrap a handler with [`Deduplicating::with_store`](crate::Deduplicating::with_store).
///
/// With a durable subscription this closes the at-least-once gap across restarts: a
/// message whose handler succeeded but whose position was not committed before a crash is
/// redelivered after the restart and skipped.
///
/// # Capacity
/// It remembers at least the most recent `capacity` ids (older ones are forgotten as whole
/// log segments are removed). One directory is open once at a time (its log holds a lock):
/// dropping the store releases it.
///
/// # Failure
/// [`DedupStore::record`] cannot return an error: when an append fails the id is still
/// remembered in memory for this run, the failure is logged with `tracing::error!` and
/// kept in [`DurableDedupStore::error`], and the id will not be remembered after a restart
/// (the message may then be processed again — never lost).
#[derive(Debug)]
pub struct DurableDedupStore {
    log: Log,
    window: InMemoryDedupStore,
    error: Mutex<Option<String>>,
}

impl DurableDedupStore {
    /// Open or create the store in `dir` on `storage`, replaying what it holds.
    pub(crate) fn open(
        storage: Arc<dyn Storage>,
        dir: PathBuf,
        capacity: usize,
    ) -> Result<Self, StreamError> {
        let capacity = capacity.max(1);
        let config = LogConfig::new()
            .segment_bytes(SEGMENT_BYTES)
            .fsync(Fsync::Always)
            .retention(
                Retention::new().max_bytes(
                    (capacity as u64)
                        .saturating_mul(RECORD_BUDGET)
                        .saturating_add(2 * SEGMENT_BYTES),
                ),
            );
        let (log, _) = Log::open_with_storage(storage, &dir, config)
            .map_err(|source| StreamError::open(dir.clone(), source))?;
        let window = InMemoryDedupStore::new(capacity);
        let mut from = log.start_offset();
        loop {
            let records = log
                .read(from, 1024)
                .map_err(|source| StreamError::read(dir.clone(), source))?;
            let Some(last) = records.last() else {
                break;
            };
            from = last.offset + 1;
            for r in records {
                let id = decode_id(&r.payload).map_err(|reason| StreamError::Decode {
                    dir: dir.clone(),
                    offset: r.offset,
                    reason,
                })?;
                window.record(id);
            }
        }
        Ok(Self {
            log,
            window,
            error: Mutex::new(None),
        })
    }

    /// Ids remembered now.
    #[must_use]
    pub fn len(&self) -> usize {
        self.window.len()
    }
    /// True when nothing is remembered.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.window.is_empty()
    }
    /// The last append failure, if one happened (see the type's "Failure" section).
    #[must_use]
    pub fn error(&self) -> Option<String> {
        self.error.lock().clone()
    }
}

fn decode_id(payload: &[u8]) -> Result<MessageId, &'static str> {
    let bytes: [u8; 16] = payload
        .try_into()
        .map_err(|_| "dedup record is not a 16-byte message id")?;
    Ok(MessageId::from_u128(u128::from_le_bytes(bytes)))
}

impl DedupStore for DurableDedupStore {
    fn contains(&self, id: MessageId) -> bool {
        self.window.contains(id)
    }

    fn record(&self, id: MessageId) {
        if self.window.contains(id) {
            return;
        }
        let record = Record {
            timestamp_ms: 0,
            key: None,
            headers: Vec::new(),
            payload: Bytes::copy_from_slice(&id.as_u128().to_le_bytes()),
        };
        if let Err(e) = self.log.append(&record) {
            let e = format!("append to {} failed: {e}", self.log.dir().display());
            tracing::error!("tidings: durable dedup store: {e}");
            *self.error.lock() = Some(e);
        }
        self.window.record(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_survive_reopening_and_foreign_records_are_typed_errors() {
        let dir = tempfile::tempdir().unwrap();
        let fs: Arc<dyn Storage> = Arc::new(tidings_log::FsStorage);
        let path = dir.path().join("d");
        let ids: Vec<MessageId> = (1..=5u128).map(MessageId::from_u128).collect();
        {
            let s = DurableDedupStore::open(fs.clone(), path.clone(), 3).unwrap();
            for id in &ids {
                s.record(*id);
            }
            assert_eq!(s.len(), 3);
        }
        let s = DurableDedupStore::open(fs.clone(), path.clone(), 3).unwrap();
        // R-DEL-5: the most recent `capacity` ids are remembered after reopening.
        assert!(!s.contains(ids[1]));
        assert!(ids[2..].iter().all(|id| s.contains(*id)));
        s.log
            .append(&Record {
                timestamp_ms: 0,
                key: None,
                headers: Vec::new(),
                payload: Bytes::from_static(b"short"),
            })
            .unwrap();
        drop(s);
        // R-LIM-2: a record that is not an id is reported with its place, not trusted.
        let e = DurableDedupStore::open(fs, path, 3).unwrap_err();
        assert!(matches!(e, StreamError::Decode { offset: 5, .. }), "{e:?}");
        assert_eq!(e.kind(), crate::StreamErrorKind::Corrupt);
    }
}
