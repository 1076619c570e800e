//! R-LOG-1, R-LOG-2: many threads appending under `Fsync::Always` share fsyncs (group commit):
//! fewer syncs than appends, and every acknowledged record survives a power cut.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::{read_all, sim_open};
use tidings_log::testing::{CrashMode, SimStorage};
use tidings_log::{Fsync, LogConfig, Record};

#[test]
fn concurrent_appenders_share_syncs_and_all_acks_are_durable() {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 40;
    let sim = SimStorage::new();
    sim.set_sync_delay(Some(Duration::from_millis(2)));
    let cfg = LogConfig::new().fsync(Fsync::Always);
    let (log, _) = sim_open(&sim, cfg.clone()).unwrap();
    let log = Arc::new(log);
    let syncs_before = sim.sync_count();
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let log = log.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                (0..PER_THREAD)
                    .map(|i| {
                        let payload = format!("thread {t} seq {i}");
                        let off = log.append(&Record::new(i as u64, payload.clone())).unwrap();
                        // Acknowledged under Always: durable and visible now.
                        assert!(log.durable_offset() > off);
                        assert!(log.end_offset() > off);
                        (off, payload)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut acked = BTreeMap::new();
    for h in handles {
        acked.extend(h.join().unwrap());
    }
    let appends = (THREADS * PER_THREAD) as u64;
    let syncs = sim.sync_count() - syncs_before;
    // R-LOG-1: group commit: one sync covers many appends.
    assert!(syncs < appends, "{syncs} syncs for {appends} appends");
    eprintln!("group commit: {syncs} syncs for {appends} appends");
    assert_eq!(acked.len() as u64, appends);

    // Power cut without a clean close: every acknowledged record must be there (R-LOG-2).
    sim.power_cut(CrashMode::DropUnsynced);
    drop(log);
    let (log, _) = sim_open(&sim, cfg).unwrap();
    let all = read_all(&log);
    assert_eq!(all.len() as u64, appends);
    for r in all {
        assert_eq!(acked[&r.offset], r.payload, "offset {}", r.offset);
    }
}

#[test]
fn real_disk_group_commit_smoke() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, _) = tidings_log::Log::open(tmp.path(), LogConfig::default()).unwrap();
    let log = Arc::new(log);
    let hs: Vec<_> = (0..16)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                for i in 0..20u64 {
                    log.append(&Record::new(i, format!("{t}/{i}"))).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(log.durable_offset(), 320);
    assert_eq!(read_all(&log).len(), 320);
}
