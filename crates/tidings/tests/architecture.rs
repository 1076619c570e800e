//! The layout shows the architecture: imports between the library's concepts point one way.
//!
//! A *concept* is a top-level module of `src/` (a file such as `queue.rs`, or a folder such as
//! `subscription/`). Modules inside one concept's folder may use each other freely; between
//! concepts, the graph of `crate::…` references must have no cycle. This test reads the
//! sources, builds that graph and fails naming every cycle with the lines that make it.
//!
//! Run it alone with `cargo test -p tidings --test architecture -- --nocapture` (it prints
//! the concept graph).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
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

/// The concept a file belongs to: its first path component under `src/` (without `.rs`).
fn concept_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?.to_owned();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
    (name != "lib").then_some(name)
}

/// Drop `//` comments and string contents' influence well enough for `crate::` scanning:
/// comment lines (incl. doc comments) are skipped entirely.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines().enumerate().filter_map(|(i, l)| {
        let t = l.trim_start();
        if t.starts_with("//") {
            None
        } else {
            Some((i + 1, l.split("//").next().unwrap_or(l)))
        }
    })
}

/// The concepts a line names through `crate::x`, `crate::{x, y::z}` or `use crate::x`.
fn referenced(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        // Not part of a longer identifier (`tidings_crate::`).
        let before = rest[..at].chars().last();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // A group: the first word of each top-level item.
            let mut depth = 0usize;
            let mut item_start = true;
            let mut word = String::new();
            for c in group.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        item_start = false;
                    }
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        if !word.is_empty() {
                            found.push(std::mem::take(&mut word));
                        }
                        item_start = true;
                    }
                    c if item_start && (c.is_alphanumeric() || c == '_') => word.push(c),
                    c if item_start && c.is_whitespace() && word.is_empty() => {}
                    _ => {
                        if !word.is_empty() {
                            found.push(std::mem::take(&mut word));
                        }
                        item_start = false;
                    }
                }
            }
            if !word.is_empty() {
                found.push(word);
            }
        } else {
            let word: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !word.is_empty() {
                found.push(word);
            }
        }
    }
    found
}

type Graph = BTreeMap<String, BTreeMap<String, Vec<String>>>;

/// concept → concept → the `file:line` references that make the edge.
fn concept_graph() -> (Graph, BTreeSet<String>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let concepts: BTreeSet<String> = files.iter().filter_map(|f| concept_of(&src, f)).collect();
    let mut graph: Graph = BTreeMap::new();
    for f in &files {
        let Some(from) = concept_of(&src, f) else {
            continue;
        };
        let text = fs::read_to_string(f).expect("a readable source file");
        for (n, line) in code_lines(&text) {
            for to in referenced(line) {
                if to != from && concepts.contains(&to) {
                    let at = format!(
                        "{}:{n}",
                        f.strip_prefix(&src).unwrap_or(f).to_string_lossy()
                    );
                    graph
                        .entry(from.clone())
                        .or_default()
                        .entry(to)
                        .or_default()
                        .push(at);
                }
            }
        }
    }
    (graph, concepts)
}

/// Strongly connected components with more than one concept (Tarjan).
fn cycles(graph: &Graph, nodes: &BTreeSet<String>) -> Vec<Vec<String>> {
    struct Tarjan<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            self.index.insert(v, self.next);
            self.low.insert(v, self.next);
            self.next += 1;
            self.stack.push(v);
            self.on_stack.insert(v);
            if let Some(edges) = self.graph.get(v) {
                for w in edges.keys() {
                    let w = w.as_str();
                    if !self.index.contains_key(w) {
                        self.visit(w);
                        let lw = self.low[w];
                        let lv = self.low.get_mut(v).expect("visited");
                        *lv = (*lv).min(lw);
                    } else if self.on_stack.contains(w) {
                        let iw = self.index[w];
                        let lv = self.low.get_mut(v).expect("visited");
                        *lv = (*lv).min(iw);
                    }
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    comp.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for n in nodes {
        if !t.index.contains_key(n.as_str()) {
            t.visit(n);
        }
    }
    t.out
}

#[test]
fn the_parser_sees_groups_and_paths() {
    assert_eq!(
        referenced("use crate::{broker::Broker, queue, topic::{Pattern, Topic}};"),
        ["broker", "queue", "topic"]
    );
    assert_eq!(
        referenced("let x = crate::message::millis(crate::clock::now());"),
        ["message", "clock"]
    );
    assert!(referenced("use tidings_crate::x;").is_empty());
}

#[test]
fn tarjan_finds_a_two_concept_cycle_and_ignores_a_chain() {
    let mut g: Graph = BTreeMap::new();
    let edge = |g: &mut Graph, a: &str, b: &str| {
        g.entry(a.into())
            .or_default()
            .insert(b.into(), vec![String::new()]);
    };
    edge(&mut g, "a", "b");
    edge(&mut g, "b", "c");
    let nodes: BTreeSet<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    assert!(cycles(&g, &nodes).is_empty());
    edge(&mut g, "c", "a");
    assert_eq!(cycles(&g, &nodes), vec![vec!["a", "b", "c"]]);
}

#[test]
fn no_import_cycle_spans_two_concepts() {
    let (graph, concepts) = concept_graph();
    for (from, edges) in &graph {
        let to: Vec<&str> = edges.keys().map(String::as_str).collect();
        println!("{from} -> {}", to.join(", "));
    }
    let found = cycles(&graph, &concepts);
    let mut report = String::new();
    for comp in &found {
        report.push_str(&format!("\ncycle among {{{}}}:\n", comp.join(", ")));
        let members: BTreeSet<&String> = comp.iter().collect();
        for from in comp {
            for (to, at) in graph.get(from).into_iter().flatten() {
                if members.contains(to) {
                    let shown: Vec<&str> = at.iter().take(3).map(String::as_str).collect();
                    report.push_str(&format!("  {from} -> {to}  ({})\n", shown.join(", ")));
                }
            }
        }
    }
    assert!(found.is_empty(), "import cycles between concepts:{report}");
}
