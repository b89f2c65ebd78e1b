//! The report's three formats: a text table, the JSON contract (the [`Report`] as is) and
//! one self-contained HTML page with an inline-SVG chart per topic.

use std::fmt::Write as _;

use crate::report::{Report, Verdict, WindowRow};
use crate::time::format_utc;
use crate::Result;

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Aligned text, one table per topic.
    Text,
    /// One JSON object (the contract in the README's audit section).
    Json,
    /// One HTML page, no external assets.
    Html,
}

/// Renders `report` in `format`.
pub fn render(report: &Report, format: Format) -> Result<String> {
    Ok(match format {
        Format::Text => text(report),
        Format::Json => serde_json::to_string_pretty(report)? + "\n",
        Format::Html => html(report),
    })
}

fn header_lines(r: &Report) -> Vec<String> {
    let gaps = r.gaps.iter().map(|g| {
        format!(
            "known loss: mirror gap {} {}-{} offsets {}..={} ({} records) deleted by retention before they were mirrored (found {})",
            g.source,
            g.topic,
            g.partition,
            g.first_offset,
            g.last_offset,
            g.records,
            format_utc(g.detected_ms)
        )
    });
    let lines = vec![
        format!(
            "audit report at {}: windows of {}, grace {}, tolerance {}",
            format_utc(r.generated_ms),
            span(r.window_ms),
            span(r.grace_ms),
            if r.tolerance == 0.0 { "exact".to_string() } else { format!("{}%", r.tolerance * 100.0) }
        ),
        format!(
            "audit records: {} counted, {} replays ignored, {} malformed skipped, {} of another window length skipped",
            r.audit_records, r.replays_ignored, r.malformed_skipped, r.other_window_skipped
        ),
    ];
    lines.into_iter().chain(gaps).collect()
}

/// `600 s` for whole seconds, else `1500 ms`.
fn span(ms: i64) -> String {
    if ms % 1000 == 0 {
        format!("{} s", ms / 1000)
    } else {
        format!("{ms} ms")
    }
}

fn cell(w: &WindowRow, tier: &str) -> String {
    let n = w.counts.get(tier).copied().unwrap_or(0);
    match w.differences.get(tier) {
        Some(d) if *d != 0 => format!("{n} ({d:+})"),
        _ => n.to_string(),
    }
}

/// The text format: a header, then per topic a table of windows × tiers.
pub fn text(r: &Report) -> String {
    let mut out = header_lines(r).join("\n") + "\n";
    for t in &r.topics {
        let rows: Vec<&WindowRow> = r.windows.iter().filter(|w| w.topic == t.topic).collect();
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(out, "\ntopic {} (producing: {})", t.topic, t.producing.join(" + "));
        let mut table = vec![std::iter::once("window (UTC)".to_string())
            .chain(t.tiers.iter().cloned())
            .chain(["verdict".into()])
            .collect::<Vec<_>>()];
        for w in rows {
            let mut verdict = w.verdict.as_str().to_string();
            if !w.problems.is_empty() {
                let _ = write!(verdict, " ({})", w.problems.join(", "));
            }
            table.push(
                std::iter::once(w.window_start_utc.clone())
                    .chain(t.tiers.iter().map(|tier| cell(w, tier)))
                    .chain([verdict])
                    .collect(),
            );
        }
        let widths: Vec<usize> = (0..table[0].len()).map(|i| table.iter().map(|row| row[i].len()).max().unwrap_or(0)).collect();
        for row in table {
            let line: Vec<String> = row.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
            let _ = writeln!(out, "  {}", line.join("  ").trim_end());
        }
    }
    if r.windows.is_empty() {
        out.push_str("\nno windows\n");
    }
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

const COLORS: [&str; 8] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

fn verdict_color(v: Verdict) -> &'static str {
    match v {
        Verdict::Complete => "#d9f2d9",
        Verdict::Pending => "#fff3c4",
        Verdict::Loss => "#f8c9c9",
        Verdict::Duplicates => "#e3d4f5",
    }
}

