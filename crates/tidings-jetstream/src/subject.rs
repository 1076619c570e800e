//! Topics and patterns as NATS subjects (R-RT-1 on JetStream).
//!
//! # The mapping
//! A tidings topic is already a valid NATS subject: the same `.`-separated words, and the
//! word alphabet (`A-Z a-z 0-9 - _ :`) contains none of NATS's special characters. A pattern's
//! `*` (exactly one word) is NATS's `*`. A pattern's `#` (zero or more words, anywhere) has no
//! NATS equivalent: NATS's `>` matches *one* or more words and only as the last token.
//!
//! So a pattern becomes a set of NATS subjects whose union is a **superset** of what the
//! pattern matches, used as the consumer's `filter_subjects` (or a stream's `subjects`);
//! the consumer re-checks every delivered topic against the pattern with
//! [`Pattern::matches`] and counts what it skips. Write the pattern as `P.R` where `P` is
//! everything before the first `#`:
//!
//! | pattern | subjects | exact? |
//! |---|---|---|
//! | no `#` (`a.*.b`) | the pattern itself | yes |
//! | `P` then only `#`s (`a.#`, `#`) | `P` and `P.>` (`>` alone when `P` is empty) | yes |
//! | `P.R`, `R` needs `k ≥ 1` more words (`a.#.b`, `#.x.y`) | `P` + `k−1` × `*` + `>` | only when `R` has no literal word |
//!
//! For example `a.#` → `[a, a.>]`, `a.#.b` → `[a.>]`, `#` → `[>]`, `#.x.y` → `[*.>]`. The
//! third row is the tightest superset a single NATS prefix filter can express: everything
//! after the first `#` can only constrain the *length*, since `>` must come last.
//!
//! A stream capturing several patterns needs subjects that do not overlap (the server refuses
//! overlapping filters): [`stream_subjects`] removes subjects covered by another and merges
//! the remaining overlapping pairs into one generalisation, so the result still covers every
//! input.

use tidings::{Pattern, Topic};

/// NATS's single-token wildcard, the same word as AMQP's `*`.
const STAR: &str = "*";
/// NATS's tail wildcard: one or more tokens, last position only.
const TAIL: &str = ">";
/// AMQP's multi-word wildcard.
const HASH: &str = "#";

/// The NATS subjects whose union is the tightest superset of `pattern` expressible as
/// prefix filters (see the [module docs](self)); pairwise non-overlapping.
///
/// ```
/// # use tidings::Pattern;
/// # use tidings_jetstream::subject::filter_subjects;
/// let p = |s: &str| Pattern::new(s).unwrap();
/// assert_eq!(filter_subjects(&p("a.#")), ["a", "a.>"]);
/// assert_eq!(filter_subjects(&p("a.#.b")), ["a.>"]);
/// assert_eq!(filter_subjects(&p("#")), [">"]);
/// assert_eq!(filter_subjects(&p("a.*.b")), ["a.*.b"]);
/// ```
#[must_use]
pub fn filter_subjects(pattern: &Pattern) -> Vec<String> {
    let words: Vec<&str> = pattern.words().collect();
    let Some(first_hash) = words.iter().position(|w| *w == HASH) else {
        return vec![pattern.as_str().to_owned()];
    };
    let prefix = &words[..first_hash];
    let required = words[first_hash..].iter().filter(|w| **w != HASH).count();
    if required == 0 {
        if prefix.is_empty() {
            return vec![TAIL.to_owned()];
        }
        let p = prefix.join(".");
        let tail = format!("{p}.{TAIL}");
        return vec![p, tail];
    }
    let mut out: Vec<&str> = prefix.to_vec();
    out.extend(std::iter::repeat_n(STAR, required - 1));
    out.push(TAIL);
    vec![out.join(".")]
}

/// Whether [`filter_subjects`] matches exactly the topics `pattern` matches, so a consumer
/// needs no client-side re-check (it still does one; this only says whether it can skip).
#[must_use]
pub fn is_exact(pattern: &Pattern) -> bool {
    let mut seen_hash = false;
    for w in pattern.words() {
        if w == HASH {
            seen_hash = true;
        } else if seen_hash && w != STAR {
            return false;
        }
    }
    true
}

/// Non-overlapping NATS subjects covering every topic any of `patterns` matches: the union
/// of their [`filter_subjects`], with subjects covered by another removed and overlapping
/// pairs merged into their generalisation. Sorted, without duplicates.
#[must_use]
pub fn stream_subjects<'a>(patterns: impl IntoIterator<Item = &'a Pattern>) -> Vec<String> {
    let mut subjects: Vec<String> = patterns.into_iter().flat_map(filter_subjects).collect();
    subjects.sort();
    subjects.dedup();
    'again: loop {
        for i in 0..subjects.len() {
            for j in (i + 1)..subjects.len() {
                let (a, b) = (tokens(&subjects[i]), tokens(&subjects[j]));
                if !collide(&a, &b) {
                    continue;
                }
                let merged = if subsumes(&a, &b) {
                    subjects[i].clone()
                } else if subsumes(&b, &a) {
                    subjects[j].clone()
                } else {
                    generalize(&a, &b)
                };
                subjects.remove(j);
                subjects.remove(i);
                subjects.push(merged);
                subjects.sort();
                subjects.dedup();
                continue 'again;
            }
        }
        return subjects;
    }
}

