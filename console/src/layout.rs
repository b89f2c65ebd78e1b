//! The page shell every page shares (head, navigation, the embedded stylesheet and script)
//! and small rendering helpers.

use axum::http::StatusCode;
use maud::{html, Markup, DOCTYPE};

/// Where the console is mounted (its routes in `router` say the same): every link is
/// absolute under it.
pub(crate) const BASE: &str = "/ui";

/// The stylesheet and script, compiled into the binary (the console works offline).
pub(crate) const CSS: &str = include_str!("../assets/console.css");
pub(crate) const JS: &str = include_str!("../assets/console.js");

/// The navigation entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nav {
    Overview,
    Topics,
    Groups,
    Schemas,
    Audit,
    Mirror,
    Loads,
    None,
}

const NAV: [(Nav, &str, &str); 7] = [
    (Nav::Overview, "/", "Overview"),
    (Nav::Topics, "/topics", "Topics"),
    (Nav::Groups, "/groups", "Groups"),
    (Nav::Schemas, "/schemas", "Schemas"),
    (Nav::Audit, "/audit", "Audit"),
    (Nav::Mirror, "/mirror", "Mirror"),
    (Nav::Loads, "/loads", "Loads"),
];

/// A whole page.
pub(crate) fn page(title: &str, active: Nav, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Fjord console" }
                link rel="icon" href="data:,";
                link rel="stylesheet" href={ (BASE) "/assets/console.css" };
                script src={ (BASE) "/assets/console.js" } defer {}
            }
            body {
                // The first tab stop: past the navigation to the page's content.
                a.skip href="#main" { "Skip to content" }
                header.top {
                    a.brand href={ (BASE) "/" } { "Fjord" }
                    nav aria-label="Sections" {
                        @for (nav, path, label) in NAV {
                            a href={ (BASE) (path) } aria-current=[(nav == active).then_some("page")] { (label) }
                        }
                    }
                }
                main #main tabindex="-1" { (body) }
            }
        }
    }
}

/// The page of an error: the shell and the message.
pub(crate) fn error_page(status: StatusCode, message: &str) -> Markup {
    page(
        "Error",
        Nav::None,
        html! {
            h1 { "Error " (status.as_u16()) }
            (error_box(message))
        },
    )
}

/// An error inside a page (one part of it failed, the rest is shown).
pub(crate) fn error_box(message: &str) -> Markup {
    html! { p.error role="alert" { (message) } }
}

/// A notice (what an action did).
pub(crate) fn notice(message: &str) -> Markup {
    html! { p.notice role="status" { (message) } }
}

/// `s` percent-encoded for one path segment or query value: everything but the unreserved
/// characters of RFC 3986, so a group id with `/`, `?`, `#` or `"` stays one segment.
pub(crate) fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A timestamp (ms since the epoch) as UTC, with milliseconds.
pub(crate) fn time(ms: i64) -> String {
    if ms < 0 {
        return "-".into();
    }
    let s = fjord_audit::time::format_utc(ms);
    format!("{}.{:03}Z", s.trim_end_matches('Z'), ms.rem_euclid(1000))
}

/// A line chart of `series` over time, drawn by the audit's SVG renderer (one line per
/// series, x labelled with the time of day): `points` are (time in ms, one value per series).
/// The renderer escapes every name it draws; the result is embedded as is.
pub(crate) fn series_chart(label: &str, series: &[&str], points: &[(i64, Vec<u64>)]) -> String {
    let rows: Vec<fjord_audit::WindowRow> = points
        .iter()
        .map(|(at, values)| fjord_audit::WindowRow {
            topic: label.to_string(),
            window_start: *at,
            window_start_utc: fjord_audit::time::format_utc(*at),
            counts: series.iter().zip(values).map(|(s, v)| (s.to_string(), *v)).collect(),
            produced: 0,
            dead_lettered: 0,
            differences: Default::default(),
            verdict: fjord_audit::Verdict::Complete,
            problems: Vec::new(),
        })
        .collect();
    let rows: Vec<&fjord_audit::WindowRow> = rows.iter().collect();
    let series: Vec<String> = series.iter().map(|s| s.to_string()).collect();
    fjord_audit::render::chart(label, &series, &rows)
}

/// Broker ids as `1, 2, 3`.
pub(crate) fn ids(ids: &[i32]) -> String {
    ids.iter().map(i32::to_string).collect::<Vec<_>>().join(", ")
}

/// A count with thousands separators.
pub(crate) fn count(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

/// A duration in ms as the largest whole unit (`7d`, `36h`, `1500ms`); -1 is unlimited.
pub(crate) fn millis(value: &str) -> String {
    let Ok(ms) = value.parse::<i64>() else { return value.to_string() };
    if ms < 0 {
        return "unlimited".into();
    }
    for (unit, len) in [("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)] {
        if ms >= len && ms % len == 0 {
            return format!("{}{unit}", ms / len);
        }
    }
    format!("{ms}ms")
}

/// Bytes as a short size; -1 is unlimited.
pub(crate) fn bytes(value: &str) -> String {
    let Ok(n) = value.parse::<i64>() else { return value.to_string() };
    if n < 0 {
        return "unlimited".into();
    }
    for (unit, len) in [("GiB", 1i64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if n >= len && n % len == 0 {
            return format!("{}{unit}", n / len);
        }
    }
    format!("{n}B")
}

/// Bytes on disk in the largest binary unit they reach (`512 B`, `1.5 KiB`, `3.0 GiB`).
pub(crate) fn human_bytes(n: i64) -> String {
    for (unit, len) in [("GiB", 1i64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if n >= len {
            return format!("{:.1} {unit}", n as f64 / len as f64);
        }
    }
    format!("{n} B")
}

/// A size cell's content: human-readable, with the exact bytes on hover; "—" when unknown.
pub(crate) fn size(bytes: Option<i64>) -> Markup {
    html! {
        @match bytes {
            Some(n) => span title={ (count(n)) " bytes" } data-bytes=(n) { (human_bytes(n)) },
            None => span title="not known: the leader's broker did not answer" { "—" },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(5 << 20), "5.0 MiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
        assert_eq!(size(Some(2048)).into_string(), "<span title=\"2,048 bytes\" data-bytes=\"2048\">2.0 KiB</span>");
        assert!(size(None).into_string().contains("—"));
        assert_eq!(enc("a b/c?\"<"), "a%20b%2Fc%3F%22%3C");
        assert_eq!(enc("orders.v1-x_y~"), "orders.v1-x_y~");
        assert_eq!(count(1234567), "1,234,567");
        assert_eq!(count(-12), "-12");
        assert_eq!(millis("604800000"), "7d");
        assert_eq!(millis("-1"), "unlimited");
        assert_eq!(millis("1500"), "1500ms");
        assert_eq!(bytes("1073741824"), "1GiB");
        assert_eq!(time(1_796_010_000_123), "2026-11-30T03:40:00.123Z");
    }

    #[test]
    fn user_text_is_escaped() {
        let p = page("<t>", Nav::None, error_box("<script>alert(1)</script>"));
        let s = p.into_string();
        assert!(!s.contains("<script>alert"), "{s}");
        assert!(s.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(s.contains("<title>&lt;t&gt; · Fjord console</title>"));
    }
}
