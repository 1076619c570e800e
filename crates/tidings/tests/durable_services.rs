//! Durable feeders run by the driver (R-EXE-4): under the pool driver an idle durable
//! subscription costs no OS thread; under the tokio driver no commit fsync (or other
//! blocking file I/O) runs on a runtime worker; durable delivery, commits and the durable
//! DLQ work the same under the pool and tokio drivers.
//!
//! Real waiting here is bounded (generous timeouts) and assertions are on invariants, never
//! on timings.

// The fsync-blocking storage is used only by the tokio cases.
#![cfg_attr(not(feature = "tokio"), allow(unused_imports))]

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tidings::embedded::Fsync;
use tidings::embedded::{EmbeddedBackend, EmbeddedStreamOptions};
use tidings::{
    Broker, Driver, DurableSpec, DurableSubscription, HandlerError, Message, StreamConfig,
    SubscribeOptions,
};
use tidings_log::Storage;
use tidings_log::storage::{DirEntry, DirLock, OpenMode, StorageFile};
use tidings_log::testing::SimStorage;

const DATA: &str = "/data";
const PATIENCE: Duration = Duration::from_secs(60);

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn broker(storage: Arc<dyn Storage>, driver: Driver, commit_every: usize) -> Broker {
    let backend = EmbeddedBackend::with_storage(DATA, storage)
        .stream_defaults(EmbeddedStreamOptions::new().commit_every(commit_every));
    let b = Broker::builder()
        .durable_backend(Arc::new(backend))
        .driver(driver)
        .build()
        .unwrap();
    b.create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap();
    b
}

fn publish(b: &Broker, range: std::ops::Range<u64>) {
    for i in range {
        b.publish(Message::to("orders.created").payload(i.to_string()))
            .unwrap();
    }
}

/// A durable subscription recording the offsets it saw; the offset `reject` is rejected
/// (dead-lettered to the durable DLQ).
fn subscribe(
    b: &Broker,
    name: &str,
    seen: &Arc<Mutex<Vec<u64>>>,
    reject: Option<u64>,
) -> DurableSubscription {
    let s = seen.clone();
    b.subscribe(
        DurableSpec::new("orders").name(name),
        SubscribeOptions::new().capacity(8),
        move |m: &Message| {
            let offset = m.offset().unwrap();
            if Some(offset) == reject {
                return Err(HandlerError::reject("no"));
            }
            s.lock().push(offset);
            Ok(())
        },
    )
    .unwrap()
}

/// A small in-memory file system with no per-file descriptor and constant-cost syncs, so
/// 10,000 durable subscriptions (an offset file and a DLQ log each) fit in one test.
#[derive(Debug, Default)]
struct MemStorage {
    state: Mutex<MemState>,
}

#[derive(Debug, Default)]
struct MemState {
    dirs: BTreeSet<PathBuf>,
    files: BTreeMap<PathBuf, Arc<Mutex<Vec<u8>>>>,
}

#[derive(Debug)]
struct MemFile(Arc<Mutex<Vec<u8>>>);

fn not_found() -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, "no such file")
}

impl StorageFile for MemFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.lock().len() as u64)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let data = self.0.lock();
        let at = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(data.len());
        let n = buf.len().min(data.len() - at);
        buf[..n].copy_from_slice(&data[at..at + n]);
        Ok(n)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        let mut data = self.0.lock();
        let at = usize::try_from(offset).map_err(io::Error::other)?;
        if data.len() < at + buf.len() {
            data.resize(at + buf.len(), 0);
        }
        data[at..at + buf.len()].copy_from_slice(buf);
        Ok(buf.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(io::Error::other)?;
        self.0.lock().resize(len, 0);
        Ok(())
    }
    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }
}

impl Storage for MemStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        for d in dir.ancestors() {
            st.dirs.insert(d.to_path_buf());
        }
        Ok(())
    }
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<DirEntry>> {
        let st = self.state.lock();
        if !st.dirs.contains(dir) {
            return Err(not_found());
        }
        let under = |p: &&PathBuf| p.parent() == Some(dir);
        let name = |p: &PathBuf| p.file_name().unwrap_or_default().to_owned();
        let files = st
            .files
            .range(dir.to_path_buf()..)
            .map(|(p, _)| p)
            .take_while(|p| p.starts_with(dir))
            .filter(under)
            .map(|p| DirEntry {
                name: name(p),
                is_file: true,
            });
        let dirs = st
            .dirs
            .range(dir.to_path_buf()..)
            .take_while(|p| p.starts_with(dir))
            .filter(under)
            .map(|p| DirEntry {
                name: name(p),
                is_file: false,
            });
        Ok(files.chain(dirs).collect())
    }
    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let file = Arc::new(Mutex::new(Vec::new()));
        self.state
            .lock()
            .files
            .insert(path.to_path_buf(), file.clone());
        Ok(Box::new(MemFile(file)))
    }
    fn open(&self, path: &Path, _mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        let st = self.state.lock();
        let file = st.files.get(path).ok_or_else(not_found)?;
        Ok(Box::new(MemFile(file.clone())))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        let file = st.files.remove(from).ok_or_else(not_found)?;
        st.files.insert(to.to_path_buf(), file);
        Ok(())
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.state
            .lock()
            .files
            .remove(path)
            .map(drop)
            .ok_or_else(not_found)
    }
    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }
}

