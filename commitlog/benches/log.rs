//! Log benchmarks: `cargo bench -p fjord-log`.
//!
//! First a summary measured with plain timed loops, all in one run so the numbers
//! compare: this machine's sequential page-cache write rate paired round by round
//! with the same volume of appends (std::fs, 1 MiB writes like `dd bs=1M`, and
//! writes of the batch's size with blocks reserved ahead as the log reserves them:
//! the kernel's cost for the log's write pattern, without the log), append throughput of 200-byte records in batches of 1, 50,
//! 1,000 records and ~1 MiB, sequential read throughput, and random `read(offset)`
//! lookup latency p50/p99 on a 1 GiB log (in page cache, 128 MiB segments so most
//! lookups go through sealed segments' index files). The append and write rates are
//! given twice: by wall time, and by this thread's CPU time (user + system, from
//! the thread CPU-time clock), which on a shared, busy machine is much steadier
//! because it leaves out the time spent waiting for a core. Then the same operations as
//! short criterion benchmarks, and the commit of a one-record transaction on a partition
//! that knows no other producer and one that knows 10,000. `FJORD_BENCH_DIR=/some/dir` measures another file
//! system (e.g. a tmpfs, to see the software overhead without disk writeback).

use std::fs::File;
use std::hint::black_box;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use fjord_log::{Log, LogConfig, Offset};
use fjord_record::BatchBuilder;

const VALUE: usize = 200;
const GIB: u64 = 1 << 30;
const MIB: f64 = (1 << 20) as f64;
const SEGMENT_BYTES: u64 = 128 << 20;

/// A batch of `records` 200-byte records; `records == 0` means "as many as fit in 1 MiB".
fn build_batch(records: usize) -> (Vec<u8>, usize) {
    let value = [b'x'; VALUE];
    let mut b = BatchBuilder::with_capacity(1_700_000_000_000, records.max(1) * (VALUE + 16));
    let mut n = 0;
    loop {
        if records > 0 && n == records {
            break;
        }
        if records == 0 && b.size() + VALUE + 32 > (1 << 20) {
            break;
        }
        b.append(1_700_000_000_000 + n as i64, None, Some(&value), &[]);
        n += 1;
    }
    (b.build_vec(), n)
}

/// A batch of one 200-byte record from producer `pid` at sequence `seq`.
fn producer_batch(pid: i64, seq: i32, transactional: bool) -> Vec<u8> {
    let mut b = BatchBuilder::new(1_700_000_000_000).producer(pid, 0, seq);
    if transactional {
        b = b.transactional();
    }
    b.append(1_700_000_000_000, None, Some(&[b'x'; VALUE]), &[]);
    b.build_vec()
}

fn bench_config() -> LogConfig {
    LogConfig {
        segment_bytes: SEGMENT_BYTES,
        retention_ms: None,
        file_delete_delay: Duration::ZERO,
        max_message_bytes: 2 << 20,
        ..LogConfig::default()
    }
}

/// Nanoseconds this thread has run on a CPU, to the nanosecond: the thread CPU-time
/// clock accounts the running slice too, where `/proc/thread-self/schedstat` is only
/// brought up to date at scheduler ticks (4 ms at HZ=250, a third of a 64 MiB
/// measurement here). 0 where the clock is missing, which shows as an infinite
/// CPU-time rate rather than a wrong one.
fn thread_cpu_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(0, |t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
}

/// Wall and CPU seconds spent on a measured piece of work.
#[derive(Default, Clone, Copy)]
struct Cost {
    wall: f64,
    cpu: f64,
}

impl Cost {
    fn since(start: Instant, cpu_start: u64) -> Cost {
        Cost { wall: start.elapsed().as_secs_f64(), cpu: (thread_cpu_ns() - cpu_start) as f64 / 1e9 }
    }

    fn add(&mut self, other: Cost) {
        self.wall += other.wall;
        self.cpu += other.cpu;
    }
}

