//! The trie's tests: the AMQP table, ordering, equivalent patterns, pruning, and proptests of
//! the plain and the memoised walk against a naive matcher (R-RT-1).

use super::super::tests::{AMQP_CASES, naive};
use super::*;
use proptest::prelude::*;

fn p(s: &str) -> Pattern {
    Pattern::new(s).unwrap()
}
fn t(s: &str) -> Topic {
    Topic::new(s).unwrap()
}
#[test]
fn first_is_the_lowest_id_under_a_pattern_or_an_equivalent_one() {
    let mut trie = TopicTrie::new();
    assert_eq!(trie.first(&p("a.b")), None);
    trie.insert(&p("a.b"), 7, "seven");
    trie.insert(&p("a.b"), 3, "three");
    trie.insert(&p("a.*.#"), 5, "five");
    assert_eq!(trie.first(&p("a.b")), Some(&"three"));
    assert_eq!(trie.first(&p("a.*.#")), Some(&"five"));
    assert_eq!(
        trie.first(&p("a.#.*")),
        Some(&"five"),
        "an equivalent pattern"
    );
    assert_eq!(trie.first(&p("a.*")), None);
    assert_eq!(trie.first(&p("a.c")), None);
    trie.remove(&p("a.b"), 3);
    assert_eq!(trie.first(&p("a.b")), Some(&"seven"));
}

fn ids<V>(trie: &TopicTrie<V>, topic: &str) -> Vec<u64> {
    let mut out = Vec::new();
    trie.for_each_match(&t(topic), |id, _| out.push(id));
    out
}

/// Live trie nodes (root included), to check pruning.
fn node_count<V>(trie: &TopicTrie<V>) -> usize {
    trie.nodes.len() - trie.free_nodes.len()
}

/// Checks internal bookkeeping: edges, word references and child counts agree.
fn check_invariants<V>(trie: &TopicTrie<V>) {
    let mut refs: HashMap<u32, u32> = HashMap::new();
    let mut kids: HashMap<u32, u32> = HashMap::new();
    for (&key, &child) in &trie.edges {
        *refs.entry(key as u32).or_default() += 1;
        *kids.entry((key >> 32) as u32).or_default() += 1;
        let parent = &trie.nodes[(key >> 32) as usize];
        assert_ne!(
            parent.bloom & bloom_bit(key as u32),
            0,
            "bloom misses an edge"
        );
        assert!(!trie.free_nodes.contains(&child));
    }
    for &(id, count) in trie.words.values() {
        assert_eq!(refs.get(&id).copied().unwrap_or(0), count);
    }
    assert_eq!(refs.len(), trie.words.len());
    for (i, n) in trie.nodes.iter().enumerate() {
        if !trie.free_nodes.contains(&(i as u32)) {
            assert_eq!(kids.get(&(i as u32)).copied().unwrap_or(0), n.children);
            assert!(i == 0 || !n.is_empty(), "empty live node {i}");
        }
    }
    let entries: usize = trie.nodes.iter().map(|n| n.entries.len()).sum();
    assert_eq!(entries, trie.wild_len);
}

/// The walk's per-thread buffers are taken for the call: a match run from inside a match
/// callback on the same thread sees a consistent trie and gives the same answers (R-RT-1).
#[test]
fn nested_match_from_a_callback() {
    let mut trie = TopicTrie::new();
    for (i, pat) in ["a.#", "#.c", "a.*.c", "*.b.*", "#"].iter().enumerate() {
        trie.insert(&p(pat), i as u64, ());
    }
    let mut outer = Vec::new();
    trie.for_each_match(&t("a.b.c"), |id, _| {
        assert_eq!(ids(&trie, "x.b.y"), vec![3, 4]); // R-RT-1
        outer.push(id);
    });
    assert_eq!(outer, vec![0, 1, 2, 3, 4]); // R-RT-1
    assert_eq!(ids(&trie, "a.b.c"), outer);
}

