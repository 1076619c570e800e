//! The canonical form of a wildcard pattern: equivalent patterns become the same trie path.
//!
//! Inside a run of consecutive wildcards the `*`s come first and repeated `#`s collapse into
//! one (`#.#` → `#`, `#.*` → `*.#`, `#.*.#` → `*.#`). These rewrites never change which topics
//! match; they make equivalent patterns one key, and they let the walk rely on a `#` node never
//! having a `#` child (see `walk.rs`).

use super::super::{HASH, MAX_WORDS, Pattern, STAR};

/// One step of a canonical pattern.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Seg<'a> {
    Word(&'a str),
    Star,
    Hash,
}

/// Canonical segments of `pattern` (see the module docs): within each run of wildcards, `k` stars
/// then at most one hash. Returns the fixed array and its used length.
pub(super) fn canonical(pattern: &Pattern) -> ([Seg<'_>; MAX_WORDS], usize) {
    let mut out = [Seg::Star; MAX_WORDS];
    let mut n = 0;
    let mut stars = 0;
    let mut hash = false;
    let mut push = |seg, n: &mut usize| {
        // Validation caps patterns at MAX_WORDS words and canonicalisation never lengthens.
        if let Some(slot) = out.get_mut(*n) {
            *slot = seg;
            *n += 1;
        }
    };
    for w in pattern.words() {
        if w == STAR {
            stars += 1;
        } else if w == HASH {
            hash = true;
        } else {
            for _ in 0..stars {
                push(Seg::Star, &mut n);
            }
            if hash {
                push(Seg::Hash, &mut n);
            }
            stars = 0;
            hash = false;
            push(Seg::Word(w), &mut n);
        }
    }
    for _ in 0..stars {
        push(Seg::Star, &mut n);
    }
    if hash {
        push(Seg::Hash, &mut n);
    }
    (out, n)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The canonical form of `pattern` as pattern text.
    pub(in super::super) fn text(pattern: &str) -> String {
        let pat = Pattern::new(pattern).unwrap();
        let (segs, n) = canonical(&pat);
        segs[..n]
            .iter()
            .map(|s| match s {
                Seg::Word(w) => (*w).to_owned(),
                Seg::Star => STAR.into(),
                Seg::Hash => HASH.into(),
            })
            .collect::<Vec<_>>()
            .join(".")
    }

    #[test]
    fn canonical_form() {
        assert_eq!(text("#.#"), "#");
        assert_eq!(text("#.*.#"), "*.#");
        assert_eq!(text("#.*"), "*.#");
        assert_eq!(text("a.#.#.b"), "a.#.b");
        assert_eq!(text("*.*"), "*.*");
        assert_eq!(text("#.a.#"), "#.a.#");
        assert_eq!(text("a.#.*.#.*.b.#"), "a.*.*.#.b.#");
    }
}
