//! The single writer: encodes records into an in-memory buffer, hands the buffer to the storage
//! when it is large (or before a sync or a read that needs it), and rolls segments.
//!
//! # Roll
//!
//! When the next record would push the active segment past `segment_bytes` (and the segment
//! already holds a record), the writer flushes its buffer and, if the active segment is not yet
//! published (its own roll's seal is still running), waits for that (back-pressure). Then:
//!
//! * under `Always`, on the append path: syncs the old segment (so a sealed segment is always
//!   complete on disk); writes its index files (best effort: they are a checked cache); creates
//!   the new segment, writes and syncs its header; syncs the directory; and only then appends
//!   into it;
//! * under `Never` and `Interval`: creates the new segment under a temporary name with its
//!   header and appends into it at once, while the [writeback](crate::writeback) thread does the
//!   same steps (sync, index files, header sync, then rename to the real name and directory
//!   sync) in the background — the [asynchronous seal](crate::writeback#asynchronous-seal).
//!
//! A failure at any step poisons the writer. After the append that rolled releases the lock,
//! the log applies its retention policy.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::error::AppendError;
use crate::index::{IndexBuilder, SealedInfo};
use crate::log::Shared;
use crate::record::{self, Record};
use crate::recovery::{create_segment, write_index_files};
use crate::segment::{FileKind, HEADER_LEN, Segment, file_path, header_bytes, pending_path};
use crate::storage::write_all_at;

/// State owned by whoever holds the writer lock.
#[derive(Debug)]
pub(crate) struct Writer {
    pub(crate) active: Arc<Segment>,
    buf: Vec<u8>,
    /// Next offset to assign.
    pub(crate) next: u64,
    builder: IndexBuilder,
    pub(crate) closed: bool,
    /// A segment was sealed since the last append returned: retention is due.
    pub(crate) rolled: bool,
    /// Bytes handed to the storage between background writeback requests (`None` under
    /// `Fsync::Always`, where every append is synced anyway); see [`crate::writeback`].
    writeback_step: Option<u64>,
    /// The active segment's `flushed` when writeback was last requested.
    requested: u64,
}

impl Writer {
    pub(crate) fn new(
        active: Arc<Segment>,
        builder: IndexBuilder,
        writeback_step: Option<u64>,
    ) -> Self {
        let next = active.end();
        let requested = active.flushed.load(Ordering::Acquire);
        Self {
            active,
            buf: Vec::new(),
            next,
            builder,
            closed: false,
            rolled: false,
            writeback_step,
            requested,
        }
    }

    /// Appends one record whose encoded length `len` was checked against the limits.
    pub(crate) fn append(
        &mut self,
        sh: &Shared,
        rec: &Record,
        len: u64,
    ) -> Result<u64, AppendError> {
        let size = self.active.size();
        if size > HEADER_LEN && size + len > sh.config.segment_bytes {
            self.roll(sh)?;
        }
        let pos = self.active.size();
        let offset = self.next;
        if let Some(p) = self.builder.on_record(offset, pos, len, rec.timestamp_ms) {
            p.apply(&mut self.active.index.write());
        }
        record::encode_without_crc(&mut self.buf, offset, rec);
        self.active.size.store(pos + len, Ordering::Release);
        // Only the writer updates `max_ts`: no read-modify-write needed.
        let seg_max = &self.active.max_ts;
        if offset == self.active.base || rec.timestamp_ms > seg_max.load(Ordering::Relaxed) {
            seg_max.store(rec.timestamp_ms, Ordering::Release);
        }
        self.next += 1;
        self.active.end.store(self.next, Ordering::Release);
        if self.buf.len() >= sh.config.write_buffer_bytes {
            self.flush(sh)?;
        }
        Ok(offset)
    }

