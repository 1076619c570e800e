//! The memoised walk: the plain walk (`walk.rs`) through this thread's lazily built DFA
//! (`topic/dfa.rs`), so a step or a whole topic seen before since the trie last changed is one
//! lookup instead of a walk over every live node.

use super::super::Topic;
use super::super::dfa::{Dfa, NO_WORD, Word};
use super::TopicTrie;
use super::entries::Lists;
use super::walk::take_buffers;

impl<V> TopicTrie<V> {
    /// What the memo stores with a live set: its nodes holding entries, and whether the next
    /// word's id matters (some node has literal children).
    fn describe(&self, set: &[u32]) -> (Box<[u32]>, bool) {
        let finals = set
            .iter()
            .copied()
            .filter(|&i| !self.nodes[i as usize].entries.is_empty())
            .collect();
        let needs_word = set.iter().any(|&i| self.nodes[i as usize].children != 0);
        (finals, needs_word)
    }

    /// The walk through this thread's memo `d` (see the type docs): known steps are one lookup;
    /// an unknown step is walked and remembered; once the memo is full the rest is walked, and
    /// while the memo is paused for thrashing (see `topic/dfa.rs`) all of it is. The
    /// live-set buffers are taken from `bufs` (filled from the per-thread ones on first need:
    /// a topic whose steps are all known needs none).
    pub(super) fn walk_memoised<'a>(
        &'a self,
        d: &mut Dfa,
        topic: &Topic,
        bufs: &mut Option<(Vec<u32>, Vec<u32>)>,
        lists: &mut Lists<'a, V>,
    ) {
        if d.bypassing() {
            let (a, b) = bufs.get_or_insert_with(take_buffers);
            self.start_set(a);
            return self.walk_from(a, b, topic.words(), lists);
        }
        if let Some(end) = d.topic(topic.as_str()) {
            d.note_answered();
            for &i in d.state(end).finals.iter() {
                lists.push(&self.nodes[i as usize].entries);
            }
            return;
        }
        let mut words = topic.words();
        let start = match d.start() {
            Some(s) => Some(s),
            None => {
                let (a, _) = bufs.get_or_insert_with(take_buffers);
                self.start_set(a);
                d.state_for(a, || self.describe(a))
            }
        };
        let Some(mut state) = start else {
            let (a, b) = bufs.get_or_insert_with(take_buffers);
            self.start_set(a);
            return self.walk_from(a, b, words, lists);
        };
        while let Some(word) = words.next() {
            if state.is_dead() {
                // Nothing can match any more.
                d.note_answered();
                d.learn_topic(topic, state);
                return;
            }
            let id = || self.words.get(word).map_or(NO_WORD, |&(w, _)| w);
            let key = if state.needs_word() {
                Word::of(word, id)
            } else {
                Word::Id(NO_WORD)
            };
            if let Some(next) = d.step(state, key) {
                state = next;
                continue;
            }
            // A step not taken before: walk it, then remember it.
            let (a, b) = bufs.get_or_insert_with(take_buffers);
            self.step_set(&d.state(state).nodes, word, None, b);
            b.sort_unstable();
            match d.state_for(b, || self.describe(b)) {
                Some(next) if d.learn(state, key, next) => state = next,
                _ => {
                    // Full (and possibly emptied): walk the rest from the set just computed.
                    std::mem::swap(a, b);
                    if a.is_empty() {
                        return;
                    }
                    return self.walk_from(a, b, words, lists);
                }
            }
        }
        // Every step was known or learnt: no state id went stale, and the topic may be
        // remembered whole.
        d.note_answered();
        d.learn_topic(topic, state);
        for &i in d.state(state).finals.iter() {
            lists.push(&self.nodes[i as usize].entries);
        }
    }
}
