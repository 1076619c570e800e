//! The background writeback of the active segment under `Never` and `Interval`: what it marks
//! durable survives a power cut (R-LOG-2), and a failed background sync poisons the writer
//! instead of being forgotten (R-LOG-2: nothing claims durability it does not have).

mod common;

use std::time::{Duration, Instant};

use common::{read_all, record_for, sim_open};
use tidings_log::testing::{CrashMode, SimOp, SimStorage};
use tidings_log::{AppendError, Fsync, LogConfig, Record};

/// 1 MiB segments (writeback every 128 KiB), every append handed to the storage at once.
fn config() -> LogConfig {
    LogConfig::new()
        .fsync(Fsync::Never)
        .segment_bytes(1 << 20)
        .write_buffer_bytes(0)
}

fn big(offset: u64) -> Record {
    let mut r = record_for(offset);
    r.payload = vec![offset as u8; 1000].into();
    r
}

/// Waits (bounded) until `cond` holds; the writeback runs on its own thread.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn writeback_makes_records_durable_without_a_sync_call() {
    for mode in [
        CrashMode::DropUnsynced,
        CrashMode::ZeroFillUnsynced,
        CrashMode::RandomPrefix { seed: 7 },
    ] {
        let sim = SimStorage::new();
        let (log, _) = sim_open(&sim, config()).unwrap();
        // 200 records of ~1 KiB: past the 128 KiB writeback step, within one segment.
        for o in 0..200 {
            assert_eq!(log.append(&big(o)).unwrap(), o);
        }
        eventually("the writeback to cover the first step", || {
            log.durable_offset() >= 100
        });
        let durable = log.durable_offset();
        assert!(durable <= 200);
        // Power is lost with the log still open: nothing else was synced on purpose.
        sim.crash_after(0);
        sim.power_cut(mode);
        drop(log);
        let (log, _) = sim_open(&sim, config()).unwrap();
        assert!(
            log.end_offset() >= durable,
            "{mode:?}: durable {durable}, recovered {}",
            log.end_offset()
        ); // R-LOG-2
        for r in read_all(&log) {
            assert_eq!(r.to_record(), big(r.offset)); // R-LOG-2: intact
        }
    }
}

#[test]
fn failed_background_sync_poisons_the_writer() {
    let sim = SimStorage::new();
    let (log, _) = sim_open(&sim, config()).unwrap();
    sim.fail_from(SimOp::Sync, 0);
    let mut appended = 0;
    // Appends succeed until the writeback's failure is seen (it poisons from its own thread).
    let failure = loop {
        match log.append(&big(appended)) {
            Ok(_) => appended += 1,
            Err(e) => break e,
        }
        if appended > 150 {
            eventually("the failed writeback to poison the writer", || {
                log.is_poisoned()
            });
        }
    };
    assert!(matches!(failure, AppendError::Poisoned), "{failure:?}");
    assert!(matches!(log.sync(), Err(AppendError::Poisoned)));
    assert_eq!(log.durable_offset(), 0, "nothing pretends to be durable");
    drop(log);
    sim.clear_faults();
    sim.power_cut(CrashMode::DropUnsynced);
    let (log, _) = sim_open(&sim, config()).unwrap();
    assert_eq!(log.end_offset(), 0);
}
