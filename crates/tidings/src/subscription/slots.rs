//! One value per dispatcher slot, the first one inline.
//!
//! Most subscriptions are serial: one slot. A boxed slice of one would still be a heap
//! allocation of its own (32 bytes with the allocator's header, for a `bool`), so the
//! first value lives inline and only the others are boxed — an empty boxed slice does not
//! allocate (issue 12: an idle subscription's heap).

use std::ops::{Index, IndexMut};

/// `n ≥ 1` values, indexed `0..n`; see the module docs.
#[derive(Debug)]
pub(crate) struct Slots<T> {
    first: T,
    rest: Box<[T]>,
}

impl<T> Slots<T> {
    /// `n` values made by `make` (at least one: `n = 0` is treated as 1).
    pub(crate) fn new(n: usize, mut make: impl FnMut() -> T) -> Self {
        Self {
            first: make(),
            rest: (1..n).map(|_| make()).collect(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        1 + self.rest.len()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        std::iter::once(&self.first).chain(self.rest.iter())
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        std::iter::once(&mut self.first).chain(self.rest.iter_mut())
    }
}

impl<T> Index<usize> for Slots<T> {
    type Output = T;
    fn index(&self, i: usize) -> &T {
        match i {
            0 => &self.first,
            _ => &self.rest[i - 1],
        }
    }
}

impl<T> IndexMut<usize> for Slots<T> {
    fn index_mut(&mut self, i: usize) -> &mut T {
        match i {
            0 => &mut self.first,
            _ => &mut self.rest[i - 1],
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
        }
    }
}
