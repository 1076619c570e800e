//! The manual driver: nothing runs until the caller drives it (R-EXE-2).
//!
//! Delivery happens in [`Broker::run_until_idle`](crate::Broker::run_until_idle), in the
//! caller's thread, subscription by subscription in id order — so with a manual clock,
//! every test of fan-out, priority, filters, retries, TTL and the DLQ is exact.

use std::sync::Arc;
use std::time::Instant;

use crate::error::SubscribeError;
use crate::subscription::shared::SubShared;

use super::{Executor, Wake};

pub(crate) struct ManualExecutor;

struct NoWake;

impl Wake for NoWake {
    fn wake(&self, _worker: usize) {}
    fn wake_all(&self) {}
}

impl Executor for ManualExecutor {
    fn start(&self, sub: &Arc<SubShared>) -> Result<(), SubscribeError> {
        sub.set_waker(Arc::new(NoWake));
        Ok(())
    }
    fn wait_stopped(&self, _deadline: Option<Instant>) -> bool {
        true
    }
    fn join(&self, _deadline: Instant) -> Vec<String> {
        Vec::new()
    }
    fn is_manual(&self) -> bool {
        true
    }
}
