//! A stream's own record of what it was created with: `streams/<name>/META` (R-LOG-5).
//!
//! The file holds the stream's patterns, retention and duplicate window, as text:
//!
//! ```text
//! tidings-stream 1
//! pattern orders.#
//! pattern orders.eu.*
//! max_bytes 1048576
//! max_age_ms 604800000
//! duplicate_window_ms 120000
//! ```
//!
//! (`max_bytes`/`max_age_ms` only when set; the window in whole milliseconds, saturating at
//! `u64::MAX`, 0 = off). A file without a `duplicate_window_ms` line (written before the
//! window existed) adopts the requested window: the line is added, nothing else changes. It is written when the stream is created (or
//! first opened by a build that writes it: such a directory adopts the requested settings),
//! atomically through the backend's [`Storage`] (`META.tmp`, fsync, rename, fsync the
//! directory), and checked at every later open: other patterns, another retention or another
//! duplicate window are refused with [`StreamError::ConfigMismatch`] naming both, and nothing is changed. The log
//! itself never reads the file ([`tidings_log::META_FILE`]).

use std::path::Path;
use std::time::Duration;

use tidings_log::{Excerpt, META_FILE, Retention, Storage};

use crate::durable::{StreamConfig, StreamError, StreamErrorKind};

use super::id_window::window_millis;
use super::offset_store::{read_small, replace_file};

const MAGIC: &str = "tidings-stream 1";
/// Longest META file read.
const MAX_META: u64 = 1 << 20;

/// What a stream was created with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StreamMeta {
    pub(crate) patterns: Vec<String>,
    pub(crate) retention: Retention,
    /// The duplicate window in whole milliseconds; `None` in a file written before it.
    pub(crate) duplicate_window_ms: Option<u64>,
}

impl StreamMeta {
    pub(crate) fn of(config: &StreamConfig) -> Self {
        Self {
            patterns: config.patterns().to_vec(),
            retention: *config.retention_policy(),
            duplicate_window_ms: Some(window_millis(config.duplicate_window_duration())),
        }
    }

    pub(super) fn encode(&self) -> String {
        let mut out = format!("{MAGIC}\n");
        for p in &self.patterns {
            out.push_str(&format!("pattern {p}\n"));
        }
        if let Some(b) = self.retention.max_bytes {
            out.push_str(&format!("max_bytes {b}\n"));
        }
        if let Some(a) = self.retention.max_age {
            out.push_str(&format!("max_age_ms {}\n", a.as_millis()));
        }
        if let Some(w) = self.duplicate_window_ms {
            out.push_str(&format!("duplicate_window_ms {w}\n"));
        }
        out
    }

    pub(super) fn decode(bytes: &[u8]) -> Result<Self, String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_owned())?;
        let mut lines = text.lines();
        if lines.next() != Some(MAGIC) {
            return Err(format!("missing `{MAGIC}` header"));
        }
        let mut meta = Self {
            patterns: Vec::new(),
            retention: Retention::default(),
            duplicate_window_ms: None,
        };
        let number = |v: &str, what: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{what} {} is not a number", Excerpt::of(v)))
        };
        for line in lines {
            match line.split_once(' ') {
                Some(("pattern", p)) => meta.patterns.push(p.to_owned()),
                Some(("max_bytes", v)) => meta.retention.max_bytes = Some(number(v, "max_bytes")?),
                Some(("max_age_ms", v)) => {
                    meta.retention.max_age = Some(Duration::from_millis(number(v, "max_age_ms")?));
                }
                Some(("duplicate_window_ms", v)) => {
                    meta.duplicate_window_ms = Some(number(v, "duplicate_window_ms")?);
                }
                // Bounded: a damaged file's line may be as long as the file (R-SEC-2).
                _ => return Err(format!("unknown line {}", Excerpt::of(line))),
            }
        }
        Ok(meta)
    }

    /// The patterns, sorted and without repeats: two pattern lists capture the same
    /// topics when these are equal.
    fn pattern_set(&self) -> Vec<&str> {
        let mut set: Vec<&str> = self.patterns.iter().map(String::as_str).collect();
        set.sort_unstable();
        set.dedup();
        set
    }
}

