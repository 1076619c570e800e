//! [`TopicName`]: the topic a [`MessageBuilder`](crate::MessageBuilder) publishes to, as the
//! caller gave it, held without a heap allocation when it can be.
//!
//! # Why
//!
//! A publish to a hot topic takes the validated [`Topic`] from the route cache
//! (src/route_cache.rs): the builder's spelling is used only to look the route up. Holding
//! that spelling in a `String` cost one `malloc` and one `free` per publish for a string
//! nobody kept. So a short spelling is copied into the builder itself (the common
//! `Message::to("orders.created")`), a checked [`Topic`] is shared (its reference count goes
//! up), and only a long string is owned on the heap.
//!
//! # Size
//!
//! The three forms share the 24 bytes a `String` took: the inline form holds up to
//! [`INLINE`] bytes. A wider builder would make every publish copy more (measured slower by
//! an earlier attempt with a larger inline buffer), so the buffer is exactly what fits.

use std::borrow::Cow;
use std::fmt;

use crate::topic::Topic;

/// Longest spelling held inside the builder without an allocation.
const INLINE: usize = 22;

/// The topic given to [`Message::to`](crate::Message::to) or
/// [`MessageBuilder::new`](crate::MessageBuilder::new): a string not yet checked, or a
/// [`Topic`] checked already.
///
/// Every string type that converts into a `String` converts into a `TopicName` too (`&str`,
/// `&mut str`, `String`, `&String`, `Box<str>`, `Cow<str>`, `char`), and so do [`Topic`]
/// and `&Topic`. A string is checked at publish, as before.
///
/// ```
/// # use tidings::*;
/// # fn region() -> &'static str { "eu" }
/// let owned = String::from("orders.created");
/// let borrowed: &str = owned.as_str(); // not 'static
/// let checked = Topic::new("orders.created")?;
/// let builders = [
///     Message::to("orders.created"),
///     Message::to(owned.clone()),
///     Message::to(&owned),
///     Message::to(borrowed),
///     Message::to(format!("orders.{}", region())),
///     Message::to(std::borrow::Cow::Borrowed("orders.created")),
///     Message::to(checked.clone()),
///     Message::to(&checked),
///     MessageBuilder::new(&checked),
/// ];
/// # let _ = builders;
/// # Ok::<(), TopicError>(())
/// ```
///
/// Generic code bounded by `Into<String>` converts first: `Message::to(String::from(t))`, or
/// bound by `Into<TopicName>` instead.
///
/// # Publishing without an allocation
///
/// A publish to a topic published before (and no subscribe or unsubscribe since) allocates
/// nothing for its topic when the topic is given as
/// - a [`Topic`] or `&Topic`, of any length: validate it once with [`Topic::new`] and keep
///   it (cloning it is a reference-count increment); or
/// - a string of at most 22 bytes (`Message::to("orders.created")`), which the builder holds
///   inline.
///
/// A longer string is copied into one heap allocation (a `String` passed by value is kept as
/// it is, shrunk to its length when it has spare capacity).
///
/// ```
/// # use tidings::*;
/// let broker = Broker::new();
/// let topic = Topic::new("orders.eu.created.priority")?; // checked once, 26 bytes
/// for n in 0..3 {
///     broker.publish(Message::to(&topic).payload(n.to_string()))?;
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct TopicName(Repr);

#[derive(Clone)]
enum Repr {
    /// A short spelling, not checked yet: `len` bytes of `buf`, valid UTF-8.
    Inline { len: u8, buf: [u8; INLINE] },
    /// A longer spelling, not checked yet.
    Heap(Box<str>),
    /// Checked already.
    Checked(Topic),
}

impl TopicName {
    /// The topic as spelled.
    #[must_use]
    pub fn as_str(&self) -> &str {
        match &self.0 {
            // Filled only from a `&str` cut at a character boundary, so this never fails;
            // an empty string would be refused at publish as an invalid topic.
            Repr::Inline { len, buf } => {
                std::str::from_utf8(&buf[..usize::from(*len)]).unwrap_or_default()
            }
            Repr::Heap(s) => s,
            Repr::Checked(t) => t.as_str(),
        }
    }

