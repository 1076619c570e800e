//! The storage the log runs on: a small file-system interface, so that tests can inject faults.
//!
//! [`FsStorage`] is the real file system. [`SimStorage`](crate::testing::SimStorage) (in
//! [`testing`](crate::testing)) is an in-memory file system that counts operations, fails or
//! "loses power" after N of them, does short writes, and on a simulated power cut keeps only what
//! was synced.
//!
//! # Contract an implementation must keep
//!
//! * `write_at` may write fewer bytes than asked (a short write) and returns how many; it never
//!   reports success for bytes it did not take.
//! * `sync_data` returns only when every byte written to the file before the call — and the file
//!   length — survives a power cut (`fdatasync`).
//! * A created, renamed or removed name survives a power cut only after `sync_dir` on its
//!   directory returned.
//! * `rename` atomically replaces the target.
//! * After any error the log assumes nothing about what reached the medium.

mod fs;
pub(crate) mod sim;

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::Path;

pub use fs::FsStorage;

/// How to open an existing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Read only (the [`tools`](crate::tools) never write).
    Read,
    /// Read and write.
    ReadWrite,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The file name (not the full path).
    pub name: OsString,
    /// Whether the entry is a regular file (directories and others are `false`).
    pub is_file: bool,
}

/// A file system: the operations the log needs, nothing more. See the [module docs](self) for
/// the durability contract.
pub trait Storage: Send + Sync + fmt::Debug {
    /// Creates `dir` and its parents if missing.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Lists the entries of `dir`, in any order.
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<DirEntry>>;
    /// Creates `path` empty for reading and writing, truncating an existing file.
    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>>;
    /// Opens the existing file `path`.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>>;
    /// Atomically renames `from` to `to`, replacing `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes the file `path`.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Makes the entries of `dir` (creations, renames, removals) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Takes the exclusive lock of the log in `dir` (the file [`LOCK_FILE`]), held until the
    /// returned guard is dropped; `ErrorKind::WouldBlock` when another handle — in this or
    /// another process — holds it. The default takes no lock (in-memory storages).
    fn lock_dir(&self, _dir: &Path) -> io::Result<DirLock> {
        Ok(DirLock::none())
    }
}

/// The name of the lock file in a log directory.
pub const LOCK_FILE: &str = "LOCK";

/// The name of a file in a log directory that belongs to the application owning the log
/// (tidings keeps a stream's patterns and retention in it). The log never reads or writes
/// it and does not report it as a foreign file; a `META.tmp` left by an interrupted write
/// is removed on open like any other `*.tmp`.
pub const META_FILE: &str = "META";

/// An exclusive lock on a log directory; released on drop.
#[derive(Debug)]
pub struct DirLock {
    /// The locked file, kept open for the lock's life (the lock is released on close).
    _file: Option<std::fs::File>,
}

impl DirLock {
    /// A guard that holds no lock (for storages without one).
    #[must_use]
    pub fn none() -> Self {
        Self { _file: None }
    }

    pub(crate) fn held(file: std::fs::File) -> Self {
        Self { _file: Some(file) }
    }
}

/// An open file. Positional reads and writes only, so readers never disturb the writer.
pub trait StorageFile: Send + Sync + fmt::Debug {
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Whether the file is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Reads up to `buf.len()` bytes at `offset`; returns how many (0 at end of file).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes up to `buf.len()` bytes at `offset`; returns how many (possibly fewer).
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize>;
    /// Writes at the end of the file; returns how many bytes were written.
    fn append(&self, buf: &[u8]) -> io::Result<usize> {
        let len = self.len()?;
        self.write_at(buf, len)
    }
    /// Truncates or extends the file to `len` bytes.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Makes the file's data and length durable (`fdatasync`).
    fn sync_data(&self) -> io::Result<()>;
}

/// Reads exactly `buf.len()` bytes at `offset`, failing with `UnexpectedEof` if the file is
/// shorter.
pub(crate) fn read_exact_at(
    file: &dyn StorageFile,
    mut buf: &mut [u8],
    mut offset: u64,
) -> io::Result<()> {
    while !buf.is_empty() {
        match file.read_at(buf, offset) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `buf` at `offset`, looping over short writes.
pub(crate) fn write_all_at(
    file: &dyn StorageFile,
    mut buf: &[u8],
    mut offset: u64,
) -> io::Result<()> {
    while !buf.is_empty() {
        match file.write_at(buf, offset) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                buf = &buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads the whole file (used for small index files and by the tools).
pub(crate) fn read_all(file: &dyn StorageFile) -> io::Result<Vec<u8>> {
    let len = file.len()?;
    let len = usize::try_from(len).map_err(|_| io::Error::other("file too large"))?;
    let mut buf = vec![0; len];
    read_exact_at(file, &mut buf, 0)?;
    Ok(buf)
}
