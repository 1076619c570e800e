//! Durable streams and durable subscriptions, independent of where messages are kept.
//!
//! [`source`] is the seam a backend implements (the embedded log, NATS JetStream); its
//! types are re-exported here.

pub mod source;

pub use source::{
    BackendCursor, BackendStream, Capabilities, CursorSpec, CursorState, CursorWaker,
    DurableBackend, DurableDeadLetter, Finished, Outcome,
};
