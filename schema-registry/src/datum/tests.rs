//! Bounded decoding: hostile lengths, sizes, counts and depths are refused before apache-avro
//! allocates for them; good data decodes exactly as apache-avro decodes it.

use std::time::Duration;

use apache_avro::types::Value;
use apache_avro::writer::datum::GenericDatumWriter;
use proptest::prelude::*;

use super::*;

/// Schemas are parsed by apache-avro directly, without the registry's limits: these are the
/// schemas a decoder may meet when a registry (an older one, another one) accepted them.
fn parse(s: &str) -> Schema {
    Schema::parse_str(s).unwrap_or_else(|e| panic!("test schema does not parse: {e}\n{s}"))
}

fn bad(schema: &Schema, datum: &[u8]) -> String {
    match decode(schema, None, datum, 1, &DatumLimits::default()) {
        Err(Error::BadDatum { reason, .. }) => reason,
        other => panic!("expected BadDatum for {datum:?}, got {other:?}"),
    }
}

/// Zig-zag varint of `n`.
fn long(n: i64) -> Vec<u8> {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    let mut out = Vec::new();
    loop {
        let b = (z & 0x7f) as u8;
        z >>= 7;
        if z == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

const RICH: &str = r#"{"type":"record","name":"R","namespace":"t","fields":[
    {"name":"s","type":"string"},
    {"name":"b","type":"bytes"},
    {"name":"f","type":{"type":"fixed","name":"F","size":4}},
    {"name":"e","type":{"type":"enum","name":"E","symbols":["A","B"]}},
    {"name":"a","type":{"type":"array","items":"long"}},
    {"name":"m","type":{"type":"map","values":["null","double"]}},
    {"name":"u","type":["null","string","F"]},
    {"name":"next","type":["null","R"],"default":null},
    {"name":"d","type":{"type":"int","logicalType":"date"}},
    {"name":"ok","type":"boolean"},
    {"name":"x","type":"float"}
]}"#;

fn rich_value(next: Option<Value>) -> Value {
    Value::Record(vec![
        ("s".into(), Value::String("héllo".into())),
        ("b".into(), Value::Bytes(vec![0, 1, 2])),
        ("f".into(), Value::Fixed(4, vec![9, 9, 9, 9])),
        ("e".into(), Value::Enum(1, "B".into())),
        ("a".into(), Value::Array(vec![Value::Long(-1), Value::Long(1 << 40)])),
        ("m".into(), Value::Map([("k".to_string(), Value::Union(1, Box::new(Value::Double(0.5))))].into_iter().collect())),
        ("u".into(), Value::Union(2, Box::new(Value::Fixed(4, vec![1, 2, 3, 4])))),
        (
            "next".into(),
            match next {
                None => Value::Union(0, Box::new(Value::Null)),
                Some(v) => Value::Union(1, Box::new(v)),
            },
        ),
        ("d".into(), Value::Date(19_000)),
        ("ok".into(), Value::Boolean(true)),
        ("x".into(), Value::Float(1.5)),
    ])
}

fn rich_datum() -> (Schema, Vec<u8>) {
    let schema = parse(RICH);
    let value = rich_value(Some(rich_value(None)));
    let bytes = GenericDatumWriter::builder(&schema).build().unwrap().write_value_to_vec(value).unwrap();
    (schema, bytes)
}

/// Zero-byte items and recursion: what lengths cannot bound.
fn nulls_datum() -> (Schema, Vec<u8>) {
    let schema = parse(
        r#"{"type":"record","name":"N","fields":[{"name":"nulls","type":{"type":"array","items":"null"}},{"name":"l","type":["null","N"]}]}"#,
    );
    let inner = Value::Record(vec![("nulls".into(), Value::Array(vec![])), ("l".into(), Value::Union(0, Box::new(Value::Null)))]);
    let value =
        Value::Record(vec![("nulls".into(), Value::Array(vec![Value::Null; 3])), ("l".into(), Value::Union(1, Box::new(inner)))]);
    let bytes = GenericDatumWriter::builder(&schema).build().unwrap().write_value_to_vec(value).unwrap();
    (schema, bytes)
}

