//! One value per dispatcher slot, the first one inline.
//!
//! Most subscriptions are serial: one slot. A boxed slice of one would still be a heap
//! allocation of its own (32 bytes with the allocator's header, for a `bool`), so the
//! first value lives inline and only the others are boxed (an idle subscription's heap is
//! budgeted). The others sit behind one thin pointer, not a boxed slice's two words: a
//! single-slot subscription then pays 8 bytes for them instead of 16, and only a
//! multi-slot one takes the extra hop to reach slot 1 and beyond.

use std::ops::{Index, IndexMut};

/// A vector behind one box (one pointer, where `Vec` is three words), for what every idle subscription holds but few use:
/// one word inline (`Option<BoxedVec<T>>` is one word too) where a `Vec` is three and a
/// boxed slice two, at the price of a second allocation once it is used.
#[allow(clippy::box_collection)] // the extra allocation is the point: see above
pub(crate) type BoxedVec<T> = Box<Vec<T>>;

/// `n ≥ 1` values, indexed `0..n`; see the module docs.
#[derive(Debug)]
pub(crate) struct Slots<T> {
    first: T,
    /// Slots `1..n`; `None` when `n = 1`.
    rest: Option<BoxedVec<T>>,
}

impl<T> Slots<T> {
    /// `n` values made by `make` (at least one: `n = 0` is treated as 1).
    pub(crate) fn new(n: usize, mut make: impl FnMut() -> T) -> Self {
        Self {
            first: make(),
            rest: (n > 1).then(|| Box::new((1..n).map(|_| make()).collect())),
        }
    }

    pub(crate) fn len(&self) -> usize {
        1 + self.rest.as_ref().map_or(0, |r| r.len())
    }

    // A plain slice after the first value, not a flattened option: `has_below` and the
    // other scans run on every poll, where a flattened chain is measurably slower.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        std::iter::once(&self.first).chain(self.rest.as_deref().map_or(&[][..], Vec::as_slice))
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        let rest = self
            .rest
            .as_deref_mut()
            .map_or(&mut [][..], Vec::as_mut_slice);
        std::iter::once(&mut self.first).chain(rest)
    }

    /// Slot `i`, `None` past the end. (No driver looks a slot up by index; the tests do.)
    #[cfg(test)]
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        match i {
            0 => Some(&self.first),
            _ => self.rest.as_deref()?.get(i - 1),
        }
    }

    /// Slot `i ≥ 1`; panics past the end, like slice indexing.
    fn other(&self, i: usize) -> &T {
        &self.rest.as_deref().map_or(&[][..], Vec::as_slice)[i - 1]
    }

    fn other_mut(&mut self, i: usize) -> &mut T {
        &mut self
            .rest
            .as_deref_mut()
            .map_or(&mut [][..], Vec::as_mut_slice)[i - 1]
    }
}

impl<T> Index<usize> for Slots<T> {
    type Output = T;
    fn index(&self, i: usize) -> &T {
        match i {
            0 => &self.first,
            _ => self.other(i),
        }
    }
}

impl<T> IndexMut<usize> for Slots<T> {
    fn index_mut(&mut self, i: usize) -> &mut T {
        match i {
            0 => &mut self.first,
            _ => self.other_mut(i),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Slots;

    #[test]
    fn indexes_and_iterates_every_slot_in_order() {
        for n in [0, 1, 2, 5] {
            let mut next = 0;
            let mut s = Slots::new(n, || {
                next += 1;
                next
            });
            assert_eq!(s.len(), n.max(1));
            let all: Vec<i32> = s.iter().copied().collect();
            assert_eq!(all, (1..=n.max(1) as i32).collect::<Vec<_>>());
            for i in 0..s.len() {
                s[i] *= 10;
            }
            s.iter_mut().for_each(|v| *v += 1);
            assert_eq!(s[s.len() - 1], n.max(1) as i32 * 10 + 1);
            assert_eq!(s.get(s.len() - 1), Some(&s[s.len() - 1]));
            assert_eq!(s.get(s.len()), None);
        }
    }

    #[test]
    #[should_panic(expected = "index out of bounds")]
    fn indexing_past_the_end_panics() {
        let s = Slots::new(1, || 0u8);
        let _ = s[1];
    }

    // A single slot's value plus one thin pointer: 16 bytes for a `bool`, not 24.
    #[test]
    fn a_single_slot_is_its_value_and_one_pointer() {
        assert_eq!(std::mem::size_of::<Slots<bool>>(), 16);
    }
}