    /// The topic's bytes as spelled, without the check [`TopicName::as_str`] makes: what the
    /// publish path looks a cached route up by (a hit proves the spelling valid), so a hot
    /// topic is never checked again.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, buf } => &buf[..usize::from(*len)],
            Repr::Heap(s) => s.as_bytes(),
            Repr::Checked(t) => t.as_str().as_bytes(),
        }
    }

    /// The [`Topic`] it was given as, when it was given as one.
    #[must_use]
    pub fn checked(&self) -> Option<&Topic> {
        match &self.0 {
            Repr::Checked(t) => Some(t),
            _ => None,
        }
    }

    /// The checked topic: the one given (shared), or the string validated ([`Topic::new`]).
    pub(crate) fn to_topic(&self) -> Result<Topic, crate::topic::TopicError> {
        match &self.0 {
            Repr::Checked(t) => Ok(t.clone()),
            _ => Topic::new(self.as_str()),
        }
    }

    /// Copy `s` inline when it fits, else onto the heap.
    fn copied(s: &str) -> Self {
        let mut buf = [0u8; INLINE];
        match buf.get_mut(..s.len()) {
            Some(head) => {
                head.copy_from_slice(s.as_bytes());
                Self(Repr::Inline {
                    len: s.len() as u8,
                    buf,
                })
            }
            None => Self(Repr::Heap(Box::from(s))),
        }
    }
}

impl fmt::Debug for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TopicName({:?})", self.as_str())
    }
}

impl fmt::Display for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl AsRef<str> for TopicName {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for TopicName {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for TopicName {}

impl From<&str> for TopicName {
    fn from(s: &str) -> Self {
        Self::copied(s)
    }
}

impl From<&mut str> for TopicName {
    fn from(s: &mut str) -> Self {
        Self::copied(s)
    }
}

impl From<&String> for TopicName {
    fn from(s: &String) -> Self {
        Self::copied(s)
    }
}

impl From<String> for TopicName {
    /// A short string is copied inline (its allocation freed); a longer one is kept.
    fn from(s: String) -> Self {
        if s.len() <= INLINE {
            Self::copied(&s)
        } else {
            Self(Repr::Heap(s.into_boxed_str()))
        }
    }
}

impl From<Box<str>> for TopicName {
    fn from(s: Box<str>) -> Self {
        if s.len() <= INLINE {
            Self::copied(&s)
        } else {
            Self(Repr::Heap(s))
        }
    }
}

impl From<Cow<'_, str>> for TopicName {
    fn from(s: Cow<'_, str>) -> Self {
        match s {
            Cow::Borrowed(s) => Self::copied(s),
            Cow::Owned(s) => Self::from(s),
        }
    }
}

impl From<char> for TopicName {
    fn from(c: char) -> Self {
        Self::copied(c.encode_utf8(&mut [0; 4]))
    }
}

impl From<Topic> for TopicName {
    fn from(t: Topic) -> Self {
        Self(Repr::Checked(t))
    }
}

impl From<&Topic> for TopicName {
    fn from(t: &Topic) -> Self {
        Self(Repr::Checked(t.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn as_wide_as_the_string_it_replaces() {
        assert_eq!(
            std::mem::size_of::<TopicName>(),
            std::mem::size_of::<String>()
        );
    }

    #[test]
    fn every_form_spells_its_topic() {
        let long = "a".repeat(INLINE + 1);
        let exact = "b".repeat(INLINE);
        let topic = Topic::new("c.d").expect("valid");
        let cases: Vec<(TopicName, &str)> = vec![
            ("a.b".into(), "a.b"),
            (exact.as_str().into(), &exact),
            (long.as_str().into(), &long),
            (long.clone().into(), &long),
            (String::from("s.t").into(), "s.t"),
            (Box::<str>::from(long.as_str()).into(), &long),
            (Cow::Borrowed("w").into(), "w"),
            ('x'.into(), "x"),
            ('é'.into(), "é"),
            ("".into(), ""),
            ("ü.ö".into(), "ü.ö"),
            ((&topic).into(), "c.d"),
            (topic.clone().into(), "c.d"),
        ];
        for (name, want) in cases {
            assert_eq!(name.as_str(), want);
            assert_eq!(name.clone().as_str(), want);
        }
        assert!(TopicName::from(&topic).checked().is_some());
        assert!(TopicName::from("c.d").checked().is_none());
        assert!(matches!(
            TopicName::from(exact.as_str()).0,
            Repr::Inline { .. }
        ));
        assert!(matches!(TopicName::from(long.as_str()).0, Repr::Heap(_)));
    }
}
