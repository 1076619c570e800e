//! The task that keeps a cursor's positions snapshot fresh (see
//! [`positions`](super::positions)).

use std::sync::Arc;
use std::time::Instant;

use super::acker::Acker;
use super::cursor_state::CursorShared;
use super::positions::{AFTER_CHANGE, IDLE_REFRESH, Positions};
use super::puller::Puller;
use crate::connection::connect::JetStream;

/// What the refresh task reads with.
pub(crate) struct Refresh {
    pub(crate) cursor: Arc<CursorShared>,
    pub(crate) puller: Arc<Puller>,
    pub(crate) acker: Acker,
    pub(crate) js: JetStream,
    /// The stream's JetStream name.
    pub(crate) stream: String,
}

/// Keeps the cursor's snapshot fresh (see the [module docs](self)); runs until the cursor
/// closes (its task is aborted).
pub(crate) async fn run(r: Refresh) {
    let snapshot = r.cursor.positions();
    let bound = r.js.request_timeout();
    let mut tick = tokio::time::interval(AFTER_CHANGE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_read = Instant::now();
    loop {
        tick.tick().await;
        if r.cursor.is_closed() {
            return;
        }
        if !snapshot.dirty() && last_read.elapsed() < IDLE_REFRESH {
            continue;
        }
        last_read = Instant::now();
        // Taken before the read: a change during it leaves the snapshot dirty.
        let ticket = snapshot.begin();
        if r.acker.unconfirmed() {
            // The ack floor counts only what the server applied. Unanswered: read anyway.
            let _ = tokio::time::timeout(bound, r.acker.flush()).await;
        }
        let durable = r.puller.durable();
        // A keyed partition that gathers compares the server's delivery count with what
        // reached this cursor (see `strays`), when no pull was in flight or made during
        // the reading: the pull epoch was even and did not move. No lock is held across
        // the read.
        let epoch = r.cursor.gathering().then(|| r.cursor.pull_epoch());
        let sent = Instant::now();
        match tokio::time::timeout(bound, Positions::read(&durable, &r.js, &r.stream)).await {
            Ok(Ok(p)) => {
                if let Some(before) = epoch
                    && before % 2 == 0
                    && r.cursor.pull_epoch() == before
                {
                    r.cursor.server_count(p.deliveries, sent);
                }
                snapshot.store(ticket, p);
            }
            // The last values stay; tried again at the next tick that is due.
            Ok(Err(e)) => r.cursor.lock().transient = Some(e.to_string()),
            Err(_) => {
                r.cursor.lock().transient = Some(format!(
                    "reading the durable consumer's state: no answer within {bound:?}"
                ));
            }
        }
    }
}
