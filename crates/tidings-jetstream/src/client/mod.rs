//! The async JetStream client layer the backend is written on: streams, appends, durable
//! pull consumers and publish pipelines over one [`JetStream`](crate::connection::connect::JetStream)
//! handle.

pub(crate) mod consumer;
pub mod pipeline;
pub(crate) mod stream;
