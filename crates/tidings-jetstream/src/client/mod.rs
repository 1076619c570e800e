//! The async JetStream client layer the backend is written on: streams, appends, durable
//! pull consumers and publish pipelines over one
//! [`JetStream`](crate::connection::connect::JetStream) handle.

pub(crate) mod consumer;
pub(crate) mod consumer_settings;
pub(crate) mod delivery;
pub(crate) mod durable;
pub mod pipeline;
pub(crate) mod stream_spec;