#[test]
fn good_data_decodes_as_apache_avro_decodes_it() {
    let (schema, bytes) = rich_datum();
    assert_eq!(validate(&schema, &bytes, &DatumLimits::default()).unwrap(), bytes.len());
    let ours = decode(&schema, None, &bytes, 1, &DatumLimits::default()).unwrap();
    let theirs = GenericDatumReader::builder(&schema).build().unwrap().read_value(&mut &bytes[..]).unwrap();
    assert_eq!(ours, theirs);
    // Every proper prefix is cut short, and a byte more is trailing.
    for cut in 0..bytes.len() {
        assert!(matches!(decode(&schema, None, &bytes[..cut], 1, &DatumLimits::default()), Err(Error::BadDatum { .. })), "{cut}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(matches!(
        decode(&schema, None, &longer, 7, &DatumLimits::default()),
        Err(Error::TrailingBytes { schema_id: 7, len: 1 })
    ));
}

/// Issue #26 case 7: the loader aborted on a 13-byte record (5 bytes of framing, 8 of datum)
/// whose schema has a `fixed` of 2^62: apache-avro allocates the size before reading.
#[test]
fn a_fixed_of_two_to_the_62_is_refused_without_allocating() {
    let schema = parse(
        r#"{"type":"record","name":"Boom","fields":[{"name":"f","type":{"type":"fixed","name":"Huge","size":4611686018427387904}}]}"#,
    );
    let reason = bad(&schema, &[0; 8]);
    assert!(reason.contains("fixed Huge of 4611686018427387904 bytes, but only 8 bytes are left"), "{reason}");
    // The same for the logical types on fixed.
    let decimal = parse(r#"{"type":"fixed","name":"D","size":4611686018427387904,"logicalType":"decimal","precision":4}"#);
    let reason = bad(&decimal, &[0; 8]);
    assert!(reason.contains("4611686018427387904"), "{reason}");
}

#[test]
fn lengths_and_counts_are_checked_against_the_bytes_left() {
    let string = parse(r#""string""#);
    assert!(bad(&string, &long(1 << 40)).contains("string of 1099511627776 bytes, but only 0 bytes are left"));
    assert!(bad(&string, &long(-3)).contains("negative string length"));
    let bytes = parse(r#""bytes""#);
    assert!(bad(&bytes, &[long(5), vec![1, 2]].concat()).contains("bytes of 5 bytes, but only 2"));
    // 2^40 longs cannot fit in 0 bytes: refused at the count, before any item.
    let longs = parse(r#"{"type":"array","items":"long"}"#);
    assert!(bad(&longs, &long(1 << 40)).contains("items of at least 1 bytes"));
    // A negative count carries the block's size, which must fit too.
    assert!(bad(&longs, &[long(-2), long(1 << 30)].concat()).contains("a block of 1073741824 bytes"));
    let doubles = parse(r#"{"type":"map","values":"double"}"#);
    assert!(bad(&doubles, &[long(1000), vec![0; 100]].concat()).contains("items of at least 9 bytes"));
    // Nulls take no bytes: their count is bounded by the value limit instead.
    let nulls = parse(r#"{"type":"array","items":"null"}"#);
    assert!(bad(&nulls, &[long(1 << 62), vec![0]].concat()).contains("max_values"));
    assert!(bad(&nulls, &[long(600_000), long(600_000), vec![0]].concat()).contains("max_values"));
    let small = [long(1000), vec![0]].concat();
    assert_eq!(decode(&nulls, None, &small, 1, &DatumLimits::default()).unwrap(), Value::Array(vec![Value::Null; 1000]));
}

#[test]
fn union_branches_and_enum_numbers_out_of_range_are_errors() {
    let union = parse(r#"["null","int"]"#);
    assert!(bad(&union, &long(2)).contains("union branch 2 of a union of 2"));
    assert!(bad(&union, &long(-1)).contains("union branch -1"));
    assert!(bad(&parse(r#""int""#), &long(1 << 40)).contains("does not fit an int"));
    assert!(bad(&parse(r#""long""#), &[0xff; 11]).contains("longer than 10 bytes"));
    // An enum number out of range passes the walk and is apache-avro's error.
    let e = parse(r#"{"type":"enum","name":"E","symbols":["A"]}"#);
    assert!(matches!(decode(&e, None, &long(5), 1, &DatumLimits::default()), Err(Error::Avro(_))));
}

/// A recursive type decodes by recursion as deep as the data goes: 100,000 links of a linked
/// list take 200,000 bytes and would take the decoder's stack with them.
#[test]
fn recursion_in_the_data_is_bounded() {
    let list = parse(r#"{"type":"record","name":"L","fields":[{"name":"next","type":["null","L"]}]}"#);
    let deep: Vec<u8> = std::iter::repeat_n(long(1), 100_000).flatten().chain(long(0)).collect();
    assert!(bad(&list, &deep).contains("nested deeper than 32 levels"));
    // Two levels per link (the record and the union): 15 links and the last one fit in 32.
    let links = |n: usize| -> Vec<u8> { std::iter::repeat_n(long(1), n).flatten().chain(long(0)).collect() };
    decode(&list, None, &links(15), 1, &DatumLimits::default()).unwrap();
    assert!(bad(&list, &links(16)).contains("nested deeper than 32 levels"));
}

#[test]
fn a_reader_schema_resolves_after_the_walk() {
    let writer = parse(r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}"#);
    let reader =
        parse(r#"{"type":"record","name":"R","fields":[{"name":"a","type":"long"},{"name":"b","type":"string","default":"x"}]}"#);
    let v = decode(&writer, Some(&reader), &long(21), 1, &DatumLimits::default()).unwrap();
    assert_eq!(v, Value::Record(vec![("a".into(), Value::Long(21)), ("b".into(), Value::String("x".into()))]));
}

proptest! {
    // PROPTEST_CASES (read by the default config) raises the count for a longer run.
    #![proptest_config(ProptestConfig { cases: ProptestConfig::default().cases.max(2_000), ..ProptestConfig::default() })]

    /// Mutated Avro binary (bytes flipped, replaced with varints, cut, grown) against a schema
    /// with every kind of type and one with zero-byte items and recursion: decoding answers
    /// (a value or an error) without a panic or an abort, and quickly.
    #[test]
    fn mutated_binary_never_panics_and_is_quick(
        seed in 0..2usize,
        // Numbers are half the time below 20 million: counts a decoder would act on.
        edits in proptest::collection::vec(
            (any::<prop::sample::Index>(), 0u8..4, any::<u8>(), prop_oneof![any::<i64>(), 0i64..20_000_000]),
            1..6,
        ),
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
    ) {
        let (schema, mut bytes) = if seed == 0 { rich_datum() } else { nulls_datum() };
        for (at, op, byte, n) in edits {
            let i = at.index(bytes.len());
            match op {
                0 => bytes[i] ^= byte | 1,
                1 => bytes[i] = byte,
                2 => { bytes.splice(i..=i, long(n)); }
                _ => bytes.insert(i, byte),
            }
        }
        if do_cut {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        let started = crate::thread_cpu();
        let _ = decode(&schema, None, &bytes, 1, &DatumLimits::default());
        let took = crate::thread_cpu() - started;
        // Without the walk, apache-avro spends 0.6 s on a five-byte count of ten million nulls;
        // with it, no case here takes 0.1 s.
        prop_assert!(took < Duration::from_millis(250), "took {took:?} of CPU");
    }
}
