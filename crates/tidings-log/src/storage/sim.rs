//! `SimStorage`: an in-memory file system with fault injection and simulated power cuts.
//!
//! # Model
//!
//! Every file (inode) has its *current* bytes and its *durable* bytes; `sync_data` copies current
//! to durable. Writes and truncations since the last sync are kept, in order, as *pending*
//! operations. Names live in a *current* namespace and a *durable* namespace; `sync_dir` copies
//! the entries of one directory from current to durable. Directories themselves are always
//! durable.
//!
//! A power cut ([`SimStorage::power_cut`]) replaces the current state by what survives under a
//! [`CrashMode`]: the durable namespace (so a file created or renamed in a directory that was
//! never synced disappears or keeps its old name), and for each file its durable bytes plus,
//! depending on the mode, nothing ([`CrashMode::DropUnsynced`]: a file that grew without a sync is
//! back at its old length), zeros to the new length ([`CrashMode::ZeroFillUnsynced`]: the length
//! reached the disk but the data did not), or an in-order prefix of the pending writes whose last
//! write may be torn ([`CrashMode::RandomPrefix`]). Handles opened before the cut fail afterwards.
//!
//! Faults: [`SimStorage::crash_after`] makes every operation after the next N fail (power is
//! gone, nothing more reaches the "disk"); [`SimStorage::fail_nth`] and
//! [`SimStorage::fail_from`] inject I/O errors on chosen operation kinds;
//! [`SimStorage::set_short_writes`] makes `write_at` take a random prefix of its buffer;
//! [`SimStorage::set_sync_delay`] makes syncs slow (to exercise group commit);
//! [`SimStorage::pause_syncs`] holds syncs until [`SimStorage::resume_syncs`] (to freeze a
//! background sync at a chosen point, deterministically).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::{DirEntry, OpenMode, Storage, StorageFile};
use crate::testing::TestRng;

/// What survives a simulated power cut, besides everything that was synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// Unsynced writes and length changes are lost.
    DropUnsynced,
    /// Unsynced growth keeps its length but reads back as zeros.
    ZeroFillUnsynced,
    /// A seeded random in-order prefix of each file's unsynced writes survives; the last
    /// surviving write may be torn (only a prefix of it reached the disk).
    RandomPrefix {
        /// Seed of the choice.
        seed: u64,
    },
}

/// Which operations an injected fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimOp {
    /// Every storage operation.
    Any,
    /// `write_at` / `append` only.
    Write,
    /// `sync_data` and `sync_dir` only.
    Sync,
}

/// An in-memory [`Storage`] with fault injection. Cloning gives
/// another handle to the same file system ([`SimStorage::fork`] gives an independent copy).
///
/// # Model
///
/// Every file has *current* and *durable* bytes; `sync_data` copies current to durable; writes
/// since the last sync are kept in order as *pending*. Names live in a current and a durable
/// namespace; `sync_dir` copies one directory's entries to durable (directories themselves are
/// always durable). [`SimStorage::power_cut`] keeps the durable namespace and, per file, the
/// durable bytes plus what the [`CrashMode`] says: nothing (a file that grew without a sync is
/// back at its old length), zeros up to the new length (length reached the disk, data did not),
/// or an in-order prefix of the pending writes, the last one possibly torn. A file created or
/// renamed in a directory that was never synced disappears or keeps its old name. Handles opened
/// before the cut fail afterwards.
#[derive(Debug, Clone, Default)]
pub struct SimStorage {
    state: Arc<Mutex<State>>,
    /// Signalled when [`SimStorage::resume_syncs`] opens the sync gate.
    gate: Arc<Condvar>,
}

#[derive(Debug, Clone, Default)]
struct Inode {
    data: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Pending>,
}

#[derive(Debug, Clone)]
enum Pending {
    Write(u64, Vec<u8>),
    SetLen(u64),
}

#[derive(Debug, Clone, Copy)]
struct Fault {
    op: SimOp,
    remaining: u64,
    sticky: bool,
}

