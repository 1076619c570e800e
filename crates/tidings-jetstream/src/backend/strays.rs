//! Deliveries of a partition's consumer that went to another process while this member
//! holds the partition ("strays"), found by the consumer's delivery sequence (R-DIST-8).
//!
//! # Why
//! Only the lease holder pulls a partition's consumer, but the server cannot tell a late
//! pull from a live one: a request that the last owner sent just before it was stopped,
//! frozen or cut off reaches the server when it resumes or the network heals — after its
//! lease lapsed and this member took the partition — and takes what this member was to
//! get next. That delivery comes back only after the ack wait, and without a guard this
//! member would start the key's next messages first: seen as "B starts k4:61 before k4:60
//! succeeded" in the keyed pause test, 2 runs in 5, and reproduced by the simulation.
//!
//! # How
//! The server numbers every delivery of a consumer, to anyone, one after the other (the
//! consumer sequence of each delivery's metadata). A member that holds the partition gets
//! every delivery from the one after the count it read when it opened its cursor; a number
//! skipped went elsewhere. Those, and the last owner's unfinished deliveries counted at the
//! open, are *out*: the cursor hands nothing out while any is (it gathers, as after a
//! take), and each comes back as a redelivery of a stream sequence this cursor never
//! received, in the range where the skipped ones must lie. A late pull that leaves no later
//! delivery to show its gap is found by the server's count of deliveries
//! ([`Strays::server_count`]). The machine bounds the wait
//! ([`Machine::strayed`](super::group::machine::Machine::strayed),
//! [`Machine::may_hand_out`](super::group::machine::Machine::may_hand_out)): a delivery
//! that never comes back (acknowledged by the process that took it, say) holds the
//! partition up for about a lease and the gathering slack. A record the client library
//! drops skips a number too; the screen that terminates it ends the wait for it.
//!
//! # What it cannot see
//! A skipped delivery that was itself a redelivery (of a sequence below every first
//! delivery seen) is counted out but never recognised when it comes back: the wait ends
//! at its bound. A redelivery this cursor caused (an acknowledgement lost) is never taken
//! for one coming back: it is a sequence this cursor received.

use std::collections::BTreeSet;

/// What one partition cursor knows of the deliveries out elsewhere (see the
/// [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Strays {
    /// The delivery sequence expected next.
    next: u64,
    /// The highest stream sequence first delivered so far (here or elsewhere, as far as
    /// this cursor can tell).
    first_through: u64,
    /// Deliveries out elsewhere, not seen back.
    out: usize,
    /// Their stream sequences lie in `(above, through]`.
    above: u64,
    through: u64,
    /// Stream sequences this cursor received while some were out: a redelivery of one of
    /// them is its own (an acknowledgement lost), never one coming back.
    seen: BTreeSet<u64>,
    /// A skipped delivery sequence was seen since [`Strays::take_fresh`] last looked.
    fresh: bool,
}

impl Strays {
    /// At the cursor's open, from the server's answer: the consumer had made `delivered`
    /// deliveries, `unfinished` of them (the last owner's) not finished, of stream
    /// sequences above its acknowledgement floor `floor` and up to `through`, the last it
    /// delivered.
    pub(crate) fn at_open(delivered: u64, unfinished: usize, floor: u64, through: u64) -> Self {
        Self {
            next: delivered.saturating_add(1),
            first_through: through,
            out: unfinished,
            above: floor,
            through,
            seen: BTreeSet::new(),
            fresh: false,
        }
    }

    /// A delivery reached this cursor: delivery sequence `dseq`, stream sequence `seq`,
    /// delivered `times` in all; `held` says whether this cursor holds `seq` already.
    /// True when it revealed deliveries that went elsewhere.
    pub(crate) fn received(
        &mut self,
        dseq: u64,
        seq: u64,
        times: u64,
        held: impl FnOnce() -> bool,
    ) -> bool {
        let skipped = dseq > self.next;
        if skipped {
            // What went elsewhere came after every first delivery seen so far, unless it
            // was a redelivery (then it is below, and found by the wait's bound alone);
            // and before this one, if this is a first delivery.
            let through = if times <= 1 {
                seq.saturating_sub(1)
            } else {
                u64::MAX
            };
            self.skipped(dseq - self.next, through);
        }
        self.next = self.next.max(dseq.saturating_add(1));
        // Back: a redelivery, in the range, of a sequence this cursor never received.
        let back = self.out > 0
            && times > 1
            && self.above < seq
            && seq <= self.through
            && !self.seen.contains(&seq)
            && !held();
        if back {
            self.out -= 1;
        }
        if times <= 1 {
            self.first_through = self.first_through.max(seq);
        }
        if self.out > 0 {
            self.seen.insert(seq);
        } else {
            self.seen.clear();
        }
        skipped
    }

    /// The server counted `delivered` deliveries of the consumer so far (its info), read
    /// while no pull of this cursor was in flight: any beyond those that reached this
    /// cursor went elsewhere — a late pull that took a delivery and left no later one to
    /// show the gap. True when some did.
    pub(crate) fn server_count(&mut self, delivered: u64) -> bool {
        if delivered < self.next {
            return false;
        }
        self.skipped(delivered + 1 - self.next, u64::MAX);
        self.next = delivered + 1;
        true
    }

    /// `n` deliveries went elsewhere, of stream sequences up to `through`.
    fn skipped(&mut self, n: u64, through: u64) {
        if self.out == 0 {
            (self.above, self.through) = (self.first_through, through);
        } else {
            self.above = self.above.min(self.first_through);
            self.through = self.through.max(through);
        }
        self.out = self
            .out
            .saturating_add(usize::try_from(n).unwrap_or(usize::MAX));
        self.fresh = true;
    }

