//! No other crate's types in tidings' public API: `tidings-log`'s version is not part of
//! it. The embedded backend's options, reports and errors are tidings' own types
//! (`tidings::embedded::{Fsync, RecoveryReport, RetentionReport}`, `tidings::Retention`,
//! `StreamError` with a boxed source); `tidings-log` is an implementation detail.
//!
//! The test reads the sources: for every file, the names it imports from `tidings_log`;
//! then every public signature — a `pub` function (its whole signature), a `pub` field or
//! type alias, a `pub use`, each line of a `pub enum` (its variants' fields are public),
//! and a `From` impl — must name neither `tidings_log::` nor one of those names.
//! `pub(crate)` and `pub(super)` items are not public and are not checked.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Public signatures allowed to name `tidings-log`, each with its reason.
const ALLOWED: &[(&str, &str)] = &[
    // Fault injection: the embedded backend reads and writes through the log's storage
    // seam, and a test double (`tidings_log::testing::SimStorage`) implements that trait.
    (
        "broker/durable.rs",
        "pub fn storage(mut self, storage: Arc<dyn Storage>) -> Self {",
    ),
    (
        "embedded/mod.rs",
        "pub fn with_storage(data_dir: impl Into<PathBuf>, storage: Arc<dyn Storage>) -> Self {",
    ),
];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .expect("the source directory is readable")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The names a file imports from `tidings_log` (`use tidings_log::{A, b::C}`, `use
/// tidings_log::A`), by their last path segment.
fn imported(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("use tidings_log::") {
        rest = &rest[at + "use tidings_log::".len()..];
        let end = rest.find(';').unwrap_or(rest.len());
        let list = rest[..end].trim_start_matches('{').trim_end_matches('}');
        for item in list.split([',', '{', '}']) {
            let item = item.trim();
            let name = item.rsplit("::").next().unwrap_or(item);
            let name = name.rsplit(" as ").next().unwrap_or(name).trim();
            if !name.is_empty() && name != "self" {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

fn names_a_word(line: &str, word: &str) -> bool {
    line.match_indices(word).any(|(at, _)| {
        let before = line[..at].chars().last();
        let after = line[at + word.len()..].chars().next();
        let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !ident(before) && !ident(after)
    })
}

/// The public signatures of one file, as (first line number, text).
fn public_signatures(text: &str) -> Vec<(usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let t = lines[i].trim_start();
        if t.starts_with("//") || t.starts_with("#[cfg(test)]") && lines.len() > i + 1 {
            if t.starts_with("#[cfg(test)]") {
                // Unit tests are not API: skip the module that follows.
                break;
            }
            i += 1;
            continue;
        }
        if t.starts_with("pub fn ")
            || t.starts_with("pub const fn ")
            || t.starts_with("pub async fn ")
        {
            // The whole signature, up to its body or `;`.
            let mut sig = String::new();
            let start = i;
            while i < lines.len() {
                sig.push_str(lines[i].trim());
                sig.push(' ');
                if lines[i].trim_end().ends_with('{') || lines[i].trim_end().ends_with(';') {
                    break;
                }
                i += 1;
            }
            out.push((start + 1, sig.trim().to_owned()));
        } else if t.starts_with("pub enum ") {
            let start = i;
            let mut depth = 0i32;
            loop {
                let l = lines[i];
                depth += l.matches('{').count() as i32 - l.matches('}').count() as i32;
                if !l.trim_start().starts_with("//") {
                    out.push((i + 1, l.trim().to_owned()));
                }
                if depth <= 0 && i > start {
                    break;
                }
                i += 1;
            }
        } else if (t.starts_with("pub ")
            && !t.starts_with("pub mod ")
            && !t.starts_with("pub struct ")
            && !t.starts_with("pub trait "))
            || (t.starts_with("impl") && t.contains("From<"))
        {
            out.push((i + 1, t.to_owned()));
        }
        i += 1;
    }
    out
}

/// Every public signature in `src/` that names `tidings-log`, as "file:line: text".
fn foreign_in_public_api() -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut found = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).expect("a readable source file");
        let rel = file
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let names = imported(&text);
        for (line, sig) in public_signatures(&text) {
            let foreign =
                sig.contains("tidings_log::") || names.iter().any(|n| names_a_word(&sig, n));
            let allowed = ALLOWED.iter().any(|(f, s)| *f == rel && sig == *s);
            if foreign && !allowed {
                found.push(format!("{rel}:{line}: {sig}"));
            }
        }
    }
    found
}

#[test]
fn the_scanner_sees_imports_signatures_and_enum_fields() {
    let text = "use tidings_log::{Fsync, storage::OpenMode as Mode};\n\
                use tidings_log::Log;\n\
                pub enum E {\n    A { source: Log },\n}\n\
                pub fn f(\n    x: Fsync,\n) -> u8 {\n    0\n}\n\
                pub(crate) fn g(x: Mode) {}\n\
                pub field: tidings_log::Retention,\n";
    let names = imported(text);
    assert_eq!(
        names,
        ["Fsync", "Log", "Mode"]
            .map(String::from)
            .into_iter()
            .collect()
    );
    let sigs = public_signatures(text);
    let flagged: Vec<_> = sigs
        .iter()
        .filter(|(_, s)| s.contains("tidings_log::") || names.iter().any(|n| names_a_word(s, n)))
        .map(|(l, _)| *l)
        .collect();
    // The variant's field, the multi-line signature and the field; not `pub(crate) fn g`.
    assert_eq!(flagged, [4, 6, 12]);
    assert!(!names_a_word("FsyncPolicy", "Fsync"));
}

// The embedded log's options, reports and errors are tidings' own: no public signature of
// tidings names a `tidings-log` type (besides the storage seam, listed with its reason).
#[test]
fn no_tidings_log_type_in_the_public_api() {
    let found = foreign_in_public_api();
    assert!(
        found.is_empty(),
        "public signatures naming tidings-log:\n{}",
        found.join("\n")
    );
}
