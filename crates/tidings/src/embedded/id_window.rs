//! The duplicate window of one embedded stream (R-DEL-7): the ids of the messages appended
//! recently, so that appending an id again stores nothing and reports the first offset.
//!
//! # What is kept
//! One entry per id: its offset and its record's timestamp (the message's, stamped by the
//! broker's clock at publish), in a hash map, plus the ids in append order. An entry goes
//! when a newer append's timestamp is `window` past it, or when more than `max_entries`
//! are kept (the oldest first): memory is bounded by both, whichever is smaller.
//!
//! # Clock
//! The window is judged by timestamps alone — a new message's against the earlier copy's —
//! so it follows the broker's clock (a [`ManualClock`](crate::ManualClock) steps past it)
//! and needs no clock at open. A clock that went back counts as "within the window".
//!
//! # Rebuild at open
//! [`IdWindow::rebuild`] reads the log's tail: the records at or after `newest - window`
//! (found with the log's time index) and at most the last `max_entries` of them. Redrive
//! copies (not publishes) and records without a tidings metadata block (a foreign
//! producer's) are skipped. A record that cannot be read stops the rebuild with a warning:
//! the window then holds what was read before it.
//!
//! # Concurrency
//! The log appends concurrently (group commit under `Fsync::Always`), so the window is not
//! locked across an append: [`IdWindow::claim`] records the id as *being appended*, the
//! append runs, then [`IdWindow::resolve`] stores its offset (or forgets the claim when the
//! append failed). A second append of the same id meanwhile waits for that outcome.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use tidings_log::Log;

use super::codec;

/// Records read per step of the rebuild.
const REBUILD_CHUNK: usize = 1024;

/// A window length in whole milliseconds (the log's timestamps), saturating.
pub(crate) fn window_millis(window: Duration) -> u64 {
    u64::try_from(window.as_millis()).unwrap_or(u64::MAX)
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// `None` while its append runs.
    offset: Option<u64>,
    timestamp_ms: u64,
}

#[derive(Debug, Default)]
struct State {
    ids: HashMap<u128, Entry>,
    /// Ids in append order with their timestamp (an id appended again after its entry
    /// expired shows twice; only the entry with the same timestamp is its own).
    order: VecDeque<(u128, u64)>,
}

/// What [`IdWindow::claim`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// New within the window: append it, then [`IdWindow::resolve`].
    Append,
    /// Already stored at this offset: store nothing.
    Duplicate(u64),
}

/// The ids appended to one stream within its window.
#[derive(Debug)]
pub(crate) struct IdWindow {
    window_ms: u64,
    max_entries: usize,
    state: Mutex<State>,
    resolved: Condvar,
}

impl IdWindow {
    /// An empty window of `window` (non-zero), keeping at most `max_entries` (≥ 1) ids.
    pub(crate) fn new(window: Duration, max_entries: usize) -> Self {
        Self {
            window_ms: window_millis(window).max(1),
            max_entries: max_entries.max(1),
            state: Mutex::new(State::default()),
            resolved: Condvar::new(),
        }
    }

