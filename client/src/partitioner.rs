//! Which partition a record goes to.
//!
//! Keyed records: `positive(murmur2(key)) % partitions`, bit for bit the Java client's
//! default partitioner and librdkafka's `murmur2_random`, so the same key lands on the same
//! partition whichever client produced it. Records without a key stick to one randomly
//! chosen partition until its batch is closed (KIP-480's sticky partitioner), which fills
//! batches instead of spraying one record per partition.

use std::hash::{BuildHasher, Hasher};

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`), seed `0x9747b28c`.
pub fn murmur2(data: &[u8]) -> i32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if tail.len() >= 3 {
        h ^= (tail[2] as u32) << 16;
    }
    if tail.len() >= 2 {
        h ^= (tail[1] as u32) << 8;
    }
    if !tail.is_empty() {
        h ^= tail[0] as u32;
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition of a keyed record among `partitions` partitions.
pub fn partition_for_key(key: &[u8], partitions: i32) -> i32 {
    // Java's Utils.toPositive: clear the sign bit (not abs, which overflows on MIN).
    (murmur2(key) & 0x7fff_ffff) % partitions
}

/// A small random source for the sticky partitioner (quality is not a concern, speed is).
pub(crate) struct Random(u64);

impl Random {
    pub(crate) fn new() -> Self {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0);
        Self(h.finish() | 1)
    }

    /// A partition in `0..partitions`, different from `avoid` when there is a choice.
    pub(crate) fn partition(&mut self, partitions: i32, avoid: Option<i32>) -> i32 {
        // xorshift64
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let p = (self.0 % partitions as u64) as i32;
        match avoid {
            Some(a) if a == p && partitions > 1 => (p + 1) % partitions,
            _ => p,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_the_java_client() {
        // org.apache.kafka.common.utils.UtilsTest.testMurmur2
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973932308),
            (b"foobar", -790332482),
            (b"a-little-bit-long-string", -985981536),
            (b"a-little-bit-longer-string", -1486304829),
            (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
            (b"abc", 479470107),
        ];
        for (key, expected) in cases {
            assert_eq!(murmur2(key), expected, "{}", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn keyed_partitions_are_positive_and_stable() {
        // -973932308 & 0x7fffffff = 1173551340; % 6 = 0, % 7 = 5
        assert_eq!(partition_for_key(b"21", 6), 0);
        assert_eq!(partition_for_key(b"21", 7), 1173551340 % 7);
        for i in 0..1000 {
            let p = partition_for_key(format!("key-{i}").as_bytes(), 3);
            assert!((0..3).contains(&p));
        }
    }

    #[test]
    fn sticky_choice_moves_away_from_the_previous_partition() {
        let mut r = Random::new();
        for _ in 0..100 {
            assert_ne!(r.partition(2, Some(1)), 1);
            assert_eq!(r.partition(1, Some(0)), 0);
        }
        let seen: std::collections::HashSet<i32> = (0..200).map(|_| r.partition(4, None)).collect();
        assert_eq!(seen.len(), 4);
    }
}
