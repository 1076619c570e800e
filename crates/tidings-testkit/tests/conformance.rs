//! The one behavioural suite, run under every driver (R-DIST-2, R-EXE-1).

use tidings::Driver;
use tidings_testkit::suite;
use tidings_testkit::{Backend, ManualBackend, ThreadedBackend};

macro_rules! conformance {
    ($module:ident, $backend:expr) => {
        mod $module {
            use super::*;
            fn backend() -> Box<dyn Backend> {
                Box::new($backend)
            }
            #[test]
            fn fan_out_order_and_exclusivity() {
                suite::fan_out_order_and_exclusivity(backend().as_ref());
            }
            #[test]
            fn retry_and_dead_letter() {
                suite::retry_and_dead_letter(backend().as_ref());
            }
            #[test]
            fn ttl_and_delay() {
                suite::ttl_and_delay(backend().as_ref());
            }
            #[test]
            fn reentrant_handlers() {
                suite::reentrant_handlers(backend().as_ref());
            }
            #[test]
            fn close_interrupts_backoff() {
                suite::close_interrupts_backoff(backend().as_ref());
            }
            #[test]
            fn per_key_order() {
                suite::per_key_order(backend().as_ref());
            }
            #[test]
            fn request_reply() {
                suite::request_reply(backend().as_ref());
            }
        }
    };
}

conformance!(manual, ManualBackend::default());
conformance!(thread, ThreadedBackend::new("thread", Driver::Thread));
conformance!(
    pool,
    ThreadedBackend::new("pool", Driver::Pool { workers: 2 })
);
#[cfg(feature = "tokio")]
conformance!(tokio, tidings_testkit::TokioBackend::new());

#[test]
fn every_suite_case_is_wired() {
    // Adding a case to suite::ALL without a test above would leave it unrun.
    assert_eq!(suite::ALL.len(), 7);
}
