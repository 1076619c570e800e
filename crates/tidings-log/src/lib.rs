//! `tidings-log`: the embedded, append-only, segmented log behind durable tidings streams
//! (SPEC R-LOG-1, R-LOG-2, R-LOG-4, R-LIM-2).
//!
//! One [`Log`] per stream directory. Appends get consecutive offsets; reads go by offset or by
//! time; old segments go by [`Retention`]; a crash at any point is recovered on the next
//! [`Log::open`] without accepting a corrupt record or losing an acknowledged one.
//!
//! ```
//! use tidings_log::{Fsync, Log, LogConfig, Record};
//! # let dir = tempfile::tempdir().unwrap();
//! let (log, _report) = Log::open(dir.path(), LogConfig::new().fsync(Fsync::Always))?;
//! let offset = log.append(&Record::new(1_700_000_000_000, "hello").with_key("k"))?;
//! let recs = log.read(offset, 10)?;
//! assert_eq!(recs[0].payload, "hello");
//! assert_eq!(log.offset_for_time(1_700_000_000_000)?, offset);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Contract
//!
//! * **Ordering.** Offsets are dense and increasing; a batch is contiguous; readers see a prefix.
//! * **Durability.** Per [`Fsync`]: `Always` acknowledges only synced records (group commit);
//!   `Interval(d)` syncs from a background thread every `d`; `Never` leaves it to the OS (and
//!   to segment rolls and [`Log::sync`]). Under both, a background writeback also syncs the
//!   active segment every eighth of a segment (at most 8 MiB) written, so that a roll has
//!   little left to sync. [`Log::durable_offset`] says what is synced.
//! * **Failure.** A failed write or fsync poisons the writer ([`AppendError::Poisoned`] from then
//!   on); nothing claims durability it does not have. Bad files are typed errors with the path
//!   and byte offset, never panics.
//!
//! # On-disk format (version 1)
//!
//! All integers are little-endian. Checksums are CRC-32C (Castagnoli).
//!
//! ## Files
//!
//! A stream directory holds, for each segment with base offset `B` (the offset of its first
//! record) written as 20 zero-padded decimal digits:
//!
//! | file | content |
//! |---|---|
//! | `BBBBBBBBBBBBBBBBBBBB.seg` | segment: header, then records |
//! | `BBBBBBBBBBBBBBBBBBBB.idx` | sparse offset index (sealed segments only) |
//! | `BBBBBBBBBBBBBBBBBBBB.tix` | time index (sealed segments only) |
//! | `BBBBBBBBBBBBBBBBBBBB.seg.tmp` | segment started by an asynchronous roll, not yet published (see the commit rules); adopted or removed on open (see the recovery rules) |
//! | other `*.tmp` | index file being written; removed on open |
//! | `LOCK` | empty; an advisory exclusive lock (`File::try_lock`) is held on it from open to close, so a second handle, in this or another process, gets [`OpenError::Locked`] |
//! | `META` | the application's own ([`META_FILE`]): never read, written or reported by the log |
//!
//! Segments are contiguous: each one's base is the previous one's end offset. The last segment is
//! the *active* one (appended to); the others are *sealed* (immutable). Other files are ignored
//! and listed in [`RecoveryReport::ignored_files`]; a `.seg`/`.idx`/`.tix` file whose stem is not
//! 20 digits is an error ([`OpenError::UnparseableName`]).
//!
//! ## Segment header
//!
//! 32 bytes:
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | magic `"TDNGSEG\0"` |
//! | 8..10 | format version `u16` = 1 |
//! | 10..16 | reserved, zero |
//! | 16..24 | base offset `u64` (must equal the file name) |
//! | 24..28 | reserved, zero |
//! | 28..32 | CRC-32C of bytes 0..28 |
//!
//! ## Record layout
//!
//! Records follow the header back to back (no padding). One record (a *frame*):
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | `body_len: u32`, bytes of body that follow the 8-byte prefix (21 ..= 2^30) |
//! | 4..8 | `crc: u32`, CRC-32C of bytes 0..4 followed by the whole body |
//! | body 0..8 | `offset: u64` |
//! | body 8..16 | `timestamp_ms: u64`, milliseconds since the UNIX epoch |
//! | body 16 | `flags: u8`: bit 0 = key present; other bits must be 0 |
//! | if key | `key_len: u32`, then `key_len` bytes |
//! | | `header_count: u32` |
//! | per header | `name_len: u16`, name (UTF-8), `value_len: u32`, value |
//! | rest of body | payload |
//!
//! A frame is *valid* when the length is in range, the frame is complete, the CRC matches, every
//! inner length fits exactly inside the body, flags are known, header names are UTF-8, and the
//! stored offset is the one expected at that position.
//!
//! ## Index files
//!
//! Both index files: a 48-byte header — magic (`"TDNGIDX\0"` offset index, `"TDNGTIX\0"` time
//! index), version `u16` = 1, reserved `u16`, entry count `u32`, base offset `u64`, covered
//! segment length `u64`, segment end offset `u64`, segment max timestamp `u64` — then 16-byte
//! entries, then a CRC-32C of everything before it.
//!
//! * Offset index entry: `(offset u64, byte position u64)`, one per `index_interval_bytes` of
//!   records. A read seeks to the last entry at or before the wanted offset and scans forward.
//! * Time index entry: `(max timestamp so far u64, offset u64)`: the largest timestamp of the
//!   segment's records up to and including `offset`, added at offset-index points when it grew.
//!   It is strictly increasing even when timestamps are not (as in Kafka).
//!
//! Index files are written (`*.tmp` then rename, not synced) when a segment is sealed. They are a
//! cache, never trusted blindly: on open they are used only if magic, version, CRC, base offset
//! and entry order check out, the covered length equals the segment's actual length, both files
//! agree, and the last indexed position holds a record with the indexed offset; otherwise the
//! segment is scanned and the files rewritten ([`RecoveryReport::rebuilt_indexes`]). Reads check
//! the offset of the record found at an indexed position and fall back to a scan from the
//! segment start if it differs. The active segment's indexes are rebuilt by the recovery scan.
//!
//! ## Time lookups
//!
//! [`Log::offset_for_time`]`(t)` is the first record **in offset order** whose own timestamp is
//! `>= t` (equivalently, where the running maximum timestamp first reaches `t`); later records
//! may carry smaller timestamps. The end offset if there is none.
//!
//! # Commit rules
//!
//! * Appends are encoded into an in-memory buffer, written (`pwrite`) when the buffer exceeds
//!   [`LogConfig::write_buffer_bytes`], before every sync, and before a read needs them.
//! * A record is *acknowledged durable* when it lies below [`Log::durable_offset`]: set only after
//!   `fdatasync` of the active segment returned (group commit: one leader syncs for every record
//!   written before it started).
//! * Rolling: flush, `fdatasync` the old segment (under every policy, so sealed segments are
//!   always complete on disk), write its index files, create the new segment, write and
//!   `fdatasync` its header, fsync the directory, then append into it. Under `Never` and
//!   `Interval` the roll is *asynchronous*: the new segment is created as `<name>.seg.tmp` and
//!   appended into at once, and the background thread does those steps, then renames it to its
//!   name (*publishes* it) and fsyncs the directory; until then nothing in it counts as durable.
//!   At most 4 rolls wait for their seal; the next waits for the oldest. The name `k+1.seg`
//!   still exists only once segment `k` and the new header are synced; a crash before leaves
//!   `k+1.seg.tmp`, which the next open adopts or removes (recovery rule 6).
//! * Writeback (`Never` and `Interval`): every `segment_bytes / 8` bytes (at most 8 MiB) handed
//!   to the storage, a background thread `fdatasync`s the active segment and raises the durable
//!   offset to the records written before it started; a failure poisons the writer. It only
//!   adds syncs, so recovery is unchanged.
//! * Every creation, rename or removal of files (roll, index rewrite, recovery repairs, retention)
//!   is followed by an fsync of the directory before anything depends on it.
//!
//! # Recovery rules
//!
//! [`Log::open`] first validates without writing anything, then repairs:
//!
//! 1. Names: foreign files are ignored and reported; log extensions with bad names are errors.
//!    Leftover `*.tmp` files (other than the unpublished segments of rule 6) and index files
//!    without their segment are removed.
//! 2. Interrupted roll: if the last segment's whole content is a prefix of the header it should
//!    have, or only zeros, it is removed ([`RecoveryReport::removed_incomplete_segment`]).
//! 3. Headers: every segment header must be valid ([`OpenError::BadHeader`],
//!    [`OpenError::UnsupportedVersion`]); a truncated header anywhere else is an error.
//! 4. Sealed segments: loaded through their index files (see above) or scanned; with
//!    [`LogConfig::verify_on_open`] every record is checked. Any bad record in a sealed segment
//!    is [`OpenError::Corrupt`] — a sealed segment was synced before the next one existed, so a
//!    crash cannot have damaged it.
//! 5. The last segment is scanned record by record. At the first record that is incomplete or
//!    invalid (at byte `p`), the rest of the file is searched byte by byte for a valid record
//!    whose offset is at least the expected one (the *resync* search). If the length prefix at
//!    `p` is readable and in range, the damaged record *claims an extent*
//!    (`p .. p + 8 + body_len`, possibly past the end of the file). The bytes inside it are that
//!    record's payload — user data, which may contain byte-exact copies of valid frames — so a
//!    valid frame found inside the extent counts only with evidence that it is the next record
//!    and the length field was what got damaged: its offset is exactly the expected one plus 1
//!    and the record at `p`, read with the length that would end it exactly there, passes its
//!    CRC. Valid frames at or after the extent count. Without a readable length, any valid frame
//!    after `p` counts.
//!    * **nothing counts: torn tail.** The file is truncated to `p` and synced, and the
//!      cut is reported in [`RecoveryReport::truncated`] (file, byte offset, bytes dropped). This
//!      covers a partial last record (whatever its payload holds), a last record with a bad CRC,
//!      and zero-filled or garbage tails.
//!    * **a valid record counts: corruption in the middle.** [`OpenError::Corrupt`] names the
//!      file and `p`; nothing is truncated, because silently dropping the valid records after it
//!      could lose acknowledged data.
//!
//!    The scan reads through a bounded window (256 KiB; larger records are checked by streaming
//!    them), so recovery needs bounded memory whatever the file length, a sparse or zero-filled
//!    multi-GiB tail included.
//! 6. Unpublished segments (`<base>.seg.tmp`, left by a crash during an asynchronous roll), in
//!    offset order: one is *adopted* when the recovered log so far has no torn tail and ends
//!    exactly at its base — then the segment before it holds every record up to the roll,
//!    intact, as after a process kill (the page cache survives it) — and its header is intact.
//!    It is then recovered like a last segment (rule 5, except that damage of any kind is a torn
//!    tail: nothing in an unpublished segment was ever reported durable), and published as the
//!    seal would have: the segment before it synced, then its file, then the rename, then the
//!    directory ([`RecoveryReport::adopted_segments`]). The first that cannot be adopted (after a
//!    power cut took part of what came before it, or its header) is removed with every later
//!    one ([`RecoveryReport::removed_files`]). So a process kill loses only the write buffer,
//!    whether or not a seal was pending.
//! 7. Segments must be contiguous ([`OpenError::Gap`]).
//!
//! A consequence: damage to the *last* record of the last segment is indistinguishable from a
//! torn write and is truncated (and reported); anywhere else it stops the open.
//!
//! # Reading past a damaged record
//!
//! A record the open did not check (a sealed segment without [`LogConfig::verify_on_open`])
//! is checked by the read that reaches it. [`Log::read`] returns the records before it; the
//! read that starts at it fails with [`ReadError::Corrupt`] (file, byte offset, record
//! offset). [`Log::next_readable`] then finds the first trustworthy record after it with the
//! resync search of rule 5 (in a sealed segment with none, the segment's end), remembers it
//! so later reads start there, and changes nothing on disk; in the active segment with none
//! it fails with the same `Corrupt`.
//!
//! # Media assumptions
//!
//! * `fdatasync` returning success means the file's data and length survive a power cut; a
//!   failed `fdatasync` may have lost dirty pages (hence poisoning, never retrying).
//! * Directory fsync makes creations, renames and removals durable; `rename` is atomic.
//! * Unsynced appended data survives a crash, if at all, as a prefix of what was written,
//!   possibly followed by a torn write, zeros or garbage up to the file length (the length may
//!   have reached the disk without the data). A crash cannot leave a hole followed by valid
//!   later records; if a file system does that, the log reports `Corrupt` instead of guessing.
//! * Sector writes need not be atomic: the CRC of each record catches torn sectors.
//! * Bit rot in synced data is detected by CRC (on read, `verify`, or `verify_on_open`), never
//!   repaired silently.
//!
//! # Modules
//!
//! Storage is pluggable ([`Storage`]) so tests can inject faults with
//! [`testing::SimStorage`]; [`tools`] has `inspect`, `verify`, `dump` for a CLI.