/// Display patterns for a mismatch error: each bounded, at most [`SHOWN_PATTERNS`] of them
/// (the file's may be anything up to its size limit).
fn show_patterns(patterns: &[String]) -> String {
    let mut out = String::from("[");
    for (i, p) in patterns.iter().take(SHOWN_PATTERNS).enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&Excerpt::of(p).to_string());
    }
    if patterns.len() > SHOWN_PATTERNS {
        out.push_str(&format!(", … {} more", patterns.len() - SHOWN_PATTERNS));
    }
    out.push(']');
    out
}

/// Most patterns a mismatch error lists.
const SHOWN_PATTERNS: usize = 16;

/// Display a retention for a mismatch error.
fn show_retention(r: &Retention) -> String {
    let bytes = r
        .max_bytes
        .map_or_else(|| "unlimited".to_owned(), |b| format!("{b} bytes"));
    let age = r
        .max_age
        .map_or_else(|| "unlimited".to_owned(), |a| format!("{a:?}"));
    format!("{{max_bytes: {bytes}, max_age: {age}}}")
}

/// Check the stream in `dir` against `requested`: write `META` when there is none (a new
/// stream, or one from a build without it), refuse when it records other settings.
pub(crate) fn check_or_write(
    storage: &dyn Storage,
    dir: &Path,
    stream: &str,
    requested: &StreamMeta,
) -> Result<(), StreamError> {
    let path = dir.join(META_FILE);
    let bad = |reason: String| {
        StreamError::backend(
            super::NAME,
            StreamErrorKind::Corrupt,
            format!("{}: {reason}", path.display()),
        )
    };
    let existing = match read_small(storage, &path, MAX_META)
        .map_err(|e| StreamError::io(&path, e))?
    {
        None => {
            let tmp = dir.join(format!("{META_FILE}.tmp"));
            return replace_file(storage, dir, (&path, &tmp), requested.encode().as_bytes());
        }
        Some(Err(len)) => return Err(bad(format!("{len} bytes long, not a tidings META file"))),
        Some(Ok(bytes)) => StreamMeta::decode(&bytes)
            .map_err(|reason| bad(format!("not a tidings META file: {reason}")))?,
    };
    if existing.pattern_set() != requested.pattern_set() {
        return Err(StreamError::ConfigMismatch {
            stream: stream.to_owned(),
            setting: "patterns",
            existing: show_patterns(&existing.patterns),
            requested: show_patterns(&requested.patterns),
        });
    }
    if existing.retention != requested.retention {
        return Err(StreamError::ConfigMismatch {
            stream: stream.to_owned(),
            setting: "retention",
            existing: show_retention(&existing.retention),
            requested: show_retention(&requested.retention),
        });
    }
    match (existing.duplicate_window_ms, requested.duplicate_window_ms) {
        (Some(had), Some(asked)) if had != asked => Err(StreamError::ConfigMismatch {
            stream: stream.to_owned(),
            setting: "duplicate_window",
            existing: show_window(had),
            requested: show_window(asked),
        }),
        // Written before the window existed: adopt the requested one.
        (None, Some(_)) => {
            let tmp = dir.join(format!("{META_FILE}.tmp"));
            let adopted = StreamMeta {
                duplicate_window_ms: requested.duplicate_window_ms,
                ..existing
            };
            replace_file(storage, dir, (&path, &tmp), adopted.encode().as_bytes())
        }
        _ => Ok(()),
    }
}

/// Display a duplicate window for a mismatch error.
fn show_window(ms: u64) -> String {
    match ms {
        0 => "off (0)".to_owned(),
        u64::MAX => "unbounded (entry cap only)".to_owned(),
        ms => format!("{:?}", Duration::from_millis(ms)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_round_trips() {
        let meta = StreamMeta {
            patterns: vec!["orders.#".into(), "refunds.*".into()],
            retention: Retention {
                max_bytes: Some(1 << 20),
                max_age: Some(Duration::from_secs(60)),
            },
            duplicate_window_ms: Some(u64::MAX),
        };
        assert_eq!(StreamMeta::decode(meta.encode().as_bytes()), Ok(meta));
        assert!(StreamMeta::decode(b"garbage").is_err());
        assert!(StreamMeta::decode(b"tidings-stream 1\nmax_bytes x\n").is_err());
    }
}
