//! Bounded quoting of bytes read from a file or a request (R-SEC-2): what an error message or
//! a one-line display shows of them.

use std::fmt;

/// Bytes as an error message or a one-line display shows them: quoted, escaped (control
/// characters as `\n`, `\u{1b}`, invalid UTF-8 as `\xff`), at most [`Excerpt::MAX`] bytes
/// of them, cut at a character boundary; a cut is followed by `… (N bytes)`, `N` the whole
/// length. So a damaged file's 70 KB line or a request's 60 KB target costs an error message
/// about a hundred bytes, and the reader still learns how long it was.
///
/// ```
/// use tidings_log::Excerpt;
/// assert_eq!(Excerpt::of("pattern a.b").to_string(), r#""pattern a.b""#);
/// let long = "x".repeat(1000);
/// assert_eq!(Excerpt::of(&long).to_string(), format!("\"{}\"… (1000 bytes)", "x".repeat(64)));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Excerpt<'a>(&'a [u8]);

impl<'a> Excerpt<'a> {
    /// Most bytes shown.
    pub const MAX: usize = 64;

    /// The excerpt of `bytes` (a `str`, `String`, `[u8]`, `Vec<u8>`, `Bytes`, …).
    #[must_use]
    pub fn of(bytes: &'a (impl AsRef<[u8]> + ?Sized)) -> Self {
        Self(bytes.as_ref())
    }
}

impl fmt::Display for Excerpt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.0;
        let mut end = bytes.len().min(Self::MAX);
        if end < bytes.len()
            && let Err(e) = std::str::from_utf8(&bytes[..end])
            && e.error_len().is_none()
        {
            // The cut splits a character: show it whole or not at all.
            end = e.valid_up_to();
        }
        f.write_str("\"")?;
        for chunk in bytes[..end].utf8_chunks() {
            for c in chunk.valid().chars() {
                write!(f, "{}", c.escape_debug())?;
            }
            for b in chunk.invalid() {
                write!(f, "\\x{b:02x}")?;
            }
        }
        f.write_str("\"")?;
        if end < bytes.len() {
            write!(f, "… ({} bytes)", bytes.len())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_quoted_whole_and_escaped() {
        assert_eq!(Excerpt::of("").to_string(), r#""""#);
        assert_eq!(Excerpt::of("a\nb\"").to_string(), r#""a\nb\"""#);
        assert_eq!(Excerpt::of(b"\xff\x00ok").to_string(), r#""\xff\0ok""#);
    }

    #[test]
    fn long_input_is_cut_with_its_length() {
        // R-SEC-2: a 68,953-byte line costs the message at most MAX bytes (escaped).
        let line = "pattern ".to_owned() + &"z".repeat(68_945);
        let shown = Excerpt::of(&line).to_string();
        assert!(shown.ends_with("… (68953 bytes)"), "{shown}");
        assert!(shown.len() < 100, "{} bytes: {shown}", shown.len());
        // Never half a character.
        let wide = "é".repeat(100);
        let shown = Excerpt::of(&wide).to_string();
        assert_eq!(shown, format!("\"{}\"… (200 bytes)", "é".repeat(32)));
        let odd = format!("a{}", "é".repeat(100));
        let shown = Excerpt::of(&odd).to_string();
        assert_eq!(shown, format!("\"a{}\"… (201 bytes)", "é".repeat(31)));
    }
}
