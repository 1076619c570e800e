//! R-LOG-2: kill -9 at random moments while appending; every acknowledged record survives
//! intact, offsets stay contiguous, no corrupt record is returned. Under `Fsync::Always` an
//! append is acknowledged once synced; under `Fsync::Never` with no write buffer, once handed to
//! the OS — which a process kill does not undo, even while the segment holding it waits for its
//! asynchronous seal under a temporary name (recovery adopts it).
//!
//! The child is this test binary re-executed with `TIDINGS_KILL_CHILD_DIR` (and
//! `TIDINGS_KILL_CHILD_FSYNC`) set; it appends and prints `ACK <offset>` after each acknowledged
//! append. `TIDINGS_KILL_CYCLES` sets the number of cycles per policy (default 50).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{assert_intact, read_all, record_for};
use tidings_log::testing::TestRng;
use tidings_log::{Fsync, Log, LogConfig};

const CHILD_ENV: &str = "TIDINGS_KILL_CHILD_DIR";
const CHILD_FSYNC_ENV: &str = "TIDINGS_KILL_CHILD_FSYNC";

/// `always`, or `never` (every append handed to the OS at once).
fn config(policy: &str) -> LogConfig {
    let (fsync, write_buffer_bytes) = match policy {
        "never" => (Fsync::Never, 0),
        _ => (Fsync::Always, LogConfig::default().write_buffer_bytes),
    };
    LogConfig::new()
        .fsync(fsync)
        .write_buffer_bytes(write_buffer_bytes)
        .segment_bytes(2048)
        .index_interval_bytes(256)
}

fn child(dir: &str) -> ! {
    let policy = std::env::var(CHILD_FSYNC_ENV).unwrap_or_default();
    let (log, _) = Log::open(dir, config(&policy)).expect("child: open");
    let mut out = std::io::stdout().lock();
    // Bounded so a lost child cannot run forever.
    for _ in 0..50_000 {
        let off = log.next_offset();
        let got = log.append(&record_for(off)).expect("child: append");
        assert_eq!(got, off);
        writeln!(out, "ACK {got}").expect("child: stdout");
        out.flush().expect("child: flush");
    }
    std::process::exit(0);
}

/// Kills the child if the parent panics.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn parse_ack(line: &str) -> Option<u64> {
    line.strip_prefix("ACK ")?.trim().parse().ok()
}

#[test]
fn kill_loop_always() {
    kill_loop("always", "kill_loop_always");
}

#[test]
fn kill_loop_never() {
    kill_loop("never", "kill_loop_never");
}

/// One kill loop at a time in this test process. A directory lock is an `flock` on an open
/// file, and a child being spawned holds a copy of every open file of its parent until it
/// execs: while one loop spawns its child, the other loop's freshly closed log could stay
/// locked by that copy for a moment, and its next open would fail with `Locked`.
static ONE_LOOP_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn kill_loop(policy: &str, test_name: &str) {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(&dir);
    }
    let _alone = ONE_LOOP_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let cycles: u64 = std::env::var("TIDINGS_KILL_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let seed = std::env::var("TIDINGS_KILL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed);
    let mut rng = TestRng::new(seed);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("stream");
    let exe = std::env::current_exe().unwrap();
    let mut max_acked: Option<u64> = None;
    let mut truncations = 0;
    let mut adopted = 0;
    for cycle in 0..cycles {
        let child = Command::new(&exe)
            .args(["--exact", test_name, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &dir)
            .env(CHILD_FSYNC_ENV, policy)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut child = KillOnDrop(child);
        let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
        let mut note = |line: String| {
            if let Some(a) = parse_ack(&line) {
                max_acked = Some(max_acked.map_or(a, |m| m.max(a)));
            }
        };
        if rng.below(2) == 0 {
            // Kill after a random number of acknowledgements.
            let want = rng.below(25);
            let mut seen = 0;
            while seen < want {
                let line = lines.next().expect("child exited early").unwrap();
                seen += u64::from(parse_ack(&line).is_some());
                note(line);
            }
        } else {
            // Kill after a random short delay (possibly before or during open).
            std::thread::sleep(Duration::from_micros(rng.below(15_000)));
        }
        child.0.kill().unwrap();
        // Acks printed before the kill are still in the pipe: they count too.
        for line in lines {
            note(line.unwrap());
        }
        child.0.wait().unwrap();
        drop(child);

        let (log, report) = Log::open(&dir, config(policy))
            .unwrap_or_else(|e| panic!("{policy}, cycle {cycle}: reopen failed: {e}"));
        truncations += usize::from(report.truncated.is_some());
        adopted += report.adopted_segments.len();
        let all = read_all(&log); // contiguous offsets from 0 (asserted inside)
        for r in &all {
            assert_intact(r); // R-LOG-2: no corrupt record returned
        }
        if let Some(a) = max_acked {
            // R-LOG-2: every acknowledged record is present.
            assert!(
                log.end_offset() > a,
                "{policy}, cycle {cycle}: acked {a} but log ends at {} ({report})",
                log.end_offset()
            );
        }
        assert_eq!(log.start_offset(), 0);
    }
    eprintln!(
        "kill loop ({policy}): {cycles} cycles, max acked {max_acked:?}, {truncations} torn \
         tails truncated, {adopted} unpublished segments adopted"
    );
}
