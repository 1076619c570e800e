//! Test helpers for tidings and the one behavioural suite every driver runs (R-DIST-2).
//!
//! A [`DriverUnderTest`] says how to build a broker and how to wait for it to settle: the
//! manual driver drives the broker in the test's thread and jumps its manual clock to the next
//! wake-up; the threaded drivers wait (bounded, generous) for a condition. Each function
//! in [`suite`] is written once and run under every driver by `tests/conformance.rs`;
//! [`durable_suite`] adds the durable cases, run under every driver against every
//! [`DurableTarget`] (the embedded log, directly and through the seam; JetStream
//! implements the same trait); [`durable_conformance!`] runs them all with one line.
//! [`nats`] starts and stops the `nats-server` the JetStream backend's tests run against.
//! [`fault_proxy`] puts a loopback TCP proxy between a client and a server (or between
//! two cluster nodes, [`nats::NatsCluster::with_proxied_node`]) that delays, blackholes or
//! stalls one direction or both, cuts, refuses new connections, and heals: partitions
//! without pausing a process (R-DIST-9).
//!
//! # Features
//! - `tokio`: [`TokioDriver`], so the suites also run under tidings' tokio driver (the
//!   [`durable_conformance!`] macro adds its cases by itself); pulls in `tokio`
//!   (rt-multi-thread, time) and turns on `tidings/tokio`.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod child;
pub mod driver;
pub mod durable;
pub mod durable_macros;
pub mod durable_suite;
pub mod fault_proxy;
pub mod helpers;
mod launch;
pub mod nats;
pub mod postgres;
pub mod process;
pub mod suite;

#[cfg(feature = "tokio")]
pub use driver::TokioDriver;
pub use driver::{DriverUnderTest, ManualDriver, ThreadedDriver};
pub use durable::{CaseOutcome, DurableStore, DurableTarget, EmbeddedLog, EmbeddedSeam};
/// What a durable backend can do; the suite's cases skip, visibly, what it cannot.
pub use tidings::durable::Capabilities;

/// The `tidings` crate, for paths inside the exported macros.
#[doc(hidden)]
pub use tidings as __tidings;