#[test]
fn amqp_table_single_pattern_trie() {
    for (i, &(pat, topic, want)) in AMQP_CASES.iter().enumerate() {
        let mut trie = TopicTrie::new();
        trie.insert(&p(pat), i as u64, ());
        let got = ids(&trie, topic);
        assert_eq!(got.len(), usize::from(want), "{pat} vs {topic}: {got:?}"); // R-RT-1
    }
}

#[test]
fn amqp_table_all_patterns_in_one_trie() {
    let mut trie = TopicTrie::new();
    for (i, &(pat, _, _)) in AMQP_CASES.iter().enumerate() {
        assert!(trie.insert(&p(pat), i as u64, i).is_none());
    }
    for &(_, topic, _) in AMQP_CASES {
        let want: Vec<u64> = AMQP_CASES
            .iter()
            .enumerate()
            .filter(|(_, (pat, _, _))| p(pat).matches(&t(topic)))
            .map(|(i, _)| i as u64)
            .collect();
        assert_eq!(ids(&trie, topic), want, "{topic}"); // R-RT-1 (ascending ids, once each)
    }
}

#[test]
fn multi_path_patterns_reported_once() {
    let mut trie = TopicTrie::new();
    for (id, pat) in ["#.#", "#.*.#", "#.a.#", "#.#.#.#", "*.#.*", "#"]
        .iter()
        .enumerate()
    {
        trie.insert(&p(pat), id as u64, ());
    }
    assert_eq!(ids(&trie, "a.a.a.a.a"), [0, 1, 2, 3, 4, 5]); // R-RT-1
    assert_eq!(ids(&trie, "a"), [0, 1, 2, 3, 5]); // R-RT-1
    assert_eq!(ids(&trie, "b"), [0, 1, 3, 5]); // R-RT-1
}

#[test]
fn ascending_id_order_across_literal_and_wildcard() {
    let mut trie = TopicTrie::new();
    trie.insert(&p("a.b"), 5, "lit5");
    trie.insert(&p("a.*"), 3, "star3");
    trie.insert(&p("a.b"), 1, "lit1");
    trie.insert(&p("#"), 4, "hash4");
    trie.insert(&p("a.#"), 2, "ahash2");
    let mut got = Vec::new();
    trie.for_each_match(&t("a.b"), |id, v| got.push((id, *v)));
    assert_eq!(
        got,
        [
            (1, "lit1"),
            (2, "ahash2"),
            (3, "star3"),
            (4, "hash4"),
            (5, "lit5")
        ]
    ); // R-RT-1 (deterministic order)
}

#[test]
fn same_id_under_several_patterns_reported_once() {
    let mut trie = TopicTrie::new();
    trie.insert(&p("a.b"), 1, "lit");
    trie.insert(&p("a.*"), 1, "star");
    trie.insert(&p("#"), 1, "hash");
    assert_eq!(trie.len(), 3);
    let mut got = Vec::new();
    trie.for_each_match(&t("a.b"), |id, v| got.push((id, *v)));
    assert_eq!(got, [(1, "lit")]); // R-RT-1
}

#[test]
fn equivalent_patterns_share_a_key() {
    let mut trie = TopicTrie::new();
    assert_eq!(trie.insert(&p("#.#"), 7, 1), None);
    assert_eq!(trie.insert(&p("#"), 7, 2), Some(1));
    assert_eq!(trie.insert(&p("#.*"), 8, 3), None);
    assert_eq!(trie.get(&p("*.#"), 8), Some(&3));
    assert_eq!(trie.len(), 2);
    assert_eq!(trie.remove(&p("#.#.#"), 7), Some(2));
    assert_eq!(trie.remove(&p("*.#"), 8), Some(3));
    assert!(trie.is_empty());
    assert_eq!(node_count(&trie), 1);
}

