//! The compatibility table: schema pairs with the expected verdict in every mode.

use super::*;

fn rec(fields: &str) -> String {
    format!(r#"{{"type":"record","name":"R","namespace":"t","fields":[{fields}]}}"#)
}

/// `(case, old, new, backward, forward)`: `backward` = the new schema reads data written with
/// the old one; `forward` = the old schema reads data written with the new one.
fn table() -> Vec<(&'static str, String, String, bool, bool)> {
    let inner = |extra: &str| {
        format!(r#"{{"name":"a","type":{{"type":"record","name":"Inner","fields":[{{"name":"x","type":"int"}}{extra}]}}}}"#)
    };
    let list = |value: &str| {
        rec(&format!(r#"{{"name":"value","type":"{value}"}},{{"name":"next","type":["null","R"],"default":null}}"#))
    };
    let enum_field = |symbols: &str, default: &str| {
        rec(&format!(r#"{{"name":"e","type":{{"type":"enum","name":"E","symbols":[{symbols}]{default}}}}}"#))
    };
    let fixed_field =
        |name: &str, size: u32| rec(&format!(r#"{{"name":"f","type":{{"type":"fixed","name":"{name}","size":{size}}}}}"#));
    let field = |ty: &str| rec(&format!(r#"{{"name":"a","type":{ty}}}"#));
    vec![
        ("identical", field(r#""int""#), field(r#""int""#), true, true),
        (
            "add field with default",
            field(r#""int""#),
            rec(r#"{"name":"a","type":"int"},{"name":"b","type":"int","default":0}"#),
            true,
            true,
        ),
        (
            "add field without default",
            field(r#""int""#),
            rec(r#"{"name":"a","type":"int"},{"name":"b","type":"int"}"#),
            false,
            true,
        ),
        (
            "remove field without default",
            rec(r#"{"name":"a","type":"int"},{"name":"b","type":"int"}"#),
            field(r#""int""#),
            true,
            false,
        ),
        (
            "remove field that had a default",
            rec(r#"{"name":"a","type":"int"},{"name":"b","type":"int","default":0}"#),
            field(r#""int""#),
            true,
            true,
        ),
        (
            "add optional union field with null default",
            field(r#""int""#),
            rec(r#"{"name":"a","type":"int"},{"name":"c","type":["null","string"],"default":null}"#),
            true,
            true,
        ),
        ("promote int to long", field(r#""int""#), field(r#""long""#), true, false),
        ("narrow long to int", field(r#""long""#), field(r#""int""#), false, true),
        ("promote int to float", field(r#""int""#), field(r#""float""#), true, false),
        ("promote int to double", field(r#""int""#), field(r#""double""#), true, false),
        ("promote long to float", field(r#""long""#), field(r#""float""#), true, false),
        ("promote long to double", field(r#""long""#), field(r#""double""#), true, false),
        ("promote float to double", field(r#""float""#), field(r#""double""#), true, false),
        ("narrow double to float", field(r#""double""#), field(r#""float""#), false, true),
        ("int to string", field(r#""int""#), field(r#""string""#), false, false),
        ("boolean to int", field(r#""boolean""#), field(r#""int""#), false, false),
        ("string to bytes", field(r#""string""#), field(r#""bytes""#), true, true),
        ("bytes to string", field(r#""bytes""#), field(r#""string""#), true, true),
        ("enum adds a symbol", enum_field(r#""A","B""#, ""), enum_field(r#""A","B","C""#, ""), true, false),
        ("enum removes a symbol", enum_field(r#""A","B","C""#, ""), enum_field(r#""A","B""#, ""), false, true),
        (
            "enum removes a symbol, reader has a default",
            enum_field(r#""A","B","C""#, ""),
            enum_field(r#""A","B""#, r#","default":"A""#),
            true,
            true,
        ),
        (
            "enum renamed",
            enum_field(r#""A""#, ""),
            rec(r#"{"name":"e","type":{"type":"enum","name":"F","symbols":["A"]}}"#),
            false,
            false,
        ),
        ("int becomes [null,int]", field(r#""int""#), field(r#"["null","int"]"#), true, false),
        ("[null,int] becomes int", field(r#"["null","int"]"#), field(r#""int""#), false, true),
        ("union gains a branch", field(r#"["null","int"]"#), field(r#"["null","int","string"]"#), true, false),
        ("union loses a branch", field(r#"["null","int","string"]"#), field(r#"["null","int"]"#), false, true),
        ("union branch promoted int to long", field(r#"["int","string"]"#), field(r#"["long","string"]"#), true, false),
        (
            "nested record adds field with default",
            rec(&inner("")),
            rec(&inner(r#",{"name":"y","type":"string","default":""}"#)),
            true,
            true,
        ),
        (
            "nested record adds field without default",
            rec(&inner("")),
            rec(&inner(r#",{"name":"y","type":"string"}"#)),
            false,
            true,
        ),
        (
            "nested record field int to string",
            rec(&inner("")),
            rec(r#"{"name":"a","type":{"type":"record","name":"Inner","fields":[{"name":"x","type":"string"}]}}"#),
            false,
            false,
        ),
        (
            "array items int to long",
            field(r#"{"type":"array","items":"int"}"#),
            field(r#"{"type":"array","items":"long"}"#),
            true,
            false,
        ),
        (
            "array items string to int",
            field(r#"{"type":"array","items":"string"}"#),
            field(r#"{"type":"array","items":"int"}"#),
            false,
            false,
        ),
        (
            "map values int to double",
            field(r#"{"type":"map","values":"int"}"#),
            field(r#"{"type":"map","values":"double"}"#),
            true,
            false,
        ),
        (
            "map becomes array",
            field(r#"{"type":"map","values":"int"}"#),
            field(r#"{"type":"array","items":"int"}"#),
            false,
            false,
        ),
        ("fixed unchanged", fixed_field("F", 16), fixed_field("F", 16), true, true),
        ("fixed size changes", fixed_field("F", 16), fixed_field("F", 8), false, false),
        ("fixed renamed", fixed_field("F", 16), fixed_field("G", 16), false, false),
        (
            "record renamed",
            field(r#""int""#),
            r#"{"type":"record","name":"S","namespace":"t","fields":[{"name":"a","type":"int"}]}"#.to_string(),
            false,
            false,
        ),
        (
            "record renamed with an alias for the old name",
            field(r#""int""#),
            r#"{"type":"record","name":"S","namespace":"t","aliases":["R"],"fields":[{"name":"a","type":"int"}]}"#.to_string(),
            true,
            false,
        ),
        (
            "record namespace changes",
            field(r#""int""#),
            r#"{"type":"record","name":"R","namespace":"u","fields":[{"name":"a","type":"int"}]}"#.to_string(),
            true,
            true,
        ),
        ("field renamed with an alias", field(r#""int""#), rec(r#"{"name":"b","type":"int","aliases":["a"]}"#), true, false),
        (
            "field that defined a named type removed; the type now defined by the reference site",
            rec(
                r#"{"name":"a","type":{"type":"record","name":"Inner","fields":[{"name":"x","type":"int"}]}},{"name":"b","type":"Inner"}"#,
            ),
            rec(r#"{"name":"b","type":{"type":"record","name":"Inner","fields":[{"name":"x","type":"int"}]}}"#),
            true,
            false,
        ),
        ("recursive list promotes its value", list("int"), list("long"), true, false),
        ("recursive list unchanged", list("int"), list("int"), true, true),
        (
            "timestamp-millis read as long",
            field(r#"{"type":"long","logicalType":"timestamp-millis"}"#),
            field(r#""long""#),
            true,
            true,
        ),
        ("date (int) promoted to long", field(r#"{"type":"int","logicalType":"date"}"#), field(r#""long""#), true, false),
        ("top-level primitive unchanged", r#""string""#.to_string(), r#""string""#.to_string(), true, true),
        ("top-level null to [null,string]", r#""null""#.to_string(), r#"["null","string"]"#.to_string(), true, false),
        ("narrow float to long", field(r#""float""#), field(r#""long""#), false, true),
        ("enum becomes string", enum_field(r#""A""#, ""), rec(r#"{"name":"e","type":"string"}"#), false, false),
        (
            "union of two records loses one",
            field(r#"[{"type":"record","name":"A","fields":[]},{"type":"record","name":"B","fields":[]}]"#),
            field(r#"[{"type":"record","name":"A","fields":[]}]"#),
            false,
            true,
        ),
        (
            "record inside a union gains a field without default",
            field(r#"["null",{"type":"record","name":"In","fields":[{"name":"x","type":"int"}]}]"#),
            field(r#"["null",{"type":"record","name":"In","fields":[{"name":"x","type":"int"},{"name":"y","type":"int"}]}]"#),
            false,
            true,
        ),
        (
            "array of records gains a defaulted field",
            field(r#"{"type":"array","items":{"type":"record","name":"It","fields":[{"name":"x","type":"int"}]}}"#),
            field(
                r#"{"type":"array","items":{"type":"record","name":"It","fields":[{"name":"x","type":"int"},{"name":"y","type":"int","default":1}]}}"#,
            ),
            true,
            true,
        ),
        (
            "map of enums gains a symbol",
            field(r#"{"type":"map","values":{"type":"enum","name":"E","symbols":["A"]}}"#),
            field(r#"{"type":"map","values":{"type":"enum","name":"E","symbols":["A","B"]}}"#),
            true,
            false,
        ),
        (
            "fixed inside a union changes size",
            field(r#"["null",{"type":"fixed","name":"F","size":4}]"#),
            field(r#"["null",{"type":"fixed","name":"F","size":8}]"#),
            false,
            false,
        ),
    ]
}

fn parse(s: &str) -> Schema {
    Schema::parse_str(s).unwrap_or_else(|e| panic!("test schema does not parse: {e}\n{s}"))
}

#[test]
fn table_has_at_least_thirty_cases() {
    assert!(table().len() >= 30, "{}", table().len());
}

#[test]
fn every_mode_gives_the_expected_verdict_for_every_pair() {
    use CompatibilityLevel::*;
    let mut failures = Vec::new();
    for (case, old, new, backward, forward) in table() {
        let (old, new) = (parse(&old), parse(&new));
        let expected = [
            (Backward, backward),
            (BackwardTransitive, backward),
            (Forward, forward),
            (ForwardTransitive, forward),
            (Full, backward && forward),
            (FullTransitive, backward && forward),
            (None, true),
        ];
        for (level, want) in expected {
            let messages = check(level, &new, &[(1, &old)]);
            if messages.is_empty() != want {
                failures.push(format!("{case} / {level}: expected compatible={want}, got {messages:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn transitive_modes_check_every_live_version_and_plain_modes_only_the_latest() {
    use CompatibilityLevel::*;
    let a = field_schema(r#"{"name":"a","type":"int"}"#);
    let ab_default = field_schema(r#"{"name":"a","type":"int"},{"name":"b","type":"int","default":0}"#);
    let ab = field_schema(r#"{"name":"a","type":"int"},{"name":"b","type":"int"}"#);
    // BACKWARD: v1 {a}, v2 {a, b=0}; new {a, b}: reads v2 data, not v1 data.
    let previous = [(2, &ab_default), (1, &a)];
    assert!(check(Backward, &ab, &previous).is_empty());
    let messages = check(BackwardTransitive, &ab, &previous);
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert!(messages[0].contains("version 1") && messages[0].contains("READER_FIELD_MISSING_DEFAULT_VALUE"), "{messages:?}");
    assert!(check(Full, &ab, &previous).is_empty());
    assert!(!check(FullTransitive, &ab, &previous).is_empty());
    // FORWARD: v1 {a, b}, v2 {a, b=0}; new {a}: v2 reads it, v1 does not.
    let previous = [(2, &ab_default), (1, &ab)];
    assert!(check(Forward, &a, &previous).is_empty());
    assert!(!check(ForwardTransitive, &a, &previous).is_empty());
    // No previous version: everything is compatible.
    for level in [Backward, BackwardTransitive, Forward, ForwardTransitive, Full, FullTransitive, None] {
        assert!(check(level, &ab, &[]).is_empty());
    }
}

fn field_schema(fields: &str) -> Schema {
    parse(&rec(fields))
}

#[test]
fn messages_name_the_rule_and_the_path() {
    let old = field_schema(r#"{"name":"a","type":{"type":"record","name":"Inner","fields":[{"name":"x","type":"int"}]}}"#);
    let new = field_schema(
        r#"{"name":"a","type":{"type":"record","name":"Inner","fields":[{"name":"x","type":"int"},{"name":"y","type":"string"}]}}"#,
    );
    let err = can_read(&old, &new).unwrap_err();
    assert_eq!(err.rule, "READER_FIELD_MISSING_DEFAULT_VALUE");
    assert_eq!(err.path, "/fields/a/fields/y");
    let err =
        can_read(&field_schema(r#"{"name":"a","type":"long"}"#), &field_schema(r#"{"name":"a","type":"int"}"#)).unwrap_err();
    assert_eq!((err.rule, err.path.as_str()), ("TYPE_MISMATCH", "/fields/a"));
    assert!(err.to_string().contains("reader type int cannot read writer type long"), "{err}");
}

#[test]
fn level_names_round_trip_and_bad_names_are_rejected() {
    for name in ["BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE", "NONE"] {
        assert_eq!(name.parse::<CompatibilityLevel>().unwrap().as_str(), name);
    }
    assert_eq!("backward".parse::<CompatibilityLevel>().unwrap(), CompatibilityLevel::Backward);
    assert!(matches!("SIDEWAYS".parse::<CompatibilityLevel>(), Err(Error::InvalidCompatibilityLevel(_))));
}
