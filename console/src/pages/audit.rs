//! `/ui/audit`: the audit report (every tier's counts per topic and window, compared with
//! the producing tiers), a chart per topic with one series per tier, and the windows with
//! loss or duplication highlighted and listed first, each linking to its counts.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use fjord_audit::{ReportConfig, Verdict, WindowRow};
use fjord_auth::{Operation, Resource};
use maud::{html, PreEscaped};
use serde::Deserialize;

use crate::layout::{count, enc, error_box, page, Nav, BASE};
use crate::{Caller, Console, Error, Result};

#[derive(Debug, Default, Deserialize)]
pub(crate) struct AuditQuery {
    /// Topics matching this regular expression.
    #[serde(default)]
    topics: String,
    /// Windows from: an age (`6h`, `2d`), `YYYY-MM-DDTHH:MMZ` or `@MILLIS`.
    #[serde(default)]
    since: String,
    /// Grace period in seconds (default the report's 15 minutes).
    #[serde(default)]
    grace_s: String,
}

fn config(c: &Console, q: &AuditQuery) -> Result<ReportConfig> {
    let mut config = ReportConfig::new(c.config.client.clone());
    config.window = c.config.audit_window;
    config.read_timeout = c.config.timeout;
    if !q.topics.trim().is_empty() {
        config = config.with_topics(q.topics.trim()).map_err(|e| Error::BadInput { field: "topics", reason: e.to_string() })?;
    }
    if !q.since.trim().is_empty() {
        let since = fjord_audit::time::parse_since(q.since.trim(), fjord_record::now_ms())
            .map_err(|e| Error::BadInput { field: "since", reason: e.to_string() })?;
        config.since_ms = Some(since);
    }
    if !q.grace_s.trim().is_empty() {
        let s: u64 = q
            .grace_s
            .trim()
            .parse()
            .map_err(|_| Error::BadInput { field: "grace_s", reason: format!("{:?} is not a number of seconds", q.grace_s) })?;
        config.grace = Duration::from_secs(s);
    }
    Ok(config)
}

fn anchor(w: &WindowRow) -> String {
    format!("w-{}-{}", enc(&w.topic), w.window_start)
}

pub(crate) async fn report(
    State(c): State<Arc<Console>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<AuditQuery>,
) -> Result<Response> {
    caller.check(&c, Operation::Read, Resource::topic(fjord_audit::AUDIT_TOPIC))?;
    let config = config(&c, &q)?;
    let report = fjord_audit::collect(&config).await;
    let form = html! {
        form.browse method="get" action={ (BASE) "/audit" } {
            label { "Topics (regex) " input name="topics" value=(q.topics); }
            label { "Since " input name="since" placeholder="6h, 2d, 2026-01-01T00:00Z" value=(q.since); }
            label { "Grace (s) " input name="grace_s" type="number" min="0" placeholder=(config.grace.as_secs()) value=(q.grace_s); }
            button type="submit" { "Report" }
        }
    };
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            let e = Error::from(e);
            let body = html! { h1 { "Audit" } (form) (error_box(&e.to_string())) };
            return Ok((e.status(), page("Audit", Nav::Audit, body)).into_response());
        }
    };
    let windows_of = |v: Verdict| report.windows.iter().filter(|w| w.verdict == v).count();
    let problems: Vec<&WindowRow> =
        report.windows.iter().filter(|w| matches!(w.verdict, Verdict::Loss | Verdict::Duplicates)).collect();
    let body = html! {
        h1 { "Audit" }
        (form)
        p.summary {
            (report.windows.len()) " windows of " (report.window_ms / 60_000) " min: "
            span.badge.ok { (windows_of(Verdict::Complete)) " complete" } " "
            span.badge.warn { (windows_of(Verdict::Pending)) " pending" } " "
            span.badge.bad #loss-count { (windows_of(Verdict::Loss)) " loss" } " "
            span.badge.dup { (windows_of(Verdict::Duplicates)) " duplicates" }
            " · " (count(report.audit_records as i64)) " audit records"
            @if report.replays_ignored > 0 { ", " (report.replays_ignored) " replays ignored" }
            @if report.malformed_skipped > 0 { ", " (report.malformed_skipped) " malformed skipped" }
        }
        @if !problems.is_empty() {
            section.problems #problems {
                h2 { "Loss and duplication" }
                ul {
                    @for w in &problems {
                        li.(w.verdict.as_str()) {
                            a href={ "#" (anchor(w)) } { (w.topic) " · " (w.window_start_utc) }
                            " · " (w.verdict.as_str()) ": "
                            (w.problems.iter().map(|t| format!("{t} {:+}", w.differences.get(t).copied().unwrap_or(0))).collect::<Vec<_>>().join(", "))
                            " (produced " (w.produced) ")"
                        }
                    }
                }
            }
        }
        @if !report.gaps.is_empty() {
            h2 { "Known gaps (mirror)" }
            table {
                thead { tr { th { "topic" } th.num { "partition" } th.num { "first offset" } th.num { "last offset" } th.num { "records" } } }
                tbody {
                    @for g in &report.gaps {
                        tr.loss { td { (g.topic) } td.num { (g.partition) } td.num { (g.first_offset) } td.num { (g.last_offset) } td.num { (g.records) } }
                    }
                }
            }
        }
        @for t in &report.topics {
            @let rows: Vec<&WindowRow> = report.windows.iter().filter(|w| w.topic == t.topic).collect();
            @if !rows.is_empty() {
                section.topic {
                    h2 { (t.topic) }
                    p.hint { "Reference: " (t.producing.join(" + ")) }
                    // The audit's own renderer escapes every name it draws.
                    div.chart { (PreEscaped(fjord_audit::render::chart(&t.topic, &t.tiers, &rows))) }
                    table.audit {
                        thead { tr {
                            th { "window (UTC)" }
                            @for tier in &t.tiers { th.num { (tier) } }
                            th { "verdict" }
                        } }
                        tbody {
                            @for w in &rows {
                                tr.(w.verdict.as_str()) #(anchor(w)) {
                                    td { (w.window_start_utc) }
                                    @for tier in &t.tiers {
                                        @let n = w.counts.get(tier).copied().unwrap_or(0);
                                        @let diff = w.differences.get(tier).copied().unwrap_or(0);
                                        td.num.(if w.problems.contains(tier) { "off" } else { "" }) {
                                            (n) @if diff != 0 { " (" (format!("{diff:+}")) ")" }
                                        }
                                    }
                                    td { (w.verdict.as_str()) }
                                }
                            }
                        }
                    }
                }
            }
        }
        @if report.windows.is_empty() { p { "No audit records yet (tiers publish their counts to " code { (fjord_audit::AUDIT_TOPIC) } ")." } }
    };
    Ok((StatusCode::OK, page("Audit", Nav::Audit, body)).into_response())
}
