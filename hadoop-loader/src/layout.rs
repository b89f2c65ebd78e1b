//! Where things go in the destination, and the hour directories (no time zone
//! database: hours are always UTC; the calendar arithmetic is [`fjord_audit::time`]'s).

use fjord_audit::time::{civil_from_days, days_from_civil, parse_utc};

/// Milliseconds in an hour.
pub const HOUR_MS: i64 = 3_600_000;

/// The hour (ms since the epoch, floored) a record timestamp falls in.
pub fn hour_of(timestamp_ms: i64) -> i64 {
    timestamp_ms.div_euclid(HOUR_MS) * HOUR_MS
}

/// `YYYY/MM/DD/HH` of the hour a timestamp falls in.
///
/// ```
/// // 2024-03-05T07:59:59.999Z
/// assert_eq!(fjord_hadoop_loader::layout::hour_path(1_709_625_599_999), "2024/03/05/07");
/// ```
pub fn hour_path(timestamp_ms: i64) -> String {
    let hours = timestamp_ms.div_euclid(HOUR_MS);
    let (y, m, d) = civil_from_days(hours.div_euclid(24));
    format!("{y:04}/{m:02}/{d:02}/{:02}", hours.rem_euclid(24))
}

/// Start (ms since the epoch) of the hour named by a `YYYY/MM/DD/HH` path.
pub fn parse_hour_path(path: &str) -> Option<i64> {
    let mut p = path.split('/');
    let (y, m, d, h) = (
        p.next()?.parse::<i64>().ok()?,
        p.next()?.parse::<u32>().ok()?,
        p.next()?.parse::<u32>().ok()?,
        p.next()?.parse::<i64>().ok()?,
    );
    if p.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&d) || !(0..24).contains(&h) {
        return None;
    }
    Some((days_from_civil(y, m, d) * 24 + h) * HOUR_MS)
}

/// Parses `YYYY-MM-DDTHH:MM[:SS]Z` (UTC) or milliseconds since the epoch.
pub fn parse_timestamp(s: &str) -> Option<i64> {
    s.parse::<i64>().ok().or_else(|| parse_utc(s))
}

/// Directory of a topic's hour: `<topic>/hourly/YYYY/MM/DD/HH`.
pub fn hour_dir(topic: &str, hour_path: &str) -> String {
    format!("{topic}/hourly/{hour_path}")
}

/// Camus-style data file name: `<topic>+<partition>+<firstOffset>+<lastOffset>.avro`.
pub fn data_file_name(topic: &str, partition: i32, first: i64, last: i64) -> String {
    format!("{topic}+{partition}+{first}+{last}.avro")
}

/// Parses a data file name back into (topic, partition, first offset, last offset). Topic
/// names cannot contain `+` (Kafka allows `[a-zA-Z0-9._-]`), so the split is unambiguous.
pub fn parse_data_file_name(name: &str) -> Option<(String, i32, i64, i64)> {
    let stem = name.strip_suffix(".avro")?;
    let mut parts = stem.rsplitn(4, '+');
    let last = parts.next()?.parse().ok()?;
    let first = parts.next()?.parse().ok()?;
    let partition = parts.next()?.parse().ok()?;
    let topic = parts.next()?.to_string();
    Some((topic, partition, first, last))
}

/// Directory of the job's committed states.
pub fn offsets_dir(job: &str) -> String {
    format!("_fjord/offsets/{job}")
}

/// File of committed state number `seq` (zero-padded, so names sort by number).
pub fn state_file(job: &str, seq: u64) -> String {
    format!("{}/{seq:020}.json", offsets_dir(job))
}

/// Directory of the job's runs in progress.
pub fn tmp_dir(job: &str) -> String {
    format!("_fjord/tmp/{job}")
}

/// File of a partition's rejected records from one run.
pub fn error_file(job: &str, topic: &str, partition: i32, first: i64, last: i64) -> String {
    format!("_fjord/errors/{job}/{topic}/{topic}+{partition}+{first}+{last}.jsonl")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hour_paths_and_timestamps_at_calendar_edges() {
        assert_eq!(hour_path(0), "1970/01/01/00");
        assert_eq!(hour_path(-1), "1969/12/31/23");
        // 2000-02-29T23:00Z, a leap day of a century leap year.
        assert_eq!(hour_path(951_865_200_000), "2000/02/29/23");
        assert_eq!(parse_timestamp("2000-02-29T23:00Z"), Some(951_865_200_000));
        assert_eq!(parse_timestamp("2024-03-05T07:59:59Z"), Some(1_709_625_599_000));
        assert_eq!(parse_timestamp("12345"), Some(12345));
        for bad in ["2024-13-01T00:00Z", "2024-01-01T00:00", "2024-01-01", "x", "2024-01-01T24:00Z"] {
            assert_eq!(parse_timestamp(bad), None, "{bad}");
        }
        assert_eq!(hour_of(HOUR_MS * 5 + 1), HOUR_MS * 5);
        for ts in [0, 951_865_200_000, 1_709_625_599_999, -1] {
            assert_eq!(parse_hour_path(&hour_path(ts)), Some(hour_of(ts)));
        }
        assert_eq!(parse_hour_path("2024/01/01"), None);
        assert_eq!(hour_of(-1), -HOUR_MS);
    }

    #[test]
    fn file_names_round_trip() {
        let name = data_file_name("my.topic-1", 3, 100, 250);
        assert_eq!(name, "my.topic-1+3+100+250.avro");
        assert_eq!(parse_data_file_name(&name), Some(("my.topic-1".into(), 3, 100, 250)));
        assert_eq!(parse_data_file_name("x+1+2.avro"), None);
        assert_eq!(state_file("nightly", 7), "_fjord/offsets/nightly/00000000000000000007.json");
    }
}
