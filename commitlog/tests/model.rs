//! Model-based test: random sequences of append / read / roll (tiny segments) /
//! flush / truncate / retention / reopen, compared with a `Vec` of batches.

mod common;

use std::time::Duration;

use common::{batch, read_all};
use fjord_log::{Log, LogConfig, Offset};
use fjord_record::batch::batches;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// One append of several batches: (records, value length) each.
    Append(Vec<(usize, usize)>),
    /// Read at `at % (log end + 1)`, at most `max_bytes`, bounded by `at + bound` when set.
    Read {
        at: u32,
        max_bytes: usize,
        bound: Option<u32>,
    },
    Flush,
    Truncate {
        at: u32,
    },
    /// Size retention down to `retention.bytes = keep`.
    Retention {
        keep: u64,
    },
    Reopen {
        clean: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop::collection::vec((1usize..6, 0usize..120), 1..4).prop_map(Op::Append),
        3 => (any::<u32>(), 1usize..2000, prop::option::of(0u32..20))
            .prop_map(|(at, max_bytes, bound)| Op::Read { at, max_bytes, bound }),
        1 => Just(Op::Flush),
        1 => any::<u32>().prop_map(|at| Op::Truncate { at }),
        1 => (0u64..3000).prop_map(|keep| Op::Retention { keep }),
        1 => any::<bool>().prop_map(|clean| Op::Reopen { clean }),
    ]
}

/// The model: `(base offset, next offset, bytes)` of every batch, in order.
type Model = Vec<(Offset, Offset, Vec<u8>)>;

/// The log end: after the last batch, or the start offset when there is none.
fn model_end(m: &Model, start: Offset) -> Offset {
    m.last().map_or(start, |b| b.1)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn log_behaves_like_a_vec_of_batches(
        segment_bytes in 200u64..1500,
        index_interval_bytes in 0u32..300,
        ops in prop::collection::vec(op(), 1..40),
    ) {
        let config = LogConfig {
            segment_bytes,
            min_segment_bytes: 200,
            index_interval_bytes,
            file_delete_delay: Duration::ZERO,
            ..LogConfig::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), config).unwrap();
        let mut model: Model = Vec::new();
        let mut start: Offset = 0;
        let mut ts = 0i64;
        for op in ops {
            match op {
                Op::Append(specs) => {
                    let mut input = Vec::new();
                    let mut expected = Vec::new();
                    let mut next = model_end(&model, start);
                    for (records, value_len) in specs {
                        ts += 1;
                        let b = batch(records, value_len, ts);
                        expected.push((next, next + records as i64));
                        next += records as i64;
                        input.extend_from_slice(&b);
                    }
                    let info = log.append(&mut input, 0).unwrap();
                    prop_assert_eq!(info.base_offset, expected[0].0);
                    let mut at = 0;
                    for (base, next) in expected {
                        let h = fjord_record::BatchHeader::parse(&input[at..]).unwrap();
                        model.push((base, next, input[at..at + h.size()].to_vec()));
                        at += h.size();
                    }
                }
                Op::Read { at, max_bytes, bound } => {
                    let end = model_end(&model, start);
                    let offset = start + i64::from(at) % (end - start + 1);
                    if start > 0 {
                        let below = log.read(start - 1, max_bytes, None, true);
                        prop_assert!(matches!(below, Err(fjord_log::Error::OffsetOutOfRange { .. })), "{:?}", below);
                    }
                    let upper = bound.map(|b| offset + i64::from(b));
                    let s = log.read(offset, max_bytes, upper, true).unwrap();
                    let bytes = s.read_to_vec().unwrap();
                    let got: Vec<Vec<u8>> = batches(&bytes).map(|b| b.unwrap().1.to_vec()).collect();
                    let first = model.iter().position(|b| b.1 > offset);
                    match first {
                        None => prop_assert!(got.is_empty()),
                        Some(i) if upper.is_some_and(|u| model[i].1 > u) => prop_assert!(got.is_empty()),
                        Some(i) => {
                            // A non-empty run of whole batches from the one holding the offset.
                            prop_assert!(!got.is_empty());
                            prop_assert!(got.len() == 1 || bytes.len() <= max_bytes);
                            for (k, b) in got.iter().enumerate() {
                                prop_assert_eq!(b, &model[i + k].2);
                                prop_assert!(upper.is_none_or(|u| model[i + k].1 <= u));
                            }
                            prop_assert_eq!(s.first_offset, model[i].0);
                            prop_assert_eq!(s.next_offset, model[i + got.len() - 1].1);
                        }
                    }
                }
                Op::Flush => {
                    log.flush().unwrap();
                    prop_assert_eq!(log.recovery_point(), model_end(&model, start));
                }
                Op::Truncate { at } => {
                    // Anywhere from 0 (below the start: the log restarts there) to the end.
                    let offset = i64::from(at) % (model_end(&model, start) + 1);
                    log.truncate_to(offset).unwrap();
                    if offset < model_end(&model, start) && offset <= start {
                        model.clear();
                        start = offset;
                    } else {
                        model.retain(|b| b.1 <= offset);
                    }
                }
                Op::Retention { keep } => {
                    log.update_config(LogConfig { retention_bytes: Some(keep), ..config }).unwrap();
                    log.apply_retention(0).unwrap();
                    log.update_config(config).unwrap();
                    // Whole batches from the front went, and only while over the limit.
                    let new_start = log.log_start_offset();
                    prop_assert!(new_start >= start);
                    if new_start > start {
                        prop_assert!(model.iter().any(|b| b.0 == new_start) || new_start == model_end(&model, start));
                        let dropped: u64 = model.iter().filter(|b| b.0 < new_start).map(|b| b.2.len() as u64).sum();
                        let total: u64 = model.iter().map(|b| b.2.len() as u64).sum();
                        prop_assert!(total - dropped >= keep);
                        model.retain(|b| b.0 >= new_start);
                        start = new_start;
                    }
                }
                Op::Reopen { clean } => {
                    if clean {
                        log.close().unwrap();
                    }
                    drop(log);
                    log = Log::open(dir.path(), config).unwrap();
                }
            }
            prop_assert_eq!(log.log_end_offset(), model_end(&model, start));
            prop_assert_eq!(log.log_start_offset(), start);
        }
        let all = read_all(&log);
        prop_assert_eq!(all.len(), model.len());
        for ((o, b), (base, _, bytes)) in all.iter().zip(&model) {
            prop_assert_eq!(o, base);
            prop_assert_eq!(b, bytes);
        }
        prop_assert_eq!(log.size_bytes(), model.iter().map(|b| b.2.len() as u64).sum::<u64>());
    }
}
