//! A tidings message as a JetStream record: the subject is the topic, the body is the
//! payload, and every other field travels in `tidings-*` headers.
//!
//! | header | field | value |
//! |---|---|---|
//! | `Nats-Msg-Id` | dedup key | the message id (a redrive copy: id, durable and DLQ sequence) |
//! | `tidings-id` | id | 32 hex digits |
//! | `tidings-ts` | timestamp | nanoseconds since the UNIX epoch |
//! | `tidings-stamp` | id and timestamp, core-NATS transport only | `{32 hex digits}.{nanoseconds}` |
//! | `tidings-exp` | expiry (TTL, R-TIME-1) | ns since the epoch; checked by tidings on receipt |
//! | `tidings-at` | delivery time (delay, R-TIME-2) | ns since the epoch |
//! | `tidings-key` | ordering key | hex |
//! | `tidings-prio` | priority | `0`..=`3`, absent for normal |
//! | `tidings-reply` | reply-to topic | the topic |
//! | `tidings-corr` | correlation id | escaped |
//! | `tidings-h` | user headers, in order | `name=value&...`, names and values escaped |
//! | `tidings-to` | redrive target | the durable subscription a redrive copy is for |
//!
//! User headers travel in one header because NATS headers are a map: it would lose their
//! order and refuse names tidings allows. Escaping is `%XX` for every byte outside
//! `!`..=`~` and for `%`, `&` and `=` (the `percent-encoding` crate, which every JetStream
//! build has anyway through async-nats; decoding is strict, see [`unescape`]).
//!
//! The core-NATS transport sends the id and the timestamp as one `tidings-stamp` header
//! instead of two: the client parses every header of every message it receives into a map
//! of allocated names and values, and a transport message carries no more than these two
//! fields most of the time. Stored records keep the two headers, so a stream's records read
//! the same to every version, and the decoder reads either form.
//!
//! A record without `tidings-id` (published by another NATS client) still becomes a message:
//! its id is derived from its stream sequence and its timestamp is the server's store time.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::HeaderMap;
use async_nats::header::HeaderName;
use bytes::Bytes;
use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};
use tidings::{Headers, Limits, Message, MessageId, MessageParts, Priority, Topic};

/// The leading header of a redrive copy (the embedded log uses the same name).
pub(crate) const TARGET: &str = "tidings-to";
const ID: &str = "tidings-id";
const TS: &str = "tidings-ts";
const STAMP: &str = "tidings-stamp";
const EXPIRES: &str = "tidings-exp";
const AT: &str = "tidings-at";
const KEY: &str = "tidings-key";
const PRIORITY: &str = "tidings-prio";
const REPLY: &str = "tidings-reply";
const CORRELATION: &str = "tidings-corr";
const USER: &str = "tidings-h";
/// Dead-letter headers.
pub(crate) const DLQ_REASON: &str = "tidings-dlq-reason";
pub(crate) const DLQ_ATTEMPTS: &str = "tidings-dlq-attempts";
pub(crate) const DLQ_ERROR: &str = "tidings-dlq-error";
pub(crate) const DLQ_OFFSET: &str = "tidings-dlq-offset";

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn from_nanos(n: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(n)
}

/// What [`escape`] turns into `%XX`: every byte outside `!`..=`~` — the controls, space,
/// DEL and (always, in `percent-encoding`) every non-ASCII byte — and `%`, `&`, `=`, which
/// the user-header list uses as its escape, pair and name/value separators.
const ESCAPED: &AsciiSet = &CONTROLS.add(b' ').add(b'%').add(b'&').add(b'=');

/// `%XX` (upper-case hex) for every byte outside `!`..=`~` and for `%`, `&`, `=`.
pub(crate) fn escape(s: &str) -> String {
    utf8_percent_encode(s, ESCAPED).to_string()
}

/// The inverse of [`escape`]. Strict where `percent-encoding`'s decoder is lenient: a `%`
/// not followed by two hex digits is an error, not a literal `%` — a record whose escapes
/// are broken was not written by tidings, and is refused rather than guessed at.
pub(crate) fn unescape(s: &str) -> Result<String, &'static str> {
    let bytes = s.as_bytes();
    for (i, _) in s.match_indices('%') {
        match bytes.get(i + 1..i + 3) {
            Some(hex) if hex.iter().all(u8::is_ascii_hexdigit) => {}
            Some(_) => return Err("bad escape"),
            None => return Err("truncated escape"),
        }
    }
    percent_decode_str(s)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .map_err(|_| "escaped text is not UTF-8")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes `s` spells in hex. Works on bytes, never on `str` slices: a foreign record's
