//! Every server-side name tidings derives from a stream's and a durable subscription's
//! names: one module, one escape, one limit (R-DIST-8: "every server-side name derived from a
//! stream and a durable name is unique to that pair").
//!
//! # The argument
//! A tidings name (`A-Z a-z 0-9 - _ .`, [`MAX_NAME_BYTES`] at most) is *escaped* into a
//! NATS name (`A-Z a-z 0-9 - _`): `_` becomes `__` and `.` becomes `_d`. In an escaped name
//! every `_` therefore starts one of the two pairs `__` and `_d`. The composed names join
//! escaped parts with *separators*, `_` followed by a letter no escape uses (`_x`, `_k`,
//! `_s`), and a fixed prefix per kind. Reading a composed name left to right in pairs
//! recovers the kind and every part ([`parse`]), so two different (kind, stream, durable,
//! partition) never give one name — `tests::every_name_parses_back` checks it over
//! adversarial names, the longest ones included.
//!
//! Before this module the lease bucket was `TIDINGS_g_<stream>_<durable>` with a bare `_`
//! between the parts: stream `a_` + durable `b` and stream `a` + durable `_b` both became
//! `TIDINGS_g_a___b`, and the two groups shared (and starved) one bucket.
//!
//! The subject namespaces of a stream's records (`$TIDINGS.s.<stream>.`, and
//! `$TIDINGS.k.<stream>.<p>.` for keyed records) live here too: the internal client reads
//! topics back through them without importing the backend.
//!
//! # Lengths
//! With parts of at most [`MAX_NAME_BYTES`] = 60 bytes (120 escaped), the longest composed
//! name, the lease bucket's stream `KV_TIDINGS_g_<120>_x<120>`, is 255 bytes: NATS's limit
//! ([`MAX_SERVER_NAME_BYTES`]).

use tidings::StreamError;

/// The name this backend reports in errors and snapshots.
pub const BACKEND_NAME: &str = "jetstream";

/// The longest tidings stream, durable-subscription or dedup-store name the JetStream backend
/// accepts, in bytes: escaped and composed, the longest server-side name derived from two of
/// them is exactly the server's limit, 255 bytes.
pub const MAX_NAME_BYTES: usize = 60;

/// The longest stream, consumer or bucket name the server accepts, in bytes.
pub(crate) const MAX_SERVER_NAME_BYTES: usize = 255;

/// Checks a tidings name for the JetStream backend: the core's rules
/// ([`tidings::durable::check_name`]), at most [`MAX_NAME_BYTES`] long.
pub(crate) fn check_name(what: &'static str, name: &str) -> Result<(), StreamError> {
    tidings::durable::check_name(what, name)?;
    // The reason is a `&'static str`: it spells the constant out.
    const _: () = assert!(MAX_NAME_BYTES == 60, "update the reason below");
    if name.len() > MAX_NAME_BYTES {
        return Err(StreamError::InvalidName {
            what,
            name: name.to_owned(),
            reason: "must be 1 to 60 bytes on the JetStream backend",
        });
    }
    Ok(())
}

/// Checks a name sent to the server (stream, consumer, bucket): 1 to
/// [`MAX_SERVER_NAME_BYTES`] bytes of `A-Z a-z 0-9 - _` (NATS forbids `.`, `*`, `>`,
/// whitespace and path separators; this is the portable subset).
pub(crate) fn check_server_name(name: &str) -> Result<(), &'static str> {
    const _: () = assert!(MAX_SERVER_NAME_BYTES == 255, "update the reason below");
    if name.is_empty() {
        return Err("empty");
    }
    if name.len() > MAX_SERVER_NAME_BYTES {
        return Err("longer than 255 bytes");
    }
    if !name
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
    {
        return Err("only A-Z a-z 0-9 - _ are allowed");
    }
    Ok(())
}

/// A tidings name as a NATS name, one to one: `_` becomes `__` and `.` becomes `_d`.
pub(crate) fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        match c {
            '_' => out.push_str("__"),
            '.' => out.push_str("_d"),
            c => out.push(c),
        }
    }
    out
}

/// The prefix of every keyed group's lease bucket.
const LEASE_BUCKET: &str = "TIDINGS_g_";
/// The prefix of every shared dedup store's bucket.
const DEDUP_BUCKET: &str = "TIDINGS_dedup_";

/// The server-side names of one durable subscription of one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DurableNames {
    /// The stream's JetStream name (escaped).
    stream: String,
    /// The durable's escaped name.
    durable: String,
}

impl DurableNames {
    /// The names of durable `durable` (a tidings name) of the stream whose JetStream name
    /// is `stream` (escaped already).
    pub(crate) fn new(stream: &str, durable: &str) -> Self {
        Self {
            stream: stream.to_owned(),
            durable: escape(durable),
        }
    }

    /// The durable's consumer (the unkeyed records of a keyed group; every record
    /// otherwise): `<durable>`, one consumer namespace per stream.
    pub(crate) fn consumer(&self) -> &str {
        &self.durable
    }

