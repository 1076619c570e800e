//! The async JetStream client layer the backend is written on, internal to this crate:
//! streams, appends and durable pull consumers over one
//! [`JetStream`](crate::connection::connect::JetStream) handle.

pub(crate) mod consumer;
pub(crate) mod consumer_settings;
pub(crate) mod delivery;
pub(crate) mod durable;
pub(crate) mod kv_last;
pub(crate) mod stream_spec;
#[cfg(test)]
mod tests;
