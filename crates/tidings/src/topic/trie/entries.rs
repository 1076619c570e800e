//! Entry lists: the `(id, value)` pairs stored under one pattern, kept sorted by id, and how
//! the lists of every matching pattern are reported as one ascending sequence of ids.

use smallvec::SmallVec;

/// The entries stored under one pattern, sorted by id. The first is kept inline (in the trie
/// node, or in the literal table's slot): most patterns have one subscriber, and its entry is
/// then read from the cache line the match just looked up instead of from a separate heap
/// block, a cache miss saved per matching pattern when topics are cold. More spill to the heap.
pub(super) type Entries<V> = SmallVec<[(u64, V); 1]>;

/// The entry lists a match collects (literal first, then the trie's in node order). Eight
/// inline slots cover almost every topic; more spill to the heap.
pub(super) type Lists<'a, V> = SmallVec<[&'a [(u64, V)]; 8]>;

/// Inserts into a list sorted by id; returns the value replaced.
pub(super) fn sorted_insert<V>(list: &mut Entries<V>, id: u64, value: V) -> Option<V> {
    match list.binary_search_by_key(&id, |e| e.0) {
        Ok(i) => Some(std::mem::replace(&mut list[i].1, value)),
        Err(i) => {
            list.insert(i, (id, value));
            None
        }
    }
}

/// Removes `id` from a list sorted by id; returns its value.
pub(super) fn sorted_remove<V>(list: &mut Entries<V>, id: u64) -> Option<V> {
    let i = list.binary_search_by_key(&id, |e| e.0).ok()?;
    Some(list.remove(i).1)
}

/// Calls `f(id, value)` once per id found in `lists`, in ascending id order; an id in several
/// lists is reported with the value of the first list holding it.
pub(super) fn report<V>(lists: &mut [&[(u64, V)]], mut f: impl FnMut(u64, &V)) {
    match lists {
        [] => {}
        // The common case: one list, no merge.
        [one] => one.iter().for_each(|(id, v)| f(*id, v)),
        many if many.len() <= 16 => merge(many, f),
        many => {
            let mut all: Vec<(u64, &V)> = many
                .iter()
                .flat_map(|l| l.iter().map(|(id, v)| (*id, v)))
                .collect();
            // Stable: on equal ids the earlier list (literal first) wins, as in `merge`.
            all.sort_by_key(|e| e.0);
            all.dedup_by_key(|e| e.0);
            all.into_iter().for_each(|(id, v)| f(id, v));
        }
    }
}

/// k-way merge of id-sorted lists, reporting each id once (from the first list holding it).
fn merge<V>(lists: &mut [&[(u64, V)]], mut f: impl FnMut(u64, &V)) {
    loop {
        let mut best: Option<(usize, u64)> = None;
        for (i, l) in lists.iter().enumerate() {
            if let Some((id, _)) = l.first()
                && best.is_none_or(|(_, b)| *id < b)
            {
                best = Some((i, *id));
            }
        }
        let Some((i, id)) = best else { return };
        f(id, &lists[i][0].1);
        for l in lists.iter_mut() {
            if l.first().is_some_and(|e| e.0 == id) {
                *l = &l[1..];
            }
        }
    }
}