/// Whether `topic` matches the NATS `subject` (`*` one token, `>` one or more at the end).
#[must_use]
pub fn subject_matches(subject: &str, topic: &Topic) -> bool {
    let mut topic_words = topic.words();
    for s in subject.split('.') {
        if s == TAIL {
            return topic_words.next().is_some();
        }
        match topic_words.next() {
            Some(w) if s == STAR || s == w => {}
            _ => return false,
        }
    }
    topic_words.next().is_none()
}

fn tokens(subject: &str) -> Vec<&str> {
    subject.split('.').collect()
}

/// Whether some topic matches both subjects.
fn collide(a: &[&str], b: &[&str]) -> bool {
    let mut i = 0;
    loop {
        match (a.get(i), b.get(i)) {
            (None, None) => return true,
            (Some(&TAIL), Some(_)) | (Some(_), Some(&TAIL)) => return true,
            (None, Some(_)) | (Some(_), None) => return false,
            (Some(x), Some(y)) => {
                if x != y && *x != STAR && *y != STAR {
                    return false;
                }
            }
        }
        i += 1;
    }
}

/// Whether every topic matching `b` matches `a`.
fn subsumes(a: &[&str], b: &[&str]) -> bool {
    let mut i = 0;
    loop {
        match (a.get(i), b.get(i)) {
            (None, None) | (Some(&TAIL), Some(_)) => return true,
            (Some(_), Some(&TAIL)) | (None, Some(_)) | (Some(_), None) => return false,
            (Some(&STAR), Some(_)) => {}
            (Some(x), Some(y)) => {
                if x != y {
                    return false;
                }
            }
        }
        i += 1;
    }
}

/// One subject covering both `a` and `b`: word-wise equal words kept, different ones `*`,
/// and `>` from the first tail wildcard or length difference on.
fn generalize(a: &[&str], b: &[&str]) -> String {
    let mut out: Vec<&str> = Vec::new();
    for i in 0..a.len().max(b.len()) {
        match (a.get(i), b.get(i)) {
            (None, None) => break,
            (Some(&TAIL), _) | (_, Some(&TAIL)) => {
                out.push(TAIL);
                break;
            }
            (Some(x), Some(y)) => out.push(if x == y { x } else { STAR }),
            (None, Some(_)) | (Some(_), None) => {
                // Different lengths without a tail wildcard: cover both from the last
                // common position on.
                out.pop();
                out.push(TAIL);
                break;
            }
        }
    }
    out.join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Pattern {
        Pattern::new(s).expect("valid pattern")
    }

    #[test]
    fn table_of_mappings() {
        // R-RT-1: the documented superset for each shape of pattern.
        let cases: &[(&str, &[&str], bool)] = &[
            ("a", &["a"], true),
            ("a.b.c", &["a.b.c"], true),
            ("*", &["*"], true),
            ("a.*.c", &["a.*.c"], true),
            ("#", &[">"], true),
            ("#.#", &[">"], true),
            ("a.#", &["a", "a.>"], true),
            ("a.#.#", &["a", "a.>"], true),
            ("*.#", &["*", "*.>"], true),
            ("a.*.#", &["a.*", "a.*.>"], true),
            ("a.#.b", &["a.>"], false),
            ("a.#.*", &["a.>"], true),
            ("a.#.*.*", &["a.*.>"], true),
            ("#.a", &[">"], false),
            ("#.x.y", &["*.>"], false),
            ("#.*", &[">"], true),
            ("a.#.b.#", &["a.>"], false),
            ("a.b.#.c.#.d", &["a.b.*.>"], false),
        ];
        for (pattern, subjects, exact) in cases {
            assert_eq!(filter_subjects(&p(pattern)), *subjects, "{pattern}");
            assert_eq!(is_exact(&p(pattern)), *exact, "{pattern}");
        }
    }

    #[test]
    fn nats_subject_matching() {
        let t = |s: &str| Topic::new(s).expect("valid topic");
        assert!(subject_matches("a.>", &t("a.b")));
        assert!(subject_matches("a.>", &t("a.b.c")));
        assert!(!subject_matches("a.>", &t("a")));
        assert!(subject_matches("a.*", &t("a.b")));
        assert!(!subject_matches("a.*", &t("a.b.c")));
        assert!(!subject_matches("a.*", &t("a")));
        assert!(subject_matches(">", &t("x")));
        assert!(subject_matches("a", &t("a")));
        assert!(!subject_matches("a", &t("a.b")));
    }

    #[test]
    fn stream_subjects_merge_overlaps() {
        let merged = |ps: &[&str]| {
            let ps: Vec<Pattern> = ps.iter().map(|s| p(s)).collect();
            stream_subjects(&ps)
        };
        assert_eq!(merged(&["a.#", "a.b"]), ["a", "a.>"]);
        assert_eq!(merged(&["a.*", "*.b"]), ["*.*"]);
        assert_eq!(merged(&["a.b", "c.d"]), ["a.b", "c.d"]);
        assert_eq!(merged(&["a.*.c", "a.b.#"]), ["a.*.>", "a.b"]);
        assert_eq!(merged(&["x", "#"]), [">"]);
        assert_eq!(merged(&["a.b", "a.b"]), ["a.b"]);
    }

    #[test]
    fn overlap_helpers() {
        assert!(collide(&["a", "*"], &["*", "b"]));
        assert!(!collide(&["a"], &["a", ">"]));
        assert!(collide(&["a", ">"], &["a", "b", "c"]));
        assert!(subsumes(&["a", ">"], &["a", "*", ">"]));
        assert!(!subsumes(&["a", "*"], &["a", ">"]));
        assert_eq!(generalize(&["a", "b"], &["a", "b", "c"]), "a.>");
        assert_eq!(generalize(&["a"], &["b", "c"]), ">");
    }
}
