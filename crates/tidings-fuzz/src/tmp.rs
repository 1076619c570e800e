//! Where file-based targets write their inputs.

use std::path::PathBuf;

/// A fresh directory for a target that writes its input as files and opens them through the
/// real open path: under `/dev/shm` when that is a writable memory file system (an fsync
/// there costs nothing, so a run executes thousands of inputs rather than dozens), else
/// under the system's temporary directory. The path is new for every call; the caller
/// removes it.
///
/// # Panics
/// When no directory can be created.
#[must_use]
pub fn scratch_dir(target: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let leaf = format!("tidings-fuzz-{target}-{}-{n}", std::process::id());
    let shm = PathBuf::from("/dev/shm");
    for root in [shm, std::env::temp_dir()] {
        let dir = root.join(&leaf);
        if std::fs::create_dir_all(&dir).is_ok() {
            return dir;
        }
    }
    panic!("no scratch directory for fuzz target {target}")
}
