//! `match/patterns=37k`: nanoseconds per "which patterns match this topic?" over a
//! NATS-sublist-like set: 33,000 literal 5-word topics and 4,000 patterns with `*` / `#`.
//!
//! * `tidings` — `tidings::topic::trie::TopicTrie`.
//! * `hashmap-exact` — one `HashMap` lookup of the literal topic: the floor (it ignores the
//!   wildcard patterns, so it finds fewer matches).
//! * `linear-scan` — every pattern tried with a straightforward word matcher.
//!
//! The trie's answers are checked against the linear scan on a sample of topics; any
//! disagreement is reported in the notes.

use std::collections::{HashMap, HashSet};
use std::hint::black_box;
use std::time::Instant;

use tidings::topic::trie::TopicTrie;
use tidings::topic::{Pattern, Topic};

use crate::harness::{Contender, Rng, interleave};
use crate::{Case, Filter, Plan};

const NAME: &str = "match/patterns=37k";
const LITERALS: usize = 33_000;
const WILDCARDS: usize = 4_000;
/// Distinct words per level of the 5-word topics.
const LEVELS: [u64; 5] = [8, 16, 32, 64, 128];
const LOOKUPS: usize = 4096;
const VERIFY: usize = 300;

pub(crate) fn case_names() -> Vec<String> {
    vec![NAME.to_owned()]
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

pub(crate) fn run(plan: &Plan, filter: &Filter) -> Vec<Case> {
    if !filter.wants(NAME) {
        return Vec::new();
    }
    let mut rng = Rng::new(0x7D1D_1265);
    let pats = patterns(&mut rng);
    // Lookup topics: half literal hits, half random (mostly literal misses, some wildcard hits).
    let lookup_strs: Vec<String> = (0..LOOKUPS)
        .map(|i| {
            if i % 2 == 0 {
                pats[rng.below(LITERALS as u64) as usize].clone()
            } else {
                random_topic(&mut rng)
            }
        })
        .collect();
    let mut case = Case::new(NAME, "ns/match", false);

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
    let trie_build = t.elapsed();
    let topics: Vec<Topic> = match lookup_strs.iter().map(|s| Topic::new(s)).collect() {
        Ok(t) => t,
        Err(e) => {
            case.note(format!("tidings skipped: Topic::new failed: {e}"));
            return vec![case];
        }
    };
    let mut exact: HashMap<&str, Vec<u64>> = HashMap::new();
    for (id, p) in pats.iter().enumerate().take(LITERALS) {
        exact.entry(p.as_str()).or_default().push(id as u64);
    }
    let split_pats: Vec<(Vec<&str>, u64)> = pats
        .iter()
        .enumerate()
        .map(|(id, p)| (p.split('.').collect(), id as u64))
        .collect();
    let linear = |topic: &str, mut out: Option<&mut Vec<u64>>| {
        let words: Vec<&str> = topic.split('.').collect();
        let mut n = 0;
        for (p, id) in &split_pats {
            if matches(p, &words) {
                n += 1;
                if let Some(o) = out.as_deref_mut() {
                    o.push(*id);
                }
            }
        }
        n
    };

    // Check the trie against the linear scan.
    let mut disagree = 0;
    let mut first = None;
    let mut total_matches = 0;
    for (s, t) in lookup_strs.iter().zip(&topics).take(VERIFY) {
        let mut want = Vec::new();
        linear(s, Some(&mut want));
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

    let secs = plan.match_round_secs;
    let (mut r1, mut r2, mut r3) = (None, None, None);
    let outcomes = {
        let trie = &trie;
        let topics = &topics;
        let lookup_strs = &lookup_strs;
        let exact = &exact;
        let linear = &linear;
        let mut cs = vec![
            Contender::new("tidings", || {
                Ok(ns_per(LOOKUPS, secs, &mut r1, |i| {
                    let mut n = 0;
                    trie.for_each_match(&topics[i], |_, _| n += 1);
                    n
                }))
            }),
            Contender::new("hashmap-exact", || {
                Ok(ns_per(LOOKUPS, secs, &mut r2, |i| {
                    exact.get(lookup_strs[i].as_str()).map_or(0, Vec::len)
                }))
            }),
            Contender::new("linear-scan", || {
                Ok(ns_per(LOOKUPS, secs, &mut r3, |i| {
                    linear(&lookup_strs[i], None)
                }))
            }),
        ];
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
         {LOOKUPS} lookup topics, half literal hits; {} rounds interleaved; trie built in {:.1} ms; \
         hashmap-exact ignores wildcards (the floor); on {VERIFY} sampled topics linear-scan found {total_matches} matches",
        plan.rounds,
        trie_build.as_secs_f64() * 1e3
    ));
    if let Some(e) = build_err {
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
    vec![case]
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
