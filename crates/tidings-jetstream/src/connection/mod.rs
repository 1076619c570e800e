//! The connection to a NATS server that the JetStream backend and the NATS transport are
//! both built from.

pub(crate) mod connect;
pub(crate) mod runtime;
