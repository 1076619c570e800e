//! An open stream: its configuration and patterns around the backend's stream, and the
//! user's [`Stream`] handle on it.

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use tidings_log::{RecoveryReport, RetentionReport};

use crate::message::Message;
use crate::topic::Pattern;

use super::source::BackendStream;
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
    /// What opening found (empty for a backend that does not recover local files).
    pub(crate) recovery: RecoveryReport,
}

impl OpenStream {
    pub(crate) fn name(&self) -> &str {
        &self.config.name
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
    /// Its directory (`<data_dir>/streams/<name>` for the embedded log); `None` for a
    /// backend that keeps no local files.
    #[must_use]
    pub fn dir(&self) -> Option<&Path> {
        self.inner.backend.dir()
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
    /// What opening the log found and repaired (torn tail, rebuilt indexes, ignored files);
    /// empty for a backend that keeps no local log.
    #[must_use]
    pub fn recovery(&self) -> &RecoveryReport {
        &self.inner.recovery
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

    /// Remove old segments per the stream's retention, judging age against `now`, now. The
    /// log does this after every segment roll and the broker on a timer
    /// ([`StreamConfig::retention_interval`]); call it to force a pass.
    ///
    /// # Errors
    /// Removing failed, or the backend applies retention itself
    /// ([`StreamError::Unsupported`]).
    pub fn apply_retention(&self, now: SystemTime) -> Result<RetentionReport, StreamError> {
        self.inner.backend.apply_retention(now)
    }
}
