//! Quick append throughput check (not the official benchmark):
//! `cargo run --release -p tidings-log --example append_bench [records] [publishers]`.
//!
//! Compares `Fsync::Never` appends with raw buffered writes of the same bytes, and `Fsync::Always`
//! with N concurrent publishers with a raw write + `fdatasync` loop at the batch size the log
//! achieved.

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use tidings_log::storage::{DirEntry, OpenMode};
use tidings_log::{FsStorage, Fsync, Log, LogConfig, Record, Storage, StorageFile};

/// `FsStorage` counting file syncs.
#[derive(Debug, Default)]
struct Counting(Arc<AtomicU64>);

#[derive(Debug)]
struct CountingFile(Box<dyn StorageFile>, Arc<AtomicU64>);

impl Storage for Counting {
    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        FsStorage.create_dir_all(dir)
    }
    fn list_dir(&self, dir: &Path) -> std::io::Result<Vec<DirEntry>> {
        FsStorage.list_dir(dir)
    }
    fn create(&self, path: &Path) -> std::io::Result<Box<dyn StorageFile>> {
        Ok(Box::new(CountingFile(
            FsStorage.create(path)?,
            self.0.clone(),
        )))
    }
    fn open(&self, path: &Path, mode: OpenMode) -> std::io::Result<Box<dyn StorageFile>> {
        Ok(Box::new(CountingFile(
            FsStorage.open(path, mode)?,
            self.0.clone(),
        )))
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        FsStorage.rename(from, to)
    }
    fn remove(&self, path: &Path) -> std::io::Result<()> {
        FsStorage.remove(path)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        FsStorage.sync_dir(dir)
    }
}

impl StorageFile for CountingFile {
    fn len(&self) -> std::io::Result<u64> {
        self.0.len()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<usize> {
        self.0.write_at(buf, offset)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.sync_data()
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let publishers: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let tmp = tempfile::tempdir().expect("tempdir");
    let payload = vec![7u8; 100];
    let rec = Record::new(1_700_000_000_000, payload.clone()).with_key("key-1");
    let frame = rec.encoded_len() as usize;

    // Never vs raw buffered writes.
    let (log, _) = Log::open(
        tmp.path().join("never"),
        LogConfig::new().fsync(Fsync::Never),
    )
    .expect("open");
    let t = Instant::now();
    for _ in 0..n {
        log.append(&rec).expect("append");
    }
    let log_rate = n as f64 / t.elapsed().as_secs_f64();
    log.close().expect("close");
    let raw_path = tmp.path().join("raw");
    let mut w = std::io::BufWriter::with_capacity(
        256 << 10,
        std::fs::File::create(&raw_path).expect("raw"),
    );
    let buf = vec![7u8; frame];
    let t = Instant::now();
    for _ in 0..n {
        w.write_all(&buf).expect("write");
    }
    w.flush().expect("flush");
    let raw_rate = n as f64 / t.elapsed().as_secs_f64();
    println!(
        "Never: log {log_rate:.0}/s, raw buffered {raw_rate:.0}/s, ratio {:.2}",
        log_rate / raw_rate
    );

    // Always with concurrent publishers (group commit) vs raw write+fdatasync at the same batch.
    let per = (n / 100 / publishers).max(20);
    let counter = Arc::new(AtomicU64::new(0));
    let (log, _) = Log::open_with_storage(
        Arc::new(Counting(counter.clone())),
        &tmp.path().join("always"),
        LogConfig::new().fsync(Fsync::Always),
    )
    .expect("open");
    let log = Arc::new(log);
    let syncs_before = counter.load(Ordering::Relaxed);
    let t = Instant::now();
    let hs: Vec<_> = (0..publishers)
        .map(|_| {
            let log = log.clone();
            let rec = rec.clone();
            std::thread::spawn(move || {
                for _ in 0..per {
                    log.append(&rec).expect("append");
                }
            })
        })
        .collect();
    for h in hs {
        h.join().expect("join");
    }
    let total = per * publishers;
    let secs = t.elapsed().as_secs_f64();
    let always_rate = total as f64 / secs;
    let log_syncs = counter.load(Ordering::Relaxed) - syncs_before;
    let avg_batch = (total / log_syncs.max(1)).max(1);
    println!(
        "Always x{publishers}: {total} appends, {log_syncs} syncs, {avg_batch} records per sync"
    );
    // A raw write + fdatasync loop at the batch size the log achieved.
    let f = std::fs::File::create(tmp.path().join("raw-sync")).expect("raw");
    let syncs = 200;
    let t = Instant::now();
    let batch = vec![7u8; frame * avg_batch as usize];
    for _ in 0..syncs {
        (&f).write_all(&batch).expect("write");
        f.sync_data().expect("sync");
    }
    let raw_sync_rate = (syncs * avg_batch) as f64 / t.elapsed().as_secs_f64();
    println!(
        "Always x{publishers}: log {always_rate:.0}/s, raw write+fdatasync of {avg_batch}-record batches {raw_sync_rate:.0}/s, ratio {:.2}",
        always_rate / raw_sync_rate
    );
}
