//! `tidings log verify` names the damaged index file (R-LIM-2).

use std::process::Command;

use tidings_log::{Fsync, Log, LogConfig, Record};

#[test]
fn log_verify_names_a_damaged_time_index_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = LogConfig::new().fsync(Fsync::Never).segment_bytes(4096);
    let (log, _) = Log::open(dir.path(), config).expect("open a fresh log");
    for i in 0..200u64 {
        log.append(&Record::new(i, format!("payload {i}")))
            .expect("append");
    }
    log.close().expect("close");
    let tix = dir.path().join(format!("{:020}.tix", 0));
    let mut bytes = std::fs::read(&tix).expect("read the sealed segment's time index");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff; // checksum mismatch
    std::fs::write(&tix, &bytes).expect("write");

    let out = Command::new(env!("CARGO_BIN_EXE_tidings"))
        .args(["log", "verify", dir.path().to_str().expect("utf-8 path")])
        .output()
        .expect("the tidings binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    // R-LIM-2: the finding names the file that is damaged, and only that one.
    assert!(stdout.contains("00000000000000000000.tix"), "{stdout}");
    assert!(!stdout.contains("00000000000000000000.idx"), "{stdout}");
}