#[derive(Debug, Clone, Default)]
struct State {
    inodes: HashMap<u64, Inode>,
    names: BTreeMap<PathBuf, u64>,
    durable_names: BTreeMap<PathBuf, u64>,
    dirs: BTreeSet<PathBuf>,
    next_ino: u64,
    generation: u64,
    ops: u64,
    syncs: u64,
    dir_syncs: u64,
    crash_in: Option<u64>,
    crashed: bool,
    fault: Option<Fault>,
    short_writes: Option<TestRng>,
    sync_delay: Option<Duration>,
    /// `sync_data` calls block while set (see [`SimStorage::pause_syncs`]).
    pause_files: bool,
    /// `sync_dir` calls block while set.
    pause_dirs: bool,
    /// Syncs blocked at the gate right now.
    paused: usize,
}

fn power_gone() -> io::Error {
    io::Error::other("simulated power cut: storage is gone")
}

impl State {
    /// Counts one operation of kind `op` and applies the fault plan.
    fn op(&mut self, op: SimOp) -> io::Result<()> {
        self.ops += 1;
        if self.crashed {
            return Err(power_gone());
        }
        if let Some(n) = self.crash_in.as_mut() {
            if *n == 0 {
                self.crashed = true;
                return Err(power_gone());
            }
            *n -= 1;
        }
        if let Some(f) = self.fault.as_mut()
            && (f.op == SimOp::Any || f.op == op)
        {
            if f.remaining == 0 {
                if !f.sticky {
                    self.fault = None;
                }
                return Err(io::Error::other("injected I/O fault"));
            }
            f.remaining -= 1;
        }
        Ok(())
    }

    fn parent_exists(&self, path: &Path) -> io::Result<()> {
        match path.parent() {
            Some(p) if self.dirs.contains(p) => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::NotFound,
                "parent directory missing",
            )),
        }
    }
}

/// Blocks while the gate for this kind of sync is closed (before the sync counts as an
/// operation, so faults and crash points apply to it once it goes through).
fn pass_gate(state: &Mutex<State>, gate: &Condvar, dir: bool) {
    let mut st = state.lock();
    let closed = |st: &State| if dir { st.pause_dirs } else { st.pause_files };
    if !closed(&st) {
        return;
    }
    st.paused += 1;
    while closed(&st) {
        gate.wait(&mut st);
    }
    st.paused -= 1;
}

#[derive(Debug)]
struct SimFile {
    state: Arc<Mutex<State>>,
    gate: Arc<Condvar>,
    ino: u64,
    generation: u64,
    writable: bool,
}

impl SimFile {
    fn with<T>(
        &self,
        op: SimOp,
        f: impl FnOnce(&mut State, u64) -> io::Result<T>,
    ) -> io::Result<T> {
        let mut st = self.state.lock();
        if st.generation != self.generation {
            st.ops += 1;
            return Err(io::Error::other(
                "stale handle from before a simulated power cut",
            ));
        }
        st.op(op)?;
        f(&mut st, self.ino)
    }
}

fn inode(st: &mut State, ino: u64) -> &mut Inode {
    st.inodes.entry(ino).or_default()
}