/// One SVG line chart: x = window, y = count, one polyline per tier; windows that are not
/// complete are shaded in their verdict's colour. Every name in it is escaped (the web
/// console embeds it as is).
pub fn chart(topic: &str, tiers: &[String], rows: &[&WindowRow]) -> String {
    const W: f64 = 720.0;
    const H: f64 = 260.0;
    const L: f64 = 60.0;
    const R: f64 = 130.0;
    const T: f64 = 20.0;
    const B: f64 = 40.0;
    let max = rows.iter().flat_map(|w| w.counts.values()).copied().max().unwrap_or(0).max(1) as f64;
    let x = |i: usize| if rows.len() <= 1 { L + (W - L - R) / 2.0 } else { L + (W - L - R) * i as f64 / (rows.len() - 1) as f64 };
    let y = |n: u64| T + (H - T - B) * (1.0 - n as f64 / max);
    let mut s = format!(
        "<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"counts per tier for {}\">\n",
        esc(topic)
    );
    let _ = writeln!(s, "<rect x=\"0\" y=\"0\" width=\"{W}\" height=\"{H}\" fill=\"#fff\"/>");
    for k in 0..=4 {
        let n = (max * f64::from(k) / 4.0).round() as u64;
        let yy = y(n);
        let _ = writeln!(s, "<line x1=\"{L}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"#ddd\"/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\">{n}</text>", W - R, L - 6.0, yy + 4.0);
    }
    for (i, w) in rows.iter().enumerate() {
        // Label at most ~8 windows so the axis stays readable.
        if rows.len() <= 8 || i % rows.len().div_ceil(8) == 0 {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"middle\">{}</text>",
                x(i),
                H - B + 16.0,
                esc(&w.window_start_utc[11..16])
            );
        }
        if w.verdict != Verdict::Complete {
            let _ = writeln!(s, "<rect x=\"{:.1}\" y=\"{T}\" width=\"6\" height=\"{:.1}\" fill=\"{}\" opacity=\"0.8\"><title>{} {}</title></rect>", x(i) - 3.0, H - T - B, verdict_color(w.verdict), esc(&w.window_start_utc), w.verdict.as_str());
        }
    }
    for (k, tier) in tiers.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let points: Vec<String> = rows
            .iter()
            .enumerate()
            .map(|(i, w)| format!("{:.1},{:.1}", x(i), y(w.counts.get(tier).copied().unwrap_or(0))))
            .collect();
        // Later tiers are drawn dashed and thinner so agreeing lines stay visible on top of each other.
        let dash = if k == 0 { String::new() } else { format!(" stroke-dasharray=\"{} 3\"", 4 + 2 * k) };
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"{}\"{dash} points=\"{}\"/>",
            3.0 - (k as f64 * 0.4).min(1.6),
            points.join(" ")
        );
        for (i, w) in rows.iter().enumerate() {
            let n = w.counts.get(tier).copied().unwrap_or(0);
            let _ = writeln!(
                s,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"><title>{} {}: {n}</title></circle>",
                x(i),
                y(n),
                esc(tier),
                esc(&w.window_start_utc)
            );
        }
        let ly = T + 16.0 * k as f64 + 8.0;
        let _ = writeln!(s, "<line x1=\"{:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" stroke=\"{color}\" stroke-width=\"3\"/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\">{}</text>", W - R + 10.0, W - R + 30.0, W - R + 36.0, ly + 4.0, esc(tier));
    }
    s.push_str("</svg>\n");
    s
}

/// The HTML format: one page, inline CSS and SVG, no scripts, no external assets.
pub fn html(r: &Report) -> String {
    let mut out = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>Fjord audit report</title>\n<style>\n\
         body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:.5em 0 2em}\
         td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f0f0f0}td.l{text-align:left}\
         .complete{background:#d9f2d9}.pending{background:#fff3c4}.loss{background:#f8c9c9}.duplicates{background:#e3d4f5}\n</style>\n</head>\n<body>\n<h1>Fjord audit report</h1>\n",
    );
    for line in header_lines(r) {
        let _ = writeln!(out, "<p class=\"header\">{}</p>", esc(&line));
    }
    let _ = writeln!(
        out,
        "<p class=\"summary\">{} windows: {} complete, {} pending, {} loss, {} duplicates</p>",
        r.windows.len(),
        count(r, Verdict::Complete),
        count(r, Verdict::Pending),
        count(r, Verdict::Loss),
        count(r, Verdict::Duplicates)
    );
    for t in &r.topics {
        let rows: Vec<&WindowRow> = r.windows.iter().filter(|w| w.topic == t.topic).collect();
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(
            out,
            "<section class=\"topic\">\n<h2>{}</h2>\n<p>producing: {}</p>",
            esc(&t.topic),
            esc(&t.producing.join(" + "))
        );
        out.push_str(&chart(&t.topic, &t.tiers, &rows));
        out.push_str("<table>\n<tr><th>window (UTC)</th>");
        for tier in &t.tiers {
            let _ = write!(out, "<th>{}</th>", esc(tier));
        }
        out.push_str("<th>verdict</th></tr>\n");
        for w in rows {
            let _ = write!(out, "<tr class=\"{}\"><td class=\"l\">{}</td>", w.verdict.as_str(), esc(&w.window_start_utc));
            for tier in &t.tiers {
                let _ = write!(out, "<td>{}</td>", esc(&cell(w, tier)));
            }
            let problems = if w.problems.is_empty() { String::new() } else { format!(" ({})", w.problems.join(", ")) };
            let _ = writeln!(out, "<td class=\"l\">{}{}</td></tr>", w.verdict.as_str(), esc(&problems));
        }
        out.push_str("</table>\n</section>\n");
    }
    out.push_str("</body>\n</html>\n");
    out
}

fn count(r: &Report, v: Verdict) -> usize {
    r.windows.iter().filter(|w| w.verdict == v).count()
}
