//! Codecs: the user's own types in and out of a message's payload bytes (R-PAT-3).
//!
//! A payload is always bytes, on every backend; a codec turns a value into those bytes and
//! back, and names its format in the [`CONTENT_TYPE_HEADER`] header, which travels with the
//! message like any other header (in memory, in the embedded log, on JetStream).
//!
//! The traits are format-agnostic and do not depend on `serde`: [`Codec`] names the content
//! type, [`Encode<T>`] and [`Decode<T>`] convert one type. Feature `serde` adds the first
//! codec, [`Json`](crate::Json) (`application/json`, with `serde_json`), and the shortcuts
//! built on it ([`MessageBuilder::json`], [`Message::json`](crate::Message::json),
//! [`json_handler`](crate::json_handler)). Any other format — CBOR,
//! MessagePack, Protocol Buffers — is one small type implementing these three traits.
//!
//! The content-type rules and the failure contract are on [`Codec`].

use std::error::Error as StdError;
use std::fmt;

use bytes::Bytes;

use crate::message::{Message, MessageBuilder};

/// The header that names a payload's format: `content-type`, lowercase, as HTTP/2 and NATS
/// spell it. Set by [`MessageBuilder::encode`], checked by [`Message::decode`]. (Names
/// starting with `tidings-` are reserved for tidings' own metadata; this one is not.)
pub const CONTENT_TYPE_HEADER: &str = "content-type";

/// A payload format: what every [`Encode`] and [`Decode`] implementation names (R-PAT-3).
///
/// A payload is always bytes, on every backend; a codec turns a value into those bytes
/// and back, and names its format in the [`CONTENT_TYPE_HEADER`] header, which travels with
/// the message like any other header (in memory, in the embedded log, on JetStream). These
/// traits are format-agnostic and need no feature; feature `serde` adds the first codec,
/// `Json`. Another format (CBOR, MessagePack, Protocol Buffers) is one small type
/// implementing `Codec`, [`Encode<T>`] and [`Decode<T>`].
///
/// # Content type
/// [`MessageBuilder::encode`] sets the `content-type` header to the codec's
/// [`Codec::content_type`], replacing any value set before. [`Message::decode`] checks the
/// header before decoding:
/// * **absent** (a producer that sets no header, a plain `payload(..)`): the payload is
///   decoded anyway — the decoder itself is the judge;
/// * **present and accepted** by [`Codec::accepts`] (by default: the same media type,
///   ignoring ASCII case and parameters such as `; charset=utf-8`): decoded;
/// * **present and different**: not decoded at all; the error is a
///   [`DecodeErrorKind::ContentType`] naming both types. A message that says it is
///   something else is not guessed at.
///
/// # Failure
/// Decoding never panics on any input: every failure is a [`DecodeError`], and a typed
/// handler ([`Typed`](crate::Typed)) turns it into a
/// [`HandlerError::reject`](crate::HandlerError::reject): the message is dead-lettered `Rejected` with the error's
/// text at once, never retried (a poison message stays poison).
pub trait Codec: Send + Sync + 'static {
    /// The media type this codec writes, e.g. `application/json`; set as the message's
    /// [`CONTENT_TYPE_HEADER`] by [`MessageBuilder::encode`].
    fn content_type(&self) -> &str;

    /// Whether a message whose `content-type` header is `content_type` is for this codec.
    ///
    /// The default compares the media type (the part before any `;`, trimmed) with
    /// [`content_type`](Codec::content_type), ignoring ASCII case.
    fn accepts(&self, content_type: &str) -> bool {
        media_type(content_type).eq_ignore_ascii_case(media_type(self.content_type()))
    }
}

/// Encodes values of type `T` into payload bytes.
pub trait Encode<T: ?Sized>: Codec {
    /// The payload for `value`.
    ///
    /// # Errors
    /// When `value` cannot be represented in this format.
    fn encode(&self, value: &T) -> Result<Bytes, EncodeError>;
}

/// Decodes payload bytes into values of type `T`.
pub trait Decode<T>: Codec {
    /// The value in `payload`.
    ///
    /// # Errors
    /// Any payload that is not a valid `T` in this format — empty, truncated, malformed,
    /// the wrong shape, out of range — is a [`DecodeError`]. It must never panic.
    fn decode(&self, payload: &Bytes) -> Result<T, DecodeError>;
}

/// The media type of a `content-type` value: before any `;`, trimmed.
fn media_type(content_type: &str) -> &str {
    content_type
        .split_once(';')
        .map_or(content_type, |(t, _)| t)
        .trim()
}

