//! Topics, subscription patterns and their validation (R-RT-1, R-RT-2, R-LIM-1).
//!
//! The syntax, the limits and the matching semantics are documented for users in the crate
//! docs, section "Topics and patterns"; the types are re-exported at the crate root.

use std::borrow::Borrow;
use std::fmt;
use std::iter::FusedIterator;
use std::str::FromStr;
use std::sync::Arc;

mod dfa;
pub(crate) mod trie;

pub use trie::TopicTrie;

/// Maximum length in bytes of a topic or pattern, separators included (AMQP's routing-key limit).
pub const MAX_TOPIC_LEN: usize = 255;

/// Maximum number of words in a topic or pattern (wildcards count as words).
pub const MAX_WORDS: usize = 32;

/// Maximum length in bytes of a single word.
pub const MAX_WORD_LEN: usize = 64;

/// The word separator.
pub const SEPARATOR: char = '.';

/// The single-word wildcard: matches exactly one word.
pub const STAR: &str = "*";

/// The multi-word wildcard: matches zero or more words.
pub const HASH: &str = "#";

/// Whether `c` may appear in a (non-wildcard) word: ASCII letters, ASCII digits, `-`, `_`, `:`.
#[must_use]
pub const fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | ':')
}

/// Why a string was refused as a [`Topic`] or [`Pattern`].
///
/// Every variant names the rule broken and, for limits, the limit's value (R-LIM-1). Positions
/// are 0-based: `index` counts words, `offset` counts bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TopicError {
    /// The string is empty.
    #[error("topic is empty")]
    Empty,
    /// The string is longer than [`MAX_TOPIC_LEN`] bytes.
    #[error("topic is {len} bytes long, over the limit of {max} bytes")]
    TooLong {
        /// Actual length in bytes.
        len: usize,
        /// The limit ([`MAX_TOPIC_LEN`]).
        max: usize,
    },
    /// The string has more than [`MAX_WORDS`] words.
    #[error("topic has more than {max} words (the limit)")]
    TooManyWords {
        /// The limit ([`MAX_WORDS`]).
        max: usize,
    },
    /// A word is longer than [`MAX_WORD_LEN`] bytes.
    #[error("word {index} is {len} bytes long, over the limit of {max} bytes")]
    WordTooLong {
        /// Word index.
        index: usize,
        /// Actual length of the word in bytes.
        len: usize,
        /// The limit ([`MAX_WORD_LEN`]).
        max: usize,
    },
    /// A word is empty: leading or trailing `.`, or `..`.
    #[error("word {index} is empty (leading, trailing or doubled '.')")]
    EmptyWord {
        /// Word index.
        index: usize,
    },
    /// A character outside `A-Z a-z 0-9 - _ :` (and outside a whole-word wildcard).
    #[error(
        "invalid character {ch:?} at byte {offset}; allowed: A-Z a-z 0-9 - _ : and '.' between words"
    )]
    InvalidChar {
        /// The offending character.
        ch: char,
        /// Byte offset of the character in the string.
        offset: usize,
    },
    /// A publish topic contains a wildcard (`*` or `#`).
    #[error("wildcard {ch:?} in word {index}: a publish topic may not contain wildcards")]
    WildcardInTopic {
        /// The wildcard character.
        ch: char,
        /// Word index.
        index: usize,
    },
    /// A pattern word mixes a wildcard with other characters (`a*`, `#b`, `**`).
    #[error("word {index} mixes a wildcard with other characters; '*' and '#' must be whole words")]
    PartialWildcard {
        /// Word index.
        index: usize,
    },
}

/// Validates `s`; `wildcards` says whether whole-word `*`/`#` are allowed. Returns whether any
/// wildcard was seen.
fn validate(s: &str, wildcards: bool) -> Result<bool, TopicError> {
    if s.len() > MAX_TOPIC_LEN {
        return Err(TopicError::TooLong {
            len: s.len(),
            max: MAX_TOPIC_LEN,
        });
    }
    if s.is_empty() {
        return Err(TopicError::Empty);
    }
    let mut any_wildcard = false;
    let mut offset = 0;
    for (index, word) in s.split(SEPARATOR).enumerate() {
        if word.is_empty() {
            return Err(TopicError::EmptyWord { index });
        }
        if word == STAR || word == HASH {
            if !wildcards {
                return Err(TopicError::WildcardInTopic {
                    ch: if word == STAR { '*' } else { '#' },
                    index,
                });
            }
            any_wildcard = true;
        } else {
            for (i, ch) in word.char_indices() {
                if is_word_char(ch) {
                    continue;
                }
                if ch == '*' || ch == '#' {
                    return Err(if wildcards {
                        TopicError::PartialWildcard { index }
                    } else {
                        TopicError::WildcardInTopic { ch, index }
                    });
                }
                return Err(TopicError::InvalidChar {
                    ch,
                    offset: offset + i,
                });
            }
            if word.len() > MAX_WORD_LEN {
                return Err(TopicError::WordTooLong {
                    index,
                    len: word.len(),
                    max: MAX_WORD_LEN,
                });
            }
        }
        if index >= MAX_WORDS {
            return Err(TopicError::TooManyWords { max: MAX_WORDS });
        }
        offset += word.len() + 1;
    }
    Ok(any_wildcard)
}