impl StorageFile for SimFile {
    fn len(&self) -> io::Result<u64> {
        self.with(SimOp::Any, |st, ino| Ok(inode(st, ino).data.len() as u64))
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.with(SimOp::Any, |st, ino| {
            let data = &inode(st, ino).data;
            let Ok(start) = usize::try_from(offset) else {
                return Ok(0);
            };
            if start >= data.len() {
                return Ok(0);
            }
            let n = buf.len().min(data.len() - start);
            buf[..n].copy_from_slice(&data[start..start + n]);
            Ok(n)
        })
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        if !self.writable {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "opened read-only",
            ));
        }
        self.with(SimOp::Write, |st, ino| {
            let mut n = buf.len();
            if let Some(rng) = st.short_writes.as_mut()
                && n > 1
                && rng.below(2) == 0
            {
                n = 1 + rng.below(n as u64 - 1) as usize;
            }
            let start = usize::try_from(offset).map_err(io::Error::other)?;
            let node = inode(st, ino);
            if node.data.len() < start + n {
                node.data.resize(start + n, 0);
            }
            node.data[start..start + n].copy_from_slice(&buf[..n]);
            node.pending.push(Pending::Write(offset, buf[..n].to_vec()));
            Ok(n)
        })
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "opened read-only",
            ));
        }
        self.with(SimOp::Write, |st, ino| {
            let node = inode(st, ino);
            node.data
                .resize(usize::try_from(len).map_err(io::Error::other)?, 0);
            node.pending.push(Pending::SetLen(len));
            Ok(())
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        pass_gate(&self.state, &self.gate, false);
        let delay = self.with(SimOp::Sync, |st, ino| {
            st.syncs += 1;
            let node = inode(st, ino);
            node.durable.clone_from(&node.data);
            node.pending.clear();
            Ok(st.sync_delay)
        })?;
        if let Some(d) = delay {
            std::thread::sleep(d);
        }
        Ok(())
    }
}

impl Storage for SimStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        st.op(SimOp::Any)?;
        for a in dir.ancestors() {
            if !a.as_os_str().is_empty() {
                st.dirs.insert(a.to_path_buf());
            }
        }
        Ok(())
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<DirEntry>> {
        let mut st = self.state.lock();
        st.op(SimOp::Any)?;
        if !st.dirs.contains(dir) {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no such directory"));
        }
        let files = st
            .names
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .map(|p| (p, true));
        let dirs = st
            .dirs
            .iter()
            .filter(|p| p.parent() == Some(dir))
            .map(|p| (p, false));
        Ok(files
            .chain(dirs)
            .filter_map(|(p, is_file)| {
                Some(DirEntry {
                    name: p.file_name()?.to_os_string(),
                    is_file,
                })
            })
            .collect())
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let mut st = self.state.lock();
        st.op(SimOp::Any)?;
        st.parent_exists(path)?;
        if st.dirs.contains(path) {
            return Err(io::Error::other("is a directory"));
        }
        let ino = match st.names.get(path) {
            Some(&ino) => {
                let node = inode(&mut st, ino);
                node.data.clear();
                node.pending.push(Pending::SetLen(0));
                ino
            }
            None => {
                st.next_ino += 1;
                let ino = st.next_ino;
                st.inodes.insert(ino, Inode::default());
                st.names.insert(path.to_path_buf(), ino);
                ino
            }
        };
        Ok(Box::new(SimFile {
            state: self.state.clone(),
            gate: self.gate.clone(),
            ino,
            generation: st.generation,
            writable: true,
        }))
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        let mut st = self.state.lock();
        st.op(SimOp::Any)?;
        if st.dirs.contains(path) {
            return Err(io::Error::other("is a directory"));
        }
        let ino = *st
            .names
            .get(path)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such file"))?;
        Ok(Box::new(SimFile {
            state: self.state.clone(),
            gate: self.gate.clone(),
            ino,
            generation: st.generation,
            writable: mode == OpenMode::ReadWrite,
        }))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        st.op(SimOp::Any)?;
        st.parent_exists(to)?;
        let ino = st
            .names
            .remove(from)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such file"))?;
        st.names.insert(to.to_path_buf(), ino);
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        st.op(SimOp::Any)?;
        st.names
            .remove(path)
            .map(drop)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such file"))
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        pass_gate(&self.state, &self.gate, true);
        let mut st = self.state.lock();
        st.op(SimOp::Sync)?;
        st.dir_syncs += 1;
        let st = &mut *st;
        st.durable_names.retain(|p, _| p.parent() != Some(dir));
        for (p, &ino) in &st.names {
            if p.parent() == Some(dir) {
                st.durable_names.insert(p.clone(), ino);
            }
        }
        Ok(())
    }
}

impl SimStorage {
    /// An empty file system.
    pub fn new() -> Self {
        Self::default()
    }