/// OS threads of this process.
fn os_threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

const CHILD: &str = "TIDINGS_THREAD_COUNT_CHILD";

/// R-EXE-4: runs the measurement below in a process of its own, so other tests' threads
/// (and the test harness's) cannot change the count while it is taken.
#[test]
fn idle_durable_subscriptions_cost_no_thread_under_the_pool() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "thread_count_with_10_and_10000_idle_durables",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("1 passed"),
        "the child ran no test: {stdout}"
    );
    let at = stdout
        .find("threads:")
        .unwrap_or_else(|| panic!("no measurement in {stdout}"));
    println!("{}", stdout[at..].lines().next().unwrap_or_default());
}

/// The measurement (run by the test above in a child process): OS threads with 10 idle
/// durable subscriptions, then with 10,000, under a pool of 2 workers.
#[test]
#[ignore = "run by idle_durable_subscriptions_cost_no_thread_under_the_pool"]
fn thread_count_with_10_and_10000_idle_durables() {
    assert!(
        std::env::var_os(CHILD).is_some(),
        "run by idle_durable_subscriptions_cost_no_thread_under_the_pool"
    );
    let b = broker(
        Arc::new(MemStorage::default()),
        Driver::Pool { workers: 2 },
        64,
    );
    publish(&b, 0..3);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut subs = Vec::new();
    let mut add = |n: usize| {
        while subs.len() < n {
            subs.push(subscribe(&b, &format!("d{}", subs.len()), &seen, None));
        }
        // Idle: every subscription read the stream to its end and delivered it.
        wait_until("idle", || seen.lock().len() == 3 * n);
        wait_until("committed", || subs.iter().all(|d| d.committed() == 3));
        os_threads()
    };
    let with_10 = add(10);
    let with_10000 = add(10_000);
    println!("threads: {with_10} with 10 idle durable subscriptions, {with_10000} with 10000");
    assert_eq!(with_10, with_10000); // R-EXE-4
    // Still live: an append reaches every one of them.
    publish(&b, 3..4);
    wait_until("the append", || seen.lock().len() == 4 * 10_000);
    drop(subs);
    b.close(Duration::from_secs(30));
}

/// Durable delivery, the commit rule and the durable DLQ under a driver: every offset is
/// delivered once or dead-lettered, the commit reaches the end, and a restart resumes there.
fn durable_round_trip(make: impl Fn(Arc<dyn Storage>) -> Broker) {
    let sim = SimStorage::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    {
        let b = make(Arc::new(sim.clone()));
        publish(&b, 0..40);
        let d = subscribe(&b, "bill", &seen, Some(7));
        publish(&b, 40..100);
        wait_until("commit", || d.committed() == 100);
        // R-LOG-3: every offset finished: delivered once, or in the durable DLQ.
        let delivered: BTreeSet<u64> = seen.lock().iter().copied().collect();
        assert_eq!(seen.lock().len(), 99, "each delivered once");
        assert_eq!(delivered, (0..100).filter(|o| *o != 7).collect());
        let dlq = d.durable_dead_letters().unwrap();
        assert_eq!(dlq.len(), 1); // R-DEL-4
        assert_eq!(dlq[0].message.offset(), Some(7));
        assert!(d.poisoned().is_none() && d.error().is_none());
        drop(d);
        b.close(Duration::from_secs(30));
    }
    // R-LOG-3: after a restart delivery resumes at the commit: nothing is redelivered.
    let b = make(Arc::new(sim));
    let again = Arc::new(Mutex::new(Vec::new()));
    let d = subscribe(&b, "bill", &again, None);
    assert_eq!(d.committed(), 100);
    publish(&b, 100..101);
    wait_until("the new message", || again.lock().len() == 1);
    assert_eq!(*again.lock(), [100]);
    drop(d);
    b.close(Duration::from_secs(30));
}

#[test]
fn durable_round_trip_under_the_pool_driver() {
    durable_round_trip(|s| broker(s, Driver::Pool { workers: 2 }, 4));
}