#[test]
fn insert_get_remove_prune() {
    let mut trie = TopicTrie::new();
    let pats = ["a.b.c", "a.*.c", "a.#", "#.c", "x", "*"];
    for (i, pat) in pats.iter().enumerate() {
        assert_eq!(trie.insert(&p(pat), i as u64, i), None);
    }
    assert_eq!(trie.len(), pats.len());
    assert_eq!(trie.insert(&p("a.*.c"), 1, 10), Some(1));
    *trie.get_mut(&p("a.#"), 2).unwrap() += 100;
    assert_eq!(trie.get(&p("a.#"), 2), Some(&102));
    assert_eq!(trie.get(&p("a.#"), 99), None);
    assert_eq!(trie.get(&p("q.#"), 2), None);
    assert_eq!(ids(&trie, "a.b.c"), [0, 1, 2, 3]); // R-RT-1
    assert_eq!(trie.remove(&p("a.b.c"), 0), Some(0));
    assert_eq!(trie.remove(&p("a.b.c"), 0), None);
    assert_eq!(trie.remove(&p("a.*.c"), 99), None);
    assert_eq!(trie.remove(&p("zz.*"), 1), None);
    assert_eq!(ids(&trie, "a.b.c"), [1, 2, 3]); // R-RT-1
    for (i, pat) in pats.iter().enumerate().skip(1) {
        assert!(trie.remove(&p(pat), i as u64).is_some());
    }
    assert!(trie.is_empty());
    assert!(trie.literal.is_empty());
    assert_eq!(node_count(&trie), 1); // pruned back to the bare root
    assert!(!trie.matches_any(&t("a.b.c")));
}

#[test]
fn shared_words_are_reference_counted() {
    let mut trie = TopicTrie::new();
    for i in 0..100u64 {
        trie.insert(&p(&format!("w{i}.*.end")), i, i);
        trie.insert(&p(&format!("#.w{i}")), 1000 + i, i);
    }
    check_invariants(&trie);
    assert_eq!(trie.words.len(), 101); // w0..w99 and "end"
    assert_eq!(ids(&trie, "w42.x.end"), [42]); // R-RT-1
    assert_eq!(ids(&trie, "a.b.w42"), [1042]); // R-RT-1
    for i in 0..98u64 {
        assert_eq!(trie.remove(&p(&format!("w{i}.*.end")), i), Some(i));
        check_invariants(&trie);
    }
    assert_eq!(trie.words.len(), 101); // still used by `#.wN`
    assert_eq!(ids(&trie, "w99.x.end"), [99]); // R-RT-1
    assert_eq!(ids(&trie, "w42.x.end"), Vec::<u64>::new()); // R-RT-1
    for i in 0..100u64 {
        assert_eq!(trie.remove(&p(&format!("#.w{i}")), 1000 + i), Some(i));
    }
    check_invariants(&trie);
    assert_eq!(trie.words.len(), 3); // w98, w99, end
    // Freed nodes and word ids are reused.
    let before = trie.nodes.len();
    trie.insert(&p("q.*"), 5, 5);
    assert_eq!(trie.nodes.len(), before);
    check_invariants(&trie);
}

#[test]
fn many_matches_spill_to_heap() {
    // More than 16 distinct matching nodes and more than 32 live states.
    let mut trie = TopicTrie::new();
    let mut id = 0;
    let mut want = Vec::new();
    for a in ["a", "*", "#"] {
        for b in ["a", "*", "#"] {
            for c in ["a", "*", "#"] {
                for d in ["a", "*", "#"] {
                    let pat = p(&format!("{a}.{b}.{c}.{d}"));
                    trie.insert(&pat, id, ());
                    if pat.matches(&t("a.a.a.a")) {
                        want.push(id);
                    }
                    id += 1;
                }
            }
        }
    }
    trie.insert(&p("a.a.a.a"), 1000, ());
    want.push(1000);
    assert_eq!(ids(&trie, "a.a.a.a"), want); // R-RT-1
}