    /// The next `ops` operations succeed (subject to other faults); every operation after them
    /// fails as if power were gone, until [`power_cut`](Self::power_cut).
    pub fn crash_after(&self, ops: u64) {
        self.state.lock().crash_in = Some(ops);
    }

    /// Whether a [`crash_after`](Self::crash_after) point was reached.
    pub fn has_crashed(&self) -> bool {
        self.state.lock().crashed
    }

    /// The operation of kind `op` after the next `n` such operations fails once with an I/O error.
    pub fn fail_nth(&self, op: SimOp, n: u64) {
        self.state.lock().fault = Some(Fault {
            op,
            remaining: n,
            sticky: false,
        });
    }

    /// Every operation of kind `op` after the next `n` such operations fails with an I/O error.
    pub fn fail_from(&self, op: SimOp, n: u64) {
        self.state.lock().fault = Some(Fault {
            op,
            remaining: n,
            sticky: true,
        });
    }

    /// Removes injected faults (not a pending crash).
    pub fn clear_faults(&self) {
        self.state.lock().fault = None;
    }

    /// With `Some(seed)`, about half of the `write_at` calls write a random shorter prefix.
    pub fn set_short_writes(&self, seed: Option<u64>) {
        self.state.lock().short_writes = seed.map(TestRng::new);
    }

    /// Every `sync_data` sleeps this long after taking effect (outside the internal lock).
    pub fn set_sync_delay(&self, delay: Option<Duration>) {
        self.state.lock().sync_delay = delay;
    }

    /// From now on, every `sync_data` (with `files`) and every `sync_dir` (with `dirs`) blocks,
    /// without taking effect, until [`resume_syncs`](Self::resume_syncs). Lets a test hold a
    /// background sync at a known point; [`paused_syncs`](Self::paused_syncs) tells when one is
    /// waiting. Resume before dropping anything that waits for those syncs.
    pub fn pause_syncs(&self, files: bool, dirs: bool) {
        let mut st = self.state.lock();
        st.pause_files = files;
        st.pause_dirs = dirs;
    }

    /// Opens the gate closed by [`pause_syncs`](Self::pause_syncs): blocked syncs go ahead.
    pub fn resume_syncs(&self) {
        let mut st = self.state.lock();
        st.pause_files = false;
        st.pause_dirs = false;
        self.gate.notify_all();
    }

    /// How many syncs are blocked by [`pause_syncs`](Self::pause_syncs) right now.
    pub fn paused_syncs(&self) -> usize {
        self.state.lock().paused
    }

    /// Simulates a power cut and reboot: keeps what `mode` says survives, clears faults and the
    /// crash point, and invalidates every handle opened before.
    pub fn power_cut(&self, mode: CrashMode) {
        let mut st = self.state.lock();
        let st = &mut *st;
        st.names = st.durable_names.clone();
        let live: BTreeSet<u64> = st.names.values().copied().collect();
        st.inodes.retain(|ino, _| live.contains(ino));
        for (&ino, node) in st.inodes.iter_mut() {
            let cur_len = node.data.len();
            let mut data = node.durable.clone();
            match mode {
                CrashMode::DropUnsynced => {}
                CrashMode::ZeroFillUnsynced => {
                    if cur_len > data.len() {
                        data.resize(cur_len, 0);
                    }
                }
                CrashMode::RandomPrefix { seed } => {
                    let mut rng = TestRng::new(seed ^ ino.wrapping_mul(0x9e37_79b9_7f4a_7c15));
                    let keep = rng.below(node.pending.len() as u64 + 1) as usize;
                    for (i, p) in node.pending.iter().enumerate().take(keep + 1) {
                        match p {
                            Pending::SetLen(len) if i < keep => data.resize(*len as usize, 0),
                            Pending::Write(off, bytes) => {
                                let n = if i < keep {
                                    bytes.len()
                                } else {
                                    rng.below(bytes.len() as u64 + 1) as usize
                                };
                                let off = *off as usize;
                                if data.len() < off + n {
                                    data.resize(off + n, 0);
                                }
                                data[off..off + n].copy_from_slice(&bytes[..n]);
                            }
                            Pending::SetLen(_) => {}
                        }
                    }
                }
            }
            node.data = data.clone();
            node.durable = data;
            node.pending.clear();
        }
        st.generation += 1;
        st.crashed = false;
        st.crash_in = None;
        st.fault = None;
    }

