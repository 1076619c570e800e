//! `match/patterns=37k`: nanoseconds per "which patterns match this topic?" over a
//! NATS-sublist-like set: 33,000 literal 5-word topics and 4,000 patterns with `*` / `#`.
//!
//! * `tidings` — `tidings::TopicTrie`.
//! * `hashmap-exact` — one `HashMap` lookup of the literal topic: the floor (it ignores the
//!   wildcard patterns, so it finds fewer matches).
//! * `linear-scan` — every pattern tried with a straightforward word matcher.
//!
//! `match/patterns=37k` cycles over 4,096 lookup topics, few enough for the trie's per-thread
//! memo to remember every one whole (the hot-topic case); `…/distinct-topics=64k` over 65,536
//! distinct topics, far more than the memo keeps, so most matches walk the trie (the cold case).
//!
//! The trie's answers are checked against the linear scan on a sample of topics; any
//! disagreement is reported in the notes.

use std::collections::{HashMap, HashSet};
use std::hint::black_box;
use std::time::Instant;

use tidings::{Pattern, Topic, TopicTrie};

use crate::harness::{Contender, Rng, interleave};
use crate::{Case, Filter, Plan};

const NAME: &str = "match/patterns=37k";
const NAME_DISTINCT: &str = "match/patterns=37k/distinct-topics=64k";
const LITERALS: usize = 33_000;
const WILDCARDS: usize = 4_000;
/// Distinct words per level of the 5-word topics.
const LEVELS: [u64; 5] = [8, 16, 32, 64, 128];
const LOOKUPS: usize = 4096;
/// Lookup topics of the cold case, all distinct (8× the trie memo's whole-topic limit).
const LOOKUPS_DISTINCT: usize = 65_536;
const VERIFY: usize = 300;

pub(crate) fn case_names() -> Vec<String> {
    vec![NAME.to_owned(), NAME_DISTINCT.to_owned()]
}

fn word(level: usize, i: u64) -> String {
    const PREFIX: [&str; 5] = ["svc", "region", "tenant", "entity", "event"];
    format!("{}{i}", PREFIX[level])
}

fn random_topic(rng: &mut Rng) -> String {
    (0..5)
        .map(|l| word(l, rng.below(LEVELS[l])))
        .collect::<Vec<_>>()
        .join(".")
}

/// The pattern set: distinct literals, then wildcard patterns of several shapes.
fn patterns(rng: &mut Rng) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    while out.len() < LITERALS {
        let t = random_topic(rng);
        if seen.insert(t.clone()) {
            out.push(t);
        }
    }
    while out.len() < LITERALS + WILDCARDS {
        let words: Vec<String> = (0..5).map(|l| word(l, rng.below(LEVELS[l]))).collect();
        let p = match rng.below(5) {
            // one `*`
            0 | 1 => {
                let k = rng.below(5) as usize;
                let mut w = words;
                w[k] = "*".into();
                w.join(".")
            }
            // two `*`
            2 => {
                let a = rng.below(5) as usize;
                let b = (a + 1 + rng.below(4) as usize) % 5;
                let mut w = words;
                w[a] = "*".into();
                w[b] = "*".into();
                w.join(".")
            }
            // prefix + `#`
            3 => {
                let k = 1 + rng.below(4) as usize;
                format!("{}.#", words[..k].join("."))
            }
            // `#` + suffix, or a `#` in the middle
            _ => {
                if rng.below(2) == 0 {
                    format!("#.{}", words[3..].join("."))
                } else {
                    format!("{}.#.{}", words[0], words[4])
                }
            }
        };
        if seen.insert(p.clone()) {
            out.push(p);
        }
    }
    out
}

/// AMQP semantics: `*` is exactly one word, `#` zero or more.
fn matches(pattern: &[&str], topic: &[&str]) -> bool {
    match pattern.split_first() {
        None => topic.is_empty(),
        Some((&"#", rest)) => (0..=topic.len()).any(|k| matches(rest, &topic[k..])),
        Some((&p, rest)) => match topic.split_first() {
            Some((&t, trest)) => (p == "*" || p == t) && matches(rest, trest),
            None => false,
        },
    }
}

