//! R-LOG-2: kill -9 at random moments while appending under `Fsync::Always`; every acknowledged
//! record survives intact, offsets stay contiguous, no corrupt record is returned.
//!
//! The child is this test binary re-executed with `TIDINGS_KILL_CHILD_DIR` set; it appends and
//! prints `ACK <offset>` after each acknowledged append. `TIDINGS_KILL_CYCLES` sets the number of
//! cycles (default 50).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{assert_intact, read_all, record_for};
use tidings_log::testing::TestRng;
use tidings_log::{Fsync, Log, LogConfig};

const CHILD_ENV: &str = "TIDINGS_KILL_CHILD_DIR";

fn config() -> LogConfig {
    LogConfig {
        fsync: Fsync::Always,
        segment_bytes: 2048,
        index_interval_bytes: 256,
        ..LogConfig::default()
    }
}

fn child(dir: &str) -> ! {
    let (log, _) = Log::open(dir, config()).expect("child: open");
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
fn kill_loop() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(&dir);
    }
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
    for cycle in 0..cycles {
        let child = Command::new(&exe)
            .args(["--exact", "kill_loop", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &dir)
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

        let (log, report) = Log::open(&dir, config())
            .unwrap_or_else(|e| panic!("cycle {cycle}: reopen failed: {e}"));
        truncations += usize::from(report.truncated.is_some());
        let all = read_all(&log); // contiguous offsets from 0 (asserted inside)
        for r in &all {
            assert_intact(r); // R-LOG-2: no corrupt record returned
        }
        if let Some(a) = max_acked {
            // R-LOG-2: every acknowledged record is present.
            assert!(
                log.end_offset() > a,
                "cycle {cycle}: acked {a} but log ends at {}",
                log.end_offset()
            );
        }
        assert_eq!(log.start_offset(), 0);
    }
    eprintln!(
        "kill loop: {cycles} cycles, max acked {max_acked:?}, {truncations} torn tails truncated"
    );
}
