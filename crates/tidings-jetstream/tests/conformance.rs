//! The durable cases of the conformance suite on NATS JetStream (R-DIST-2), under every
//! driver, against a `nats-server` started per case by the testkit launcher.
//!
//! The suite runs unchanged; capability flags say what JetStream does differently. It
//! cannot keep a priority and stamps `StartAt::Time` with the server's clock (the cases
//! needing those skip, naming the capability), numbers offsets from 1, and acknowledges
//! each message on its own instead of committing a low watermark (after a restart only the
//! unfinished messages come again).
//!
//! Without a `nats-server` binary the launcher installs one (or the cases fail with the fix);
//! they skip, with a notice, only under `TIDINGS_SKIP_NATS=1`.

use std::sync::Arc;
use std::time::Duration;

use tidings::{Broker, BrokerBuilder, StreamConfig, StreamError};
use tidings_jetstream::{ConnectOptions, JetStreamBackend};
use tidings_testkit::nats::{NatsServer, NatsServerOptions, install};
use tidings_testkit::{Capabilities, DurableStore, DurableTarget};

/// JetStream on a fresh server per case.
struct JetStream;

/// One case's server and the backend connected to it (dropped first).
struct Store {
    backend: Arc<JetStreamBackend>,
    _server: NatsServer,
}

impl DurableTarget for JetStream {
    fn name(&self) -> String {
        "jetstream".into()
    }
    fn caps(&self) -> Capabilities {
        tidings_jetstream::CAPABILITIES
    }
    fn unavailable(&self) -> Option<String> {
        if install::skip_requested() {
            return Some(format!("{}=1", install::SKIP_ENV));
        }
        // Installs a missing binary, or fails the case with the fix.
        if let Err(e) = install::ensure_binary() {
            panic!("the JetStream cases need a nats-server: {e}");
        }
        None
    }
    fn open(&self) -> Box<dyn DurableStore> {
        let server = NatsServer::start(NatsServerOptions::new())
            .unwrap_or_else(|e| panic!("could not start nats-server: {e}"));
        let backend = JetStreamBackend::connect(
            ConnectOptions::new(server.url()).request_timeout(Duration::from_secs(5)),
        )
        .expect("connects");
        Box::new(Store {
            backend: Arc::new(backend),
            _server: server,
        })
    }
}

impl DurableStore for Store {
    fn attach(&self, builder: BrokerBuilder) -> BrokerBuilder {
        builder
            .durable_backend(Arc::clone(&self.backend) as Arc<dyn tidings::durable::DurableBackend>)
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

tidings_testkit::durable_conformance!(jetstream, JetStream);
