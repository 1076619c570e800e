//! Keep-alive: while a message is fetched and not finished, the server is told every
//! `interval` (a third of the ack wait) that it is still being worked on, so a handler that
//! takes long, or the broker's in-place retries with backoff (R-ORD-1), never reach the
//! ack wait and the message is not handed to another process meanwhile.

use std::sync::Arc;
use std::time::Duration;

use super::cursor_state::CursorShared;

/// Runs until the cursor closes (its task is aborted).
pub(crate) async fn run(cursor: Arc<CursorShared>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        if !cursor.keeps_alive() {
            // A keyed group's lease lapsed: what this process holds is another's soon.
            continue;
        }
        let held = cursor.held();
        // Best effort: a lost keep-alive is sent again at the next tick, well within the
        // ack wait.
        let sends = held.iter().map(|d| d.in_progress_unconfirmed());
        let _ = futures_util::future::join_all(sends).await;
        cursor.note_keep_alive(held.len());
    }
}