/// Time to write `total` bytes in writes of `chunk`, no fsync, to 128 MiB files
/// of which at most 512 MiB are kept: the same file pattern as the log's appends
/// (128 MiB segments, retention 512 MiB), so both meet the same page-cache and
/// writeback conditions. With `reserve`, blocks are reserved 4 MiB ahead of the
/// writes and the rest given back at the end, as the log does (`preallocate`); `dd`
/// does not. Returns the cost and the bytes written (`total` rounded up to whole writes).
fn page_cache_write(dir: &Path, total: u64, chunk: &[u8], reserve: bool) -> (Cost, u64) {
    use nix::fcntl::{fallocate, FallocateFlags};
    use std::os::fd::AsRawFd;
    const AHEAD: u64 = 4 << 20;
    let mut files = std::collections::VecDeque::new();
    let mut written = 0u64;
    let (start, cpu_start) = (Instant::now(), thread_cpu_ns());
    while written < total {
        let path = dir.join(format!("dd-{}.tmp", files.len() + written as usize));
        let mut f = File::create(&path).unwrap();
        let (mut in_file, mut reserved) = (0u64, 0u64);
        while in_file < SEGMENT_BYTES && written < total {
            if reserve && in_file + chunk.len() as u64 > reserved {
                fallocate(f.as_raw_fd(), FallocateFlags::FALLOC_FL_KEEP_SIZE, reserved as i64, AHEAD as i64).unwrap();
                reserved += AHEAD;
            }
            f.write_all(chunk).unwrap();
            in_file += chunk.len() as u64;
            written += chunk.len() as u64;
        }
        if reserve {
            f.set_len(in_file).unwrap();
        }
        files.push_back(path);
        if files.len() > 4 {
            std::fs::remove_file(files.pop_front().unwrap()).unwrap();
        }
    }
    let cost = Cost::since(start, cpu_start);
    for f in files {
        std::fs::remove_file(f).unwrap();
    }
    (cost, written)
}

/// `dd bs=1M`'s buffer: 1 MiB, page-aligned, and written to before use (dd reads into
/// it), where a fresh `vec![0; n]` is untouched pages that all map the one zero page.
/// The alignment matters: the kernel's copy into the page cache slows down when source
/// and file position sit differently within a cache line (measured on an AMD EPYC
/// Zen 4: 17% slower with the source 16 bytes off, 2x with the file position 8 off).
/// Holds `batch` repeated, so both sides write the same kind of bytes.
fn dd_buffer(batch: &[u8]) -> (Vec<u8>, usize) {
    const PAGE: usize = 4096;
    let mut buf: Vec<u8> = batch.iter().copied().cycle().take((1 << 20) + PAGE).collect();
    let start = (PAGE - buf.as_ptr() as usize % PAGE) % PAGE;
    buf.truncate(start + (1 << 20));
    (buf, start)
}

/// Writes back other dirty pages first (`sync`), so that a measurement does not
/// pay for the writeback of earlier ones or of other processes on this machine.
fn settle() {
    let _ = std::process::Command::new("sync").status();
}

/// Appends `batch` until `total` bytes went in; keeps at most ~512 MiB on disk.
/// Returns the cost, bytes and records appended.
fn append(dir: &Path, batch: &[u8], records: usize, total: u64) -> (Cost, u64, u64) {
    let config = LogConfig { retention_bytes: Some(512 << 20), ..bench_config() };
    let log = Log::open(dir.join("append-0"), config).unwrap();
    log.append(&mut batch.to_vec(), 0).unwrap(); // the first append writes the epoch checkpoint
    let mut buf = batch.to_vec();
    let mut written = 0u64;
    let mut appends = 0u64;
    let (start, cpu_start) = (Instant::now(), thread_cpu_ns());
    while written < total {
        log.append(&mut buf, 0).unwrap();
        written += buf.len() as u64;
        appends += 1;
        if appends.is_multiple_of(4096) {
            log.apply_retention(0).unwrap();
        }
    }
    let cost = Cost::since(start, cpu_start);
    log.delete().unwrap();
    (cost, written, appends * records as u64)
}

