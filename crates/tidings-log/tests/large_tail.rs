//! R-LIM-2, R-LOG-2: a last segment that is a huge zero-filled or sparse file
//! (its length reached the disk, its data did not) is recovered in bounded memory: every read
//! the recovery makes is bounded by the scan window, whatever the file length.

mod common;

use std::fs::OpenOptions;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{fill, read_all};
use tidings_log::storage::{DirEntry, OpenMode};
use tidings_log::{DirLock, FsStorage, Fsync, Log, LogConfig, Storage, StorageFile};

const GIB: u64 = 1 << 30;
/// Largest single read recovery may make: its scan window (256 KiB), with room to spare, and
/// in any case nowhere near the file sizes below.
const READ_BOUND: usize = 1 << 20;

/// `FsStorage` that records the largest buffer any `read_at` was given (a whole-file read would
/// show up as a buffer the size of the file).
#[derive(Debug, Default)]
struct Counting {
    inner: FsStorage,
    max_read: Arc<AtomicUsize>,
}

#[derive(Debug)]
struct CountingFile {
    inner: Box<dyn StorageFile>,
    max_read: Arc<AtomicUsize>,
}

impl StorageFile for CountingFile {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.max_read.fetch_max(buf.len(), Ordering::Relaxed);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.inner.write_at(buf, offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()
    }
}

impl Counting {
    fn wrap(&self, f: Box<dyn StorageFile>) -> Box<dyn StorageFile> {
        Box::new(CountingFile {
            inner: f,
            max_read: self.max_read.clone(),
        })
    }
}

impl Storage for Counting {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.inner.create_dir_all(dir)
    }
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<DirEntry>> {
        self.inner.list_dir(dir)
    }
    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        self.inner.create(path).map(|f| self.wrap(f))
    }
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        self.inner.open(path, mode).map(|f| self.wrap(f))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }
    fn lock_dir(&self, dir: &Path) -> io::Result<DirLock> {
        self.inner.lock_dir(dir)
    }
}

fn config() -> LogConfig {
    LogConfig::new().fsync(Fsync::Never).segment_bytes(4096)
}

fn segments(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

/// A 2 GiB sparse tail after the last record: a torn tail of zeros, truncated; every read
/// bounded.
#[test]
fn sparse_two_gib_tail_is_truncated_in_bounded_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, _) = Log::open(tmp.path(), config()).unwrap();
    fill(&log, 100);
    let before = read_all(&log);
    drop(log);
    let last = segments(tmp.path()).pop().unwrap();
    let valid = std::fs::metadata(&last).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&last)
        .unwrap()
        .set_len(2 * GIB)
        .unwrap();
    let storage = Arc::new(Counting::default());
    let max_read = storage.max_read.clone();
    let (log, report) = Log::open_with_storage(storage, tmp.path(), config()).unwrap();
    let t = report.truncated.as_ref().expect("truncation reported");
    // R-LOG-2: the zero tail is cut off at the end of the last record, nothing else.
    assert_eq!(
        (&t.path, t.byte_offset, t.bytes_dropped),
        (&last, valid, 2 * GIB - valid)
    );
    assert_eq!(read_all(&log), before); // R-LOG-2
    let m = max_read.load(Ordering::Relaxed);
    assert!(m <= READ_BOUND, "largest read {m} bytes"); // R-LIM-2: bounded memory
    assert_eq!(std::fs::metadata(&last).unwrap().len(), valid);
}

/// A last segment that is 1 GiB of zeros (an interrupted roll whose length reached the disk):
/// removed, streamed in bounded memory.
#[test]
fn sparse_zero_segment_is_removed_in_bounded_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, _) = Log::open(tmp.path(), config()).unwrap();
    fill(&log, 100);
    let before = read_all(&log);
    let end = log.end_offset();
    drop(log);
    let extra = tmp.path().join(format!("{end:020}.seg"));
    std::fs::File::create(&extra).unwrap().set_len(GIB).unwrap();
    let storage = Arc::new(Counting::default());
    let max_read = storage.max_read.clone();
    let (log, report) = Log::open_with_storage(storage, tmp.path(), config()).unwrap();
    // R-LOG-2: the interrupted roll is removed, the records kept.
    assert_eq!(report.removed_incomplete_segment.as_ref(), Some(&extra));
    assert_eq!(read_all(&log), before);
    let m = max_read.load(Ordering::Relaxed);
    assert!(m <= READ_BOUND, "largest read {m} bytes"); // R-LIM-2: bounded memory
    assert!(!extra.exists());
}

/// A 1 GiB sparse `.idx` next to a sealed segment: never read (longer than any index of that
/// segment can be), rebuilt; verify names it.
#[test]
fn huge_index_file_is_not_read_and_is_rebuilt() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, _) = Log::open(tmp.path(), config()).unwrap();
    fill(&log, 100);
    let before = read_all(&log);
    drop(log);
    let idx = tmp.path().join(format!("{:020}.idx", 0));
    OpenOptions::new()
        .write(true)
        .open(&idx)
        .unwrap()
        .set_len(GIB)
        .unwrap();
    let storage = Arc::new(Counting::default());
    let max_read = storage.max_read.clone();
    let v = tidings_log::tools::verify_with_storage(&*storage, tmp.path()).unwrap();
    assert!(
        v.problems.iter().any(|p| p.path == idx),
        "{v}" // R-LIM-2: reported under its own name
    );
    let (log, report) = Log::open_with_storage(storage, tmp.path(), config()).unwrap();
    assert!(report.rebuilt_indexes.contains(&idx), "{report}");
    assert_eq!(read_all(&log), before); // R-LOG-2
    let m = max_read.load(Ordering::Relaxed);
    assert!(m <= READ_BOUND, "largest read {m} bytes"); // R-LIM-2: bounded memory
    assert!(std::fs::metadata(&idx).unwrap().len() < 4096);
}