/// value may hold a multi-byte character anywhere, and slicing inside one panics (R-SEC-2).
fn unhex(s: &str) -> Result<Vec<u8>, &'static str> {
    let digit = |b: u8| hex_digit(b).ok_or("bad hex");
    let bytes = s.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return Err("odd hex length");
    }
    bytes
        .chunks_exact(2)
        .map(|pair| Ok((digit(pair[0])? << 4) | digit(pair[1])?))
        .collect()
}

fn put(map: &mut HeaderMap, name: &'static str, value: String) {
    // Every value written here is escaped, hex or decimal: never CR or LF. So the value is
    // handed over as it is (no validating parse and second copy), and the static name
    // needs no check or allocation either.
    debug_assert!(!value.contains(['\r', '\n']), "{name}: {value:?}");
    map.insert(HeaderName::from_static(name), value);
}

/// The headers carrying `m` as a stored record (without `Nats-Msg-Id`).
pub(crate) fn encode(m: &Message) -> HeaderMap {
    let mut map = HeaderMap::new();
    put(&mut map, ID, m.id().to_string());
    put(&mut map, TS, nanos(m.timestamp()).to_string());
    encode_rest(m, map)
}

/// The headers carrying `m` on the core-NATS transport: [`encode`]'s, with the id and the
/// timestamp in one `tidings-stamp` header.
pub(crate) fn encode_for_transport(m: &Message) -> HeaderMap {
    let mut map = HeaderMap::new();
    put(
        &mut map,
        STAMP,
        format!("{}.{}", m.id(), nanos(m.timestamp())),
    );
    encode_rest(m, map)
}

/// The optional fields' headers, added to `map`.
fn encode_rest(m: &Message, mut map: HeaderMap) -> HeaderMap {
    if let Some(t) = m.expires_at() {
        put(&mut map, EXPIRES, nanos(t).to_string());
    }
    if let Some(t) = m.deliver_at() {
        put(&mut map, AT, nanos(t).to_string());
    }
    if let Some(k) = m.key() {
        put(&mut map, KEY, hex(k));
    }
    if m.priority() != Priority::Normal {
        put(&mut map, PRIORITY, m.priority().index().to_string());
    }
    if let Some(r) = m.reply_to() {
        put(&mut map, REPLY, r.as_str().to_owned());
    }
    if let Some(c) = m.correlation_id() {
        put(&mut map, CORRELATION, escape(c));
    }
    if !m.headers().is_empty() {
        let list: Vec<String> = m
            .headers()
            .iter()
            .map(|(n, v)| format!("{}={}", escape(n), escape(v)))
            .collect();
        put(&mut map, USER, list.join("&"));
    }
    map
}

/// What a stored record looks like to the decoder.
pub(crate) struct Stored<'a> {
    pub(crate) subject: &'a str,
    pub(crate) payload: Bytes,
    pub(crate) sequence: u64,
    pub(crate) published: SystemTime,
    /// The first value of a header, borrowed from the record: a decode looks up about ten
    /// names per message, and an owned copy of each found value was an allocation each.
    pub(crate) header: &'a dyn Fn(&str) -> Option<&'a str>,
}

/// Why a record is not a tidings message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecodeError {
    pub(crate) sequence: u64,
    /// The header at fault, when one is.
    pub(crate) header: Option<String>,
    pub(crate) reason: String,
}

impl std::error::Error for DecodeError {}

impl crate::classify::Classify for DecodeError {
    fn class(&self) -> (tidings::StreamErrorKind, Option<u64>) {
        (tidings::StreamErrorKind::Corrupt, None)
    }
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "record {} is not a tidings message: {}",
            self.sequence, self.reason
        )
    }
}

/// Whether a record carries its own id and timestamp (a tidings message does), so its
/// `published` time is never read: a receiver may then skip reading a clock for it.
pub(crate) fn carries_own_time<'a>(header: &dyn Fn(&str) -> Option<&'a str>) -> bool {
    header(STAMP).is_some() || (header(ID).is_some() && header(TS).is_some())
}