/// A log of about `total` bytes in batches of 50 records; returns it and its end offset.
fn build_log(dir: &Path, total: u64) -> (Log, Offset) {
    let log = Log::open(dir.join("read-0"), bench_config()).unwrap();
    let (mut batch, _) = build_batch(50);
    while log.size_bytes() < total {
        log.append(&mut batch, 0).unwrap();
    }
    let end = log.log_end_offset();
    (log, end)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// A small xorshift generator: reproducible random offsets without a dependency.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn summary(dir: &Path) {
    println!("== fjord-log summary (one run; 200-byte records) ==");
    // Paired measurements: each round writes the same volume three ways, back to
    // back, after a `sync`: 1 MiB writes from a page-aligned buffer (dd bs=1M), writes
    // of the batch's size from a copy of the batch into reserved blocks (the kernel's
    // cost for the log's write pattern: per write, and per alignment of the file
    // positions), and log appends. Times add up over the rounds, so all three see the
    // same (shared, noisy) machine.
    const ROUNDS: u32 = 8;
    for (label, records) in
        [("1-record batches", 1), ("50-record batches", 50), ("1000-record batches", 1000), ("1 MiB batches", 0)]
    {
        let (batch, n) = build_batch(records);
        let total: u64 = if records == 1 { 8 << 20 } else { 64 << 20 };
        let (mut page_cache, mut same_size, mut appends) = (Cost::default(), Cost::default(), Cost::default());
        let (mut page_cache_bytes, mut same_size_bytes, mut bytes, mut msgs) = (0u64, 0u64, 0u64, 0u64);
        let (dd, dd_start) = dd_buffer(&batch);
        // The same-size writes copy from the batch itself, allocated as the log's is.
        let same = batch.to_vec();
        for round in 0..ROUNDS {
            settle();
            // A different one goes first in each round: whatever the first after a
            // `sync` meets (e.g. writeback still going) falls on each alike.
            for step in 0..3 {
                match (step + round) % 3 {
                    0 => {
                        let (cost, b) = page_cache_write(dir, total, &dd[dd_start..], false);
                        page_cache.add(cost);
                        page_cache_bytes += b;
                    }
                    1 => {
                        let (cost, b) = page_cache_write(dir, total, &same, bench_config().preallocate);
                        same_size.add(cost);
                        same_size_bytes += b;
                    }
                    _ => {
                        let (cost, b, m) = append(dir, &batch, n, total);
                        appends.add(cost);
                        bytes += b;
                        msgs += m;
                    }
                }
            }
        }
        let rate = |c: Cost, bytes: u64| (bytes as f64 / c.wall, bytes as f64 / c.cpu);
        let ((page_cache, page_cache_cpu), (same_size, same_size_cpu)) =
            (rate(page_cache, page_cache_bytes), rate(same_size, same_size_bytes));
        let (append_rate, append_cpu) = (bytes as f64 / appends.wall, bytes as f64 / appends.cpu);
        println!(
            "append {label:<20} ({:>7} B/batch, {:>4} MiB): {:>6.0} MB/s {:>9.0} msg/s | page cache 1 MiB writes {:>6.0} MB/s -> {:>5.1}% | same-size writes {:>6.0} MB/s -> {:>5.1}%",
            batch.len(),
            (total * u64::from(ROUNDS)) >> 20,
            append_rate / MIB,
            msgs as f64 / appends.wall,
            page_cache / MIB,
            100.0 * append_rate / page_cache,
            same_size / MIB,
            100.0 * append_rate / same_size,
        );
        println!(
            "  by CPU time {:<12} ({:>4.0}% of wall): {:>6.0} MB/s               | page cache 1 MiB writes {:>6.0} MB/s -> {:>5.1}% | same-size writes {:>6.0} MB/s -> {:>5.1}%",
            "",
            100.0 * appends.cpu / appends.wall,
            append_cpu / MIB,
            page_cache_cpu / MIB,
            100.0 * append_cpu / page_cache_cpu,
            same_size_cpu / MIB,
            100.0 * append_cpu / same_size_cpu,
        );
    }
    let (log, end) = build_log(dir, GIB);
    println!("read log: {} MiB, {} records, {} segments", log.size_bytes() >> 20, end, log.segment_count());
    let start = Instant::now();
    let mut at = 0;
    let mut bytes = 0u64;
    while at < end {
        let s = log.read(at, 1 << 20, None, true).unwrap();
        bytes += s.read_to_vec().unwrap().len() as u64;
        at = s.next_offset;
    }
    println!("sequential read (1 MiB reads, copied): {:>8.0} MB/s", bytes as f64 / start.elapsed().as_secs_f64() / MIB);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut samples = Vec::with_capacity(200_000);
    for _ in 0..200_000 {
        let offset = rng.below(end as u64) as Offset;
        let t = Instant::now();
        let s = log.read(offset, 1, None, true).unwrap();
        samples.push(t.elapsed());
        assert!(s.first_offset <= offset && offset < s.next_offset);
    }
    samples.sort_unstable();
    println!(
        "random read(offset) lookup on the 1 GiB log: p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs",
        percentile(&samples, 0.50).as_secs_f64() * 1e6,
        percentile(&samples, 0.99).as_secs_f64() * 1e6,
        percentile(&samples, 0.999).as_secs_f64() * 1e6
    );
    log.delete().unwrap();
}