#[derive(Debug, Clone)]
enum Op {
    Insert(String, u64),
    Remove(usize),
}

fn word() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        3 => Just("a"),
        3 => Just("b"),
        1 => Just("c"),
        3 => Just("*"),
        3 => Just("#"),
    ]
}

fn pattern() -> impl Strategy<Value = String> {
    prop::collection::vec(word(), 1..6).prop_map(|w| w.join("."))
}

fn topic() -> impl Strategy<Value = String> {
    prop::collection::vec(prop_oneof![Just("a"), Just("b"), Just("c")], 1..7)
        .prop_map(|w| w.join("."))
}

/// A word longer than the memo's inline keys (it goes through the word id).
const LONG: &str = "long-word-longer-than-twenty-four-bytes";

#[derive(Debug, Clone)]
enum Step {
    Insert(String, u64),
    Remove(usize),
    Match(String),
}

fn memo_word() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        3 => Just("a"),
        3 => Just("b"),
        1 => Just("cccccccccc"),
        1 => Just(LONG),
        3 => Just("*"),
        3 => Just("#"),
    ]
}

fn memo_topic() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just("a"),
            Just("b"),
            Just("cccccccccc"),
            Just(LONG),
            Just("zz")
        ],
        1..7,
    )
    .prop_map(|w| w.join("."))
}

fn memo_steps() -> impl Strategy<Value = Vec<Step>> {
    let pattern = prop::collection::vec(memo_word(), 1..6).prop_map(|w| w.join("."));
    prop::collection::vec(
        prop_oneof![
            2 => (pattern, 0u64..10).prop_map(|(p, id)| Step::Insert(p, id)),
            1 => (0usize..64).prop_map(Step::Remove),
            // Few distinct topics, so most matches replay memoised steps.
            4 => prop::sample::select(vec![0usize, 1, 2, 3]).prop_flat_map(|k| {
                memo_topic().prop_map(move |t| (k, t))
            }).prop_map(|(_, t)| Step::Match(t)),
        ],
        1..60,
    )
}

fn canon_text(pat: &str) -> String {
    canonical::tests::text(pat)
}

