//! What a durable subscription reads: the stream, its durable name, a filter and where it
//! starts (R-LOG-3, R-LOG-4).

use super::StartAt;

/// Which stream a durable subscription reads, under which durable name, which of its
/// messages and from where: the target of [`Broker::subscribe`](crate::Broker::subscribe)
/// for a durable subscription (its contract — where it resumes, clamping, the window — is
/// in that method's *Durable targets* section).
///
/// Built from the stream's name; the other parts are named by their methods, so two names
/// cannot be swapped silently.
///
/// | part | method | default |
/// |---|---|---|
/// | stream | [`DurableSpec::new`] | (required) |
/// | durable name | [`DurableSpec::name`] | (required) |
/// | filter pattern | [`DurableSpec::filter`] | every message of the stream |
/// | start position | [`DurableSpec::start`] | [`StartAt::Earliest`] |
///
/// # Names
/// The durable name is the key of the subscription's committed position (R-LOG-3): a later
/// subscription with the same stream and name resumes where this one stopped, and `start`
/// applies only when no position is committed yet. A spec without a name (or with an empty
/// one) is refused by `subscribe` with [`StreamError::InvalidName`], as is any name
/// that is not 1 to 200 bytes of ASCII letters, digits, `-`, `_` and `.`.
///
/// # Filter
/// A [`Pattern`](crate::Pattern) over topics. Without one the subscription receives every
/// message of the stream, whichever of the stream's patterns captured it. The filter is
/// checked by `subscribe` ([`StreamError::InvalidPattern`]).
///
/// ```
/// use tidings::{Broker, DurableSpec, Message, StartAt, StreamConfig, SubscribeOptions};
/// # let dir = tempfile::tempdir()?;
/// let broker = Broker::builder().data_dir(dir.path()).build()?;
/// broker.create_stream(StreamConfig::new("orders", ["orders.#"]))?;
/// let billing = broker.subscribe(
///     DurableSpec::new("orders")        // the stream
///         .name("billing")               // the durable name (required)
///         .filter("orders.created")      // optional; default: every message of the stream
///         .start(StartAt::Earliest),     // optional; default StartAt::Earliest
///     SubscribeOptions::default(),
///     |m: &Message| {
///         println!("billing {:?}", m.payload());
///         Ok(())
///     },
/// )?;
/// assert_eq!(billing.durable_name(), "billing");
/// assert_eq!(billing.stream(), "orders");
/// # broker.close(std::time::Duration::from_secs(1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// [`StreamError::InvalidName`]: crate::StreamError::InvalidName
/// [`StreamError::InvalidPattern`]: crate::StreamError::InvalidPattern
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct DurableSpec {
    pub(crate) stream: String,
    /// Empty until [`DurableSpec::name`] sets it (refused as an invalid name).
    pub(crate) name: String,
    /// `None`: every message of the stream.
    pub(crate) filter: Option<String>,
    pub(crate) start: StartAt,
}

impl DurableSpec {
    /// A spec reading the stream `stream`: no name yet (required, see
    /// [`DurableSpec::name`]), every message, from [`StartAt::Earliest`].
    pub fn new(stream: impl Into<String>) -> Self {
        Self {
            stream: stream.into(),
            name: String::new(),
            filter: None,
            start: StartAt::Earliest,
        }
    }

    /// The durable name: the key of the committed position, so the subscription resumes
    /// under it after a restart (R-LOG-3). Required.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Only the stream's messages whose topic matches this [`Pattern`](crate::Pattern).
    /// Default: every message of the stream.
    pub fn filter(mut self, pattern: impl Into<String>) -> Self {
        self.filter = Some(pattern.into());
        self
    }

    /// Where to start when the name has no committed position yet (R-LOG-4); ignored when
    /// it has one. Default: [`StartAt::Earliest`].
    pub fn start(mut self, at: StartAt) -> Self {
        self.start = at;
        self
    }

    /// The filter pattern the subscription uses: the one given, or `#` (every topic, on
    /// every backend) by default.
    pub(crate) fn filter_pattern(&self) -> &str {
        self.filter.as_deref().unwrap_or(crate::topic::HASH)
    }
}