/// Time `f` over the lookups, repeating to fill about `secs`; returns ns per lookup.
fn ns_per(
    lookups: usize,
    secs: f64,
    reps: &mut Option<usize>,
    mut f: impl FnMut(usize) -> usize,
) -> f64 {
    let reps = *reps.get_or_insert_with(|| {
        // Profiling aid: `TIDINGS_BENCH_MATCH_REPS=N` fixes the lookups per round, so
        // instruction and cycle counts (`perf stat`, callgrind) compare across builds.
        if let Some(n) = std::env::var("TIDINGS_BENCH_MATCH_REPS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
        {
            return n.max(1);
        }
        // Calibrate once so every round does the same work.
        let t = Instant::now();
        let mut n = 0;
        while t.elapsed().as_secs_f64() < secs / 10.0 {
            black_box(f(n % lookups));
            n += 1;
        }
        (n * 10).max(1)
    });
    let t = Instant::now();
    let mut total = 0usize;
    for i in 0..reps {
        total += f(i % lookups);
    }
    black_box(total);
    t.elapsed().as_nanos() as f64 / reps as f64
}

/// The trie and the baselines' data, built once for every case.
struct Setup<'p> {
    trie: TopicTrie<u64>,
    trie_build_ms: f64,
    build_err: Option<String>,
    exact: HashMap<&'p str, Vec<u64>>,
    split_pats: Vec<(Vec<&'p str>, u64)>,
}

impl Setup<'_> {
    /// Number of patterns matching `topic` by the linear scan; their ids into `out` if given.
    fn linear(&self, topic: &str, mut out: Option<&mut Vec<u64>>) -> usize {
        let words: Vec<&str> = topic.split('.').collect();
        let mut n = 0;
        for (p, id) in &self.split_pats {
            if matches(p, &words) {
                n += 1;
                if let Some(o) = out.as_deref_mut() {
                    o.push(*id);
                }
            }
        }
        n
    }
}

/// `n` lookup topics, half literal hits and half random topics (mostly literal misses, some
/// wildcard hits); all distinct when `distinct`.
fn lookups(rng: &mut Rng, pats: &[String], n: usize, distinct: bool) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let t = if out.len() % 2 == 0 {
            pats[rng.below(LITERALS as u64) as usize].clone()
        } else {
            random_topic(rng)
        };
        if !distinct || seen.insert(t.clone()) {
            out.push(t);
        }
    }
    out
}

pub(crate) fn run(plan: &Plan, filter: &Filter) -> Vec<Case> {
    if !filter.wants(NAME) && !filter.wants(NAME_DISTINCT) {
        return Vec::new();
    }
    let mut rng = Rng::new(0x7D1D_1265);
    let pats = patterns(&mut rng);
    let hot = lookups(&mut rng, &pats, LOOKUPS, false);

    // Build.
    let t = Instant::now();
    let mut trie = TopicTrie::<u64>::default();
    let mut build_err = None;
    for (id, p) in pats.iter().enumerate() {
        match Pattern::new(p) {
            Ok(p) => {
                trie.insert(&p, id as u64, id as u64);
            }
            Err(e) => {
                build_err.get_or_insert(format!("Pattern::new({p:?}): {e}"));
            }
        }
    }
    let trie_build_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut exact: HashMap<&str, Vec<u64>> = HashMap::new();
    for (id, p) in pats.iter().enumerate().take(LITERALS) {
        exact.entry(p.as_str()).or_default().push(id as u64);
    }
    let split_pats: Vec<(Vec<&str>, u64)> = pats
        .iter()
        .enumerate()
        .map(|(id, p)| (p.split('.').collect(), id as u64))
        .collect();
    let setup = Setup {
        trie,
        trie_build_ms,
        build_err,
        exact,
        split_pats,
    };

    let mut cases = Vec::new();
    if filter.wants(NAME) {
        cases.push(measure(
            plan,
            &setup,
            NAME,
            &hot,
            "4096 lookup topics, half literal hits (few enough for the trie's per-thread memo to \
             remember each one whole after the first round)",
        ));
    }
    if filter.wants(NAME_DISTINCT) {
        let cold = lookups(&mut rng, &pats, LOOKUPS_DISTINCT, true);
        cases.push(measure(
            plan,
            &setup,
            NAME_DISTINCT,
            &cold,
            "65536 distinct lookup topics, half literal hits (8x what the trie's per-thread memo \
             remembers whole: most matches walk the trie)",
        ));
    }
    cases
}