/// Runs `steps` against a trie and a model, checking every match against the naive
/// matcher: matches after inserts and removes must never see a stale memoised step.
fn check_memo(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let mut trie = TopicTrie::new();
    let mut model: Vec<(String, u64)> = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    for step in steps {
        match step {
            Step::Insert(pat, id) => {
                let key = canon_text(&pat);
                model.retain(|(q, qid)| !(*qid == id && canon_text(q) == key));
                trie.insert(&p(&pat), id, ());
                model.push((pat, id));
            }
            Step::Remove(i) if !model.is_empty() => {
                let (pat, id) = model.remove(i % model.len());
                prop_assert!(trie.remove(&p(&pat), id).is_some());
            }
            Step::Remove(_) => {}
            Step::Match(topic) => seen.push(topic),
        }
        // Replay every topic seen so far: memoised steps from before the change meet the
        // trie after it.
        for topic in &seen {
            let tw: Vec<&str> = topic.split('.').collect();
            let mut want: Vec<u64> = model
                .iter()
                .filter(|(pat, _)| naive(&pat.split('.').collect::<Vec<_>>(), &tw))
                .map(|(_, id)| *id)
                .collect();
            want.sort_unstable();
            want.dedup();
            prop_assert_eq!(ids(&trie, topic), want, "topic {}", topic); // R-RT-1
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    /// The memoised walk agrees with the naive matcher across inserts and removes (R-RT-1).
    #[test]
    fn memoised_walk_agrees_with_naive_matcher(steps in memo_steps()) {
        dfa::set_limits_for_this_thread(dfa::MAX_STATES, dfa::MAX_TRANSITIONS, dfa::MAX_TOPICS);
        check_memo(steps)?;
    }

    /// The same with a memo so small it is full most of the time: the walk takes over
    /// mid-topic, and the memo is emptied and refilled (R-RT-1).
    #[test]
    fn full_memo_falls_back_to_the_walk(steps in memo_steps()) {
        dfa::set_limits_for_this_thread(3, 4, 2);
        check_memo(steps)?;
    }

    /// Room for every step but only two whole topics: remembered topics are forgotten and
    /// learnt again while the steps stay (R-RT-1).
    #[test]
    fn small_topic_table_agrees_with_naive_matcher(steps in memo_steps()) {
        dfa::set_limits_for_this_thread(dfa::MAX_STATES, dfa::MAX_TRANSITIONS, 2);
        check_memo(steps)?;
    }
}

/// The memo never grows past its limits, and answers stay right once it is full.
#[test]
fn memo_stays_within_its_limits() {
    dfa::set_limits_for_this_thread(5, 7, 3);
    let mut trie = TopicTrie::new();
    for i in 0..20u64 {
        trie.insert(&p(&format!("w{i}.*.#")), i, ());
    }
    for round in 0..3 {
        for i in 0..20u64 {
            assert_eq!(ids(&trie, &format!("w{i}.x.y")), [i], "round {round}"); // R-RT-1
            let (states, steps, topics) = dfa::with(trie.uid, trie.epoch, |d| d.len()).unwrap();
            assert!(
                states <= 5 && steps <= 7 && topics <= 3,
                "{states} states, {steps} steps, {topics} topics"
            );
        }
    }
    dfa::set_limits_for_this_thread(dfa::MAX_STATES, dfa::MAX_TRANSITIONS, dfa::MAX_TOPICS);
}

/// A full memo that answers no topic whole (every topic new) is emptied and left unused for a
/// pause that doubles each time it is found thrashing again; the answers stay those of the walk
/// throughout (R-RT-1).
#[test]
fn thrashing_memo_pauses_and_learns_again() {
    // Window 1 topic, first pause 16 matches.
    dfa::set_limits_for_this_thread(4, 16, 2);
    let mut trie = TopicTrie::new();
    for i in 0..50u64 {
        trie.insert(&p(&format!("w{i}.*.#")), i, ());
    }
    let mut empty_runs = Vec::new();
    let mut run = 0;
    for n in 0..120u64 {
        let i = n % 50;
        assert_eq!(ids(&trie, &format!("w{i}.x.y")), [i], "match {n}"); // R-RT-1
        let (states, ..) = dfa::with(trie.uid, trie.epoch, |d| d.len()).unwrap();
        if states == 0 {
            run += 1;
        } else if run > 0 {
            empty_runs.push(run);
            run = 0;
        }
    }
    // Each time: the match that finds the memo thrashing empties it, then the pause; the match
    // after the pause learns again and the next one finds it full and thrashing again.
    assert_eq!(empty_runs, [1 + 16, 1 + 32, 1 + 64]);
    dfa::set_limits_for_this_thread(dfa::MAX_STATES, dfa::MAX_TRANSITIONS, dfa::MAX_TOPICS);
}

/// A full memo that still answers most topics whole is kept in use (R-RT-1).
#[test]
fn full_memo_answering_most_topics_is_kept() {
    // Window 4 topics, first pause 64 matches.
    dfa::set_limits_for_this_thread(4, 64, 8);
    let mut trie = TopicTrie::new();
    for i in 0..50u64 {
        trie.insert(&p(&format!("w{i}.*.#")), i, ());
    }
    let memo_len = |trie: &TopicTrie<()>| dfa::with(trie.uid, trie.epoch, |d| d.len()).unwrap();
    assert_eq!(ids(&trie, "w0.x.y"), [0]); // R-RT-1
    let learnt = memo_len(&trie);
    assert_eq!(learnt.0, 4, "the first topic fills the memo's states");
    for n in 1..=4u64 {
        // A new topic the full memo cannot take, then the known one, answered whole, twice.
        assert_eq!(ids(&trie, &format!("w{n}.x.y")), [n]); // R-RT-1
        assert_eq!(ids(&trie, "w0.x.y"), [0]); // R-RT-1
        assert_eq!(ids(&trie, "w0.x.y"), [0]); // R-RT-1
    }
    // Judged at the fourth refusal: 6 answered whole against 4 refused, so not paused.
    assert_eq!(memo_len(&trie), learnt);
    assert_eq!(ids(&trie, "w5.x.y"), [5]); // R-RT-1
    assert_eq!(memo_len(&trie), learnt);
    dfa::set_limits_for_this_thread(dfa::MAX_STATES, dfa::MAX_TRANSITIONS, dfa::MAX_TOPICS);
}

/// A topic matched again is answered from the remembered whole topic, and a change of the
/// wildcard side (insert or remove) is seen by the next match of that same topic (R-RT-1).
#[test]
fn remembered_topics_follow_changes() {
    dfa::set_limits_for_this_thread(dfa::MAX_STATES, dfa::MAX_TRANSITIONS, dfa::MAX_TOPICS);
    let mut trie = TopicTrie::new();
    trie.insert(&p("a.*"), 1, ());
    trie.insert(&p("a.b"), 5, ());
    let remembered = |trie: &TopicTrie<()>| {
        dfa::with(trie.uid, trie.epoch, |d| d.topic("a.b").is_some()).unwrap()
    };
    assert_eq!(ids(&trie, "a.b"), [1, 5]); // R-RT-1
    assert!(remembered(&trie));
    assert_eq!(ids(&trie, "a.b"), [1, 5]); // R-RT-1
    trie.insert(&p("#.b"), 2, ());
    assert!(!remembered(&trie));
    assert_eq!(ids(&trie, "a.b"), [1, 2, 5]); // R-RT-1
    assert_eq!(ids(&trie, "a.b"), [1, 2, 5]); // R-RT-1
    trie.remove(&p("a.*"), 1);
    assert_eq!(ids(&trie, "a.b"), [2, 5]); // R-RT-1
    trie.remove(&p("#.b"), 2);
    assert_eq!(ids(&trie, "a.b"), [5]); // R-RT-1
    // A topic no wildcard pattern can match is remembered too (the dead state).
    trie.insert(&p("q.*"), 3, ());
    assert_eq!(ids(&trie, "a.b"), [5]); // R-RT-1
    assert!(remembered(&trie));
    assert_eq!(ids(&trie, "a.b"), [5]); // R-RT-1
}

/// Tries matched alternately on one thread each keep their own memo; more tries than
/// slots evict one another without mixing answers (R-RT-1).
#[test]
fn several_tries_on_one_thread() {
    let tries: Vec<TopicTrie<()>> = (0..dfa::SLOTS + 2)
        .map(|k| {
            let mut trie = TopicTrie::new();
            trie.insert(&p(&format!("t{k}.*")), k as u64, ());
            trie.insert(&p("#.end"), 100, ());
            trie
        })
        .collect();
    for _ in 0..3 {
        for (k, trie) in tries.iter().enumerate() {
            for (j, _) in tries.iter().enumerate() {
                let want: Vec<u64> = if j == k { vec![k as u64] } else { vec![] };
                assert_eq!(ids(trie, &format!("t{j}.x")), want); // R-RT-1
            }
            assert_eq!(ids(trie, &format!("t{k}.end")), vec![k as u64, 100]); // R-RT-1
        }
    }
}

/// A memo cleared by `clear` (a new identity) or rebuilt after a remove and re-insert that
/// reuses node and word ids never answers for the old shape (R-RT-1).
#[test]
fn reused_ids_do_not_revive_old_steps() {
    let mut trie = TopicTrie::new();
    trie.insert(&p("a.b.#"), 1, ());
    assert_eq!(ids(&trie, "a.b.c"), [1]);
    trie.remove(&p("a.b.#"), 1);
    trie.insert(&p("x.y.#"), 2, ()); // reuses the freed word and node ids
    assert_eq!(ids(&trie, "a.b.c"), Vec::<u64>::new()); // R-RT-1
    assert_eq!(ids(&trie, "x.y.c"), [2]); // R-RT-1
    trie.clear();
    trie.insert(&p("a.*.c"), 3, ());
    assert_eq!(ids(&trie, "x.y.c"), Vec::<u64>::new()); // R-RT-1
    assert_eq!(ids(&trie, "a.b.c"), [3]); // R-RT-1
    assert_eq!(ids(&trie, &format!("a.{LONG}.c")), [3]); // R-RT-1
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    /// 2,000 cases × 8 topics each = 16,000 (pattern set, topic) checks.
    #[test]
    fn trie_agrees_with_naive_matcher(
        ops in prop::collection::vec(
            prop_oneof![
                3 => (pattern(), 0u64..12).prop_map(|(p, id)| Op::Insert(p, id)),
                1 => (0usize..64).prop_map(Op::Remove),
            ],
            1..40,
        ),
        topics in prop::collection::vec(topic(), 8),
    ) {
        let mut trie = TopicTrie::new();
        // Model: (pattern text, id) -> value, with at most one live key per equivalence.
        let mut model: Vec<(String, u64, usize)> = Vec::new();
        for (step, op) in ops.into_iter().enumerate() {
            match op {
                Op::Insert(pat, id) => {
                    let pp = p(&pat);
                    let key = canonical(&pp);
                    let old = model.iter().position(|(q, qid, _)| {
                        *qid == id && canonical(&p(q)) == key
                    });
                    let got = trie.insert(&pp, id, step);
                    prop_assert_eq!(got, old.map(|i| model[i].2));
                    if let Some(i) = old {
                        model.remove(i);
                    }
                    model.push((pat, id, step));
                }
                Op::Remove(i) if !model.is_empty() => {
                    let (pat, id, v) = model.remove(i % model.len());
                    prop_assert_eq!(trie.remove(&p(&pat), id), Some(v));
                    prop_assert_eq!(trie.remove(&p(&pat), id), None);
                }
                Op::Remove(_) => {}
            }
            prop_assert_eq!(trie.len(), model.len());
        }
        check_invariants(&trie);
        for topic in &topics {
            let tw: Vec<&str> = topic.split('.').collect();
            let mut want: Vec<u64> = model
                .iter()
                .filter(|(pat, _, _)| {
                    let pw: Vec<&str> = pat.split('.').collect();
                    naive(&pw, &tw)
                })
                .map(|(_, id, _)| *id)
                .collect();
            want.sort_unstable();
            want.dedup();
            prop_assert_eq!(ids(&trie, topic), want, "topic {}", topic); // R-RT-1
            for (pat, _, _) in &model {
                let pw: Vec<&str> = pat.split('.').collect();
                prop_assert_eq!(p(pat).matches(&t(topic)), naive(&pw, &tw)); // R-RT-1
            }
        }
        // Removing everything prunes the trie back to its root.
        for (pat, id, _) in model.drain(..) {
            prop_assert!(trie.remove(&p(&pat), id).is_some());
        }
        prop_assert!(trie.is_empty());
        prop_assert_eq!(node_count(&trie), 1);
    }
}

/// An inline entry list is the size of a `Vec`, so keeping the first entry inline grows
/// neither the trie's nodes nor the literal table's slots (on 64-bit targets, where the
/// inline entry fills the two words a `Vec` uses for pointer and length).
#[cfg(target_pointer_width = "64")]
#[test]
fn inline_entries_cost_no_space() {
    use std::mem::size_of;
    assert_eq!(
        size_of::<super::entries::Entries<std::sync::Arc<()>>>(),
        size_of::<Vec<(u64, std::sync::Arc<()>)>>()
    );
    assert!(size_of::<super::node::Node<std::sync::Arc<()>>>() <= 48);
}
