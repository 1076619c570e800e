//! The ledger of one subscription: counters, dead-letter queue, what close must report.
//!
//! Every path that ends a message's life goes through [`Counts`] and [`Ledger`], which is
//! what makes conservation (R-DEL-6) hold by construction rather than by care at each call
//! site.
//!
//! # Memory
//! The ledger is split by use: [`Counts`], which every delivery touches, lives inline in the
//! core; the [`Ledger`] — refusals and dead letters by reason, failures, the dead-letter
//! queue, forwards, the close report, durable completions — is allocated on its first use,
//! so a subscription that has only ever delivered (or is idle) does not carry it.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use crate::dlq::{DeadLetter, DeadLetterQueue, DeadLetterReason};
use crate::message::Message;
use crate::options::Settings;
use crate::stats::{DeadLetterCounts, RefusedCounts};

/// The counters of the delivery path.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) offered: u64,
    pub(crate) accepted: u64,
    pub(crate) delivered: u64,
    pub(crate) in_flight: u64,
    pub(crate) attempts: u64,
}

impl Counts {
    /// A message taken off the queue finished (delivered or dead-lettered).
    pub(crate) fn finished(&mut self) {
        self.in_flight -= 1;
    }
}

/// The rest of the ledger, allocated on first use (see the module docs).
#[derive(Debug)]
pub(crate) struct Ledger {
    pub(crate) refused: RefusedCounts,
    pub(crate) dead_lettered: DeadLetterCounts,
    pub(crate) failures: u64,
    /// Taken off the queue and handed back unstarted: the start gate refused them.
    pub(crate) released: u64,
    /// The last starts within the rate limit's period (R-PAT-2); made at the first start
    /// of a subscription with a rate limit.
    pub(crate) start_log: Option<crate::rate_limit::StartLog>,
    pub(crate) dlq: DeadLetterQueue,
    /// Dead letters to publish to the dead-letter topic, handed out with the step's
    /// effects (see `Core::effects`).
    pub(crate) to_forward: Vec<DeadLetter>,
    /// Messages abandoned by unsubscribe/close, for the close report.
    pub(crate) shutdown: Vec<Arc<Message>>,
    /// Dead letters whose forward to the dead-letter topic failed (their DLQ entry stays).
    pub(crate) forward_failures: u64,
    forward: bool,
    keep_shutdown: bool,
    /// Completion record for durable subscriptions (`None` = disabled, zero cost): every
    /// message that finished by delivery or dead-lettering (never `Shutdown`).
    pub(crate) completions: Option<Completions>,
    /// While draining: when the drain gives up on what is still queued. Kept here, not in
    /// the core's state, so that an open subscription's state is one byte.
    pub(crate) drain_deadline: Option<Instant>,
}

pub(crate) use super::effects::Finished;
use super::effects::{FinishedHook, Outcome};

/// A durable subscription's finished messages, not yet reported, and who they go to. Kept
/// in the ledger rather than beside the core so that a subscription without one pays
/// nothing for it.
pub(crate) struct Completions {
    pub(crate) items: Vec<Finished>,
    pub(crate) hook: FinishedHook,
    /// Asked before every handler attempt (a keyed group's leases, R-DIST-6).
    pub(crate) gate: Option<Arc<dyn crate::subscription::StartGate>>,
}

impl std::fmt::Debug for Completions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completions")
            .field("items", &self.items)
            .finish_non_exhaustive()
    }
}

impl Ledger {
    pub(crate) fn new(settings: &Settings) -> Self {
        Self {
            refused: RefusedCounts::default(),
            dead_lettered: DeadLetterCounts::default(),
            failures: 0,
            released: 0,
            start_log: None,
            dlq: DeadLetterQueue::new(settings.dlq_capacity),
            to_forward: Vec::new(),
            shutdown: Vec::new(),
            forward_failures: 0,
            forward: settings.dlq_topic.is_some(),
            keep_shutdown: settings.keep_shutdown,
            completions: None,
            drain_deadline: None,
        }
    }

    /// Note a successful delivery for the completion hook, when enabled.
    pub(crate) fn completed(&mut self, message: &Arc<Message>) {
        if let Some(c) = &mut self.completions {
            c.items
                .push(Finished::new(message.clone(), Outcome::Delivered));
        }
    }

    /// Record a dead letter: counted by reason always, kept when `keep`.
    pub(crate) fn dead_letter(
        &mut self,
        message: Arc<Message>,
        reason: DeadLetterReason,
        attempts: u32,
        at: SystemTime,
        keep: bool,
    ) {
        self.dead_lettered.count(&reason);
        if let Some(c) = &mut self.completions
            && !matches!(reason, DeadLetterReason::Shutdown)
        {
            c.items.push(Finished::new(
                message.clone(),
                Outcome::DeadLettered {
                    reason: reason.clone(),
                    attempts,
                },
            ));
        }
        if !keep {
            return;
        }
        let entry = DeadLetter {
            message,
            reason,
            attempts,
            at,
        };
        if self.forward {
            self.to_forward.push(entry.clone());
        }
        self.dlq.push(entry);
    }

    /// An accepted message ends undelivered because its subscription is closing.
    pub(crate) fn abandon(&mut self, message: Arc<Message>, attempts: u32, at: SystemTime) {
        self.shutdown.push(message.clone());
        let keep = self.keep_shutdown;
        self.dead_letter(message, DeadLetterReason::Shutdown, attempts, at, keep);
    }
}
