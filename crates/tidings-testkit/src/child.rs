//! Child processes for tests that need real OS processes: the test binary runs itself again
//! with one ignored test selected, so a child is ordinary test code with its own broker.
//!
//! A child is killed (SIGKILL) and reaped when its [`TestChild`] is dropped, so a failing
//! test never leaves a process behind; a [`ScratchDir`] removes its files on drop.
//!
//! ```no_run
//! use std::time::Duration;
//! use tidings_testkit::child::{ScratchDir, TestChild, wait_until};
//!
//! // In the parent test:
//! let dir = ScratchDir::new("my-test");
//! let mut child = TestChild::spawn("child_entry", [("MY_ROLE", "worker")]);
//! wait_until("the child is ready", Duration::from_secs(60), || dir.path().join("ready").exists());
//! child.kill();
//! ```

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A child process running one ignored test of the current test binary; SIGKILLed and
/// reaped on drop.
#[derive(Debug)]
pub struct TestChild {
    process: Child,
}

impl TestChild {
    /// Starts the current test binary again, running only the ignored test `entry` (given
    /// `--exact`), with the extra environment `envs`. Its standard input and output are
    /// closed; its standard error is inherited, so a child's panic shows in the test's output.
    ///
    /// The entry test must return at once when its role variable is not set, since a plain
    /// `cargo test -- --ignored` runs it in the parent too.
    ///
    /// # Panics
    /// When the test binary cannot be found or started.
    #[must_use]
    pub fn spawn<K, V>(entry: &str, envs: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        let process = Command::new(std::env::current_exe().expect("the test binary's path"))
            .args([
                "--ignored",
                "--exact",
                entry,
                "--nocapture",
                "--test-threads=1",
            ])
            .envs(envs)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start a child process");
        Self { process }
    }

    /// Takes over a child the caller started itself (another command line, a piped
    /// standard output to read a protocol from): it is SIGKILLed and reaped on drop like
    /// one [`spawn`](Self::spawn) started.
    #[must_use]
    pub fn adopt(process: Child) -> Self {
        Self { process }
    }

    /// The child's standard output, when the caller started it piped (see
    /// [`adopt`](Self::adopt)); `None` otherwise or once taken.
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.process.stdout.take()
    }

    /// The child's process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// SIGKILL, then reap. Killing a child that already exited is not an error.
    ///
    /// # Panics
    /// When the child cannot be reaped.
    pub fn kill(&mut self) {
        let _ = self.process.kill();
        self.process.wait().expect("reap the child");
    }

    /// Sends `SIGSTOP` (`stop == true`) or `SIGCONT` through the system's `kill` command.
    ///
    /// # Panics
    /// When the signal cannot be sent.
    pub fn pause(&self, stop: bool) {
        let signal = if stop { "-STOP" } else { "-CONT" };
        let status = Command::new("kill")
            .args([signal, &self.pid().to_string()])
            .status()
            .expect("run kill(1)");
        assert!(status.success(), "kill {signal} {} failed", self.pid());
    }

    /// Whether the child has exited, without waiting.
    ///
    /// # Panics
    /// When the child's state cannot be read.
    #[must_use]
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.process.try_wait().expect("poll the child")
    }

    /// Waits (bounded by `patience`) for the child to exit by itself, and asserts it succeeded.
    ///
    /// # Panics
    /// When it does not exit within `patience`, or exits with a failure.
    pub fn wait_success(&mut self, patience: Duration) {
        let deadline = Instant::now() + patience;
        loop {
            if let Some(status) = self.exited() {
                assert!(status.success(), "child exited with {status}");
                return;
            }
            assert!(
                Instant::now() < deadline,
                "child {} did not exit within {patience:?}",
                self.pid()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for TestChild {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// A fresh directory under the system's temporary directory, removed with its files on drop.
#[derive(Debug)]
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Creates `tidings-<name>-<pid>-<n>` (emptied first if a crashed run left it).
    ///
    /// # Panics
    /// When the directory cannot be created.
    #[must_use]
    pub fn new(name: &str) -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tidings-{name}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create the scratch directory");
        Self(dir)
    }

    /// The directory.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Polls `cond` every 10 ms until it holds.
///
/// # Panics
/// When it does not hold within `patience` (the message names `what`): a bounded wait for an
/// invariant, never a timing assertion.
pub fn wait_until(what: &str, patience: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + patience;
    while !cond() {
        assert!(Instant::now() < deadline, "not within {patience:?}: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How many entries of `dir` have names starting with `prefix` (e.g. `ready-` files that
/// children write once subscribed).
#[must_use]
pub fn count_files(dir: &Path, prefix: &str) -> usize {
    fs::read_dir(dir).map_or(0, |d| {
        d.filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
            .count()
    })
}

/// The complete lines of a file other processes are appending to, one `write(2)` per line.
///
/// `O_APPEND` keeps writers' lines whole and in one order, but a *reader* racing a writer
/// can see a line whose bytes are only partly placed (the kernel publishes a write's size
/// page by page), so a last line without its newline is left for the next read. The cut is
/// made on bytes, before decoding: a character split by the race is never seen, and a line
/// that is not UTF-8 (a writer killed mid-line) is decoded lossily rather than hiding every
/// other line. A missing file has no lines.
#[must_use]
pub fn complete_lines(path: &Path) -> Vec<String> {
    let bytes = fs::read(path).unwrap_or_default();
    let complete = bytes
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |end| end + 1);
    String::from_utf8_lossy(&bytes[..complete])
        .lines()
        .map(str::to_owned)
        .collect()
}