impl MessageBuilder {
    /// Encode `value` with `codec` as the payload, and set the [`CONTENT_TYPE_HEADER`]
    /// header to the codec's content type (replacing any earlier value of that header).
    ///
    /// ```
    /// # #[cfg(feature = "serde")]
    /// # {
    /// use tidings::{CONTENT_TYPE_HEADER, Json, Message};
    /// let built = Message::to("orders.created").encode(&Json, &[1, 2, 3])?.build_detached()?;
    /// assert_eq!(built.header(CONTENT_TYPE_HEADER), Some("application/json"));
    /// assert_eq!(built.payload().as_ref(), b"[1,2,3]");
    /// # }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// The codec's [`EncodeError`]; the builder is consumed.
    pub fn encode<T, C>(mut self, codec: &C, value: &T) -> Result<Self, EncodeError>
    where
        T: ?Sized,
        C: Encode<T> + ?Sized,
    {
        self.payload = codec.encode(value)?;
        self.headers
            .set(CONTENT_TYPE_HEADER, codec.content_type().to_owned());
        Ok(self)
    }
}

impl Message {
    /// Decode the payload with `codec`, after checking the [`CONTENT_TYPE_HEADER`] header
    /// (see [`Codec`]: absent — decoded anyway; accepted by [`Codec::accepts`] — decoded;
    /// another type — an error naming both, the payload not decoded).
    ///
    /// # Errors
    /// [`DecodeErrorKind::ContentType`] for a message of another content type; otherwise
    /// whatever the codec reports. Never panics, whatever the payload.
    pub fn decode<T, C>(&self, codec: &C) -> Result<T, DecodeError>
    where
        C: Decode<T> + ?Sized,
    {
        if let Some(found) = self.header(CONTENT_TYPE_HEADER)
            && !codec.accepts(found)
        {
            return Err(DecodeError::content_type(codec.content_type(), found));
        }
        codec.decode(self.payload())
    }
}

/// What kind of [`DecodeError`] it is: match on this, never on the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DecodeErrorKind {
    /// The payload is not well-formed in the codec's format (a bad token, invalid UTF-8
    /// in a text format, nesting deeper than the decoder allows).
    Syntax,
    /// Well-formed, but not a valid value of the type: a missing field, a wrong type, a
    /// number out of range.
    Data,
    /// The payload ended before the value did: empty or truncated.
    Truncated,
    /// The message's `content-type` header names another format; the payload was not
    /// decoded ([`DecodeError::found_content_type`] has the value).
    ContentType,
    /// Anything else the decoder reports.
    Other,
}

/// Why a payload did not decode (R-PAT-3).
///
/// Holds no foreign type: the decoder's message and location are kept as data
/// ([`message`](Self::message), [`location`](Self::location)) and the decoder's own error,
/// when there is one, as the boxed [`source`](StdError::source).
///
/// Displayed as `cannot decode the <content type> payload: <decoder message>[ at line L
/// column C]`, which for [`Json`](crate::Json) ends with exactly what `serde_json` says.
#[derive(Debug)]
pub struct DecodeError {
    kind: DecodeErrorKind,
    content_type: String,
    message: String,
    location: Option<(usize, usize)>,
    found_content_type: Option<String>,
    source: Option<Box<dyn StdError + Send + Sync>>,
}

impl DecodeError {
    /// A decode error of `kind` from the codec for `content_type`, with the decoder's
    /// `message` (for codec implementors).
    #[must_use]
    pub fn new(
        kind: DecodeErrorKind,
        content_type: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            kind,
            content_type: content_type.into(),
            message: message.into(),
            location: None,
            found_content_type: None,
            source: None,
        }
    }

    /// Where in the payload the decoder stopped: 1-based `line` and `column`.
    #[must_use]
    pub fn with_location(mut self, line: usize, column: usize) -> Self {
        self.location = Some((line, column));
        self
    }

    /// The decoder's own error, kept as the [`source`](StdError::source).
    #[must_use]
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// The message says it is `found`, which the codec for `expected` does not accept.
    fn content_type(expected: &str, found: &str) -> Self {
        let mut e = Self::new(
            DecodeErrorKind::ContentType,
            expected,
            // `found` is the message's, any length: quoted bounded (R-SEC-2).
            format!(
                "the message's {CONTENT_TYPE_HEADER} is {}, not {expected:?}",
                tidings_log::Excerpt::of(found)
            ),
        );
        e.found_content_type = Some(found.to_owned());
        e
    }

    /// What kind of failure it is.
    #[must_use]
    pub fn kind(&self) -> DecodeErrorKind {
        self.kind
    }

    /// The content type of the codec that failed (e.g. `application/json`).
    #[must_use]
    pub fn codec_content_type(&self) -> &str {
        &self.content_type
    }

    /// The decoder's message, without the location.
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Where the decoder stopped, as 1-based `(line, column)`, when it says.
    #[must_use]
    pub fn location(&self) -> Option<(usize, usize)> {
        self.location
    }

    /// For [`DecodeErrorKind::ContentType`]: the message's `content-type` header.
    #[must_use]
    pub fn found_content_type(&self) -> Option<&str> {
        self.found_content_type.as_deref()
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot decode the {} payload: {}",
            self.content_type, self.message
        )?;
        if let Some((line, column)) = self.location {
            write!(f, " at line {line} column {column}")?;
        }
        Ok(())
    }
}

