//! Documented limits on what the broker accepts (R-LIM-1).

use crate::error::ConfigError;

/// Sizes and counts the broker refuses beyond, with a typed error naming the limit.
///
/// Built with [`Limits::new`] (the defaults) and its setters; the fields stay readable, and
/// a new limit is not a breaking change (`#[non_exhaustive]`).
///
/// ```
/// # use tidings::Limits;
/// let limits = Limits::new().max_payload_bytes(1 << 20).max_headers(16);
/// assert_eq!(limits.max_payload_bytes, 1 << 20);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Largest payload in bytes. Default 8 MiB.
    pub max_payload_bytes: usize,
    /// Most headers on one message. Default 64.
    pub max_headers: usize,
    /// Largest total of header names and values in bytes. Default 64 KiB.
    pub max_header_bytes: usize,
    /// Largest key in bytes. Default 1 KiB.
    pub max_key_bytes: usize,
    /// Most live subscriptions on one broker. Default 1,000,000.
    pub max_subscriptions: usize,
    /// Largest correlation id in bytes. Default 1 KiB. (The reply-to topic is bounded by
    /// the topic limits, [`MAX_TOPIC_LEN`](crate::MAX_TOPIC_LEN).)
    pub max_correlation_id_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_payload_bytes: 8 << 20,
            max_headers: 64,
            max_header_bytes: 64 << 10,
            max_key_bytes: 1 << 10,
            max_subscriptions: 1_000_000,
            max_correlation_id_bytes: 1 << 10,
        }
    }
}

impl Limits {
    /// The defaults (see each field).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
    /// Largest payload in bytes.
    #[must_use]
    pub fn max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }
    /// Most headers on one message.
    #[must_use]
    pub fn max_headers(mut self, headers: usize) -> Self {
        self.max_headers = headers;
        self
    }
    /// Largest total of header names and values in bytes.
    #[must_use]
    pub fn max_header_bytes(mut self, bytes: usize) -> Self {
        self.max_header_bytes = bytes;
        self
    }
    /// Largest key in bytes.
    #[must_use]
    pub fn max_key_bytes(mut self, bytes: usize) -> Self {
        self.max_key_bytes = bytes;
        self
    }
    /// Most live subscriptions on one broker.
    #[must_use]
    pub fn max_subscriptions(mut self, subscriptions: usize) -> Self {
        self.max_subscriptions = subscriptions;
        self
    }
    /// Largest correlation id in bytes.
    #[must_use]
    pub fn max_correlation_id_bytes(mut self, bytes: usize) -> Self {
        self.max_correlation_id_bytes = bytes;
        self
    }
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let checks = [
            ("limits.max_payload_bytes", self.max_payload_bytes),
            ("limits.max_header_bytes", self.max_header_bytes),
            ("limits.max_key_bytes", self.max_key_bytes),
            ("limits.max_subscriptions", self.max_subscriptions),
            (
                "limits.max_correlation_id_bytes",
                self.max_correlation_id_bytes,
            ),
        ];
        for (setting, value) in checks {
            if value == 0 {
                return Err(ConfigError::invalid(setting, "0".into(), "at least 1"));
            }
        }
        Ok(())
    }
}
