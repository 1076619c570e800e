//! The map of `Broker`'s methods stays complete (R-PAT-2: a newcomer finds every method
//! beside its concern). The `# Methods by concern` table in the docs of `Broker`
//! (src/broker/mod.rs) must name every public method of every `impl Broker` block in the
//! crate's sources, whatever file and feature it is in, each once, and nothing else. One
//! verb has one name: `subscribe` takes every target and handler kind, so no per-target or
//! per-kind `subscribe_*` method comes back.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("the source directory is readable") {
        let p = entry.expect("a directory entry").path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// `name` of a line `pub fn name…` or `pub async fn name…`.
fn pub_fn_name(line: &str) -> Option<String> {
    let rest = line
        .trim_start()
        .strip_prefix("pub fn ")
        .or_else(|| line.trim_start().strip_prefix("pub async fn "))?;
    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some(rest[..end].to_owned())
}

/// Every public method of an `impl Broker` block (at any indentation: blocks inside a
/// feature-gated module count) in `text`.
fn broker_methods(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut open: Option<String> = None; // the closing line of the block we are in
    for line in text.lines() {
        let trimmed = line.trim_start();
        match &open {
            None => {
                if [
                    "impl Broker {",
                    "impl crate::Broker {",
                    "impl super::Broker {",
                ]
                .contains(&trimmed)
                {
                    let indent = &line[..line.len() - trimmed.len()];
                    open = Some(format!("{indent}}}"));
                }
            }
            Some(close) => {
                if line == close {
                    open = None;
                } else if let Some(name) = pub_fn_name(line) {
                    found.push(name);
                }
            }
        }
    }
    found
}

/// The names the map's table links to (`(Broker::name)`), between its heading and the
/// next, in the order they appear (the prose around the table may link to them again).
fn mapped(text: &str) -> Vec<String> {
    let start = text
        .find("/// # Methods by concern")
        .expect("the map's heading in the docs of Broker");
    let section = &text[start + 1..];
    let end = section.find("/// # ").unwrap_or(section.len());
    let mut names = Vec::new();
    for row in section[..end]
        .lines()
        .filter(|l| l.trim_start().starts_with("/// |"))
    {
        let mut rest = row;
        while let Some(at) = rest.find("(Broker::") {
            rest = &rest[at + "(Broker::".len()..];
            let end = rest.find(')').expect("a closed link");
            names.push(rest[..end].to_owned());
        }
    }
    names
}

#[test]
fn the_method_map_names_every_public_broker_method_and_nothing_else() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut methods = BTreeSet::new();
    for f in &files {
        let text = fs::read_to_string(f).expect("a readable source file");
        for name in broker_methods(&text) {
            assert!(
                methods.insert(name.clone()),
                "{name} is defined twice ({})",
                f.display()
            );
        }
    }
    assert!(
        methods.len() > 30,
        "the scan found too few methods to be right: {methods:?}"
    );
    let listed =
        mapped(&fs::read_to_string(src.join("broker/mod.rs")).expect("src/broker/mod.rs reads"));
    let mut map = BTreeSet::new();
    let twice: Vec<_> = listed
        .iter()
        .filter(|n| !map.insert(n.to_string()))
        .collect();
    assert!(
        twice.is_empty(),
        "the map in src/broker/mod.rs names these methods more than once: {twice:?}"
    );
    let missing: Vec<_> = methods.difference(&map).collect();
    let unknown: Vec<_> = map.difference(&methods).collect();
    assert!(
        missing.is_empty(),
        "public Broker methods missing from the map in src/broker/mod.rs: {missing:?}"
    );
    assert!(
        unknown.is_empty(),
        "the map in src/broker/mod.rs names methods that do not exist: {unknown:?}"
    );
    // R-PAT-2: one name per verb.
    let variants: Vec<_> = methods
        .iter()
        .filter(|m| m.starts_with("subscribe_"))
        .collect();
    assert!(
        variants.is_empty(),
        "subscribe takes every target and handler kind; no variant: {variants:?}"
    );
}

#[test]
fn the_scanner_sees_nested_blocks_and_stops_at_their_end() {
    let text = "impl Broker {\n    pub fn a(&self) {}\n    fn hidden() {}\n}\npub fn outside() {}\nmod m {\n    impl Broker {\n        pub async fn b(&self) {}\n    }\n    pub fn after() {}\n}\n";
    assert_eq!(broker_methods(text), ["a", "b"]);
}
