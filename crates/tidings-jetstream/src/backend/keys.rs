//! Where a keyed record goes: its key's partition.

/// The key partition of `key` among `partitions`: FNV-1a, 64 bits, modulo the count. Fixed
/// forever: records already stored were placed by it.
///
/// **Waits:** never.
#[must_use]
pub fn key_partition(key: &[u8], partitions: u32) -> u32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // The remainder is below `partitions`, a u32.
    u32::try_from(hash % u64::from(partitions.max(1))).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hash places stored records: it must never change. FNV-1a-64 test vectors (the
    /// empty key, "a", "foobar") and where they land among 16 partitions.
    #[test]
    fn the_key_hash_is_fnv1a_64() {
        assert_eq!(
            key_partition(b"", u32::MAX),
            (0xcbf2_9ce4_8422_2325u64 % u64::from(u32::MAX)) as u32
        );
        assert_eq!(
            key_partition(b"a", u32::MAX),
            (0xaf63_dc4c_8601_ec8cu64 % u64::from(u32::MAX)) as u32
        );
        assert_eq!(
            key_partition(b"foobar", u32::MAX),
            (0x8594_4171_f739_67e8u64 % u64::from(u32::MAX)) as u32
        );
        assert_eq!(key_partition(b"a", 16), 0xc);
        assert_eq!(key_partition(b"foobar", 16), 8);
        assert_eq!(key_partition(b"anything", 1), 0);
    }
}
