//! One line runs the whole durable suite against a backend, under every driver (R-DIST-2).
//!
//! In a crate's `tests/conformance.rs`:
//!
//! ```ignore
//! // `MyBackend` implements `tidings_testkit::DurableTarget`; its store's `attach` calls
//! // `BrokerBuilder::durable_backend(..)`.
//! tidings_testkit::durable_conformance!(my_backend, MyBackend::new());
//! ```
//!
//! This expands to one module per driver — `manual`, `thread`, `pool`, and `tokio` and
//! `tokio_async` (the same cases with async handlers, R-EXE-3) when `tidings-testkit` is
//! built with its `tokio` feature — each with one `#[test]` per case
//! of [`durable_suite::ALL`](crate::durable_suite::ALL). A backend whose
//! [`Capabilities`](crate::Capabilities) are all of them must run every assertion of every
//! case; one with fewer may skip a case, naming the missing capability.

/// One `#[test]` per named durable case, each calling the enclosing module's
/// `run(name, case)` (see [`durable_cases!`](crate::durable_cases)).
#[macro_export]
macro_rules! durable_tests {
    ($($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                run(stringify!($case), $crate::durable_suite::$case);
            }
        )*
    };
}

/// Every durable case against the durable backend `$durable`, under the driver
/// `$driver` (a [`DriverUnderTest`](crate::DriverUnderTest)), in a module called `$module`.
#[macro_export]
macro_rules! durable_cases {
    ($module:ident, $durable:expr, $driver:expr) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            fn run(name: &str, case: $crate::durable_suite::DurableCaseFn) {
                let driver: Box<dyn $crate::DriverUnderTest> = Box::new($driver);
                let durable: Box<dyn $crate::DurableTarget> = Box::new($durable);
                let outcome =
                    $crate::durable_suite::run(name, case, driver.as_ref(), durable.as_ref());
                // A backend with every capability runs every assertion.
                if $crate::DurableTarget::caps(durable.as_ref()) == $crate::Capabilities::all() {
                    assert_eq!(outcome, $crate::CaseOutcome::Ran, "{name}");
                }
            }
            $crate::durable_tests!(
                resume_after_restart,
                replay_by_offset,
                replay_by_time,
                durable_dlq_reasons,
                durable_dlq_redrive_and_drain,
                lag_and_slow_consumer,
                durable_filter,
                durable_message_fields,
                many_durables_progress,
                seek_while_outstanding,
                delayed_durable_message,
                resubscribe_resumes,
                seek_survives_restart,
                durable_dedup_store,
            );
        }
    };
}

/// The whole durable suite against `$durable` under every driver, in a module called
/// `$module` (see the [module docs](crate::durable_macros)).
#[macro_export]
macro_rules! durable_conformance {
    ($module:ident, $durable:expr) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            $crate::durable_cases!(manual, $durable, $crate::ManualDriver::default());
            $crate::durable_cases!(
                thread,
                $durable,
                $crate::ThreadedDriver::new("thread", $crate::__tidings::Driver::Thread)
            );
            $crate::durable_cases!(
                pool,
                $durable,
                $crate::ThreadedDriver::new("pool", $crate::__tidings::Driver::Pool { workers: 2 })
            );
            $crate::__durable_cases_tokio!(tokio, $durable);
        }
    };
}

/// The tokio driver's cases, with sync handlers (`$module`) and with async ones
/// (`tokio_async`, R-EXE-3), when `tidings-testkit` has its `tokio` feature (decided here,
/// not in the crate that expands the macro).
#[cfg(feature = "tokio")]
#[doc(hidden)]
#[macro_export]
macro_rules! __durable_cases_tokio {
    ($module:ident, $durable:expr) => {
        $crate::durable_cases!($module, $durable, $crate::TokioDriver::new());
        $crate::durable_cases!(
            tokio_async,
            $durable,
            $crate::TokioDriver::with_async_handlers()
        );
    };
}

/// Without the `tokio` feature there is no tokio driver to run.
#[cfg(not(feature = "tokio"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __durable_cases_tokio {
    ($module:ident, $durable:expr) => {};
}
