//! Fixtures the unit tests of the log manager and the log dirs share.

use std::time::Duration;

use crate::LogConfig;

/// A batch of `n` records with values `value`, timestamps from 1,000 ms.
pub(crate) fn batch(n: usize) -> Vec<u8> {
    let mut b = fjord_record::BatchBuilder::new(1_000);
    for i in 0..n {
        b.append(1_000 + i as i64, None, Some(b"value"), &[]);
    }
    b.build_vec()
}

/// Tiny segments (300 bytes), so a few batches make several, deleted at once.
pub(crate) fn config() -> LogConfig {
    LogConfig { segment_bytes: 300, min_segment_bytes: 300, file_delete_delay: Duration::ZERO, ..LogConfig::default() }
}
