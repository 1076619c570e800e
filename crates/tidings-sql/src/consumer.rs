//! The consumer a processed-messages table records ids for.

use std::fmt;

use crate::error::ConsumerNameError;

/// The longest consumer name accepted, in bytes.
pub const MAX_CONSUMER_NAME_LEN: usize = 128;

/// A validated consumer name: whose ids a [`Transactional`](crate::Transactional) records.
///
/// # Contract
/// The processed-messages table is keyed by (consumer, message id), and its fence table by
/// (consumer, key partition): a message id recorded by one consumer never makes another
/// skip it, and one consumer's lease terms never fence another. Name the consumer after
/// what applies the effects, e.g. the durable subscription's name; every process, lane or
/// handler that applies *the same* effects uses the same name (then a redelivery to any of
/// them is a skip), and handlers applying *different* effects use different names.
///
/// Non-empty, at most [`MAX_CONSUMER_NAME_LEN`] bytes, no control characters (it appears
/// in error texts and logs). It is stored as a value, never written into SQL text.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ConsumerName(String);

impl ConsumerName {
    /// Validate `name`.
    ///
    /// # Errors
    /// [`ConsumerNameError`] says what is wrong with it.
    pub fn new(name: &str) -> Result<Self, ConsumerNameError> {
        if name.is_empty() {
            return Err(ConsumerNameError::Empty);
        }
        if name.len() > MAX_CONSUMER_NAME_LEN {
            return Err(ConsumerNameError::TooLong {
                len: name.len(),
                max: MAX_CONSUMER_NAME_LEN,
            });
        }
        if let Some((at, found)) = name.char_indices().find(|(_, c)| c.is_control()) {
            return Err(ConsumerNameError::Control { found, at });
        }
        Ok(Self(name.to_owned()))
    }

    /// The name as given.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as an SQL string literal (single-quoted, quotes doubled), for the
    /// migration a refused table's error spells out.
    pub(crate) fn literal(&self) -> String {
        format!("'{}'", self.0.replace('\'', "''"))
    }
}

impl fmt::Display for ConsumerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ConsumerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConsumerName({:?})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(ConsumerName::new("billing").unwrap().as_str(), "billing");
        assert!(ConsumerName::new("orders/billing v2 — ü").is_ok());
        assert_eq!(ConsumerName::new(""), Err(ConsumerNameError::Empty));
        assert_eq!(
            ConsumerName::new(&"a".repeat(129)),
            Err(ConsumerNameError::TooLong { len: 129, max: 128 })
        );
        assert!(ConsumerName::new(&"a".repeat(128)).is_ok());
        assert_eq!(
            ConsumerName::new("a\nb"),
            Err(ConsumerNameError::Control { found: '\n', at: 1 })
        );
        assert_eq!(
            ConsumerName::new("o'brien").unwrap().literal(),
            "'o''brien'"
        );
    }
}