/// An iterator over the words of a [`Topic`] or [`Pattern`], left to right.
#[derive(Debug, Clone)]
pub struct Words<'a> {
    rest: Option<&'a str>,
}

impl<'a> Iterator for Words<'a> {
    type Item = &'a str;

    #[inline]
    fn next(&mut self) -> Option<&'a str> {
        // A plain byte scan: words are short, so this beats a vectorised search's set-up cost.
        let rest = self.rest?;
        match rest.bytes().position(|b| b == b'.') {
            Some(i) => {
                self.rest = rest.get(i + 1..);
                rest.get(..i)
            }
            None => {
                self.rest = None;
                Some(rest)
            }
        }
    }
}

impl FusedIterator for Words<'_> {}

macro_rules! string_like {
    ($ty:ident, $what:literal) => {
        impl $ty {
            /// The validated string.
            #[must_use]
            #[inline]
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The words, left to right (wildcards included, for a pattern).
            #[inline]
            pub fn words(&self) -> Words<'_> {
                Words {
                    rest: Some(&self.0),
                }
            }

            /// Number of words (at least 1, at most [`MAX_WORDS`]).
            #[must_use]
            pub fn word_count(&self) -> usize {
                self.0.bytes().filter(|&b| b == b'.').count() + 1
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($what, "({:?})"), &*self.0)
            }
        }

        impl FromStr for $ty {
            type Err = TopicError;

            fn from_str(s: &str) -> Result<Self, TopicError> {
                Self::new(s)
            }
        }

        impl TryFrom<&str> for $ty {
            type Error = TopicError;

            fn try_from(s: &str) -> Result<Self, TopicError> {
                Self::new(s)
            }
        }

        impl TryFrom<String> for $ty {
            type Error = TopicError;

            fn try_from(s: String) -> Result<Self, TopicError> {
                Self::new(&s)
            }
        }

        impl AsRef<str> for $ty {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        /// Hashes and compares exactly like the underlying `str`.
        impl Borrow<str> for $ty {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $ty {
            fn eq(&self, other: &str) -> bool {
                &*self.0 == other
            }
        }

        impl PartialEq<&str> for $ty {
            fn eq(&self, other: &&str) -> bool {
                &*self.0 == *other
            }
        }

        /// Serialised as its string.
        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        /// Deserialised from a string and validated like `new` (invalid input is a serde error).
        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                Self::new(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}

/// A validated publish topic: dot-separated words, no wildcards (R-RT-2).
///
/// Cheap to clone (a reference-counted string). Equality, ordering and hashing are those of the
/// string, so a `HashMap<Topic, _>` can be queried with a `&str`.
///
/// ```
/// # use tidings::{Topic, TopicError};
/// let t: Topic = "orders.eu.created".parse()?;
/// assert_eq!(t.words().collect::<Vec<_>>(), ["orders", "eu", "created"]);
/// assert!(matches!(Topic::new("orders.*"), Err(TopicError::WildcardInTopic { .. })));
/// # Ok::<(), TopicError>(())
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Topic(Arc<str>);

impl Topic {
    /// Validates `s` as a publish topic (see [Topics and patterns](crate#topics-and-patterns) for the rules).
    ///
    /// # Errors
    ///
    /// The first rule broken, as a [`TopicError`]; a `*` or `#` anywhere gives
    /// [`TopicError::WildcardInTopic`].
    pub fn new(s: &str) -> Result<Self, TopicError> {
        // Every publish validates its topic: the common case takes one pass over the bytes,
        // and anything unusual gets the full check, which names the rule broken.
        if !plainly_valid_topic(s) {
            validate(s, false)?;
        }
        Ok(Self(Arc::from(s)))
    }
}

/// True when `s` is certainly a valid publish topic: ASCII word characters, non-empty words
/// within [`MAX_WORD_LEN`], at most [`MAX_WORDS`] words and [`MAX_TOPIC_LEN`] bytes. `false`
/// means only "not certainly": [`validate`] decides. One branch-light pass, no UTF-8 decoding
/// (every allowed character is ASCII, so a multi-byte character is refused here).
fn plainly_valid_topic(s: &str) -> bool {
    let bytes = s.as_bytes();
    if bytes.len() > MAX_TOPIC_LEN {
        return false;
    }
    let (mut words, mut word_len) = (1usize, 0usize);
    for &c in bytes {
        if c == b'.' {
            if word_len == 0 {
                return false;
            }
            words += 1;
            word_len = 0;
        } else if WORD_BYTE[usize::from(c)] {
            word_len += 1;
        } else {
            return false;
        }
    }
    word_len > 0 && words <= MAX_WORDS && longest_word_ok(bytes)
}

/// `WORD_BYTE[b]`: byte `b` is a word character ([`is_word_char`]), one load per byte.
const WORD_BYTE: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 128 {
        table[b] = is_word_char(b as u8 as char);
        b += 1;
    }
    table
};

/// No word of `bytes` is longer than [`MAX_WORD_LEN`] (split out of the hot loop: it rarely
/// matters and costs a compare per byte there).
fn longest_word_ok(bytes: &[u8]) -> bool {
    bytes.len() <= MAX_WORD_LEN
        || bytes
            .split(|&c| c == b'.')
            .all(|word| word.len() <= MAX_WORD_LEN)
}

string_like!(Topic, "Topic");

/// A validated subscription pattern: dot-separated words where `*` matches exactly one word and
/// `#` matches zero or more words, anywhere (AMQP 0-9-1 topic-exchange semantics, R-RT-1).
///
/// Kept exactly as written: `#.#` and `#` are different `Pattern` values that match the same
/// topics. Cheap to clone.
///
/// ```
/// # use tidings::{Pattern, Topic, TopicError};
/// let p: Pattern = "orders.*.#".parse()?;
/// assert!(p.matches(&Topic::new("orders.eu")?));
/// assert!(p.matches(&Topic::new("orders.eu.created.v2")?));
/// assert!(!p.matches(&Topic::new("orders")?));
/// # Ok::<(), TopicError>(())
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pattern(Arc<str>);

impl Pattern {
    /// Validates `s` as a subscription pattern (see [Topics and patterns](crate#topics-and-patterns) for the rules).
    ///
    /// # Errors
    ///
    /// The first rule broken, as a [`TopicError`]; a wildcard that is not a whole word gives
    /// [`TopicError::PartialWildcard`].
    pub fn new(s: &str) -> Result<Self, TopicError> {
        validate(s, true)?;
        Ok(Self(Arc::from(s)))
    }

    /// True when the pattern has no wildcard, so it matches exactly one topic (itself).
    #[must_use]
    pub fn is_literal(&self) -> bool {
        !self.0.bytes().any(|b| b == b'*' || b == b'#')
    }

    /// The single topic this pattern matches, when it is [literal](Self::is_literal).
    #[must_use]
    pub fn as_topic(&self) -> Option<Topic> {
        self.is_literal().then(|| Topic(Arc::clone(&self.0)))
    }

    /// Whether `topic` matches this pattern, with AMQP 0-9-1 semantics.
    ///
    /// This is a direct matcher for one pattern, in O(pattern words × topic words) time and no
    /// allocation; to match a topic against many patterns use [`TopicTrie`].
    #[must_use]
    pub fn matches(&self, topic: &Topic) -> bool {
        // NFA simulation: bit `i` of `states` = "the first `i` pattern words have consumed the
        // topic words seen so far". Validation bounds words to MAX_WORDS (32), so positions
        // 0..=32 fit in a u64.
        const _: () = assert!(MAX_WORDS < 64);
        let pat: [&str; MAX_WORDS] = {
            let mut a = [""; MAX_WORDS];
            for (slot, w) in a.iter_mut().zip(self.words()) {
                *slot = w;
            }
            a
        };
        let n = self.word_count().min(MAX_WORDS);
        let pat = &pat[..n];
        // Adds the epsilon moves: a `#` at position i may match zero words.
        let close = |mut s: u64| {
            for (i, w) in pat.iter().enumerate() {
                if s & (1 << i) != 0 && *w == HASH {
                    s |= 1 << (i + 1);
                }
            }
            s
        };
        let mut states = close(1);
        for word in topic.words() {
            let mut next = 0u64;
            for (i, w) in pat.iter().enumerate() {
                if states & (1 << i) == 0 {
                    continue;
                }
                if *w == HASH {
                    next |= 1 << i;
                } else if *w == STAR || *w == word {
                    next |= 1 << (i + 1);
                }
            }
            states = close(next);
            if states == 0 {
                return false;
            }
        }
        states & (1 << n) != 0
    }
}

string_like!(Pattern, "Pattern");

/// Every topic is a literal pattern matching exactly itself.
impl From<Topic> for Pattern {
    fn from(t: Topic) -> Self {
        Self(t.0)
    }
}

impl From<&Topic> for Pattern {
    fn from(t: &Topic) -> Self {
        Self(Arc::clone(&t.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The one-pass check never accepts what the full check refuses, and accepts the
        /// plain topics publishers use (R-RT-1).
        #[test]
        fn plain_check_agrees_with_validate(s in "[a-zA-Z0-9.:_#*é -]{0,80}|([a-z]{1,70}[.]){0,40}[a-z]{0,3}") {
            if plainly_valid_topic(&s) {
                proptest::prop_assert_eq!(validate(&s, false), Ok(false));
            }
            let plain = !s.is_empty()
                && s.split('.').all(|w| !w.is_empty() && w.len() <= MAX_WORD_LEN
                    && w.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b':')))
                && s.split('.').count() <= MAX_WORDS
                && s.len() <= MAX_TOPIC_LEN;
            proptest::prop_assert_eq!(plainly_valid_topic(&s), plain);
        }
    }

    fn t(s: &str) -> Topic {
        Topic::new(s).unwrap()
    }
    fn p(s: &str) -> Pattern {
        Pattern::new(s).unwrap()
    }

    /// Reference matcher, written straight from the AMQP 0-9-1 rules.
    pub(crate) fn naive(pat: &[&str], topic: &[&str]) -> bool {
        match pat.split_first() {
            None => topic.is_empty(),
            Some((&"#", rest)) => {
                naive(rest, topic) || (!topic.is_empty() && naive(pat, &topic[1..]))
            }
            Some((&"*", rest)) => !topic.is_empty() && naive(rest, &topic[1..]),
            Some((w, rest)) => topic.first() == Some(w) && naive(rest, &topic[1..]),
        }
    }

    /// (pattern, topic, expected) derived from the AMQP 0-9-1 topic-exchange rules.
    pub(crate) const AMQP_CASES: &[(&str, &str, bool)] = &[
        // `#` alone matches every topic.
        ("#", "a", true),
        ("#", "a.b", true),
        ("#", "a.b.c.d.e", true),
        // `*` alone matches exactly one word.
        ("*", "a", true),
        ("*", "a.b", false),
        ("*", "abc", true),
        // Literals.
        ("a", "a", true),
        ("a", "b", false),
        ("a", "a.b", false),
        ("a.b", "a", false),
        ("a.b", "a.b", true),
        ("a.b.c", "a.b.c", true),
        ("a.b.c", "a.b.d", false),
        ("A", "a", false),
        // `*` at every position.
        ("*.b.c", "a.b.c", true),
        ("*.b.c", "x.b.c", true),
        ("*.b.c", "b.c", false),
        ("a.*.c", "a.b.c", true),
        ("a.*.c", "a.c", false),
        ("a.*.c", "a.b.b.c", false),
        ("a.b.*", "a.b.c", true),
        ("a.b.*", "a.b", false),
        ("a.b.*", "a.b.c.d", false),
        ("*.*", "a.b", true),
        ("*.*", "a", false),
        ("*.*", "a.b.c", false),
        ("*.*.*", "a.b.c", true),
        // `#` at the start.
        ("#.c", "c", true),
        ("#.c", "a.c", true),
        ("#.c", "a.b.c", true),
        ("#.c", "a.b", false),
        ("#.c", "c.a", false),
        // `#` at the end.
        ("a.#", "a", true),
        ("a.#", "a.b", true),
        ("a.#", "a.b.c", true),
        ("a.#", "b.a", false),
        ("a.#", "b", false),
        // `#` in the middle.
        ("a.#.b", "a.b", true),
        ("a.#.b", "a.x.b", true),
        ("a.#.b", "a.x.y.b", true),
        ("a.#.b", "a.b.b", true),
        ("a.#.b", "a", false),
        ("a.#.b", "a.b.c", false),
        ("a.#.b", "b.a.b", false),
        // Repeated `#`.
        ("#.#", "a", true),
        ("#.#", "a.b.c", true),
        ("a.#.#.b", "a.b", true),
        ("a.#.#.b", "a.x.b", true),
        ("a.#.#.b", "a.x.y.z.b", true),
        ("a.#.#.b", "a.x", false),
        ("#.a.#", "a", true),
        ("#.a.#", "x.a", true),
        ("#.a.#", "a.x", true),
        ("#.a.#", "x.y.a.z", true),
        ("#.a.#", "a.a.a", true),
        ("#.a.#", "x.y", false),
        ("#.*.#", "a", true),
        ("#.*.#", "a.b.c", true),
        ("#.*.*.#", "a", false),
        ("#.*.*.#", "a.b", true),
        // `#` next to `*`: both mean "one or more".
        ("#.*", "a", true),
        ("#.*", "a.b.c", true),
        ("*.#", "a", true),
        ("*.#", "a.b", true),
        ("a.*.#", "a", false),
        ("a.*.#", "a.b", true),
        ("a.#.*", "a", false),
        ("a.#.*", "a.b.c", true),
        ("*.#.*", "a", false),
        ("*.#.*", "a.b", true),
        ("*.#.*", "a.b.c.d", true),
        // `#` between literals that repeat: backtracking is needed.
        ("#.a.b", "a.a.b", true),
        ("#.a.b", "a.b.a.b", true),
        ("#.a.b", "a.b.a", false),
        ("a.#.a", "a", false),
        ("a.#.a", "a.a", true),
        ("a.#.a", "a.b.a.b", false),
        ("#.b.#.c", "a.b.x.b.c", true),
        ("#.b.#.c", "a.c.b", false),
        // Single-word topics.
        ("a.*", "a", false),
        ("*.a", "a", false),
        ("#.a", "a", true),
        ("a.#", "a", true),
        ("#.a.#.b", "a", false),
    ];

    #[test]
    fn amqp_table_direct_matcher() {
        for &(pat, topic, want) in AMQP_CASES {
            assert_eq!(p(pat).matches(&t(topic)), want, "{pat} vs {topic}"); // R-RT-1
            let pw: Vec<_> = pat.split('.').collect();
            let tw: Vec<_> = topic.split('.').collect();
            assert_eq!(naive(&pw, &tw), want, "naive: {pat} vs {topic}"); // R-RT-1
        }
    }

    #[test]
    fn validation_table() {
        use TopicError as E;
        let long_word = "w".repeat(MAX_WORD_LEN);
        let too_long_word = "w".repeat(MAX_WORD_LEN + 1);
        let max_words = vec!["a"; MAX_WORDS].join(".");
        let too_many_words = vec!["a"; MAX_WORDS + 1].join(".");
        // Exactly MAX_TOPIC_LEN bytes: 3 words of 64 plus one of 60, and 3 dots = 255.
        let max_len = format!("{long_word}.{long_word}.{long_word}.{}", "x".repeat(60));
        assert_eq!(max_len.len(), MAX_TOPIC_LEN);
        let over_len = format!("{max_len}x");
        let at_limit_ok = [
            long_word.as_str(),
            max_words.as_str(),
            max_len.as_str(),
            "a-b_c:D9",
            "0",
        ];
        for s in at_limit_ok {
            assert!(Topic::new(s).is_ok(), "{s}"); // R-RT-2, R-LIM-1
            assert!(Pattern::new(s).is_ok(), "{s}"); // R-RT-2, R-LIM-1
        }
        // (input, error as topic, error as pattern)
        let word_too_long = E::WordTooLong {
            index: 0,
            len: MAX_WORD_LEN + 1,
            max: MAX_WORD_LEN,
        };
        let too_many = E::TooManyWords { max: MAX_WORDS };
        let too_long = E::TooLong {
            len: MAX_TOPIC_LEN + 1,
            max: MAX_TOPIC_LEN,
        };
        let bad = |ch, offset| E::InvalidChar { ch, offset };
        let empty = |index| E::EmptyWord { index };
        let wild = |ch, index| E::WildcardInTopic { ch, index };
        let partial = |index| Some(E::PartialWildcard { index });
        // (input, error as a topic, error as a pattern or None when it is a valid pattern)
        let cases: Vec<(&str, E, Option<E>)> = vec![
            ("", E::Empty, Some(E::Empty)),
            (".", empty(0), Some(empty(0))),
            (".a", empty(0), Some(empty(0))),
            ("a.", empty(1), Some(empty(1))),
            ("a..b", empty(1), Some(empty(1))),
            ("#..a", wild('#', 0), Some(empty(1))),
            ("a b", bad(' ', 1), Some(bad(' ', 1))),
            ("ab.c/d", bad('/', 4), Some(bad('/', 4))),
            ("a.\u{e9}", bad('\u{e9}', 2), Some(bad('\u{e9}', 2))),
            ("a.>", bad('>', 2), Some(bad('>', 2))),
            ("a+", bad('+', 1), Some(bad('+', 1))),
            ("a\n", bad('\n', 1), Some(bad('\n', 1))),
            ("*", wild('*', 0), None),
            ("#", wild('#', 0), None),
            ("a.#.b", wild('#', 1), None),
            ("a*", wild('*', 0), partial(0)),
            ("a.#b", wild('#', 1), partial(1)),
            ("a.**", wild('*', 1), partial(1)),
            ("##", wild('#', 0), partial(0)),
            (&too_long_word, word_too_long.clone(), Some(word_too_long)),
            (&too_many_words, too_many.clone(), Some(too_many)),
            (&over_len, too_long.clone(), Some(too_long)),
        ];
        for (s, as_topic, as_pattern) in cases {
            assert_eq!(Topic::new(s).unwrap_err(), as_topic, "topic {s:?}"); // R-RT-2, R-LIM-1
            assert_eq!(Pattern::new(s).err(), as_pattern, "pattern {s:?}"); // R-RT-2, R-LIM-1
        }
        // Wildcard words count towards MAX_WORDS too.
        let wild_max = vec!["#"; MAX_WORDS].join(".");
        assert!(Pattern::new(&wild_max).is_ok()); // R-LIM-1
        let wild_over = vec!["*"; MAX_WORDS + 1].join(".");
        assert_eq!(
            Pattern::new(&wild_over).unwrap_err(),
            E::TooManyWords { max: MAX_WORDS }
        ); // R-LIM-1
        // A huge input is refused by length before anything else is scanned.
        let huge = "a.".repeat(1 << 20);
        assert!(matches!(Topic::new(&huge), Err(E::TooLong { .. }))); // R-LIM-1
        // Error messages name the limit and its value.
        let msg = Topic::new(&over_len).unwrap_err().to_string();
        assert!(msg.contains("255"), "{msg}"); // R-LIM-1
        let msg = Topic::new(&too_many_words).unwrap_err().to_string();
        assert!(msg.contains("32"), "{msg}"); // R-LIM-1
    }

    #[test]
    fn accessors_and_conversions() {
        let topic: Topic = "a.b.c".parse().unwrap();
        assert_eq!(topic.as_str(), "a.b.c");
        assert_eq!(topic.to_string(), "a.b.c");
        assert_eq!(format!("{topic:?}"), "Topic(\"a.b.c\")");
        assert_eq!(topic.words().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(topic.word_count(), 3);
        assert_eq!(Topic::try_from("a.b.c").unwrap(), topic);
        assert_eq!(Topic::try_from(String::from("a.b.c")).unwrap(), topic);
        assert!(topic == "a.b.c");
        let pat = Pattern::from(&topic);
        assert!(pat.is_literal()); // R-RT-1
        assert_eq!(pat.as_topic(), Some(topic.clone()));
        let wild = p("a.*.#");
        assert!(!wild.is_literal()); // R-RT-1
        assert_eq!(wild.as_topic(), None);
        assert_eq!(wild.words().collect::<Vec<_>>(), ["a", "*", "#"]);
        let mut set = std::collections::HashSet::new();
        set.insert(topic.clone());
        assert!(set.contains("a.b.c"));
    }

    #[test]
    fn serde_round_trip_validates() {
        let topic = t("orders.eu");
        let json = serde_json::to_string(&topic).unwrap();
        assert_eq!(json, "\"orders.eu\"");
        assert_eq!(serde_json::from_str::<Topic>(&json).unwrap(), topic);
        let pat = p("orders.#");
        let back: Pattern = serde_json::from_str(&serde_json::to_string(&pat).unwrap()).unwrap();
        assert_eq!(back, pat);
        assert!(serde_json::from_str::<Topic>("\"orders.#\"").is_err()); // R-RT-2
        assert!(serde_json::from_str::<Pattern>("\"a..b\"").is_err()); // R-RT-2
    }
}