    /// How many ids it holds now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.state.lock().ids.len()
    }

    /// `u64::MAX` (a window too long for milliseconds, `Duration::MAX`) never ends.
    fn within(&self, earlier_ms: u64, now_ms: u64) -> bool {
        self.window_ms == u64::MAX || now_ms.saturating_sub(earlier_ms) < self.window_ms
    }

    /// Fill the window from the tail of `log` (see "Rebuild at open"); returns how many
    /// ids it holds.
    pub(crate) fn rebuild(&self, log: &Log) -> usize {
        let (start, end) = (log.start_offset(), log.end_offset());
        if end <= start {
            return 0;
        }
        let newest = match log.read(end - 1, 1) {
            Ok(mut r) if !r.is_empty() => r.swap_remove(0).timestamp_ms,
            Ok(_) => return 0,
            Err(e) => {
                tracing::warn!(
                    "tidings: {}: duplicate window not rebuilt: reading the last record: {e}",
                    log.dir().display()
                );
                return 0;
            }
        };
        // The time index keeps the running maximum of timestamps: every record before
        // this offset is older than the window as seen from the newest one.
        let by_age = log
            .offset_for_time(newest.saturating_sub(self.window_ms))
            .unwrap_or(start);
        let by_count = end.saturating_sub(self.max_entries as u64);
        let mut from = by_age.max(by_count).max(start);
        let mut st = self.state.lock();
        while from < end {
            let records = match log.read(from, REBUILD_CHUNK) {
                Ok(r) if !r.is_empty() => r,
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(
                        "tidings: {}: duplicate window rebuilt only up to offset {from}: {e}",
                        log.dir().display()
                    );
                    break;
                }
            };
            for r in &records {
                from = r.offset + 1;
                if let Some(id) = codec::published_id(r) {
                    self.insert(&mut st, id, Some(r.offset), r.timestamp_ms);
                }
            }
        }
        st.ids.len()
    }

    fn insert(&self, st: &mut State, id: u128, offset: Option<u64>, timestamp_ms: u64) {
        st.ids.insert(
            id,
            Entry {
                offset,
                timestamp_ms,
            },
        );
        st.order.push_back((id, timestamp_ms));
        // Forget what is past the window as of this append, and what the cap pushes out.
        while let Some(&(old, ts)) = st.order.front() {
            if st.order.len() <= self.max_entries && self.within(ts, timestamp_ms) {
                break;
            }
            st.order.pop_front();
            if st.ids.get(&old).is_some_and(|e| e.timestamp_ms == ts) {
                st.ids.remove(&old);
            }
        }
    }

    /// Before appending the message `id` stamped `timestamp_ms`: is it new within the
    /// window? A claim of [`Claim::Append`] must be followed by [`IdWindow::resolve`].
    /// Waits while another append of the same id runs.
    pub(crate) fn claim(&self, id: u128, timestamp_ms: u64) -> Claim {
        let mut st = self.state.lock();
        loop {
            match st.ids.get(&id).copied() {
                Some(e) if self.within(e.timestamp_ms, timestamp_ms) => match e.offset {
                    Some(offset) => return Claim::Duplicate(offset),
                    None => self.resolved.wait(&mut st),
                },
                _ => {
                    self.insert(&mut st, id, None, timestamp_ms);
                    return Claim::Append;
                }
            }
        }
    }

    /// The append claimed for `id` stored it at `offset` (`None`: it failed, forget it).
    pub(crate) fn resolve(&self, id: u128, timestamp_ms: u64, offset: Option<u64>) {
        let mut st = self.state.lock();
        let own = st
            .ids
            .get(&id)
            .is_some_and(|e| e.timestamp_ms == timestamp_ms && e.offset.is_none());
        if own {
            match offset {
                Some(o) => {
                    if let Some(e) = st.ids.get_mut(&id) {
                        e.offset = Some(o);
                    }
                }
                None => {
                    st.ids.remove(&id);
                }
            }
        }
        drop(st);
        self.resolved.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_again_within_the_window_is_a_duplicate_of_its_first_offset() {
        let w = IdWindow::new(Duration::from_secs(10), 100);
        assert_eq!(w.claim(7, 1_000), Claim::Append);
        w.resolve(7, 1_000, Some(3));
        assert_eq!(w.claim(7, 10_999), Claim::Duplicate(3));
        // Past the window: new again.
        assert_eq!(w.claim(7, 11_000), Claim::Append);
        w.resolve(7, 11_000, Some(9));
        assert_eq!(w.claim(7, 11_001), Claim::Duplicate(9));
    }

    #[test]
    fn a_failed_append_is_forgotten() {
        let w = IdWindow::new(Duration::from_secs(10), 100);
        assert_eq!(w.claim(1, 5), Claim::Append);
        w.resolve(1, 5, None);
        assert_eq!(w.claim(1, 6), Claim::Append);
    }

    #[test]
    fn the_entry_cap_bounds_memory_even_for_an_endless_window() {
        let w = IdWindow::new(Duration::MAX, 3);
        for id in 0..10u128 {
            assert_eq!(w.claim(id, 0), Claim::Append);
            w.resolve(id, 0, Some(id as u64));
        }
        assert_eq!(w.len(), 3);
        assert_eq!(w.claim(9, u64::MAX), Claim::Duplicate(9));
        assert_eq!(w.claim(0, 0), Claim::Append, "pushed out by the cap");
    }

    #[test]
    fn expired_entries_leave_on_the_next_append() {
        let w = IdWindow::new(Duration::from_millis(100), 1_000);
        for id in 0..50u128 {
            w.claim(id, id as u64);
            w.resolve(id, id as u64, Some(id as u64));
        }
        w.claim(999, 10_000);
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn a_clock_that_went_back_counts_as_within() {
        let w = IdWindow::new(Duration::from_secs(1), 10);
        w.claim(5, 10_000);
        w.resolve(5, 10_000, Some(0));
        assert_eq!(w.claim(5, 2_000), Claim::Duplicate(0));
    }

    #[test]
    fn a_concurrent_second_append_waits_for_the_first() {
        let w = std::sync::Arc::new(IdWindow::new(Duration::from_secs(10), 10));
        assert_eq!(w.claim(42, 0), Claim::Append);
        let second = {
            let w = w.clone();
            std::thread::spawn(move || w.claim(42, 1))
        };
        std::thread::sleep(Duration::from_millis(20));
        w.resolve(42, 0, Some(11));
        assert_eq!(second.join().expect("joins"), Claim::Duplicate(11));
    }
}
