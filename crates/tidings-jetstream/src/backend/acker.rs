//! The acknowledgement task of one cursor: finishes (ack, nak, term) sent in order, plain,
//! with one confirmed answer per batch.
//!
//! # Why plain
//! A confirmed acknowledgement per message (the server answers each) costs a round trip
//! per message, and with `sync_interval: always` an fsync wait too: NATS users acknowledge
//! with a plain publish and get 25 times the rate. A plain acknowledgement that is lost
//! (the connection broke) costs one redelivery after the ack wait, which at-least-once
//! delivery already allows: nothing is lost, a message is at worst handled twice.
//!
//! # Order and batches
//! [`Acker::send`] never waits: it queues the finish for this cursor's task, which takes
//! everything queued at once as one batch (at most [`MAX_BATCH`]), sends all but the last
//! plain, in the order they were queued, and the last one asking for the server's answer.
//! The server handles one consumer's acknowledgements from one connection in the order
//! they arrive, so that answer says the whole batch was applied. While the task waits for
//! it, new finishes queue up: the batches grow with the load, one round trip each.
//!
//! # Where confirmation is awaited
//! [`Acker::flush`] returns once everything queued before it was confirmed (or says which
//! part failed). The cursor awaits it only where its code must know: before `close`
//! returns, before `seek` deletes the consumer (a late acknowledgement would otherwise land
//! on the consumer created in its place, which has the same name), before `commit` and
//! `state` read the ack floor, and after a dead letter's DLQ store (the original is
//! terminated, and that is awaited before the finish returns).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{mpsc, oneshot};

use crate::client::delivery::{Delivery, Finish};

/// Most finishes sent in one batch (one confirmed answer each).
pub(crate) const MAX_BATCH: usize = 1024;

enum Command {
    /// Send this finish.
    Send(Arc<Delivery>, Finish),
    /// Answer once everything queued before is confirmed.
    Flush(oneshot::Sender<Result<(), String>>),
}

/// The sending side of one cursor's acknowledgement task (see the [module docs](self)).
#[derive(Clone)]
pub(crate) struct Acker {
    tx: mpsc::UnboundedSender<Command>,
    /// Finishes queued and not yet answered (confirmed or failed).
    unconfirmed: Arc<AtomicU64>,
}

impl Acker {
    /// The sender, and the task to spawn on the backend's runtime; `on_error` hears of a
    /// batch whose confirmation failed (its messages come back after the ack wait).
    pub(crate) fn new(
        on_error: impl Fn(String) + Send + 'static,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (tx, rx) = mpsc::unbounded_channel();
        let unconfirmed = Arc::new(AtomicU64::new(0));
        let task = run(rx, Arc::clone(&unconfirmed), on_error);
        (Self { tx, unconfirmed }, task)
    }

    /// Queues `finish` of `delivery`; never waits. After the task stopped (the cursor
    /// closed) it is dropped: the server hands the message out again after the ack wait.
    pub(crate) fn send(&self, delivery: Arc<Delivery>, finish: Finish) {
        self.unconfirmed.fetch_add(1, Ordering::AcqRel);
        if self.tx.send(Command::Send(delivery, finish)).is_err() {
            self.unconfirmed.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Whether finishes were queued that the server has not answered yet.
    pub(crate) fn unconfirmed(&self) -> bool {
        self.unconfirmed.load(Ordering::Acquire) > 0
    }

    /// Waits until everything queued before this call was confirmed by the server.
    ///
    /// # Errors
    /// A confirmation failed or timed out (those finishes may be lost: their messages come
    /// back after the ack wait), or the task stopped.
    ///
    /// # Cancel safety
    /// Dropping the future loses only the answer; the finishes are sent all the same.
    pub(crate) async fn flush(&self) -> Result<(), String> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Flush(tx))
            .map_err(|_| "the acknowledgement task stopped".to_owned())?;
        rx.await
            .map_err(|_| "the acknowledgement task stopped".to_owned())?
    }
}

async fn run(
    mut rx: mpsc::UnboundedReceiver<Command>,
    unconfirmed: Arc<AtomicU64>,
    on_error: impl Fn(String),
) {
    let mut batch = Vec::with_capacity(64);
    // A failure not yet reported to a flush: a flush answers for everything queued before
    // it, earlier batches included.
    let mut unreported: Option<String> = None;
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(c) => batch.push(c),
                Err(_) => break,
            }
        }
        let last = batch.iter().rposition(|c| matches!(c, Command::Send(..)));
        let mut sent = 0u64;
        let mut error: Option<String> = None;
        let mut waiters = Vec::new();
        for (i, command) in batch.drain(..).enumerate() {
            match command {
                Command::Send(d, finish) => {
                    sent += 1;
                    let result = if Some(i) == last {
                        d.confirm(finish).await
                    } else {
                        d.send(finish).await
                    };
                    if let Err(e) = result {
                        error.get_or_insert_with(|| e.to_string());
                    }
                }
                Command::Flush(tx) => waiters.push(tx),
            }
        }
        unconfirmed.fetch_sub(sent, Ordering::AcqRel);
        if let Some(e) = error {
            on_error(format!("acknowledging: {e}"));
            unreported.get_or_insert(e);
        }
        if !waiters.is_empty() {
            let answer = unreported.take().map_or(Ok(()), Err);
            for w in waiters {
                let _ = w.send(answer.clone());
            }
        }
    }
}
