//! What the server launchers ([`crate::nats`], [`crate::postgres`]) share: a free loopback
//! port, a fresh temporary directory, and running one install step.

use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A TCP port of 127.0.0.1 free at the moment of asking, and never handed out before in
/// this process: the kernel may give a port just released to the next bind, so two
/// servers started at once by parallel tests could otherwise be handed the same one. A
/// launcher still retries when another process (or an outgoing connection) takes it
/// before the server binds it.
pub(crate) fn free_port() -> std::io::Result<u16> {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed = HANDED_OUT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut port = 0;
    // Bounded: the ephemeral range has ~28,000 ports, and a test run uses a few hundred.
    for _ in 0..64 {
        port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
            .local_addr()?
            .port();
        if !handed.contains(&port) {
            break;
        }
    }
    handed.push(port);
    Ok(port)
}

/// A path under the temporary directory no other launch in this or another process uses:
/// `tidings-<kind>-<pid>-<n>-<nanos>`.
pub(crate) fn unique_dir(kind: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    std::env::temp_dir().join(format!(
        "tidings-{kind}-{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Runs one install step (no standard input) to completion; on failure, what it printed or
/// why it could not run.
pub(crate) fn run_step(command: &mut Command) -> Result<(), String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!("{}: {}", output.status, output_text(&output)))
}

/// What a finished process printed: its standard error, then its standard output.
pub(crate) fn output_text(out: &Output) -> String {
    let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stdout));
    text
}
