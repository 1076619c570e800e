//! The fencing token a keyed consumer group hands out with each delivery (R-DIST-8).

use std::fmt;

/// Which owner handed a delivery out: the key partition it belongs to and the **term** of
/// the lease under which this process holds that partition.
///
/// # Contract
/// Terms of one partition only grow: a process that takes a partition over gets a term
/// greater than every earlier owner's (the engine assigns it, not a local counter), so two
/// owners of one partition never share a term. A process whose lease lapsed, was handed
/// over, or was frozen starts nothing more under its old term; but a handler that was
/// already running may still finish. An effect store that remembers the highest term it
/// saw per partition and refuses anything lower inside the effect's own transaction (the
/// fencing token of Kleppmann's "How to do distributed locking", as `tidings-sql` does)
/// therefore never commits a stale owner's effect after the new owner's first one.
///
/// Present on deliveries of keyed consumer groups only ([`Message::fence`]); `None`
/// elsewhere, where one process owns everything it is handed.
///
/// [`Message::fence`]: crate::Message::fence
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fence {
    partition: u32,
    term: u64,
}

impl Fence {
    /// The fence of partition `partition` held under lease term `term`.
    #[must_use]
    pub const fn new(partition: u32, term: u64) -> Self {
        Self { partition, term }
    }

    /// The key partition the delivery belongs to.
    #[must_use]
    pub const fn partition(self) -> u32 {
        self.partition
    }

    /// The owner's lease term: greater for every later owner of the partition.
    #[must_use]
    pub const fn term(self) -> u64 {
        self.term
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "partition {} term {}", self.partition, self.term)
    }
}