    /// Hands the buffer to the storage (no sync). A failure poisons the writer.
    pub(crate) fn flush(&mut self, sh: &Shared) -> Result<(), AppendError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        if sh.commit.is_poisoned() {
            return Err(AppendError::Poisoned);
        }
        let at = self.active.flushed.load(Ordering::Acquire);
        // The buffer holds whole frames, all still without their CRC (see `encode_without_crc`).
        record::fill_crcs(&mut self.buf);
        match write_all_at(&*self.active.file, &self.buf, at) {
            Ok(()) => {
                let flushed = at + self.buf.len() as u64;
                self.active.flushed.store(flushed, Ordering::Release);
                self.buf.clear();
                if let Some(step) = self.writeback_step
                    && flushed - self.requested >= step
                {
                    // Every record below `next` is now in this file or a sealed segment.
                    sh.writeback.request(&self.active, self.next);
                    self.requested = flushed;
                }
                Ok(())
            }
            Err(source) => Err(sh.commit.poison_with(&self.active.path, source)),
        }
    }

    /// Starts the next segment; see the [module docs](self).
    fn roll(&mut self, sh: &Shared) -> Result<(), AppendError> {
        self.flush(sh)?;
        // Back-pressure: the segments started by the last rolls may still wait for their seals.
        // Starting one more only once the oldest of those is published keeps at most
        // `MAX_PENDING_SEALS` pending.
        let oldest = {
            let segs = sh.segments.read();
            segs.len()
                .checked_sub(crate::writeback::MAX_PENDING_SEALS)
                .map(|i| segs[i].clone())
        };
        if let Some(seg) = oldest {
            crate::writeback::wait_published(sh, &seg)?;
        }
        let old = self.active.clone();
        let seg = if self.writeback_step.is_some() {
            self.start_unpublished(sh, old)?
        } else {
            self.seal_inline(sh, &old)?
        };
        sh.segments.write().push(seg.clone());
        self.active = seg;
        self.requested = HEADER_LEN;
        self.builder = IndexBuilder::new(sh.config.index_interval_bytes);
        self.rolled = true;
        Ok(())
    }

    /// The asynchronous roll (`Never`, `Interval`): the next segment under its temporary name,
    /// header written but not synced; the writeback thread seals `old` and publishes it.
    fn start_unpublished(
        &mut self,
        sh: &Shared,
        old: Arc<Segment>,
    ) -> Result<Arc<Segment>, AppendError> {
        let path = file_path(&sh.dir, self.next, FileKind::Segment);
        let tmp = pending_path(&path);
        let file: Arc<dyn crate::storage::StorageFile> = sh
            .storage
            .create(&tmp)
            .map_err(|e| sh.commit.poison_with(&tmp, e))?
            .into();
        write_all_at(&*file, &header_bytes(self.next), 0)
            .map_err(|e| sh.commit.poison_with(&tmp, e))?;
        let seg = Arc::new(Segment::unpublished(self.next, path, file));
        sh.writeback.seal(old, seg.clone(), tmp);
        Ok(seg)
    }

    /// The synchronous roll (`Always`): seal `old`, create the next segment, sync the directory.
    fn seal_inline(&mut self, sh: &Shared, old: &Segment) -> Result<Arc<Segment>, AppendError> {
        if let Err(e) = old.file.sync_data() {
            return Err(sh.commit.poison_with(&old.path, e));
        }
        sh.commit.mark_durable(sh, self.next);
        let info = SealedInfo {
            covered_len: old.size(),
            end: old.end(),
            max_ts: old.max_ts.load(Ordering::Acquire),
        };
        // Best effort: index files are checked on load and rebuilt when missing or bad.
        let _ = write_index_files(&*sh.storage, &sh.dir, old.base, &info, &old.index.read());
        let (path, file) = create_segment(&*sh.storage, &sh.dir, self.next)
            .map_err(|(p, e)| sh.commit.poison_with(&p, e))?;
        if let Err(e) = sh.storage.sync_dir(&sh.dir) {
            return Err(sh.commit.poison_with(&sh.dir, e));
        }
        Ok(Arc::new(Segment::new(
            self.next,
            path,
            file,
            Default::default(),
            self.next,
            HEADER_LEN,
            0,
        )))
    }
}
