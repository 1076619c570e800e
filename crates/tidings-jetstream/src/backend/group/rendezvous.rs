//! Which live member a key partition belongs to.

/// The live member partition `p` belongs to: the highest hash of (member, partition)
/// (FNV-1a-64 of the member, mixed with the partition), ties to the smaller name.
pub(crate) fn rendezvous(members: &[String], p: u32) -> Option<&str> {
    members
        .iter()
        .max_by(|a, b| {
            score(a, p)
                .cmp(&score(b, p))
                .then_with(|| b.as_str().cmp(a.as_str()))
        })
        .map(String::as_str)
}

fn score(member: &str, p: u32) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in member.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // SplitMix64's finalizer over (member hash, partition): every bit of both matters.
    let mut z = hash ^ u64::from(p).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every partition has one owner among the members, and a member joining takes
    /// partitions only from the others (none move between those that stay).
    #[test]
    fn rendezvous_moves_only_what_a_joining_member_takes() {
        let two: Vec<String> = vec!["a".into(), "b".into()];
        let three: Vec<String> = vec!["a".into(), "b".into(), "c".into()];
        let mut taken = 0;
        for p in 0..64 {
            let before = rendezvous(&two, p).expect("an owner");
            let after = rendezvous(&three, p).expect("an owner");
            if after == "c" {
                taken += 1;
            } else {
                assert_eq!(before, after, "partition {p} moved between staying members");
            }
        }
        assert!((10..=40).contains(&taken), "c took {taken} of 64");
        assert_eq!(rendezvous(&[], 0), None);
    }
}
