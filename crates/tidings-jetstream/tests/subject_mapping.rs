//! The pattern → NATS subject mapping never loses a topic (R-RT-1 on JetStream): checked
//! exhaustively over small alphabets and by proptest, against a reference AMQP matcher
//! written here independently of `tidings`.

use proptest::prelude::*;
use tidings::{Pattern, Topic};
use tidings_jetstream::subject::{filter_subjects, is_exact, stream_subjects, subject_matches};

/// Reference AMQP 0-9-1 topic matching: `*` one word, `#` zero or more, by recursion.
fn amqp_matches(pattern: &[&str], topic: &[&str]) -> bool {
    match pattern.split_first() {
        None => topic.is_empty(),
        Some((&"#", rest)) => (0..=topic.len()).any(|skip| amqp_matches(rest, &topic[skip..])),
        Some((&"*", rest)) => !topic.is_empty() && amqp_matches(rest, &topic[1..]),
        Some((word, rest)) => topic.first() == Some(word) && amqp_matches(rest, &topic[1..]),
    }
}

/// Every topic of 1..=`max_len` words over `alphabet`.
fn all_topics(alphabet: &[&str], max_len: usize) -> Vec<Topic> {
    let mut out = Vec::new();
    let mut layer: Vec<Vec<&str>> = vec![vec![]];
    for _ in 0..max_len {
        layer = layer
            .iter()
            .flat_map(|prefix| {
                alphabet.iter().map(move |w| {
                    let mut t = prefix.clone();
                    t.push(w);
                    t
                })
            })
            .collect();
        out.extend(
            layer
                .iter()
                .map(|t| Topic::new(&t.join(".")).expect("valid topic")),
        );
    }
    out
}

fn all_patterns(alphabet: &[&str], max_len: usize) -> Vec<Pattern> {
    let mut out = Vec::new();
    let mut layer: Vec<Vec<&str>> = vec![vec![]];
    for _ in 0..max_len {
        layer = layer
            .iter()
            .flat_map(|prefix| {
                alphabet.iter().map(move |w| {
                    let mut t = prefix.clone();
                    t.push(w);
                    t
                })
            })
            .collect();
        out.extend(
            layer
                .iter()
                .map(|t| Pattern::new(&t.join(".")).expect("valid pattern")),
        );
    }
    out
}

fn words(s: &str) -> Vec<&str> {
    s.split('.').collect()
}

/// Checks one pattern against every topic: the superset covers every match, is exact when
/// it says so, has no two subjects matching one topic, and `Pattern::matches` agrees with
/// the reference.
fn check_pattern(pattern: &Pattern, topics: &[Topic]) -> Result<(), String> {
    let subjects = filter_subjects(pattern);
    let exact = is_exact(pattern);
    for topic in topics {
        let expected = amqp_matches(&words(pattern.as_str()), &words(topic.as_str()));
        if pattern.matches(topic) != expected {
            return Err(format!(
                "Pattern::matches({pattern}, {topic}) != {expected}"
            ));
        }
        let hits = subjects
            .iter()
            .filter(|s| subject_matches(s, topic))
            .count();
        if expected && hits == 0 {
            return Err(format!("{pattern} matches {topic} but {subjects:?} do not"));
        }
        if exact && !expected && hits > 0 {
            return Err(format!(
                "{pattern} is exact but {subjects:?} let {topic} through"
            ));
        }
        if hits > 1 {
            return Err(format!("{subjects:?} overlap on {topic}"));
        }
    }
    Ok(())
}

#[test]
fn every_small_pattern_maps_to_a_covering_superset() {
    let topics = all_topics(&["a", "b", "c"], 6);
    let patterns = all_patterns(&["a", "b", "*", "#"], 4);
    assert_eq!(patterns.len(), 4 + 16 + 64 + 256);
    for pattern in &patterns {
        // R-RT-1: the server-side filter never drops a topic the AMQP pattern matches.
        check_pattern(pattern, &topics).unwrap_or_else(|e| panic!("{e}"));
    }
}

fn pattern_strategy() -> impl Strategy<Value = Pattern> {
    prop::collection::vec(prop::sample::select(vec!["a", "b", "c", "*", "#"]), 1..=7)
        .prop_map(|w| Pattern::new(&w.join(".")).expect("valid pattern"))
}

fn topic_strategy() -> impl Strategy<Value = Topic> {
    prop::collection::vec(prop::sample::select(vec!["a", "b", "c", "d"]), 1..=9)
        .prop_map(|w| Topic::new(&w.join(".")).expect("valid topic"))
}

proptest! {
    #[test]
    fn superset_contains_every_match(pattern in pattern_strategy(), topic in topic_strategy()) {
        let expected = amqp_matches(&words(pattern.as_str()), &words(topic.as_str()));
        // R-RT-1: the client-side re-check agrees with the reference matcher.
        prop_assert_eq!(pattern.matches(&topic), expected);
        let subjects = filter_subjects(&pattern);
        let hits = subjects.iter().filter(|s| subject_matches(s, &topic)).count();
        // R-RT-1: every matching topic passes the server-side filter.
        prop_assert!(!expected || hits == 1, "{} {} {:?}", pattern, topic, subjects);
        if is_exact(&pattern) {
            prop_assert_eq!(hits == 1, expected);
        }
    }

    #[test]
    fn stream_subjects_cover_every_pattern_without_overlap(
        patterns in prop::collection::vec(pattern_strategy(), 1..=4),
        topic in topic_strategy(),
    ) {
        let subjects = stream_subjects(&patterns);
        let hits = subjects.iter().filter(|s| subject_matches(s, &topic)).count();
        prop_assert!(hits <= 1, "{:?} overlap on {}", subjects, topic);
        if patterns.iter().any(|p| p.matches(&topic)) {
            // R-RT-1: a stream captures every topic any of its patterns matches.
            prop_assert_eq!(hits, 1, "{:?} lose {}", subjects, topic);
        }
    }
}