fn criterion_benches(c: &mut Criterion, dir: &Path) {
    let mut group = c.benchmark_group("append");
    for (label, records) in [("1", 1), ("50", 50), ("1000", 1000), ("1MiB", 0)] {
        let (batch, _) = build_batch(records);
        let config = LogConfig { retention_bytes: Some(512 << 20), ..bench_config() };
        let log = Log::open(dir.join(format!("criterion-{label}-0")), config).unwrap();
        let mut buf = batch.clone();
        let mut n = 0u64;
        group.throughput(Throughput::Bytes(batch.len() as u64));
        group.bench_function(label, |b| {
            b.iter(|| {
                log.append(&mut buf, 0).unwrap();
                n += 1;
                if n.is_multiple_of(4096) {
                    log.apply_retention(0).unwrap();
                }
            })
        });
        log.delete().unwrap();
    }
    group.finish();

    // A one-record transaction committed (its batch, then the marker) on a partition
    // that knows `known` other producers: the marker's cost must not grow with them.
    let mut group = c.benchmark_group("transaction");
    for known in [0, 10_000] {
        let log = Log::open(dir.join(format!("criterion-txn-{known}")), bench_config()).unwrap();
        for pid in 0..known {
            log.append(&mut producer_batch(pid, 0, false), 0).unwrap();
        }
        let (pid, mut seq) = (known + 1, 0);
        group.throughput(Throughput::Elements(1));
        group.bench_function(format!("commit, {known} producers known"), |b| {
            b.iter(|| {
                log.append(&mut producer_batch(pid, seq, true), 0).unwrap();
                log.append_marker(pid, 0, 0, true, 0).unwrap();
                seq += 1;
            })
        });
        log.delete().unwrap();
    }
    group.finish();

    let (log, end) = build_log(dir, GIB / 4);
    let mut group = c.benchmark_group("read");
    let mut at = 0;
    group.throughput(Throughput::Bytes(1 << 20));
    group.bench_function("sequential 1MiB", |b| {
        b.iter(|| {
            if at >= end {
                at = 0;
            }
            let s = log.read(at, 1 << 20, None, true).unwrap();
            black_box(s.read_to_vec().unwrap());
            at = s.next_offset;
        })
    });
    let mut rng = Rng(42);
    group.throughput(Throughput::Elements(1));
    group.bench_function("random lookup", |b| {
        b.iter(|| black_box(log.read(rng.below(end as u64) as Offset, 1, None, true).unwrap()))
    });
    group.finish();
    log.delete().unwrap();
}

fn main() {
    // FJORD_BENCH_DIR picks the file system to measure (default: the temp dir).
    let dir = match std::env::var_os("FJORD_BENCH_DIR") {
        Some(d) => tempfile::tempdir_in(d).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    summary(dir.path());
    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(10);
    criterion_benches(&mut c, dir.path());
    c.final_summary();
}
