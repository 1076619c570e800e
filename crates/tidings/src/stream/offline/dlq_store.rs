//! Everything the offline tools know about a durable dead-letter log's representation, in
//! one place: which entries are present, how one decodes, what record redrives it, and how
//! entries are durably removed (the `<name>.dlq.removed` file; format in the parent
//! module's docs). Everything else in `offline` goes through these functions.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use tidings_log::{Log, Record, StoredRecord, tools};

use crate::message::Message;
use crate::stream::codec;
use crate::stream::commit::sync_dir;
use crate::stream::durable::{decode_dead_letter, redrive_record as original_record};
use crate::stream::error::StreamError;

/// A dead-letter entry decoded for display.
#[derive(Debug)]
pub(crate) struct Decoded {
    /// The original message, without dead-letter metadata.
    pub(crate) message: Message,
    /// The reason's display text.
    pub(crate) reason: String,
    /// Handler attempts made.
    pub(crate) attempts: u32,
    /// The message's offset in its stream.
    pub(crate) stream_offset: Option<u64>,
}

/// Decode one entry record.
pub(crate) fn decode(r: &StoredRecord) -> Result<Decoded, &'static str> {
    let original = original_record(r);
    let message = codec::decode(StoredRecord {
        offset: r.offset,
        timestamp_ms: original.timestamp_ms,
        key: original.key,
        headers: original.headers,
        payload: original.payload,
    })?;
    let d = decode_dead_letter(r.clone())?;
    Ok(Decoded {
        message,
        reason: d.reason,
        attempts: d.attempts,
        stream_offset: d.message.offset(),
    })
}

/// The stream record that redrives entry `r` of durable subscription `_durable`.
pub(crate) fn redrive_record(r: &StoredRecord, _durable: &str) -> Record {
    original_record(r)
}

/// The present (not removed) entries of the log in `dlq_dir`, oldest first, read-only and
/// without the lock. None when the log does not exist.
pub(crate) fn read_present(dlq_dir: &Path) -> Result<Vec<StoredRecord>, String> {
    if !dlq_dir.is_dir() {
        return Ok(Vec::new());
    }
    let removed = Removed::load(dlq_dir).map_err(|e| e.to_string())?;
    let all = tools::dump(dlq_dir, 0, usize::MAX).map_err(|e| e.to_string())?;
    Ok(all
        .into_iter()
        .filter(|r| !removed.contains(r.offset))
        .collect())
}

/// The present entries of an open (locked) dead-letter log, oldest first.
pub(crate) fn log_present(dlq: &Log) -> Result<Vec<StoredRecord>, StreamError> {
    let dir = dlq.dir();
    let removed = Removed::load(dir)?;
    let mut present = Vec::new();
    let mut from = dlq.start_offset();
    loop {
        let recs = dlq.read(from, 1024).map_err(|source| StreamError::Read {
            dir: dir.to_path_buf(),
            source,
        })?;
        let Some(last) = recs.last() else { break };
        from = last.offset + 1;
        present.extend(recs.into_iter().filter(|r| !removed.contains(r.offset)));
    }
    Ok(present)
}

/// Durably remove these entries from an open (locked) dead-letter log.
pub(crate) fn mark_removed(dlq: &Log, ids: &[u64]) -> Result<(), StreamError> {
    let mut removed = Removed::load(dlq.dir())?;
    for &id in ids {
        removed.insert(id);
    }
    removed.store(dlq.dir())
}

const REMOVED_MAGIC: &str = "tidings-dlq-removed 1\n";

/// The set of removed entry ids of one dead-letter log (`<name>.dlq.removed`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Removed {
    /// start → end (exclusive), disjoint and non-adjacent.
    ranges: BTreeMap<u64, u64>,
}

/// `<dir>/<name>.dlq` → `<dir>/<name>.dlq.removed`.
pub(crate) fn removed_path(dlq_dir: &Path) -> PathBuf {
    let mut p = dlq_dir.as_os_str().to_owned();
    p.push(".removed");
    PathBuf::from(p)
}

impl Removed {
    /// Load the removed set of the dead-letter log in `dlq_dir` (empty when no file).
    pub(crate) fn load(dlq_dir: &Path) -> Result<Self, StreamError> {
        let path = removed_path(dlq_dir);
        let text = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(StreamError::io(&path, e)),
        };
        let bad = |reason: &str| StreamError::BadOffsetFile {
            path: path.clone(),
            reason: reason.to_owned(),
        };
        let text = std::str::from_utf8(&text).map_err(|_| bad("not UTF-8"))?;
        let body = text
            .strip_prefix(REMOVED_MAGIC)
            .ok_or_else(|| bad("missing `tidings-dlq-removed 1` header"))?;
        let mut out = Self::default();
        for line in body.lines() {
            let (a, b) = line
                .split_once(' ')
                .ok_or_else(|| bad("a line is not `<start> <end>`"))?;
            let a: u64 = a.parse().map_err(|_| bad("start is not a number"))?;
            let b: u64 = b.parse().map_err(|_| bad("end is not a number"))?;
            if a >= b {
                return Err(bad("empty or reversed range"));
            }
            out.insert_range(a, b);
        }
        Ok(out)
    }

    /// Durably replace the file with this set.
    pub(crate) fn store(&self, dlq_dir: &Path) -> Result<(), StreamError> {
        let path = removed_path(dlq_dir);
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let mut text = String::from(REMOVED_MAGIC);
        for (a, b) in &self.ranges {
            text.push_str(&format!("{a} {b}\n"));
        }
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| StreamError::io(&tmp, e))?;
        f.write_all(text.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| StreamError::io(&tmp, e))?;
        drop(f);
        fs::rename(&tmp, &path).map_err(|e| StreamError::io(&path, e))?;
        match path.parent() {
            Some(parent) => sync_dir(parent),
            None => Ok(()),
        }
    }

    /// Whether entry `id` was removed.
    pub(crate) fn contains(&self, id: u64) -> bool {
        self.ranges
            .range(..=id)
            .next_back()
            .is_some_and(|(_, &end)| id < end)
    }

    /// Mark entry `id` removed.
    pub(crate) fn insert(&mut self, id: u64) {
        self.insert_range(id, id.saturating_add(1));
    }

    fn insert_range(&mut self, mut a: u64, mut b: u64) {
        // Merge with every overlapping or adjacent range.
        while let Some((&s, &e)) = self.ranges.range(..=b).next_back() {
            if e < a {
                break;
            }
            a = a.min(s);
            b = b.max(e);
            self.ranges.remove(&s);
        }
        self.ranges.insert(a, b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removed_ranges_merge_and_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let dlq = dir.path().join("billing.dlq");
        let mut r = Removed::load(&dlq).unwrap();
        for id in [5, 3, 4, 9, 0, 10, 8] {
            r.insert(id);
        }
        assert_eq!(
            r.ranges.iter().map(|(&a, &b)| (a, b)).collect::<Vec<_>>(),
            [(0, 1), (3, 6), (8, 11)]
        );
        assert!(r.contains(4) && r.contains(10) && !r.contains(6) && !r.contains(11));
        r.store(&dlq).unwrap();
        assert_eq!(Removed::load(&dlq).unwrap(), r);
        // R-LIM-2: a foreign file is a typed error naming the path.
        fs::write(removed_path(&dlq), "tidings-dlq-removed 1\n7 3\n").unwrap();
        let e = Removed::load(&dlq).unwrap_err().to_string();
        assert!(e.contains("billing.dlq.removed"), "{e}");
        fs::write(removed_path(&dlq), "hello").unwrap();
        assert!(Removed::load(&dlq).is_err());
    }
}
