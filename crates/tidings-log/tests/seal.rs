//! The asynchronous seal under `Never` and `Interval`: a roll starts the next segment under a
//! temporary name and a background thread syncs the old one, then publishes the new one. These
//! tests freeze that thread at chosen points (`SimStorage::pause_syncs`) and check that nothing
//! weakens: the new name appears only after the old segment is synced (R-LOG-2), a power cut
//! during a pending seal recovers a prefix holding everything reported durable (R-LOG-2), a
//! process kill loses nothing (R-LOG-2), `sync` and close wait for the seal (R-LOG-2), rolls wait
//! once four seals are pending (bounded back-pressure), a failed seal poisons the writer
//! (R-LOG-2: nothing claims durability it does not have), retention never removes the last
//! published segment (R-LOG-1), and readers see every record in order throughout (R-LOG-4).

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{assert_intact, read_all, record_for, sim_open};
use tidings_log::testing::{CrashMode, SimOp, SimStorage, TestRng};
use tidings_log::{AppendError, Fsync, Log, LogConfig, Retention};

/// 512-byte segments (a roll every few records), every append handed to the storage at once.
fn tiny(fsync: Fsync) -> LogConfig {
    LogConfig::new()
        .fsync(fsync)
        .segment_bytes(512)
        .write_buffer_bytes(0)
        .index_interval_bytes(100)
}

const MODES: [CrashMode; 3] = [
    CrashMode::DropUnsynced,
    CrashMode::ZeroFillUnsynced,
    CrashMode::RandomPrefix { seed: 11 },
];

/// Waits (bounded) until `cond` holds; the seal runs on its own thread.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// How long a test lets a thread that must stay blocked run before checking that it did. A
/// correct log passes whatever this is; it only bounds how long a broken one has to show it.
const GRACE: Duration = Duration::from_millis(200);

/// Opens the sync gate when dropped, so that a failing assertion (which drops the log, and so
/// waits for its held seal) ends the test instead of hanging it. Declare it after the log.
struct ResumeOnDrop(SimStorage);

impl Drop for ResumeOnDrop {
    fn drop(&mut self) {
        self.0.resume_syncs();
    }
}

fn files_with(sim: &SimStorage, suffix: &str) -> Vec<PathBuf> {
    sim.snapshot()
        .into_keys()
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect()
}

fn segs(sim: &SimStorage) -> Vec<PathBuf> {
    files_with(sim, ".seg")
}

fn tmps(sim: &SimStorage) -> Vec<PathBuf> {
    files_with(sim, ".seg.tmp")
}

/// Appends the next record.
fn append_next(log: &Log) -> u64 {
    let off = log.next_offset();
    assert_eq!(log.append(&record_for(off)).unwrap(), off);
    off
}

/// The highest segment base offset among segment files, published or not.
fn newest_base(sim: &SimStorage) -> Option<u64> {
    sim.snapshot()
        .into_keys()
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_owned();
            let stem = name
                .strip_suffix(".seg")
                .or(name.strip_suffix(".seg.tmp"))?;
            stem.parse().ok()
        })
        .max()
}

/// Appends until a roll started a new segment; returns its base offset. With syncs paused, its
/// seal is then pending.
fn append_until_pending_seal(sim: &SimStorage, log: &Log) -> u64 {
    let before = newest_base(sim);
    for _ in 0..100 {
        let off = append_next(log);
        if newest_base(sim) != before {
            assert_eq!(newest_base(sim), Some(off));
            return off;
        }
    }
    panic!("no roll after 100 appends");
}

/// Cuts the power with `log` still open, then lets it go: the dead process's remaining
/// operations (a held seal included) fail instead of reaching the rebooted storage.
fn cut_power<T>(sim: &SimStorage, mode: CrashMode, log: T) {
    sim.crash_after(0);
    sim.power_cut(mode);
    sim.crash_after(0);
    sim.resume_syncs();
    drop(log);
    // Reboot: clears the crash point (nothing reached the storage since the cut).
    sim.power_cut(mode);
}