/// A `tidings-stamp` value: exactly 32 hex digits, `.`, decimal nanoseconds.
fn parse_stamp(v: &str) -> Option<(MessageId, SystemTime)> {
    let (id, ts) = v.split_once('.')?;
    if id.len() != 32 || !ts.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Digit by digit: `u128::from_str_radix` checks for overflow at each of the 32 steps,
    // which cannot happen here, and costs several times this loop.
    let mut bits = 0u128;
    for b in id.bytes() {
        bits = (bits << 4) | u128::from(hex_digit(b)?);
    }
    Some((MessageId::from_u128(bits), from_nanos(ts.parse().ok()?)))
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Rebuilds the message a record carries, with its offset set to the record's sequence.
pub(crate) fn decode(r: &Stored<'_>, limits: &Limits) -> Result<Message, DecodeError> {
    let fail = |reason: String| DecodeError {
        sequence: r.sequence,
        header: None,
        reason,
    };
    let bad = |name: &str, why: &str| DecodeError {
        header: Some(name.to_owned()),
        ..fail(format!("header {name}: {why}"))
    };
    let number = |name: &'static str| -> Result<Option<u64>, DecodeError> {
        (r.header)(name)
            .map(|v| v.parse::<u64>().map_err(|_| bad(name, "not a number")))
            .transpose()
    };
    let topic = Topic::new(r.subject).map_err(|e| fail(format!("subject: {e}")))?;
    let stamp = (r.header)(STAMP)
        .map(|v| parse_stamp(v).ok_or_else(|| bad(STAMP, "not {32 hex digits}.{nanoseconds}")))
        .transpose()?;
    let id = match (stamp, (r.header)(ID)) {
        (Some((id, _)), _) => id,
        (None, Some(v)) => MessageId::from_u128(
            u128::from_str_radix(v, 16).map_err(|_| bad(ID, "not 32 hex digits"))?,
        ),
        // A record from another client: an id unique within the stream, ordered by time.
        (None, None) => MessageId::from_u128(
            (u128::from(nanos(r.published) / 1_000_000) << 80) | u128::from(r.sequence),
        ),
    };
    let timestamp = match stamp {
        Some((_, ts)) => ts,
        None => number(TS)?.map_or(r.published, from_nanos),
    };
    let mut parts = MessageParts::new(id, topic, timestamp);
    parts.payload = r.payload.clone();
    parts.expires_at = number(EXPIRES)?.map(from_nanos);
    parts.deliver_at = number(AT)?.map(from_nanos);
    parts.key = (r.header)(KEY)
        .map(|k| unhex(k).map(Bytes::from).map_err(|e| bad(KEY, e)))
        .transpose()?;
    parts.priority = match number(PRIORITY)? {
        None | Some(1) => Priority::Normal,
        Some(0) => Priority::Low,
        Some(2) => Priority::High,
        Some(3) => Priority::Urgent,
        Some(_) => return Err(bad(PRIORITY, "not 0..=3")),
    };
    parts.reply_to = (r.header)(REPLY)
        .map(|t| Topic::new(t).map_err(|e| bad(REPLY, &e.to_string())))
        .transpose()?;
    parts.correlation_id = (r.header)(CORRELATION)
        .map(|c| unescape(c).map_err(|e| bad(CORRELATION, e)))
        .transpose()?;
    if let Some(list) = (r.header)(USER) {
        let mut headers = Headers::new();
        for pair in list.split('&').filter(|p| !p.is_empty()) {
            let (n, v) = pair.split_once('=').ok_or_else(|| bad(USER, "no '='"))?;
            headers.insert(
                unescape(n).map_err(|e| bad(USER, e))?,
                unescape(v).map_err(|e| bad(USER, e))?,
            );
        }
        parts.headers = headers;
    }
    parts.offset = Some(r.sequence);
    Message::from_parts(parts, limits).map_err(|e| fail(e.to_string()))
}

/// The first value of `name` in `map`.
pub(crate) fn lookup<'m>(map: &'m HeaderMap, name: &str) -> Option<&'m str> {
    map.get(name).map(|v| v.as_str())
}

/// Every header name this codec writes begins with this.
const PREFIX: &str = "tidings-";

/// The first value of each `tidings-*` header of a map, found in one pass over it.
///
/// A decode asks for about ten names, and each [`HeaderMap::get`] builds (allocates) a
/// header name and hashes it; a message carries two or three of them, so looking them up
/// in this short list is cheaper. The same answers as [`lookup`] for these names (header
/// names compare exactly, as `get` compares them).
pub(crate) struct TidingsHeaders<'a>(Vec<(&'a str, &'a str)>);

impl<'a> TidingsHeaders<'a> {
    /// The `tidings-*` headers of `map` (none without a map).
    pub(crate) fn of(map: Option<&'a HeaderMap>) -> Self {
        let found = map
            .into_iter()
            .flat_map(HeaderMap::iter)
            .filter_map(|(name, values)| {
                let name: &str = name.as_ref();
                let first = values.first()?;
                name.starts_with(PREFIX).then(|| (name, first.as_str()))
            })
            .collect();
        Self(found)
    }

