//! The one behavioural suite, run under every driver (R-DIST-2, R-EXE-1), and its durable
//! cases under every driver against every durable backend.
//!
//! A new durable backend plugs in with one line (here, or in its own crate's tests):
//! `tidings_testkit::durable_conformance!(<module>, <its DurableTarget>);`.

use tidings::Driver;
use tidings_testkit::{
    Capabilities, DurableTarget, EmbeddedLog, EmbeddedSeam, durable_suite, suite,
};
use tidings_testkit::{CaseOutcome, DriverUnderTest, ManualDriver, ThreadedDriver};

macro_rules! conformance {
    ($module:ident, $driver:expr) => {
        mod $module {
            use super::*;
            fn driver() -> Box<dyn DriverUnderTest> {
                Box::new($driver)
            }
            #[test]
            fn fan_out_order_and_exclusivity() {
                suite::fan_out_order_and_exclusivity(driver().as_ref());
            }
            #[test]
            fn retry_and_dead_letter() {
                suite::retry_and_dead_letter(driver().as_ref());
            }
            #[test]
            fn ttl_and_delay() {
                suite::ttl_and_delay(driver().as_ref());
            }
            #[test]
            fn reentrant_handlers() {
                suite::reentrant_handlers(driver().as_ref());
            }
            #[test]
            fn close_interrupts_backoff() {
                suite::close_interrupts_backoff(driver().as_ref());
            }
            #[test]
            fn per_key_order() {
                suite::per_key_order(driver().as_ref());
            }
            #[test]
            fn request_reply() {
                suite::request_reply(driver().as_ref());
            }
            #[test]
            fn expired_forwarded_to_dead_letter_topic() {
                suite::expired_forwarded_to_dead_letter_topic(driver().as_ref());
            }
        }
    };
}

conformance!(manual, ManualDriver::default());
conformance!(thread, ThreadedDriver::new("thread", Driver::Thread));
conformance!(
    pool,
    ThreadedDriver::new("pool", Driver::Pool { workers: 2 })
);
#[cfg(feature = "tokio")]
conformance!(tokio, tidings_testkit::TokioDriver::new());

// The durable backends, one line each, under every driver (R-DIST-2): the embedded log
// built by `data_dir`, and the same log plugged in through `durable_backend` (the seam
// alone, as JetStream is).
tidings_testkit::durable_conformance!(embedded_log, EmbeddedLog);
tidings_testkit::durable_conformance!(embedded_seam, EmbeddedSeam);

/// The embedded log with some capabilities taken away: the cases needing them must skip,
/// naming the capability, instead of passing or failing silently.
struct Restricted(Capabilities);

impl DurableTarget for Restricted {
    fn name(&self) -> String {
        "restricted-log".into()
    }
    fn caps(&self) -> Capabilities {
        self.0
    }
    fn open(&self) -> Box<dyn tidings_testkit::DurableStore> {
        EmbeddedLog.open()
    }
}

#[test]
fn a_missing_capability_skips_visibly() {
    let restricted = Restricted(Capabilities::all().without_manual_time().without_priority());
    let b = ManualDriver::default();
    let outcome = durable_suite::run(
        "replay_by_time",
        durable_suite::replay_by_time,
        &b,
        &restricted,
    );
    assert!(
        matches!(&outcome, CaseOutcome::Skipped(why) if why.contains("manual_time")),
        "{outcome:?}"
    ); // R-DIST-2
    let outcome = durable_suite::run(
        "durable_message_fields",
        durable_suite::durable_message_fields,
        &b,
        &restricted,
    );
    assert!(
        matches!(&outcome, CaseOutcome::Skipped(why) if why.contains("priority") && why.contains("manual_time")),
        "{outcome:?}"
    ); // R-DIST-2
    // The embedded log itself has every capability: nothing is skipped there.
    let all = durable_suite::run(
        "replay_by_time",
        durable_suite::replay_by_time,
        &b,
        &EmbeddedLog,
    );
    assert_eq!(all, CaseOutcome::Ran); // R-DIST-2
}

#[test]
fn every_suite_case_is_wired() {
    // Adding a case to suite::ALL without a test above would leave it unrun.
    assert_eq!(suite::ALL.len(), 8);
    assert_eq!(durable_suite::ALL.len(), 14);
}