#![deny(missing_docs)]
// No `unsafe` anywhere but `crc` (the CPU's CRC instruction; see that module).
#![deny(unsafe_code)]

mod commit;
mod config;
#[allow(unsafe_code)]
mod crc;
mod dir;
mod error;
mod excerpt;
#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod fuzz_targets;
mod index;
mod log;
mod log_reader;
mod reader;
mod record;
mod record_ref;
mod recovery;
mod retention;
mod scan;
mod segment;
pub mod storage;
mod tail;
pub mod testing;
pub mod tools;
mod writeback;
mod writer;

pub use config::{Fsync, LogConfig, MAX_RECORD_BYTES, MIN_SEGMENT_BYTES, Retention};
pub use error::{
    AppendError, CloseError, ConfigError, OpenError, ReadError, RetentionError, ToolError,
};
pub use excerpt::Excerpt;
pub use log::Log;
pub use log_reader::LogReader;
pub use record::{MAX_HEADER_NAME, Record, StoredRecord};
pub use record_ref::{Headers, RecordRef};
pub use recovery::{RecoveryReport, Truncation};
pub use retention::{RemovedSegment, RetentionReport};
pub use segment::FORMAT_VERSION;
pub use storage::{DirLock, FsStorage, LOCK_FILE, META_FILE, Storage, StorageFile};
pub use tail::AppendListener;
