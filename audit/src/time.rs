//! UTC timestamps without a date library: formatting window starts and parsing `--since`.

use crate::{Error, Result};

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// (year, month, day) → days since 1970-01-01.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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
    let bad = || Error::InvalidConfig(format!("--since {s:?}: expected @MILLIS, YYYY-MM-DDTHH:MM[:SS]Z or an age like 30m, 6h, 2d"));
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
    let body = s.strip_suffix('Z').ok_or_else(bad)?;
    let (date, time) = body.split_once('T').ok_or_else(bad)?;
    let num = |x: &str| x.parse::<u32>().map_err(|_| bad());
    let mut date_parts = date.splitn(3, '-');
    let (y, mo, d) = match (date_parts.next(), date_parts.next(), date_parts.next()) {
        (Some(y), Some(m), Some(d)) => (y.parse::<i64>().map_err(|_| bad())?, num(m)?, num(d)?),
        _ => return Err(bad()),
    };
    let t: Vec<u32> = time.split(':').map(num).collect::<Result<_>>()?;
    let (h, mi, sec) = match t[..] {
        [h, m] => (h, m, 0),
        [h, m, s] => (h, m, s),
        _ => return Err(bad()),
    };
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 59 {
        return Err(bad());
    }
    let secs = days_from_civil(y, mo, d) * 86_400 + i64::from(h * 3600 + mi * 60 + sec);
    Ok(secs * 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

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