    /// An independent deep copy of the file system (faults and counters reset).
    pub fn fork(&self) -> SimStorage {
        let st = self.state.lock();
        let mut copy = st.clone();
        copy.generation += 1;
        copy.ops = 0;
        copy.syncs = 0;
        copy.dir_syncs = 0;
        copy.crash_in = None;
        copy.crashed = false;
        copy.fault = None;
        copy.pause_files = false;
        copy.pause_dirs = false;
        copy.paused = 0;
        SimStorage {
            state: Arc::new(Mutex::new(copy)),
            gate: Arc::default(),
        }
    }

    /// Number of operations so far (including failed ones).
    pub fn op_count(&self) -> u64 {
        self.state.lock().ops
    }

    /// Number of successful file syncs so far.
    pub fn sync_count(&self) -> u64 {
        self.state.lock().syncs
    }

    /// Number of successful directory syncs so far.
    pub fn dir_sync_count(&self) -> u64 {
        self.state.lock().dir_syncs
    }

    /// Current contents of `path`, if it exists.
    pub fn read_file(&self, path: &Path) -> Option<Vec<u8>> {
        let st = self.state.lock();
        let ino = st.names.get(path)?;
        st.inodes.get(ino).map(|n| n.data.clone())
    }

    /// Creates or replaces `path` with `bytes`, durably (as if written, synced and dir-synced).
    /// Creates missing parent directories.
    pub fn write_file(&self, path: &Path, bytes: &[u8]) {
        let mut st = self.state.lock();
        if let Some(parent) = path.parent() {
            for a in parent.ancestors().filter(|a| !a.as_os_str().is_empty()) {
                st.dirs.insert(a.to_path_buf());
            }
        }
        let ino = match st.names.get(path) {
            Some(&ino) => ino,
            None => {
                st.next_ino += 1;
                st.next_ino
            }
        };
        st.names.insert(path.to_path_buf(), ino);
        st.durable_names.insert(path.to_path_buf(), ino);
        st.inodes.insert(
            ino,
            Inode {
                data: bytes.to_vec(),
                durable: bytes.to_vec(),
                pending: Vec::new(),
            },
        );
    }

    /// Removes `path` durably; returns whether it existed.
    pub fn delete_file(&self, path: &Path) -> bool {
        let mut st = self.state.lock();
        st.durable_names.remove(path);
        st.names.remove(path).is_some()
    }

    /// Creates a directory (durably).
    pub fn create_dir(&self, path: &Path) {
        let mut st = self.state.lock();
        for a in path.ancestors().filter(|a| !a.as_os_str().is_empty()) {
            st.dirs.insert(a.to_path_buf());
        }
    }

    /// Flips bit `bit` (0 = least significant bit of byte 0) of `path`, durably. Returns `false`
    /// if the file does not exist or is too short.
    pub fn flip_bit(&self, path: &Path, bit: u64) -> bool {
        let Some(mut bytes) = self.read_file(path) else {
            return false;
        };
        let Some(b) = bytes.get_mut((bit / 8) as usize) else {
            return false;
        };
        *b ^= 1 << (bit % 8);
        self.write_file(path, &bytes);
        true
    }

    /// Current files and their contents, sorted by path.
    pub fn snapshot(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        let st = self.state.lock();
        st.names
            .iter()
            .map(|(p, ino)| {
                (
                    p.clone(),
                    st.inodes
                        .get(ino)
                        .map(|n| n.data.clone())
                        .unwrap_or_default(),
                )
            })
            .collect()
    }
}