/// One case: the three contenders over `lookup_strs`.
fn measure(plan: &Plan, setup: &Setup<'_>, name: &str, lookup_strs: &[String], what: &str) -> Case {
    let mut case = Case::new(name, "ns/match", false);
    let topics: Vec<Topic> = match lookup_strs.iter().map(|s| Topic::new(s)).collect() {
        Ok(t) => t,
        Err(e) => {
            case.note(format!("tidings skipped: Topic::new failed: {e}"));
            return case;
        }
    };
    let trie = &setup.trie;

    // Check the trie against the linear scan.
    let mut disagree = 0;
    let mut first = None;
    let mut total_matches = 0;
    for (s, t) in lookup_strs.iter().zip(&topics).take(VERIFY) {
        let mut want = Vec::new();
        setup.linear(s, Some(&mut want));
        want.sort_unstable();
        let mut got = Vec::new();
        trie.for_each_match(t, |id, _| got.push(id));
        got.sort_unstable();
        total_matches += want.len();
        if got != want {
            disagree += 1;
            first.get_or_insert(format!(
                "{s}: trie {} ids, linear {} ids",
                got.len(),
                want.len()
            ));
        }
    }

    // Profiling aid: `TIDINGS_BENCH_MATCH_CONTENDERS=tidings,hashmap-exact` runs only those
    // (the linear scan takes minutes under callgrind).
    let only = std::env::var("TIDINGS_BENCH_MATCH_CONTENDERS").ok();
    let wanted = |c: &str| only.as_deref().is_none_or(|o| o.split(',').any(|w| w == c));
    let secs = plan.match_round_secs;
    let n = lookup_strs.len();
    let (mut r1, mut r2, mut r3) = (None, None, None);
    let outcomes = {
        let topics = &topics;
        let exact = &setup.exact;
        let mut cs = Vec::new();
        if wanted("tidings") {
            cs.push(Contender::new("tidings", || {
                Ok(ns_per(n, secs, &mut r1, |i| {
                    let mut k = 0;
                    trie.for_each_match(&topics[i], |_, _| k += 1);
                    k
                }))
            }));
        }
        if wanted("hashmap-exact") {
            cs.push(Contender::new("hashmap-exact", || {
                Ok(ns_per(n, secs, &mut r2, |i| {
                    exact.get(lookup_strs[i].as_str()).map_or(0, Vec::len)
                }))
            }));
        }
        if wanted("linear-scan") {
            cs.push(Contender::new("linear-scan", || {
                Ok(ns_per(n, secs, &mut r3, |i| {
                    setup.linear(&lookup_strs[i], None)
                }))
            }));
        }
        interleave(plan.rounds, &mut cs)
    };
    for o in outcomes {
        match (o.name.as_str(), o.median()) {
            ("tidings", v) => case.tidings = v,
            (name, Some(v)) => {
                case.baselines.insert(name.to_owned(), v);
            }
            (name, None) => case.note(format!("{name} failed: {:?}", o.error)),
        }
    }
    case.note(format!(
        "{LITERALS} literal 5-word topics + {WILDCARDS} `*`/`#` patterns (one `*`, two `*`, prefix.#, #.suffix, a.#.b); \
         {what}; {} rounds interleaved; trie built in {:.1} ms; \
         hashmap-exact ignores wildcards (the floor); on {VERIFY} sampled topics linear-scan found {total_matches} matches",
        plan.rounds, setup.trie_build_ms
    ));
    if let Some(e) = &setup.build_err {
        case.note(format!("some patterns refused: {e}"));
    }
    if disagree > 0 {
        case.note(format!(
            "TRIE DISAGREES with linear-scan on {disagree} of {VERIFY} sampled topics (first: {}); \
             if the trie finds only the literal match, tidings is still built with its exact-match \
             topic stub (`#[path = \"topic_stub.rs\"] pub mod topic;` in crates/tidings/src/lib.rs) and \
             this ns/match is the stub's, not the trie's",
            first.unwrap_or_default()
        ));
    } else {
        case.note(format!(
            "trie agrees with linear-scan on all {VERIFY} sampled topics"
        ));
    }
    case
}

#[cfg(test)]
mod tests {
    use super::matches;

    fn m(p: &str, t: &str) -> bool {
        let p: Vec<&str> = p.split('.').collect();
        let t: Vec<&str> = t.split('.').collect();
        matches(&p, &t)
    }

    #[test]
    fn amqp_semantics() {
        assert!(m("a.*.c", "a.b.c"));
        assert!(!m("a.*.c", "a.c"));
        assert!(m("a.#", "a"));
        assert!(m("a.#", "a.b.c"));
        assert!(m("#.c", "c"));
        assert!(m("a.#.c", "a.c"));
        assert!(m("a.#.c", "a.x.y.c"));
        assert!(!m("a.#.c", "a.x.y"));
        assert!(m("#", "a.b"));
    }
}