#[cfg(feature = "tokio")]
#[test]
fn durable_round_trip_under_the_tokio_driver() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let handle = rt.handle().clone();
    durable_round_trip(|s| broker(s, Driver::Tokio(handle.clone()), 4));
}

#[cfg(feature = "tokio")]
/// A storage whose fsyncs (file and directory) wait until the runtime thread has run
/// another task: made on the runtime thread they would wait forever, so they give up after
/// a bounded wait, fail, and count a violation.
#[derive(Debug)]
struct RuntimeGatedStorage {
    inner: SimStorage,
    gate: Arc<Gate>,
}

#[cfg(feature = "tokio")]
#[derive(Debug, Default)]
struct Gate {
    /// Bumped by a task on the runtime thread.
    ticks: AtomicU64,
    violations: AtomicU64,
    fsyncs: AtomicU64,
}

#[cfg(feature = "tokio")]
impl Gate {
    fn pass(&self) -> io::Result<()> {
        self.fsyncs.fetch_add(1, Ordering::SeqCst);
        let seen = self.ticks.load(Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.ticks.load(Ordering::SeqCst) == seen {
            if Instant::now() > deadline {
                self.violations.fetch_add(1, Ordering::SeqCst);
                return Err(io::Error::other("fsync blocked the runtime thread"));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }
}

#[cfg(feature = "tokio")]
#[derive(Debug)]
struct GatedFile {
    inner: Box<dyn StorageFile>,
    gate: Arc<Gate>,
}

#[cfg(feature = "tokio")]
impl StorageFile for GatedFile {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.inner.write_at(buf, offset)
    }
    fn append(&self, buf: &[u8]) -> io::Result<usize> {
        self.inner.append(buf)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.gate.pass()?;
        self.inner.sync_data()
    }
}

#[cfg(feature = "tokio")]
impl RuntimeGatedStorage {
    fn wrap(&self, f: Box<dyn StorageFile>) -> Box<dyn StorageFile> {
        Box::new(GatedFile {
            inner: f,
            gate: self.gate.clone(),
        })
    }
}

#[cfg(feature = "tokio")]
impl Storage for RuntimeGatedStorage {
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
        self.gate.pass()?;
        self.inner.sync_dir(dir)
    }
    fn lock_dir(&self, dir: &Path) -> io::Result<DirLock> {
        self.inner.lock_dir(dir)
    }
}

#[cfg(feature = "tokio")]
/// R-EXE-4: durable subscriptions on a current-thread runtime make
/// progress while their commits fsync (one per message) and dead letters are appended to
/// the durable DLQ with an fsync. Each fsync waits for the runtime thread to run another
/// task, so one made on the runtime thread would never return (here: fails after 5 s).
#[test]
fn durable_progress_on_a_current_thread_runtime_while_commits_fsync() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let handle = rt.handle().clone();
    let gate = Arc::new(Gate::default());
    let stop = Arc::new(AtomicBool::new(false));
    // The runtime's one thread: drives a ticker, and every task spawned on the handle.
    let runtime_thread = {
        let (gate, stop) = (gate.clone(), stop.clone());
        std::thread::spawn(move || {
            rt.block_on(async move {
                while !stop.load(Ordering::SeqCst) {
                    gate.ticks.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            });
        })
    };
    let storage = Arc::new(RuntimeGatedStorage {
        inner: SimStorage::new(),
        gate: gate.clone(),
    });
    let b = broker(storage, Driver::Tokio(handle), 1);
    publish(&b, 0..30);
    let (seen_a, seen_b) = (
        Arc::new(Mutex::new(Vec::new())),
        Arc::new(Mutex::new(Vec::new())),
    );
    let a = subscribe(&b, "a", &seen_a, Some(3));
    let c = subscribe(&b, "c", &seen_b, None);
    publish(&b, 30..60);
    wait_until("both committed to the end", || {
        a.committed() == 60 && c.committed() == 60 || a.poisoned().is_some()
    });
    // R-EXE-4: no fsync ran on the runtime thread; nothing was poisoned.
    assert_eq!(gate.violations.load(Ordering::SeqCst), 0);
    assert!(a.poisoned().is_none() && c.poisoned().is_none());
    assert_eq!(a.committed(), 60);
    assert_eq!(c.committed(), 60);
    assert_eq!(seen_a.lock().len(), 59);
    assert_eq!(seen_b.lock().len(), 60);
    // R-DEL-4: the dead letter reached the durable DLQ (an fsynced append).
    assert_eq!(a.durable_dead_letters().unwrap().len(), 1);
    assert!(gate.fsyncs.load(Ordering::SeqCst) >= 60);
    drop((a, c));
    let report = b.close(Duration::from_secs(30));
    assert!(report.unjoined.is_empty(), "{:?}", report.unjoined);
    stop.store(true, Ordering::SeqCst);
    runtime_thread.join().unwrap();
}

/// R-EXE-4, R-LOG-1: the retention service is run by the driver — the pool's timer and a
/// worker, or a tokio task — and sheds an idle stream's old segments when a manual clock
/// moves past their age.
fn retention_run_by_the_driver(driver: Driver) {
    const HOUR: Duration = Duration::from_secs(3600);
    let dir = tempfile::tempdir().unwrap();
    let clock = tidings::ManualClock::new();
    let backend = EmbeddedBackend::new(dir.path()).stream_options(
        "orders",
        EmbeddedStreamOptions::new()
            .fsync(Fsync::Never)
            .segment_bytes(256)
            .retention_interval(Duration::from_secs(60)),
    );
    let b = Broker::builder()
        .durable_backend(Arc::new(backend))
        .clock(clock.clone())
        .driver(driver)
        .build()
        .unwrap();
    let s = b
        .create_stream(
            StreamConfig::new("orders", ["orders.#"])
                .retention(tidings::Retention::new().max_age(HOUR)),
        )
        .unwrap();
    for i in 0..20 {
        b.publish(Message::to("orders.created").payload(format!("order number {i:04}")))
            .unwrap();
    }
    let end = s.end_offset();
    assert_eq!(s.start_offset(), 0);
    clock.advance(2 * HOUR);
    wait_until(
        "R-LOG-1: the idle stream's old segments are removed",
        || s.start_offset() > 0,
    );
    assert!(s.start_offset() < end); // R-LOG-1
    assert_eq!(s.end_offset(), end);
    let report = b.close(Duration::from_secs(30));
    assert!(report.unjoined.is_empty(), "{:?}", report.unjoined);
}

#[test]
fn retention_runs_on_the_pool() {
    retention_run_by_the_driver(Driver::Pool { workers: 2 });
}

#[cfg(feature = "tokio")]
#[test]
fn retention_runs_as_a_tokio_task() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    retention_run_by_the_driver(Driver::Tokio(rt.handle().clone()));
}

