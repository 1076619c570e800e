//! A tailing reader wakes on append (condvar and listeners, no polling); waits are bounded with
//! generous timeouts and nothing asserts on timing.

mod common;

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{record_for, sim_open};
use tidings_log::testing::SimStorage;
use tidings_log::{Fsync, Log, LogConfig};

const LONG: Duration = Duration::from_secs(30);

fn open(fsync: Fsync) -> Arc<Log> {
    let sim = SimStorage::new();
    Arc::new(sim_open(&sim, LogConfig::new().fsync(fsync)).unwrap().0)
}

#[test]
fn waiter_wakes_on_append() {
    for fsync in [
        Fsync::Always,
        Fsync::Never,
        Fsync::Interval(Duration::from_millis(5)),
    ] {
        let log = open(fsync);
        let (ready_tx, ready_rx) = mpsc::channel();
        let l = log.clone();
        let waiter = std::thread::spawn(move || {
            ready_tx.send(()).unwrap();
            let woke = l.wait_for_append(0, LONG);
            (woke, l.read(0, 10).unwrap())
        });
        ready_rx.recv().unwrap();
        log.append(&record_for(0)).unwrap();
        let (woke, recs) = waiter.join().unwrap();
        assert!(woke, "{fsync:?}");
        assert_eq!(recs.len(), 1);
        // Already satisfied: returns at once.
        assert!(log.wait_for_append(0, LONG));
    }
}

#[test]
fn wait_times_out_without_append() {
    let log = open(Fsync::Never);
    assert!(!log.wait_for_append(0, Duration::from_millis(20)));
}

#[test]
fn close_wakes_waiters() {
    let log = open(Fsync::Never);
    let l = log.clone();
    let waiter = std::thread::spawn(move || l.wait_for_append(0, LONG));
    std::thread::sleep(Duration::from_millis(10)); // let it block (not required for correctness)
    log.close().unwrap();
    assert!(!waiter.join().unwrap());
    assert!(matches!(
        log.append(&record_for(0)),
        Err(tidings_log::AppendError::Closed)
    ));
}

#[test]
fn listener_is_called_after_records_are_readable_and_may_reenter() {
    for fsync in [Fsync::Always, Fsync::Never] {
        let log = open(fsync);
        let (tx, rx) = mpsc::channel::<Vec<u64>>();
        let tx = Mutex::new(tx);
        let weak = Arc::downgrade(&log);
        log.add_append_listener(Arc::new(move |end| {
            // Re-entering the log from the listener must not deadlock, and the records are there.
            let log = weak.upgrade().unwrap();
            let got: Vec<u64> = log
                .read(0, 1000)
                .unwrap()
                .iter()
                .map(|r| r.offset)
                .collect();
            assert!(got.len() as u64 >= end);
            tx.lock().unwrap().send(got).unwrap();
        }));
        for i in 0..3 {
            log.append(&record_for(i)).unwrap();
        }
        let mut last = Vec::new();
        while last.len() < 3 {
            last = rx.recv_timeout(LONG).expect("listener not called");
        }
        assert_eq!(last, vec![0, 1, 2], "{fsync:?}");
    }
}

#[test]
fn interval_flusher_makes_records_durable() {
    let log = open(Fsync::Interval(Duration::from_millis(2)));
    log.append(&record_for(0)).unwrap();
    let deadline = std::time::Instant::now() + LONG;
    while log.durable_offset() < 1 {
        assert!(std::time::Instant::now() < deadline, "flusher never synced");
        std::thread::sleep(Duration::from_millis(2));
    }
}
