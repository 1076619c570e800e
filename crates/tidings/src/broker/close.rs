//! Closing the broker (R-CORE-6): stop accepting, drain until a deadline, close every
//! queue, join every thread, stop the durable side, and report what was left.
//!
//! # Closing
//! The first call does the work; every other call waits for it and returns a copy of its
//! report (a call from the closing thread's own drain returns an empty report at once).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::clock::deadline_after;
use crate::report::{CloseReport, Undelivered};
use crate::topic::trie::TopicTrie;

use super::{BrokerInner, CloseState};

/// How long close waits for a handler that is still running after queues were closed.
const JOIN_GRACE: Duration = Duration::from_secs(5);

impl BrokerInner {
    /// The first call closes and stores the report; every other call returns a copy of it
    /// (waiting for the first to finish, unless it is the closing thread itself).
    pub(super) fn close(&self, drain: Duration) -> CloseReport {
        {
            let me = std::thread::current().id();
            let mut state = self.close_state.lock();
            loop {
                match &*state {
                    CloseState::Done(report) => return report.clone(),
                    CloseState::Running(closer) if *closer == me => {
                        return CloseReport::default();
                    }
                    CloseState::Running(_) => self.close_done.wait(&mut state),
                    CloseState::Open => {
                        *state = CloseState::Running(me);
                        break;
                    }
                }
            }
        }
        let report = self.close_once(drain);
        *self.close_state.lock() = CloseState::Done(report.clone());
        self.close_done.notify_all();
        report
    }

    pub(super) fn close_once(&self, drain: Duration) -> CloseReport {
        self.closed.store(true, Ordering::Release);
        // Stop receiving from the transport (src/broker/transport.rs).
        self.close_remotes();
        if let Some(inbox) = self.inbox.get() {
            inbox.close();
        }
        let mut report = CloseReport::default();
        for (message, subscription) in self.scheduler.close() {
            report.undelivered.push(Undelivered {
                subscription,
                message,
            });
        }
        let subs = self.live();
        // `Duration::MAX` (a deadline past what `Instant` holds) drains until empty.
        let drain_until = deadline_after(self.clock.now(), drain);
        for sub in &subs {
            sub.begin_drain(drain_until);
        }
        self.executor
            .drain(deadline_after(Instant::now(), drain), &mut || {
                self.run_until_idle()
            });
        for sub in &subs {
            for message in sub.close() {
                report.undelivered.push(Undelivered {
                    subscription: Some(sub.id),
                    message,
                });
            }
        }
        report.unjoined = self.executor.join(Instant::now() + JOIN_GRACE, &subs);
        // Stop durable feeders, write durable positions, close streams (src/durable).
        self.durables.close();
        self.close_transport();
        self.scheduler.join_timer();
        // Handlers that were running when their queue closed and then failed retryably
        // were dead-lettered as `Shutdown` after `sub.close()` returned: report them too,
        // so the report and the `Shutdown` dead letters agree exactly (R-CORE-6).
        for sub in &subs {
            for message in sub.take_shutdown() {
                report.undelivered.push(Undelivered {
                    subscription: Some(sub.id),
                    message,
                });
            }
        }
        let mut reg = self.registry.write();
        reg.all.clear();
        reg.internal.clear();
        reg.router = TopicTrie::default();
        let evicted = self.routes.invalidate();
        drop(reg);
        drop(evicted);
        report
    }
}
