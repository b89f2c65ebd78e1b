use std::fs;

use fjord_record::batch::BatchHeader;
use fjord_record::{Records, BATCH_OVERHEAD};

use super::offset_map::key_hash;
use super::rewrite::rebuild;
use super::*;
use crate::LogConfig;

#[test]
fn the_offset_map_keeps_the_latest_offset_per_key_within_its_capacity() {
    let mut m = OffsetMap::new(SLOT_BYTES * 16);
    assert_eq!(m.max_entries, 12);
    for i in 0..12i64 {
        m.put(key_hash(format!("k{i}").as_bytes()), i);
    }
    assert_eq!(m.free(), 0);
    m.put(key_hash(b"k3"), 40);
    assert_eq!((m.free(), m.get(&key_hash(b"k3"))), (0, Some(40)));
    assert_eq!(m.get(&key_hash(b"absent")), None);
    m.clear();
    assert_eq!((m.free(), m.get(&key_hash(b"k3"))), (12, None));
    assert_ne!(key_hash(b"a"), key_hash(b"b"));
}

#[test]
fn tombstone_ages_follow_passes_and_survive_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    let retention = Duration::from_millis(100);
    let mut s = CleanerState::default();
    assert_eq!(s.first_cleaned_at(0), None);
    s.record_pass(10, 1_000, retention);
    s.record_pass(20, 1_050, retention);
    assert_eq!((s.first_cleaned_at(9), s.first_cleaned_at(10), s.first_cleaned_at(20)), (Some(1_000), Some(1_050), None));
    s.save(dir.path()).unwrap();
    let loaded = CleanerState::load(dir.path());
    assert_eq!((loaded.first_dirty, loaded.horizons.clone()), (20, vec![(10, 1_000), (20, 1_050)]));
    // Once a range is older than the retention it collapses into "expired below".
    s.record_pass(30, 1_120, retention);
    assert_eq!((s.expired_below, s.first_cleaned_at(5), s.first_cleaned_at(15)), (10, Some(i64::MIN), Some(1_050)));
    for i in 0..(MAX_HORIZONS as i64 + 10) {
        s.record_pass(100 + i, 1_121 + i, Duration::from_secs(3600));
    }
    assert_eq!(s.horizons.len(), MAX_HORIZONS);
    fs::write(dir.path().join(CLEANER_CHECKPOINT), "0\nnot a number\n").unwrap();
    assert_eq!(CleanerState::load(dir.path()).first_dirty, 0);
    // Written checksummed; the layout from before the checksum is still read.
    s.save(dir.path()).unwrap();
    assert!(fs::read_to_string(dir.path().join(CLEANER_CHECKPOINT)).unwrap().starts_with("1\n"));
    fs::write(dir.path().join(CLEANER_CHECKPOINT), "0\n20\n10\n1500\n1\n20 1050\n").unwrap();
    let old = CleanerState::load(dir.path());
    assert_eq!((old.first_dirty, old.expired_below, old.horizons, old.tombstones_due), (20, 10, vec![(20, 1_050)], Some(1_500)));
}

#[test]
fn cleaner_config_uses_kafka_names() {
    let mut c = CleanerConfig::default();
    c.set("log.cleaner.dedupe.buffer.size", "1048576").unwrap();
    c.set("log.cleaner.io.max.bytes.per.second", "1.7976931348623157E308").unwrap();
    assert_eq!(c.io_max_bytes_per_second, None);
    c.set("log.cleaner.io.max.bytes.per.second", "1000000").unwrap();
    c.set("log.cleaner.backoff.ms", "100").unwrap();
    assert_eq!(
        c,
        CleanerConfig { dedupe_buffer_size: 1 << 20, io_max_bytes_per_second: Some(1e6), backoff: Duration::from_millis(100) }
    );
    for (k, v) in [("log.cleaner.dedupe.buffer.size", "10"), ("log.cleaner.io.max.bytes.per.second", "0"), ("x", "1")] {
        assert!(matches!(c.set(k, v), Err(Error::InvalidConfig { .. })), "{k}={v}");
    }
}

#[test]
fn the_throttle_holds_the_rate() {
    let mut t = Throttle::new(Some(100_000.0));
    let start = Instant::now();
    for _ in 0..10 {
        t.account(2_000);
    }
    assert!(start.elapsed() >= Duration::from_millis(190), "{:?}", start.elapsed());
}

#[test]
fn a_rebuilt_batch_keeps_its_header_fields_and_gets_a_valid_crc() {
    let mut b = fjord_record::BatchBuilder::new(500).producer(9, 2, 40);
    for i in 0..5u8 {
        let value = [i; 10];
        b.append(500 + i64::from(i), Some(&[i]), if i == 3 { None } else { Some(&value) }, &[]);
    }
    let mut src = b.build_vec();
    fjord_record::batch::set_base_offset(&mut src, 1_000);
    let h = BatchHeader::parse(&src).unwrap();
    let body = &src[BATCH_OVERHEAD..];
    let ranges: Vec<(usize, usize)> = {
        let starts: Vec<usize> = Records::new(body, 0).map(|r| r.unwrap().position).collect();
        starts.iter().enumerate().map(|(i, &s)| (s, starts.get(i + 1).copied().unwrap_or(body.len()))).collect()
    };
    let mut out = Vec::new();
    rebuild(&src, &h, body, &[ranges[1], ranges[3]], &mut out).unwrap();
    let n = BatchHeader::parse(&out).unwrap();
    n.validate_records(&out).unwrap();
    assert_eq!((n.base_offset, n.last_offset(), n.record_count), (1_000, 1_004, 2));
    assert_eq!((n.producer_id, n.producer_epoch, n.base_sequence, n.max_timestamp), (9, 2, 40, h.max_timestamp));
    let kept: Vec<_> = Records::new(&out[BATCH_OVERHEAD..], 0).map(|r| r.unwrap()).collect();
    assert_eq!((kept[0].offset_delta, kept[1].offset_delta, kept[1].value), (1, 3, None));
}

#[test]
fn leftovers_of_an_uncommitted_clean_are_removed_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogConfig::default()).unwrap();
    let mut b = fjord_record::BatchBuilder::new(1);
    b.append(1, Some(b"k"), Some(b"v"), &[]);
    log.append(&mut b.build_vec(), 0).unwrap();
    log.close().unwrap();
    for name in ["00000000000000000000.log.cleaned", "00000000000000000000.index.swap", "junk.swap"] {
        fs::write(dir.path().join(name), b"partial").unwrap();
    }
    let log = Log::open(dir.path(), LogConfig::default()).unwrap();
    assert_eq!(log.log_end_offset(), 1);
    let mut names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(
        names,
        ["00000000000000000000.index", "00000000000000000000.log", "00000000000000000000.timeindex", "leader-epoch-checkpoint"]
    );
}