/// Reopens after a power cut: a prefix of what was written, every record intact, at least
/// `acked`, no temporary file left. Returns the log and the recovered end.
fn reopen_checked(sim: &SimStorage, cfg: &LogConfig, acked: u64, written: u64, what: &str) -> u64 {
    let (log, report) =
        sim_open(sim, cfg.clone()).unwrap_or_else(|e| panic!("{what}: reopen failed: {e}"));
    let all = read_all(&log);
    all.iter().for_each(assert_intact); // R-LOG-2: no corrupt record accepted
    let end = log.end_offset();
    assert!(
        end >= acked,
        "{what}: reported durable {acked}, recovered {end} ({report})"
    ); // R-LOG-2: nothing reported durable is lost
    assert!(
        end <= written,
        "{what}: recovered {end} > written {written}"
    );
    assert!(
        tmps(sim).is_empty(),
        "{what}: temporary segment left behind"
    );
    // The recovered log takes appends and rolls again.
    for _ in 0..10 {
        append_next(&log);
    }
    log.close().unwrap();
    end
}

#[test]
fn the_next_segment_is_published_only_after_the_old_one_is_synced() {
    for fsync in [Fsync::Never, Fsync::Interval(Duration::from_millis(1))] {
        let sim = SimStorage::new();
        let cfg = tiny(fsync);
        let (log, _) = sim_open(&sim, cfg.clone()).unwrap();
        let _resume = ResumeOnDrop(sim.clone());
        sim.pause_syncs(true, true);
        let base = append_until_pending_seal(&sim, &log);
        // More records go into the unpublished segment while the seal is held.
        append_next(&log);
        append_next(&log);
        eventually("the background thread to block on a sync", || {
            sim.paused_syncs() > 0
        });
        // R-LOG-2: without the old segment's sync, the new one does not exist under its name.
        assert_eq!(segs(&sim).len(), 1, "{fsync:?}");
        assert!(
            log.durable_offset() <= base,
            "{fsync:?}: durable {} past the unpublished segment at {base}",
            log.durable_offset()
        );
        // R-LOG-4: readers see every record, the unpublished segment's included, in order.
        let all = read_all(&log);
        assert_eq!(all.len() as u64, log.next_offset());
        all.iter().for_each(assert_intact);
        sim.resume_syncs();
        eventually("the seal to publish the segment", || tmps(&sim).is_empty());
        assert_eq!(segs(&sim).len(), 2);
        eventually("the durable offset to reach the sealed segment", || {
            log.durable_offset() >= base
        });
        log.close().unwrap();
        let (log, report) = sim_open(&sim, cfg).unwrap();
        assert!(report.is_clean(), "{report}");
        assert_eq!(read_all(&log).len() as u64, base + 3);
    }
}

#[test]
fn power_cut_during_a_pending_seal() {
    for mode in MODES {
        for hold_dirs_only in [false, true] {
            let sim = SimStorage::new();
            let cfg = tiny(Fsync::Never);
            let (log, _) = sim_open(&sim, cfg.clone()).unwrap();
            common::fill(&log, 5);
            log.sync().unwrap();
            // Held at the old segment's sync, or (dirs only) after the rename, at the directory
            // sync that makes it durable.
            let _resume = ResumeOnDrop(sim.clone());
            sim.pause_syncs(!hold_dirs_only, true);
            append_until_pending_seal(&sim, &log);
            append_next(&log);
            eventually("the seal to block", || sim.paused_syncs() > 0);
            let acked = log.durable_offset();
            let written = log.next_offset();
            sim.crash_after(0);
            sim.power_cut(mode);
            sim.crash_after(0);
            sim.resume_syncs();
            // The seal's remaining steps fail on the dead storage: poisoned, close says so.
            assert!(log.close().is_err());
            drop(log);
            sim.power_cut(mode);
            let what = format!("{mode:?}, dirs only {hold_dirs_only}");
            reopen_checked(&sim, &cfg, acked.max(5), written, &what);
        }
    }
}

#[test]
fn sync_waits_for_the_pending_seal() {
    let sim = SimStorage::new();
    let cfg = tiny(Fsync::Never);
    let (log, _) = sim_open(&sim, cfg.clone()).unwrap();
    let log = Arc::new(log);
    // Hold the seal after its rename, at the directory sync: the new segment's file syncs
    // freely, but its name is not durable yet.
    let _resume = ResumeOnDrop(sim.clone());
    sim.pause_syncs(false, true);
    let base = append_until_pending_seal(&sim, &log);
    append_next(&log);
    eventually("the seal to block on the directory sync", || {
        sim.paused_syncs() > 0
    });
    let written = log.next_offset();
    let syncer = {
        let log = log.clone();
        std::thread::spawn(move || log.sync())
    };
    std::thread::sleep(GRACE);
    // R-LOG-2: `sync` does not report records durable while their segment's name is not.
    assert!(!syncer.is_finished(), "sync returned during the seal");
    assert!(log.durable_offset() <= base);
    sim.resume_syncs();
    syncer.join().unwrap().unwrap();
    assert_eq!(log.durable_offset(), written);
    // Everything `sync` reported survives a power cut right after it.
    cut_power(&sim, CrashMode::DropUnsynced, log);
    let end = reopen_checked(&sim, &cfg, written, written, "sync then power cut");
    assert_eq!(end, written);
}