    /// Key partition `p`'s consumer: `<durable>_k<p>`.
    pub(crate) fn partition_consumer(&self, p: u32) -> String {
        format!("{}_k{p}", self.durable)
    }

    /// The keyed group's lease bucket: `TIDINGS_g_<stream>_x<durable>`.
    pub(crate) fn lease_bucket(&self) -> String {
        format!("{LEASE_BUCKET}{}_x{}", self.stream, self.durable)
    }

    /// The DLQ stream: `<stream>_x<durable>`.
    pub(crate) fn dlq_stream(&self) -> String {
        format!("{}_x{}", self.stream, self.durable)
    }

    /// The DLQ stream's subject.
    pub(crate) fn dlq_subject(&self) -> String {
        format!("$TIDINGS.dlq.{}.{}", self.stream, self.durable)
    }

    /// The stream counting handler starts: `<stream>_x<durable>_s`.
    pub(crate) fn starts_stream(&self) -> String {
        format!("{}_x{}_s", self.stream, self.durable)
    }

    /// The handler-start stream's subject prefix (an offset follows).
    pub(crate) fn starts_subject(&self) -> String {
        format!("$TIDINGS.start.{}.{}.", self.stream, self.durable)
    }
}

/// The prefix of the DLQ (and handler-start) streams of every durable of the stream whose
/// JetStream name is `stream`: `<stream>_x`. No other stream's name starts with it.
pub(crate) fn dlq_prefix(stream: &str) -> String {
    format!("{stream}_x")
}

/// The bucket of the shared dedup store `name` (a tidings name).
pub(crate) fn dedup_bucket(name: &str) -> String {
    format!("{DEDUP_BUCKET}{}", escape(name))
}

/// The subject namespace of the tidings stream whose JetStream name is `nats`: a topic
/// `t` of it is stored on the subject `$TIDINGS.s.<nats>.t`, which no core publish uses (a
/// topic cannot begin with `$`).
pub(crate) fn subject_prefix(nats: &str) -> String {
    format!("$TIDINGS.s.{nats}.")
}

/// The subject namespace of the *keyed* records of the tidings stream whose JetStream name
/// is `nats`: a record of topic `t` with a key in partition `p` is stored on
/// `$TIDINGS.k.<nats>.<p>.t`.
pub(crate) fn keyed_prefix(nats: &str) -> String {
    format!("$TIDINGS.k.{nats}.")
}

/// The topic of a record stored on `subject` in the stream whose JetStream name is `nats`
/// (either namespace); the subject itself when it is in neither.
pub(crate) fn record_topic<'a>(subject: &'a str, nats: &str) -> &'a str {
    strip_namespaces(subject, &subject_prefix(nats), &keyed_prefix(nats))
}

/// `subject` without the unkeyed prefix `plain`, or without the keyed prefix `keyed` and
/// the partition word after it.
pub(crate) fn strip_namespaces<'a>(subject: &'a str, plain: &str, keyed: &str) -> &'a str {
    if let Some(topic) = subject.strip_prefix(plain) {
        return topic;
    }
    if !keyed.is_empty()
        && let Some(rest) = subject.strip_prefix(keyed)
        && let Some((_, topic)) = rest.split_once('.')
    {
        return topic;
    }
    subject
}

/// What a server-side name was derived from (see [`parse`]).
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Parsed {
    /// A tidings stream's JetStream stream.
    Stream(String),
    /// A DLQ stream: (stream, durable).
    Dlq(String, String),
    /// A handler-start stream: (stream, durable).
    Starts(String, String),
    /// A lease bucket: (stream, durable).
    LeaseBucket(String, String),
    /// A dedup store's bucket.
    DedupBucket(String),
    /// A consumer of some stream: (durable, partition).
    Consumer(String, Option<u32>),
}

/// Reads an escaped name up to its end or its first separator: the tidings name and the
/// rest (starting with the separator's letter), or `None` when a `_` is followed by no
/// known pair.
#[cfg(test)]
fn unescape(s: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'_' {
            match b.get(i + 1) {
                Some(b'_') => out.push('_'),
                Some(b'd') => out.push('.'),
                Some(_) => return Some((out, &s[i + 1..])),
                None => return None,
            }
            i += 2;
        } else {
            out.push(char::from(b[i]));
            i += 1;
        }
    }
    Some((out, ""))
}

