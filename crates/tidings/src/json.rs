//! The JSON codec (feature `serde`, R-PAT-3): `serde_json` behind the format-agnostic
//! [`Codec`] traits, and the shortcuts every Rust user reaches for first —
//! [`MessageBuilder::json`] and [`Message::json`].
//!
//! # Failure
//! Every bad payload is a [`DecodeError`], never a panic: empty ([`Truncated`]), truncated
//! ([`Truncated`]), malformed, not UTF-8 or with trailing bytes ([`Syntax`]), the wrong
//! shape or a number the field's type cannot hold ([`Data`]), a number too large for any
//! number type ([`Syntax`]), and input nested deeper than `serde_json`'s recursion limit of
//! 128 ([`Syntax`], "recursion limit exceeded" — an error, not a stack overflow). Nesting
//! inside a field the type does not have is skipped without recursing, so it cannot
//! overflow either.
//!
//! [`Truncated`]: DecodeErrorKind::Truncated
//! [`Syntax`]: DecodeErrorKind::Syntax
//! [`Data`]: DecodeErrorKind::Data

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::codec::{Codec, Decode, DecodeError, DecodeErrorKind, Encode, EncodeError};
use crate::message::{Message, MessageBuilder};

/// The content type [`Json`] writes: `application/json`.
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub const JSON_CONTENT_TYPE: &str = "application/json";

/// The JSON codec: `serde_json`, content type [`JSON_CONTENT_TYPE`].
///
/// It [accepts](Codec::accepts) `application/json` and every `+json` media type
/// (`application/vnd.acme.order+json`, `application/problem+json`), with any parameters.
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use tidings::{Json, Message};
///
/// #[derive(Serialize, Deserialize, Debug, PartialEq)]
/// struct Order { id: u64 }
///
/// let m = Message::to("orders.created").json(&Order { id: 7 })?.build_detached()?;
/// assert_eq!(m.header("content-type"), Some("application/json"));
/// assert_eq!(m.json::<Order>()?, Order { id: 7 });
/// assert_eq!(m.decode::<Order, _>(&Json)?, Order { id: 7 }); // the same, spelled out
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub struct Json;

impl Codec for Json {
    fn content_type(&self) -> &str {
        JSON_CONTENT_TYPE
    }

    fn accepts(&self, content_type: &str) -> bool {
        let media = content_type
            .split_once(';')
            .map_or(content_type, |(t, _)| t)
            .trim();
        let lower = media.to_ascii_lowercase();
        lower == JSON_CONTENT_TYPE || (lower.contains('/') && lower.ends_with("+json"))
    }
}

impl<T: Serialize + ?Sized> Encode<T> for Json {
    fn encode(&self, value: &T) -> Result<Bytes, EncodeError> {
        serde_json::to_vec(value)
            .map(Bytes::from)
            .map_err(|e| EncodeError::new(JSON_CONTENT_TYPE, without_location(&e)).with_source(e))
    }
}

impl<T: DeserializeOwned> Decode<T> for Json {
    fn decode(&self, payload: &Bytes) -> Result<T, DecodeError> {
        serde_json::from_slice(payload).map_err(decode_error)
    }
}

/// A `serde_json` error as a [`DecodeError`]: its category as the kind, its message and
/// location as data, itself as the source.
fn decode_error(e: serde_json::Error) -> DecodeError {
    use serde_json::error::Category;
    let kind = match e.classify() {
        Category::Syntax => DecodeErrorKind::Syntax,
        Category::Data => DecodeErrorKind::Data,
        Category::Eof => DecodeErrorKind::Truncated,
        Category::Io => DecodeErrorKind::Other,
    };
    let mut out = DecodeError::new(kind, JSON_CONTENT_TYPE, without_location(&e));
    if e.line() > 0 {
        out = out.with_location(e.line(), e.column());
    }
    out.with_source(e)
}

/// `serde_json`'s message without the " at line L column C" it appends.
fn without_location(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    match text.strip_suffix(&suffix) {
        Some(message) if e.line() > 0 => message.to_owned(),
        _ => text,
    }
}

impl MessageBuilder {
    /// Encode `value` as JSON into the payload and set the `content-type` header to
    /// `application/json` (R-PAT-3): [`encode`](MessageBuilder::encode) with [`Json`].
    ///
    /// ```
    /// use tidings::{Broker, Driver, Message};
    /// # #[derive(serde::Serialize)] struct Order { id: u64 }
    /// let broker = Broker::builder().driver(Driver::Manual).build()?;
    /// broker.publish(Message::to("orders.created").key("order-7").json(&Order { id: 7 })?)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// A value JSON cannot represent (a map whose keys are not strings, a `Serialize`
    /// implementation that fails): the builder is consumed.
    #[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
    pub fn json<T: Serialize + ?Sized>(self, value: &T) -> Result<Self, EncodeError> {
        self.encode(&Json, value)
    }
}

impl Message {
    /// Decode the payload as JSON (R-PAT-3): [`decode`](Message::decode) with [`Json`].
    ///
    /// A message whose `content-type` header names another format is refused without
    /// decoding ([`DecodeErrorKind::ContentType`]); one without the header is decoded.
    ///
    /// # Errors
    /// A [`DecodeError`] for any payload that is not a JSON `T`; never panics.
    #[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, DecodeError> {
        self.decode(&Json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // R-PAT-3: `application/json` and `+json` types, any case and parameters.
    #[test]
    fn accepts_json_media_types_only() {
        for ok in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/vnd.acme.order+json",
            "application/problem+json;v=2",
        ] {
            assert!(Json.accepts(ok), "{ok}");
        }
        for no in [
            "text/plain",
            "application/jsonx",
            "+json",
            "",
            "application/xml",
        ] {
            assert!(!Json.accepts(no), "{no}");
        }
    }

    // R-PAT-3: the message keeps serde_json's text; the location is data.
    #[test]
    fn decode_error_keeps_message_and_location_apart() {
        let e = <Json as Decode<Vec<u8>>>::decode(&Json, &Bytes::from_static(b"[1,")).unwrap_err();
        assert_eq!(e.kind(), DecodeErrorKind::Truncated);
        assert_eq!(e.message(), "EOF while parsing a value");
        assert_eq!(e.location(), Some((1, 3)));
        let inner = serde_json::from_slice::<Vec<u8>>(b"[1,").unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("cannot decode the application/json payload: {inner}")
        );
    }

    // R-PAT-3: a value JSON cannot hold is an EncodeError, not a panic.
    #[test]
    fn unrepresentable_value_is_an_encode_error() {
        let mut map = std::collections::HashMap::new();
        map.insert(vec![1u8], 1);
        let e = Message::to("t").json(&map).unwrap_err();
        assert_eq!(e.codec_content_type(), JSON_CONTENT_TYPE);
        assert_eq!(e.message(), "key must be a string");
        assert!(std::error::Error::source(&e).is_some());
    }
}