/// R-EXE-4, R-TIME-2: the scheduler's timer is run by the driver (the pool's timer and a
/// worker, or a tokio task): delayed messages — published ones and a durable subscription's
/// delayed records — are released when a manual clock reaches them, in due order.
fn scheduler_run_by_the_driver(driver: Driver) {
    let clock = tidings::ManualClock::new();
    let b = Broker::builder()
        .storage(Arc::new(SimStorage::new()))
        .data_dir(DATA)
        .clock(clock.clone())
        .driver(driver)
        .build()
        .unwrap();
    b.create_stream(StreamConfig::new("orders", ["orders.#"]))
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let _sub = b
        .subscribe("t", SubscribeOptions::default(), move |m: &Message| {
            s.lock()
                .push(String::from_utf8_lossy(m.payload()).into_owned());
            Ok(())
        })
        .unwrap();
    let durable_seen = Arc::new(Mutex::new(Vec::new()));
    let d = subscribe(&b, "late", &durable_seen, None);
    let ms = Duration::from_millis(1);
    for (payload, delay) in [("d300", 300), ("d100", 100), ("d200", 200)] {
        b.publish(Message::to("t").payload(payload).delay(delay * ms))
            .unwrap();
    }
    b.publish(Message::to("orders.created").payload("0").delay(150 * ms))
        .unwrap();
    clock.advance(120 * ms);
    wait_until("the first due message", || seen.lock().len() == 1);
    assert!(durable_seen.lock().is_empty()); // R-TIME-2: not yet due
    clock.advance(200 * ms);
    wait_until("every due message", || {
        seen.lock().len() == 3 && durable_seen.lock().len() == 1
    });
    assert_eq!(*seen.lock(), ["d100", "d200", "d300"]); // R-TIME-2: due order
    drop(d);
    let report = b.close(Duration::from_secs(30));
    assert!(report.unjoined.is_empty(), "{:?}", report.unjoined);
    assert!(report.undelivered.is_empty());
}

#[test]
fn scheduler_runs_on_the_pool() {
    scheduler_run_by_the_driver(Driver::Pool { workers: 2 });
}

#[test]
fn scheduler_runs_on_a_thread() {
    scheduler_run_by_the_driver(Driver::Thread);
}

#[cfg(feature = "tokio")]
#[test]
fn scheduler_runs_as_a_tokio_task() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    scheduler_run_by_the_driver(Driver::Tokio(rt.handle().clone()));
}