/// Recovers what a stream or bucket name was derived from (`consumer`: it is a consumer
/// name). `None`: no name of this module has that shape. The proof of injectivity: every
/// name composed here parses back to exactly its parts.
#[cfg(test)]
pub(crate) fn parse(name: &str, consumer: bool) -> Option<Parsed> {
    if consumer {
        let (durable, rest) = unescape(name)?;
        return match rest.strip_prefix('k') {
            None if rest.is_empty() => Some(Parsed::Consumer(durable, None)),
            Some(p) if p == "0" || !p.starts_with('0') => {
                Some(Parsed::Consumer(durable, Some(p.parse().ok()?)))
            }
            _ => None,
        };
    }
    if let Some(rest) = name.strip_prefix(DEDUP_BUCKET) {
        let (store, rest) = unescape(rest)?;
        return rest.is_empty().then_some(Parsed::DedupBucket(store));
    }
    if let Some(rest) = name.strip_prefix(LEASE_BUCKET) {
        let (stream, rest) = unescape(rest)?;
        let (durable, rest) = unescape(rest.strip_prefix('x')?)?;
        return rest
            .is_empty()
            .then_some(Parsed::LeaseBucket(stream, durable));
    }
    let (stream, rest) = unescape(name)?;
    if rest.is_empty() {
        return Some(Parsed::Stream(stream));
    }
    let (durable, rest) = unescape(rest.strip_prefix('x')?)?;
    match rest {
        "" => Some(Parsed::Dlq(stream, durable)),
        "s" => Some(Parsed::Starts(stream, durable)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The names that break a naive composition: separators' letters, escapes, dots next to
    /// underscores.
    fn adversarial() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                Just('_'),
                Just('.'),
                Just('x'),
                Just('k'),
                Just('s'),
                Just('d'),
                Just('g'),
                Just('-'),
                Just('0'),
                Just('a'),
            ],
            1..=MAX_NAME_BYTES,
        )
        .prop_map(|v| v.into_iter().collect())
        .prop_filter("a valid tidings name", |n: &String| {
            check_name("stream", n).is_ok()
        })
    }

    /// Every name of every kind parses back to exactly its parts (so no two pairs share a
    /// name), and is a valid server name. R-DIST-8
    fn parses_back(stream: &str, durable: &str, p: u32) {
        let nats = escape(stream);
        let n = DurableNames::new(&nats, durable);
        let (s, d) = (stream.to_owned(), durable.to_owned());
        let cases = [
            (nats.clone(), Parsed::Stream(s.clone())),
            (n.dlq_stream(), Parsed::Dlq(s.clone(), d.clone())),
            (n.starts_stream(), Parsed::Starts(s.clone(), d.clone())),
            (n.lease_bucket(), Parsed::LeaseBucket(s.clone(), d.clone())),
            (dedup_bucket(durable), Parsed::DedupBucket(d.clone())),
        ];
        for (name, want) in cases {
            assert_eq!(parse(&name, false), Some(want), "{name}");
            assert_eq!(check_server_name(&name), Ok(()), "{name}");
            // A bucket's stream is `KV_<bucket>`: no tidings stream starts so (it would be
            // escaped `KV__…`).
            assert_eq!(
                check_server_name(&format!("KV_{name}")),
                Ok(()),
                "KV_{name}"
            );
        }
        assert!(
            !nats.starts_with("KV_"),
            "a tidings stream never looks like a bucket's"
        );
        assert_eq!(
            parse(n.consumer(), true),
            Some(Parsed::Consumer(d.clone(), None))
        );
        assert_eq!(
            parse(&n.partition_consumer(p), true),
            Some(Parsed::Consumer(d, Some(p)))
        );
        assert!(n.dlq_stream().starts_with(&dlq_prefix(&nats)));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]
        /// R-DIST-8: every server-side name is unique to its (stream, durable) pair.
        #[test]
        fn every_name_parses_back(stream in adversarial(), durable in adversarial(), p in 0u32..1024) {
            parses_back(&stream, &durable, p);
        }
    }

    /// The pair, and the longest names: 255 bytes exactly. R-DIST-8
    #[test]
    fn the_colliding_pair_of_the_old_scheme_and_the_longest_names() {
        let a = DurableNames::new(&escape("a_"), "b");
        let b = DurableNames::new(&escape("a"), "_b");
        assert_ne!(a.lease_bucket(), b.lease_bucket());
        let long = "_".repeat(MAX_NAME_BYTES);
        let n = DurableNames::new(&escape(&long), &long);
        assert_eq!(
            format!("KV_{}", n.lease_bucket()).len(),
            MAX_SERVER_NAME_BYTES
        );
        parses_back(&long, &long, 4095);
        parses_back("a_", "b", 0);
        parses_back("a", "_b", 0);
    }

    #[test]
    fn bad_names_are_typed_errors() {
        for bad in ["", "a b", "a/b", "a*", "a>", &"x".repeat(61)] {
            assert!(
                matches!(
                    check_name("stream", bad),
                    Err(StreamError::InvalidName { what: "stream", .. })
                ),
                "{bad:?}"
            );
        }
        for bad in ["", "a.b", "a b", &"x".repeat(256)] {
            assert!(check_server_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_server_name("orders_v2-eu").is_ok());
        assert_eq!(escape("orders.v2_eu"), "orders_dv2__eu");
    }

    #[test]
    fn a_record_topic_is_read_from_either_namespace() {
        assert_eq!(record_topic("$TIDINGS.s.o.a.b", "o"), "a.b");
        assert_eq!(record_topic("$TIDINGS.k.o.7.a.b", "o"), "a.b");
        assert_eq!(record_topic("other.a", "o"), "other.a");
    }
}