    /// The first value of `name`, as [`lookup`] gives it.
    pub(crate) fn get(&self, name: &str) -> Option<&'a str> {
        self.0.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_pass_header_lookup_answers_as_the_map_does() {
        let m = Message::to("a.b")
            .payload("x")
            .key("k1")
            .header("user", "v")
            .reply_to("r.s")
            .build_detached()
            .expect("valid");
        let mut map = encode(&m);
        map.insert("Nats-Msg-Id", "dup");
        map.insert("other", "1");
        let one_pass = TidingsHeaders::of(Some(&map));
        for name in [
            ID,
            TS,
            STAMP,
            EXPIRES,
            AT,
            KEY,
            PRIORITY,
            REPLY,
            CORRELATION,
            USER,
            TARGET,
        ] {
            assert_eq!(one_pass.get(name), lookup(&map, name), "{name}");
        }
        assert!(one_pass.get(KEY).is_some() && one_pass.get(REPLY).is_some());
        assert_eq!(
            one_pass.get("other"),
            None,
            "only tidings-* headers are kept"
        );
        assert_eq!(TidingsHeaders::of(None).get(ID), None);
    }

    #[test]
    fn escaping_round_trips() {
        for s in [
            "",
            "plain",
            "a b",
            "x=y&z",
            "100%",
            "line\nbreak\r",
            "naïve ✓",
        ] {
            let e = escape(s);
            assert!(e.bytes().all(|b| (b'!'..=b'~').contains(&b)), "{e}");
            assert_eq!(unescape(&e).as_deref(), Ok(s));
        }
        assert!(unescape("%4").is_err());
        assert!(unescape("%zz").is_err());
        assert!(unescape("%FF").is_err());
        assert!(unescape("a%").is_err());
        assert!(unescape("%%41").is_err());
        assert_eq!(
            unescape("%e2%9c%93").as_deref(),
            Ok("✓"),
            "lower-case hex is read"
        );
    }

    // The escaping set, byte by byte: what the stored records of earlier versions hold
    // must read back, and what is written now must be what they wrote.
    #[test]
    fn every_ascii_byte_is_escaped_exactly_as_before() {
        for b in 0u8..=0x7f {
            let s = char::from(b).to_string();
            let kept = (b'!'..=b'~').contains(&b) && !matches!(b, b'%' | b'&' | b'=');
            let want = if kept { s.clone() } else { format!("%{b:02X}") };
            assert_eq!(escape(&s), want, "byte {b:#04x}");
            assert_eq!(unescape(&want).as_deref(), Ok(s.as_str()), "byte {b:#04x}");
        }
        // Beyond ASCII every UTF-8 byte is escaped.
        assert_eq!(escape("é✓"), "%C3%A9%E2%9C%93");
    }

