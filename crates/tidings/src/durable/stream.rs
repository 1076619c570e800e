//! An open stream: its configuration and patterns around the backend's stream, and the
//! user's [`Stream`] handle on it.

use std::sync::Arc;
use std::time::Duration;

use crate::message::Message;
use crate::topic::Pattern;

use super::source::{BackendStream, StorageInfo};
use super::{StreamConfig, StreamError};

/// One stream open in a broker.
#[derive(Debug)]
pub(crate) struct OpenStream {
    pub(crate) config: StreamConfig,
    pub(crate) patterns: Vec<Pattern>,
    pub(crate) backend: Arc<dyn BackendStream>,
    /// The backend's name, for errors.
    pub(crate) backend_name: &'static str,
    /// The backend stores priority.
    pub(crate) keeps_priority: bool,
}

impl OpenStream {
    pub(crate) fn name(&self) -> &str {
        &self.config.name
    }

    /// The period of the broker's retention timer for this stream (`Duration::MAX`:
    /// never, the backend applies retention itself).
    pub(crate) fn retention_interval(&self) -> Duration {
        self.backend.retention_interval().unwrap_or(Duration::MAX)
    }
}

/// A handle on an open stream (cheap to clone).
#[derive(Debug, Clone)]
pub struct Stream {
    pub(crate) inner: Arc<OpenStream>,
}

impl Stream {
    /// The stream's name.
    #[must_use]
    pub fn name(&self) -> &str {
        self.inner.name()
    }
    /// The patterns it captures.
    #[must_use]
    pub fn patterns(&self) -> &[Pattern] {
        &self.inner.patterns
    }
    /// Its configuration.
    pub fn config(&self) -> &StreamConfig {
        &self.inner.config
    }
    /// The earliest retained offset.
    #[must_use]
    pub fn start_offset(&self) -> u64 {
        self.inner.backend.start_offset()
    }
    /// One past the last readable record.
    #[must_use]
    pub fn end_offset(&self) -> u64 {
        self.inner.backend.end_offset()
    }
    /// Read up to `max` messages from `from` (each carries its [`Message::offset`]).
    /// Reading moves no durable subscription.
    ///
    /// # Errors
    /// [`StreamError::OutOfRetention`], [`StreamError::BeyondEnd`], or what reading failed
    /// with (a record that is not a tidings message is [`StreamError::Decode`], R-LIM-2).
    pub fn read(&self, from: u64, max: usize) -> Result<Vec<Message>, StreamError> {
        self.inner.backend.read(from, max)
    }

    /// Where and how the backend stores it (size, location, durability), as a snapshot
    /// shows it. The embedded log's own details (directory, recovery report, a retention
    /// pass on demand) are on [`EmbeddedBackend`](crate::embedded::EmbeddedBackend).
    #[must_use]
    pub fn storage_info(&self) -> StorageInfo {
        self.inner.backend.storage_info()
    }
}