impl StdError for DecodeError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

/// Why a value could not be encoded (a map with non-string keys for JSON, say).
///
/// Holds no foreign type: the encoder's message as data, its error as the boxed
/// [`source`](StdError::source).
#[derive(Debug)]
pub struct EncodeError {
    content_type: String,
    message: String,
    source: Option<Box<dyn StdError + Send + Sync>>,
}

impl EncodeError {
    /// An encode error from the codec for `content_type`, with the encoder's `message`
    /// (for codec implementors).
    #[must_use]
    pub fn new(content_type: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            content_type: content_type.into(),
            message: message.into(),
            source: None,
        }
    }

    /// The encoder's own error, kept as the [`source`](StdError::source).
    #[must_use]
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// The content type of the codec that failed.
    #[must_use]
    pub fn codec_content_type(&self) -> &str {
        &self.content_type
    }

    /// The encoder's message.
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot encode the value as {}: {}",
            self.content_type, self.message
        )
    }
}

impl StdError for EncodeError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Text;
    impl Codec for Text {
        fn content_type(&self) -> &str {
            "text/plain; charset=utf-8"
        }
    }
    impl Decode<String> for Text {
        fn decode(&self, payload: &Bytes) -> Result<String, DecodeError> {
            String::from_utf8(payload.to_vec()).map_err(|e| {
                DecodeError::new(DecodeErrorKind::Syntax, "text/plain", e.to_string())
                    .with_source(e)
            })
        }
    }
    impl Encode<str> for Text {
        fn encode(&self, value: &str) -> Result<Bytes, EncodeError> {
            Ok(Bytes::copy_from_slice(value.as_bytes()))
        }
    }

    // R-PAT-3: the default `accepts` compares media types, ignoring case and parameters.
    #[test]
    fn accepts_compares_media_types() {
        assert!(Text.accepts("text/plain"));
        assert!(Text.accepts(" TEXT/Plain ;charset=latin1"));
        assert!(!Text.accepts("application/json"));
        assert!(!Text.accepts(""));
    }

    // R-PAT-3: a codec of the user's own (no serde): encode sets the header (replacing an
    // earlier one), decode checks it; a foreign content type is refused, naming both.
    #[test]
    fn a_custom_codec_round_trips_and_checks_the_content_type() {
        let m = Message::to("t")
            .header(CONTENT_TYPE_HEADER, "application/octet-stream")
            .encode(&Text, "hello")
            .unwrap()
            .build_detached()
            .unwrap();
        assert_eq!(
            m.header(CONTENT_TYPE_HEADER),
            Some("text/plain; charset=utf-8")
        );
        assert_eq!(m.headers().iter().count(), 1);
        assert_eq!(m.decode::<String, _>(&Text).unwrap(), "hello");

        let bad = Message::to("t")
            .header(CONTENT_TYPE_HEADER, "image/png")
            .payload("hello")
            .build_detached()
            .unwrap();
        let e = bad.decode::<String, _>(&Text).unwrap_err();
        assert_eq!(e.kind(), DecodeErrorKind::ContentType);
        assert_eq!(e.found_content_type(), Some("image/png"));
        assert_eq!(
            e.to_string(),
            "cannot decode the text/plain; charset=utf-8 payload: the message's content-type \
             is \"image/png\", not \"text/plain; charset=utf-8\""
        );

        let raw = Message::to("t")
            .payload(vec![0xff, 0xfe])
            .build_detached()
            .unwrap();
        let e = raw.decode::<String, _>(&Text).unwrap_err();
        assert_eq!(e.kind(), DecodeErrorKind::Syntax);
        assert!(e.source().is_some());
    }
}
