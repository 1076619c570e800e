//! The durable dimension of the suite: where durable streams live (R-DIST-2).
//!
//! A [`DurableTarget`] opens a fresh, empty [`DurableStore`] for each case; the store
//! outlives the brokers a case builds on it, so a case can close its broker and build a new
//! one on the same store (a restart). [`Capabilities`] say what the backend can do; a case
//! that needs a missing capability returns [`CaseOutcome::Skipped`] naming it, and the test that
//! ran it prints the reason.
//!
//! A store attaches its storage to each broker the case builds with
//! [`DurableStore::attach`]: the embedded log through
//! [`BrokerBuilder::data_dir`](tidings::BrokerBuilder::data_dir) ([`EmbeddedLog`]), any
//! other backend through
//! [`BrokerBuilder::durable_backend`](tidings::BrokerBuilder::durable_backend)
//! ([`EmbeddedSeam`] does so with the embedded log, as JetStream does with its own). A new
//! backend implements these two traits and runs the whole suite under every driver with
//! one line: [`durable_conformance!`](crate::durable_conformance).

use std::sync::Arc;

use tidings::durable::Capabilities;
use tidings::embedded::EmbeddedBackend;
use tidings::{Broker, BrokerBuilder, StreamConfig, StreamError};

/// A kind of durable storage the suite runs its durable cases against.
pub trait DurableTarget {
    /// A short name for failure messages.
    fn name(&self) -> String;
    /// What it can do (what the backend's
    /// [`capabilities`](tidings::durable::DurableBackend::capabilities) say).
    fn caps(&self) -> Capabilities;
    /// Why this backend cannot run here (a server binary missing, say): every case is then
    /// skipped with this reason. `None`, the default: it can.
    fn unavailable(&self) -> Option<String> {
        None
    }
    /// A fresh, empty store for one case. It lives until the case drops it, across every
    /// broker the case builds on it.
    fn open(&self) -> Box<dyn DurableStore>;
}

/// One case's durable storage, shared by the brokers the case builds on it in turn.
pub trait DurableStore {
    /// Point `builder` at this store: for the embedded log its data directory, for any
    /// other backend `builder.durable_backend(..)` with the backend serving this store.
    fn attach(&self, builder: BrokerBuilder) -> BrokerBuilder;
    /// Create — or, on a broker built after a restart, reopen — the stream `name` capturing
    /// the topics matching `patterns`, acknowledging appends durably.
    ///
    /// # Errors
    /// What [`Broker::create_stream`] reports.
    fn create_stream(
        &self,
        broker: &Broker,
        name: &str,
        patterns: &[&str],
    ) -> Result<(), StreamError>;
}

/// The embedded log (`tidings-log`) in a temporary data directory, fsync on every append
/// (the default).
#[derive(Debug, Default, Clone, Copy)]
pub struct EmbeddedLog;

impl DurableTarget for EmbeddedLog {
    fn name(&self) -> String {
        "embedded-log".into()
    }
    fn caps(&self) -> Capabilities {
        Capabilities::all()
    }
    /// # Panics
    /// If no temporary directory can be made (a test-environment failure).
    fn open(&self) -> Box<dyn DurableStore> {
        Box::new(EmbeddedStore {
            dir: tempfile::tempdir().expect("a temporary directory"),
        })
    }
}

/// A temporary data directory, removed on drop.
struct EmbeddedStore {
    dir: tempfile::TempDir,
}

impl DurableStore for EmbeddedStore {
    fn attach(&self, builder: BrokerBuilder) -> BrokerBuilder {
        builder.data_dir(self.dir.path())
    }
    fn create_stream(
        &self,
        broker: &Broker,
        name: &str,
        patterns: &[&str],
    ) -> Result<(), StreamError> {
        broker
            .create_stream(StreamConfig::new(name, patterns.iter().copied()))
            .map(drop)
    }
}

/// The embedded log in a temporary directory, plugged in through
/// [`BrokerBuilder::durable_backend`](tidings::BrokerBuilder::durable_backend) as any other
/// backend is: proves the suite runs through the seam alone.
#[derive(Debug, Default, Clone, Copy)]
pub struct EmbeddedSeam;

impl DurableTarget for EmbeddedSeam {
    fn name(&self) -> String {
        "embedded-seam".into()
    }
    fn caps(&self) -> Capabilities {
        let backend = EmbeddedBackend::new("unused");
        tidings::durable::DurableBackend::capabilities(&backend)
    }
    /// # Panics
    /// If no temporary directory can be made (a test-environment failure).
    fn open(&self) -> Box<dyn DurableStore> {
        Box::new(SeamStore {
            dir: tempfile::tempdir().expect("a temporary directory"),
        })
    }
}

/// A temporary data directory served by a new [`EmbeddedBackend`] for each broker.
struct SeamStore {
    dir: tempfile::TempDir,
}

impl DurableStore for SeamStore {
    fn attach(&self, builder: BrokerBuilder) -> BrokerBuilder {
        builder.durable_backend(Arc::new(EmbeddedBackend::new(self.dir.path())))
    }
    fn create_stream(
        &self,
        broker: &Broker,
        name: &str,
        patterns: &[&str],
    ) -> Result<(), StreamError> {
        broker
            .create_stream(StreamConfig::new(name, patterns.iter().copied()))
            .map(drop)
    }
}

/// What running one durable case did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a skipped case must be reported"]
pub enum CaseOutcome {
    /// Every assertion of the case ran.
    Ran,
    /// The backend lacks what the case needs: the reason names the capability.
    Skipped(String),
}