/// How many rolls may wait for their seal at once (`writeback::MAX_PENDING_SEALS`).
const MAX_PENDING_SEALS: usize = 4;

#[test]
fn rolls_wait_once_the_most_seals_are_pending() {
    let sim = SimStorage::new();
    let cfg = tiny(Fsync::Never);
    let (log, _) = sim_open(&sim, cfg.clone()).unwrap();
    let log = Arc::new(log);
    let _resume = ResumeOnDrop(sim.clone());
    sim.pause_syncs(true, true);
    let base = append_until_pending_seal(&sim, &log);
    const MORE: u64 = 300; // many segments' worth
    let done = Arc::new(AtomicU64::new(0));
    let appender = {
        let (log, done) = (log.clone(), done.clone());
        std::thread::spawn(move || {
            for _ in 0..MORE {
                append_next(&log);
                done.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    eventually("the appender to roll as far as it may", || {
        tmps(&sim).len() == MAX_PENDING_SEALS
    });
    std::thread::sleep(GRACE);
    // Back-pressure: the append that would start one more unpublished segment waits for the
    // oldest seal; there are never more than `MAX_PENDING_SEALS`.
    assert!(
        !appender.is_finished(),
        "appends went past the pending seals"
    );
    assert_eq!(tmps(&sim).len(), MAX_PENDING_SEALS);
    assert_eq!(segs(&sim).len(), 1);
    let held = done.load(Ordering::SeqCst);
    assert!(held < MORE);
    // What waits is in the temporary files (the page cache), not in the writer's memory.
    let in_files: usize = tmps(&sim)
        .iter()
        .map(|t| sim.read_file(t).unwrap().len() - 32)
        .sum();
    assert!(in_files > held as usize * 20, "records not in the files");
    // R-LOG-4: the waiting append does not hide the records before it.
    assert_eq!(read_all(&log).len() as u64, base + 1 + held);
    // R-LOG-2: a process killed now (the page cache survives) loses none of them: every
    // unpublished segment continues a complete one and is adopted, in order.
    let killed = sim.fork();
    let (copy, report) = sim_open(&killed, cfg.clone()).unwrap();
    assert_eq!(report.adopted_segments.len(), MAX_PENDING_SEALS, "{report}");
    assert_eq!(copy.end_offset(), base + 1 + held, "{report}");
    read_all(&copy).iter().for_each(assert_intact);
    drop(copy);
    sim.resume_syncs();
    appender.join().unwrap();
    assert_eq!(log.next_offset(), base + 1 + MORE);
    Arc::try_unwrap(log).unwrap().close().unwrap();
    let (log, report) = sim_open(&sim, cfg).unwrap();
    assert!(report.is_clean(), "{report}");
    let all = read_all(&log);
    assert_eq!(all.len() as u64, base + 1 + MORE);
    all.iter().for_each(assert_intact);
}

#[test]
fn a_failed_seal_sync_poisons_the_writer() {
    for hold_dirs_only in [false, true] {
        let sim = SimStorage::new();
        let cfg = tiny(Fsync::Never);
        let (log, _) = sim_open(&sim, cfg.clone()).unwrap();
        let log = Arc::new(log);
        common::fill(&log, 4);
        log.sync().unwrap();
        let _resume = ResumeOnDrop(sim.clone());
        sim.pause_syncs(!hold_dirs_only, true);
        let base = append_until_pending_seal(&sim, &log);
        eventually("the seal to block", || sim.paused_syncs() > 0);
        let written = log.next_offset();
        // A `sync` waiting for the seal is woken by its failure, with an error.
        let syncer = {
            let log = log.clone();
            std::thread::spawn(move || log.sync())
        };
        if hold_dirs_only {
            // The held directory sync (the seal's own, nothing else syncs the directory here)
            // is the one that fails.
            sim.fail_nth(SimOp::Sync, 0);
        } else {
            sim.fail_from(SimOp::Sync, 0);
        }
        sim.resume_syncs();
        let synced = syncer.join().unwrap();
        assert!(synced.is_err(), "sync succeeded over a failed seal");
        eventually("the failed seal to poison the writer", || log.is_poisoned());
        // R-LOG-2: the caller of the next append and sync sees a typed error.
        assert!(matches!(
            log.append(&record_for(written)),
            Err(AppendError::Poisoned)
        ));
        assert!(matches!(log.sync(), Err(AppendError::Poisoned)));
        let durable = log.durable_offset();
        assert!(durable <= base, "durable {durable} past the failed seal");
        // Reads keep working.
        assert_eq!(read_all(&log).len() as u64, written);
        assert!(log.close().is_err());
        drop(log);
        sim.clear_faults();
        sim.power_cut(CrashMode::DropUnsynced);
        let what = format!("failed seal, dirs only {hold_dirs_only}");
        reopen_checked(&sim, &cfg, durable.max(4), written, &what);
    }
}

#[test]
fn close_and_drop_finish_a_pending_seal() {
    for by_drop in [false, true] {
        let sim = SimStorage::new();
        let cfg = tiny(Fsync::Never);
        let (log, _) = sim_open(&sim, cfg.clone()).unwrap();
        let _resume = ResumeOnDrop(sim.clone());
        sim.pause_syncs(true, true);
        append_until_pending_seal(&sim, &log);
        append_next(&log);
        let written = log.next_offset();
        let closer = std::thread::spawn(move || {
            if by_drop {
                drop(log);
                Ok(())
            } else {
                log.close()
            }
        });
        std::thread::sleep(GRACE);
        assert!(!closer.is_finished(), "close returned before the seal");
        sim.resume_syncs();
        closer.join().unwrap().unwrap();
        assert!(tmps(&sim).is_empty());
        // A clean close leaves nothing for recovery to repair and loses no record.
        let (log, report) = sim_open(&sim, cfg.clone()).unwrap();
        assert!(report.is_clean(), "{report}");
        assert_eq!(log.end_offset(), written);
        read_all(&log).iter().for_each(assert_intact);
    }
}

#[test]
fn retention_keeps_the_segment_before_a_pending_seal() {
    let sim = SimStorage::new();
    let cfg = tiny(Fsync::Never).retention(Retention::new().max_bytes(1));
    let (log, _) = sim_open(&sim, cfg.clone()).unwrap();
    common::fill(&log, 12);
    log.sync().unwrap();
    let acked = log.durable_offset();
    let _resume = ResumeOnDrop(sim.clone());
    sim.pause_syncs(true, false);
    // The roll's own retention pass runs while the seal is held, and an explicit one after it.
    append_until_pending_seal(&sim, &log);
    log.apply_retention(0).unwrap();
    assert_eq!(
        segs(&sim).len(),
        1,
        "R-LOG-1: the last segment on disk must stay while its successor is unpublished"
    );
    let written = log.next_offset();
    cut_power(&sim, CrashMode::DropUnsynced, log);
    reopen_checked(&sim, &cfg, acked, written, "retention during a seal");
}

#[test]
fn readers_race_rolls_and_seals() {
    // R-LOG-4: tailing readers see every record once, in order, intact, while tiny segments
    // roll every few records and their seals run concurrently.
    const N: u64 = 3000;
    for fsync in [Fsync::Never, Fsync::Interval(Duration::from_millis(1))] {
        let sim = SimStorage::new();
        let (log, _) = sim_open(&sim, tiny(fsync)).unwrap();
        let log = Arc::new(log);
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let log = log.clone();
                std::thread::spawn(move || {
                    let mut next = 0;
                    let deadline = Instant::now() + Duration::from_secs(60);
                    while next < N {
                        assert!(Instant::now() < deadline, "reader stuck at {next}");
                        if !log.wait_for_append(next, Duration::from_secs(1)) {
                            continue;
                        }
                        for r in log.read(next, 50).unwrap() {
                            assert_eq!(r.offset, next);
                            assert_intact(&r);
                            next += 1;
                        }
                    }
                })
            })
            .collect();
        for _ in 0..N {
            append_next(&log);
        }
        for r in readers {
            r.join().unwrap();
        }
        Arc::try_unwrap(log).unwrap().close().unwrap();
        let (log, report) = sim_open(&sim, tiny(fsync)).unwrap();
        assert!(report.is_clean(), "{report}");
        assert_eq!(log.end_offset(), N);
        assert!(segs(&sim).len() > 100, "the workload should roll often");
    }
}

#[test]
fn smallest_segments_roll_on_every_record() {
    // A segment of `MIN_SEGMENT_BYTES` holds one record: every append rolls, every roll but
    // the last waits for the previous seal. R-LOG-1 / R-LOG-2.
    let sim = SimStorage::new();
    let cfg = tiny(Fsync::Never).segment_bytes(tidings_log::MIN_SEGMENT_BYTES);
    let (log, _) = sim_open(&sim, cfg.clone()).unwrap();
    for _ in 0..200 {
        append_next(&log);
    }
    assert_eq!(read_all(&log).len(), 200);
    log.close().unwrap();
    let (log, report) = sim_open(&sim, cfg).unwrap();
    assert!(report.is_clean(), "{report}");
    assert!(segs(&sim).len() >= 100);
    let all = read_all(&log);
    assert_eq!(all.len(), 200);
    all.iter().for_each(assert_intact);
    assert_eq!(log.offset_for_time(0).unwrap(), 0);
}

#[test]
fn power_cut_at_random_points_with_tiny_segments() {
    // R-LOG-2 under every background seal and writeback: whatever `durable_offset` reported at
    // any moment survives a power cut at a random operation.
    let mut rng = TestRng::new(0x5ea1);
    for run in 0..300u64 {
        let cfg = tiny(Fsync::Never)
            .fsync(if rng.below(2) == 0 {
                Fsync::Never
            } else {
                Fsync::Interval(Duration::from_millis(1))
            })
            .segment_bytes(128 + rng.below(600))
            .write_buffer_bytes([0, 64, 256 << 10][rng.below(3) as usize]);
        let appends = 20 + rng.below(60);
        let sim = SimStorage::new();
        let Ok((log, _)) = sim_open(&sim, cfg.clone()) else {
            panic!("open")
        };
        sim.crash_after(20 + rng.below(200));
        let mut acked = 0;
        for i in 0..appends {
            let off = log.next_offset();
            if log.append(&record_for(off)).is_err() {
                break;
            }
            if i % 7 == 6 && log.sync().is_err() {
                break;
            }
            acked = acked.max(log.durable_offset());
        }
        acked = acked.max(log.durable_offset());
        let written = log.next_offset();
        let mode = MODES[rng.below(3) as usize];
        let mode = match mode {
            CrashMode::RandomPrefix { .. } => CrashMode::RandomPrefix { seed: run },
            m => m,
        };
        cut_power(&sim, mode, log);
        let what = format!("run {run}: {:?}, {mode:?}", cfg.fsync);
        reopen_checked(&sim, &cfg, acked, written, &what);
    }
}

#[test]
fn process_killed_during_a_pending_seal() {
    // A kill leaves the page cache: `fork` copies the storage as it stands, with the seal held
    // at every point it can stop. R-LOG-2: the copy opens with every record written (the old
    // segment is complete, so the temporary one is adopted), nothing left temporary.
    for (files, dirs) in [(true, true), (false, true)] {
        let sim = SimStorage::new();
        let cfg = tiny(Fsync::Never);
        let (log, _) = sim_open(&sim, cfg.clone()).unwrap();
        common::fill(&log, 6);
        log.sync().unwrap();
        let _resume = ResumeOnDrop(sim.clone());
        sim.pause_syncs(files, dirs);
        let base = append_until_pending_seal(&sim, &log);
        append_next(&log);
        eventually("the seal to block", || sim.paused_syncs() > 0);
        let acked = log.durable_offset();
        let written = log.next_offset();
        let killed = sim.fork();
        let left = tmps(&killed);
        let (copy, report) = sim_open(&killed, cfg.clone()).unwrap();
        // Held before the rename, the new segment is still temporary and is adopted; held at
        // the directory sync, the rename is visible and there is nothing to adopt.
        assert_eq!(left.len(), usize::from(files));
        assert_eq!(report.adopted_segments.len(), left.len(), "{report}");
        assert!(tmps(&killed).is_empty());
        let end = copy.end_offset();
        assert!(end >= acked.max(6), "recovered {end} < durable {acked}");
        assert_eq!(end, written, "{report}");
        assert!(base < written);
        read_all(&copy).iter().for_each(assert_intact);
        drop(copy);
        sim.resume_syncs();
        log.close().unwrap();
    }
}