    /// Any text: every `char`, controls and separators included.
    fn any_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            proptest::collection::vec(any::<char>(), 0..32),
            proptest::collection::vec(proptest::char::range('\0', '\u{7f}'), 0..32),
        ]
        .prop_map(|chars| chars.into_iter().collect())
    }

    proptest::proptest! {
        // Any text round-trips, and its escaped form is printable ASCII without the list's
        // separators: no `&` or `=` left unescaped.
        #[test]
        fn any_text_round_trips(s in any_text()) {
            let e = escape(&s);
            proptest::prop_assert!(e.bytes().all(|b| (b'!'..=b'~').contains(&b)));
            proptest::prop_assert!(!e.contains('&') && !e.contains('='));
            proptest::prop_assert_eq!(unescape(&e), Ok(s));
        }

        // Arbitrary input never panics: it decodes or is refused with a reason.
        #[test]
        fn any_input_is_decoded_or_refused(s in "\\PC*|[%0-9a-fA-FxyZ]*") {
            let _ = unescape(&s);
        }
    }

    #[test]
    fn every_field_travels() {
        // R-CORE-4: the message read back is the one published, field for field.
        let m = Message::to("a.b")
            .payload("p")
            .header("h", "v")
            .header("odd name=", "a&b%\n")
            .header("h", "second")
            .key([0u8, 255, 7])
            .priority(Priority::Urgent)
            .ttl(Duration::from_secs(60))
            .delay(Duration::from_secs(5))
            .reply_to("r.s")
            .correlation_id("c 1\n")
            .build_detached()
            .expect("valid");
        // Both forms: the stored record's, and the transport's with its one stamp header.
        for (map, stamped) in [(encode(&m), false), (encode_for_transport(&m), true)] {
            assert_eq!(lookup(&map, STAMP).is_some(), stamped);
            assert_eq!(lookup(&map, ID).is_some(), !stamped);
            let header = |n: &str| lookup(&map, n);
            assert!(carries_own_time(&header));
            let stored = Stored {
                subject: "a.b",
                payload: m.payload().clone(),
                sequence: 9,
                // Never read for either form: the record says its own time.
                published: SystemTime::UNIX_EPOCH,
                header: &header,
            };
            let back = decode(&stored, &Limits::default()).expect("decodes");
            let mut want = m.to_parts();
            want.offset = Some(9);
            assert_eq!(back.to_parts(), want);
        }
    }

    // R-SEC-2, R-LIM-2: a stamp header that is not exactly `{32 hex}.{decimal}` is a typed
    // error naming it, never a panic nor a guess; a well-formed one wins over the two
    // per-field headers.
    #[test]
    fn a_malformed_stamp_is_refused_by_name() {
        let id = "0123456789abcdef0123456789ABCDEF";
        let bad = [
            String::new(),
            "x".to_owned(),
            id.to_owned(),
            format!("{id}."),
            format!("{id}.-1"),
            format!("{id}.+1"),
            format!("{id}.1e3"),
            format!("{id}.18446744073709551616"),
            format!("{}.1", &id[1..]),
            format!("+{}.1", &id[1..]),
            format!("{id}0.1"),
            format!("✓{}.1", &id[3..]),
            format!("{id}.1.2"),
        ];
        // A record of subject `a` whose headers `header` answers.
        fn decode_headers<'a>(
            header: &'a dyn Fn(&str) -> Option<&'a str>,
        ) -> Result<Message, DecodeError> {
            let stored = Stored {
                subject: "a",
                payload: Bytes::new(),
                sequence: 1,
                published: SystemTime::UNIX_EPOCH,
                header,
            };
            decode(&stored, &Limits::default())
        }
        for value in &bad {
            let err = decode_headers(&|n| (n == STAMP).then_some(value.as_str())).expect_err(value);
            assert_eq!(err.header.as_deref(), Some(STAMP), "{value:?}");
        }
        let good = format!("{id}.1500");
        let header = |n: &str| match n {
            STAMP => Some(good.as_str()),
            ID => Some("ffffffffffffffffffffffffffffffff"),
            TS => Some("9"),
            _ => None,
        };
        let m = decode_headers(&header).expect("decodes");
        assert_eq!(
            m.id(),
            MessageId::from_u128(u128::from_str_radix(id, 16).expect("hex"))
        );
        assert_eq!(m.timestamp(), from_nanos(1500));
    }

    // R-SEC-2: any text is hex or refused, never a panic: a multi-byte character at an
    // even byte offset (`✓a`) once sliced inside the character.
    #[test]
    fn unhex_refuses_what_is_not_hex_without_panicking() {
        assert_eq!(unhex("00ff7A"), Ok(vec![0, 255, 0x7a]));
        assert_eq!(unhex(""), Ok(Vec::new()));
        for s in ["✓a", "abé", "é", "0x", "a", "✓✓", "+1", "１２"] {
            assert!(unhex(s).is_err(), "{s:?}");
        }
    }

    proptest::proptest! {
        // R-SEC-2: any text decodes as hex or is refused; hex round-trips.
        #[test]
        fn any_text_is_hex_or_refused(s in any_text()) {
            if let Ok(bytes) = unhex(&s) {
                proptest::prop_assert_eq!(hex(&bytes), s.to_ascii_lowercase());
            }
        }
    }

    #[test]
    fn foreign_and_malformed_records() {
        let none = |_: &str| None;
        let stored = Stored {
            subject: "a",
            payload: Bytes::from_static(b"x"),
            sequence: 3,
            published: SystemTime::now(),
            header: &none,
        };
        let m = decode(&stored, &Limits::default()).expect("a foreign record is a message");
        assert_eq!(m.offset(), Some(3));
        let bad = |n: &str| (n == TS).then_some("soon");
        let stored = Stored {
            header: &bad,
            ..stored
        };
        // R-LIM-2: a malformed record is a typed error naming the header, never a panic.
        let err = decode(&stored, &Limits::default()).expect_err("malformed");
        assert_eq!(err.header.as_deref(), Some("tidings-ts"), "{err}");
    }
}
