//! UTC timestamps without a date library: the proleptic Gregorian calendar arithmetic,
//! formatting window starts, and parsing `YYYY-MM-DDTHH:MM[:SS]Z` and `--since`. The
//! Hadoop loader's hour directories use the same functions.

use crate::{Error, Result};

/// `(year, month, day)` of a day number since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, valid far beyond any Kafka timestamp).
///
/// ```
/// assert_eq!(fjord_audit::time::civil_from_days(0), (1970, 1, 1));
/// assert_eq!(fjord_audit::time::civil_from_days(19_723), (2024, 1, 1));
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
    (yoe + era * 400 + i64::from(month <= 2), month, day)
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

/// Ms since the epoch of `YYYY-MM-DDTHH:MM[:SS]Z` (UTC); `None` when it is not that.
///
/// ```
/// assert_eq!(fjord_audit::time::parse_utc("2000-02-29T23:00Z"), Some(951_865_200_000));
/// assert_eq!(fjord_audit::time::parse_utc("2000-02-29 23:00Z"), None);
/// ```
pub fn parse_utc(s: &str) -> Option<i64> {
    let (date, time) = s.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-');
    let (y, mo, da) = (d.next()?.parse::<i64>().ok()?, d.next()?.parse::<u32>().ok()?, d.next()?.parse::<u32>().ok()?);
    let mut t = time.split(':');
    let (h, mi) = (t.next()?.parse::<i64>().ok()?, t.next()?.parse::<i64>().ok()?);
    let sec = t.next().map_or(Some(0), |x| x.parse::<i64>().ok())?;
    if d.next().is_some() || t.next().is_some() || !(1..=12).contains(&mo) || !(1..=31).contains(&da) {
        return None;
    }
    if !(0..24).contains(&h) || !(0..60).contains(&mi) || !(0..60).contains(&sec) {
        return None;
    }
    Some(((days_from_civil(y, mo, da) * 24 + h) * 60 + mi) * 60_000 + sec * 1000)
}

/// `YYYY-MM-DDTHH:MM:SSZ` for ms since the epoch.
pub fn format_utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!("{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}Z", s / 3600, s / 60 % 60, s % 60)
}

/// Parses a `--since` value relative to `now_ms`: `@MILLIS` since the epoch,
/// `YYYY-MM-DDTHH:MM[:SS]Z`, or an age such as `90s`, `30m`, `6h`, `2d` (that long ago).
pub fn parse_since(s: &str, now_ms: i64) -> Result<i64> {
    let bad =
        || Error::InvalidConfig(format!("--since {s:?}: expected @MILLIS, YYYY-MM-DDTHH:MM[:SS]Z or an age like 30m, 6h, 2d"));
    let s = s.trim();
    if let Some(ms) = s.strip_prefix('@') {
        return ms.parse().map_err(|_| bad());
    }
    if let Some(unit) = s.chars().last().filter(|c| "smhd".contains(*c)) {
        if let Ok(n) = s[..s.len() - 1].parse::<i64>() {
            let per = match unit {
                's' => 1_000,
                'm' => 60_000,
                'h' => 3_600_000,
                _ => 86_400_000,
            };
            return n.checked_mul(per).and_then(|age| now_ms.checked_sub(age)).filter(|_| n >= 0).ok_or_else(bad);
        }
    }
    parse_utc(s).ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calendar_round_trips() {
        for days in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn formats_and_parses_utc() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_utc(1_796_010_000_000), "2026-11-30T03:40:00Z");
        assert_eq!(parse_since("2026-11-30T03:40:00Z", 0).unwrap(), 1_796_010_000_000);
        assert_eq!(parse_since("2026-11-30T03:40Z", 0).unwrap(), 1_796_010_000_000);
        assert_eq!(parse_since("2000-02-29T12:00:00Z", 0).map(format_utc).unwrap(), "2000-02-29T12:00:00Z");
        assert_eq!(parse_since("@42", 0).unwrap(), 42);
        assert_eq!(parse_since("30m", 3_600_000).unwrap(), 1_800_000);
        assert_eq!(parse_since("2d", 200_000_000).unwrap(), 200_000_000 - 172_800_000);
        for bad in ["", "yesterday", "2026-13-01T00:00Z", "2026-11-30 03:40Z", "-5m", "@x", "2026-11-30T25:00Z"] {
            assert!(parse_since(bad, 0).is_err(), "{bad:?} accepted");
        }
    }
}
