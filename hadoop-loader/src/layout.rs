//! Where things go in the destination, and the UTC calendar arithmetic behind hour
//! directories (no time zone database: hours are always UTC).

/// Milliseconds in an hour.
pub const HOUR_MS: i64 = 3_600_000;

/// The hour (ms since the epoch, floored) a record timestamp falls in.
pub fn hour_of(timestamp_ms: i64) -> i64 {
    timestamp_ms.div_euclid(HOUR_MS) * HOUR_MS
}

/// `(year, month, day)` of a day number since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, valid far beyond any Kafka timestamp).
///
/// ```
/// assert_eq!(fjord_hadoop_loader::layout::civil_from_days(0), (1970, 1, 1));
/// assert_eq!(fjord_hadoop_loader::layout::civil_from_days(19_723), (2024, 1, 1));
/// ```
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Days since 1970-01-01 of a civil date (inverse of [`civil_from_days`]).
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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
    let (y, m, d, h) = (p.next()?.parse::<i64>().ok()?, p.next()?.parse::<u32>().ok()?, p.next()?.parse::<u32>().ok()?, p.next()?.parse::<i64>().ok()?);
    if p.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&d) || !(0..24).contains(&h) {
        return None;
    }
    Some((days_from_civil(y, m, d) * 24 + h) * HOUR_MS)
}

/// Parses `YYYY-MM-DDTHH:MM[:SS]Z` (UTC) or milliseconds since the epoch.
pub fn parse_timestamp(s: &str) -> Option<i64> {
    if let Ok(ms) = s.parse::<i64>() {
        return Some(ms);
    }
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-');
    let (y, mo, da) = (d.next()?.parse::<i64>().ok()?, d.next()?.parse::<u32>().ok()?, d.next()?.parse::<u32>().ok()?);
    let mut t = time.split(':');
    let (h, mi) = (t.next()?.parse::<i64>().ok()?, t.next()?.parse::<i64>().ok()?);
    let sec = t.next().map_or(Some(0), |x| x.parse::<i64>().ok())?;
    if d.next().is_some() || t.next().is_some() || !(1..=12).contains(&mo) || !(1..=31).contains(&da) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    Some(((days_from_civil(y, mo, da) * 24 + h) * 60 + mi) * 60_000 + sec * 1000)
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
    fn calendar_round_trips_and_known_dates() {
        for days in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
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
