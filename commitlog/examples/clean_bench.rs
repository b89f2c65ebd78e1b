//! Cleaner throughput: builds a compacted log of about `MB` megabytes in which every
//! key was written `UPDATES` times (so 1/UPDATES of the records are live), seals it,
//! and times one [`Cleaner::clean`].
//!
//! ```text
//! cargo run --release -p fjord-log --example clean_bench -- [MB=200] [UPDATES=10] [VALUE_BYTES=200] [CODEC=none|gzip|snappy|lz4|zstd] [MAP_MIB=128]
//! ```
//! The log goes to a temp dir under `FJORD_BENCH_DIR` (default: the system temp dir).
//! Prints the clean's throughput over the source bytes, its output size, and the
//! process's peak resident memory (the offset map is `log.cleaner.dedupe.buffer.size`).

use std::time::{Duration, Instant};

use fjord_log::{Cleaner, CleanerConfig, CleanupPolicy, Log, LogConfig};
use fjord_record::{BatchBuilder, Compression};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: usize| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (mb, updates, value_bytes) = (arg(0, 200), arg(1, 10).max(1), arg(2, 200));
    let codec = match args.get(3).map(String::as_str) {
        Some("gzip") => Compression::Gzip,
        Some("snappy") => Compression::Snappy,
        Some("lz4") => Compression::Lz4,
        Some("zstd") => Compression::Zstd,
        _ => Compression::None,
    };
    let base = std::env::var_os("FJORD_BENCH_DIR").map_or_else(std::env::temp_dir, Into::into);
    let dir = tempfile::tempdir_in(base).expect("temp dir");
    let config =
        LogConfig { segment_bytes: 64 << 20, cleanup_policy: CleanupPolicy::Compact, segment_ms: None, ..LogConfig::default() };
    let log = Log::open(dir.path(), config).expect("open");

    // Keys are updated round-robin in a shuffled order, so every segment holds stale values.
    let record_bytes = value_bytes + 30;
    let records = (mb << 20) / record_bytes;
    let keys = (records / updates).max(1);
    let per_batch = 100;
    let value = vec![b'v'; value_bytes];
    let started = Instant::now();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut written = 0;
    while written < records {
        let mut b = BatchBuilder::with_capacity(1_000, per_batch * record_bytes);
        for _ in 0..per_batch {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = format!("key-{:010}", x % keys as u64);
            b.append(1_000, Some(key.as_bytes()), Some(&value), &[]);
        }
        log.append(&mut b.build_compressed(codec).expect("compress").to_vec(), 0).expect("append");
        written += per_batch;
    }
    // Seal everything: a last batch in a new segment.
    let mut b = BatchBuilder::new(1_000);
    b.append(1_000, Some(b"last"), Some(b"x"), &[]);
    log.update_config(LogConfig { segment_bytes: 100, min_segment_bytes: 100, ..config }).expect("config");
    log.append(&mut b.build_vec(), 0).expect("append");
    log.set_high_watermark(log.log_end_offset());
    log.flush().expect("flush");
    let size = log.size_bytes();
    println!(
        "log: {:.1} MB, {written} records, {keys} keys ({:.0}% live), {codec:?}, built in {:.1?}",
        size as f64 / 1e6,
        100.0 * keys as f64 / written as f64,
        started.elapsed()
    );

    let cleaner_config = CleanerConfig { dedupe_buffer_size: arg(4, 128) << 20, ..CleanerConfig::default() };
    let mut cleaner = Cleaner::new(cleaner_config);
    let stats = cleaner.clean(&log, 0).expect("clean");
    let secs = stats.elapsed.max(Duration::from_micros(1)).as_secs_f64();
    println!(
        "clean: {:.1} MB read and rewritten -> {:.1} MB written (log now {:.1} MB) in {:.2?}: {:.1} MB/s, {} passes, {} of {} records kept",
        stats.bytes_before as f64 / 1e6,
        stats.bytes_after as f64 / 1e6,
        log.size_bytes() as f64 / 1e6,
        stats.elapsed,
        stats.bytes_before as f64 / 1e6 / secs,
        stats.passes,
        stats.records_kept,
        stats.records_read,
    );
    println!(
        "memory: offset map {} MiB ({} keys per pass), peak RSS {}",
        cleaner_config.dedupe_buffer_size >> 20,
        cleaner.map_capacity(),
        peak_rss().unwrap_or_else(|| "unknown".to_owned())
    );
}

/// `VmHWM` from /proc (Linux).
fn peak_rss() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find(|l| l.starts_with("VmHWM:")).map(|l| l["VmHWM:".len()..].trim().to_owned())
}