    /// Stream sequence `seq` was terminated without this cursor receiving it (a record the
    /// client library dropped, found by the screen): if it is where the skipped deliveries
    /// lie, it was one of them, and it will not come back.
    pub(crate) fn terminated(&mut self, seq: u64) {
        if self.out > 0 && self.above < seq && seq <= self.through && !self.seen.contains(&seq) {
            self.out -= 1;
            self.seen.insert(seq);
        }
    }

    /// Deliveries still out elsewhere.
    pub(crate) fn out(&self) -> usize {
        self.out
    }

    /// Whether a skipped delivery sequence was seen since the last call.
    pub(crate) fn take_fresh(&mut self) -> bool {
        std::mem::take(&mut self.fresh)
    }

    /// The wait for them ended (its bound passed): what is still out is not waited for
    /// again.
    pub(crate) fn forgive(&mut self) {
        self.out = 0;
        self.seen.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // R-DIST-8: a late pull of the last owner took delivery 12 (stream sequence 60); this
    // member's next delivery, 13 (sequence 61), reveals it, and its redelivery brings it
    // back.
    #[test]
    fn a_skipped_delivery_is_out_until_it_comes_back() {
        let mut s = Strays::at_open(10, 0, 50, 58);
        assert!(!s.received(11, 59, 1, || false), "the one expected");
        assert_eq!(s.out(), 0);
        assert!(s.received(13, 61, 1, || false), "12 went elsewhere");
        assert_eq!((s.out(), s.above, s.through), (1, 59, 60));
        assert!(s.take_fresh());
        assert!(!s.take_fresh());
        // A redelivery of what this cursor holds is not the stray.
        assert!(!s.received(14, 61, 2, || true));
        // Nor a redelivery of one it finished (its acknowledgement lost), below the range.
        assert!(!s.received(15, 40, 2, || false));
        // A first delivery is not a return.
        assert!(!s.received(16, 62, 1, || false));
        assert_eq!(s.out(), 1);
        assert!(!s.received(17, 60, 2, || false));
        assert_eq!(s.out(), 0);
    }

    // R-DIST-8: a gap revealed by a redelivery of this cursor's own (an acknowledgement
    // lost) is not its own return: the simulation's seed 242 ran key 2's #6 before #5
    // when it was.
    #[test]
    fn a_redelivery_that_reveals_a_gap_is_not_the_stray() {
        let mut s = Strays::at_open(20, 0, 0, 21);
        assert!(s.received(22, 6, 2, || false), "21 went elsewhere");
        assert_eq!(s.out(), 1);
        assert!(!s.received(23, 23, 1, || false));
        // Sequence 23 redelivered (its acknowledgement lost): seen here, not the stray.
        assert!(!s.received(24, 23, 2, || false));
        assert_eq!(s.out(), 1);
        assert!(!s.received(25, 22, 2, || false));
        assert_eq!(s.out(), 0);
    }

    // R-DIST-8: the last owner's unfinished deliveries are out from the open: each comes
    // back as a redelivery above the floor.
    #[test]
    fn the_last_owners_unfinished_are_out_from_the_open() {
        let mut s = Strays::at_open(5, 2, 2, 4);
        assert_eq!(s.out(), 2);
        assert!(!s.received(6, 3, 2, || false));
        assert!(!s.received(7, 5, 1, || false));
        assert_eq!(s.out(), 1);
        assert!(!s.received(8, 1, 3, || false), "below the floor");
        assert_eq!(s.out(), 1);
        assert!(!s.received(9, 4, 2, || false));
        assert_eq!(s.out(), 0);
        s.forgive();
        assert_eq!(s.out(), 0);
    }

    // R-DIST-8: a late pull took a delivery and this cursor received nothing after it: the
    // server's count shows it (the simulation's seed 24515 handed out key 2 #4 while #3
    // was taken a second time by the old owner's late pull).
    #[test]
    fn the_servers_count_shows_a_delivery_no_later_one_revealed() {
        let mut s = Strays::at_open(8, 1, 5, 12);
        assert!(!s.received(9, 6, 2, || false));
        assert_eq!(s.out(), 0);
        assert!(!s.server_count(9), "every delivery reached this cursor");
        assert!(s.server_count(10), "delivery 10 went elsewhere");
        assert_eq!((s.out(), s.through), (1, u64::MAX));
        assert!(s.take_fresh());
        assert!(!s.received(11, 13, 1, || false), "10 was counted already");
        // Delivery 10 was a redelivery of 8 (below every first delivery seen): not told
        // apart from this cursor's own when it comes back; the wait's bound ends it.
        assert!(!s.received(12, 8, 3, || false));
        assert_eq!(s.out(), 1);
        // A first delivery taken elsewhere (14, of sequence 14) is recognised when back.
        assert!(s.server_count(13));
        assert_eq!(s.out(), 2);
        assert!(!s.received(14, 14, 2, || false));
        assert_eq!(s.out(), 1);
    }

    // R-SEC-2, R-DIST-8: a record the client library drops skips a delivery sequence; the
    // screen terminates it, and the wait for it ends there, not at the bound.
    #[test]
    fn a_dropped_unreadable_record_is_not_waited_for() {
        let mut s = Strays::at_open(3, 0, 0, 3);
        assert!(s.received(5, 5, 1, || false), "4 dropped by the client");
        s.terminated(9);
        assert_eq!(s.out(), 1, "outside the range");
        s.terminated(4);
        assert_eq!(s.out(), 0);
    }
}
