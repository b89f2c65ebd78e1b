//! `/ui/groups` (every group with its state, members and total lag) and `/ui/groups/<id>`
//! (members and assignment, lag per partition, live over Server-Sent Events, and resetting
//! the committed offsets of an empty group).

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use fjord_auth::{Operation, Resource};
use fjord_client::{OffsetSpec, TopicPartition};
use futures::Stream;
use maud::{html, Markup, PreEscaped};
use serde::Deserialize;

use crate::brokers::{lag, GroupLag};
use crate::history::LagSample;
use crate::layout;
use crate::layout::{count, enc, error_box, notice, page, Nav, BASE};
use crate::{Caller, Console, Error, Result};

/// How often the live lag is sent.
const LAG_INTERVAL: Duration = Duration::from_secs(2);
/// A live lag stream ends after this (the browser's EventSource reconnects), so a tab
/// left open does not hold a task forever if its connection is never seen to close.
const LAG_STREAM_LIFETIME: Duration = Duration::from_secs(600);

/// Keeps only the partitions of topics the caller may see.
fn visible(c: &Console, caller: &Caller, mut g: GroupLag) -> GroupLag {
    g.partitions.retain(|(tp, _, _)| caller.may(c, Operation::Describe, Resource::topic(&tp.topic)));
    g
}

pub(crate) async fn list(State(c): State<Arc<Console>>, Extension(caller): Extension<Caller>) -> Result<Markup> {
    let groups: Vec<(String, String)> = c
        .brokers
        .list_groups()
        .await?
        .into_iter()
        .filter(|(g, _)| caller.may(&c, Operation::Describe, Resource::group(g)))
        .collect();
    let ids: Vec<String> = groups.iter().map(|(g, _)| g.clone()).collect();
    let lags = c.brokers.groups_lag(&ids, true).await?;
    let body = html! {
        h1 { "Consumer groups" }
        p.tools { input #filter type="search" placeholder="Filter groups" aria-label="Filter groups" data-filter="groups"; }
        table #groups {
            thead { tr { th { "group" } th { "state" } th.num { "members" } th { "topics" } th.num { "partitions" } th.num { "lag" } } }
            tbody {
                @for ((id, state), (_, lag)) in groups.iter().zip(lags) {
                    tr data-name=(id) {
                        td { a href={ (BASE) "/groups/" (enc(id)) } { (id) } }
                        td { (state) }
                        @match lag.map(|l| visible(&c, &caller, l)) {
                            Ok(l) => {
                                @let topics: BTreeSet<&str> = l.partitions.iter().map(|(tp, _, _)| tp.topic.as_str()).collect();
                                td.num { (l.description.as_ref().map_or(0, |d| d.members.len())) }
                                td { (topics.into_iter().collect::<Vec<_>>().join(", ")) }
                                td.num { (l.partitions.len()) }
                                td.num.lag { (count(l.total_lag())) }
                            }
                            Err(e) => td colspan="4" { (error_box(&e.to_string())) },
                        }
                    }
                }
            }
        }
        @if groups.is_empty() { p { "No consumer groups." } }
    };
    Ok(page("Groups", Nav::Groups, body))
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct GroupQuery {
    reset: Option<String>,
}

pub(crate) async fn group(
    State(c): State<Arc<Console>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(q): Query<GroupQuery>,
) -> Result<Markup> {
    group_page(&c, &caller, &id, q.reset.as_deref().map(|n| format!("Reset {n} committed offsets.")), None).await
}

async fn one(c: &Console, caller: &Caller, id: &str) -> Result<GroupLag> {
    caller.check(c, Operation::Describe, Resource::group(id))?;
    let lag = c.brokers.groups_lag(&[id.to_string()], true).await?.pop().map(|(_, r)| r);
    let lag = lag.unwrap_or_else(|| Err(Error::NotFound { kind: "group", name: id.to_string() }))?;
    // Every topic's lag is remembered; each page sums the ones its caller may see.
    let mut topics: BTreeMap<String, i64> = BTreeMap::new();
    for (tp, committed, end) in &lag.partitions {
        *topics.entry(tp.topic.clone()).or_default() += crate::brokers::lag(*committed, *end);
    }
    c.history.record_lag(id, LagSample { at_ms: fjord_record::now_ms(), topics });
    Ok(visible(c, caller, lag))
}

/// The group's total lag over the last minutes (over the topics the caller may see), as
/// an SVG chart; `None` before there are two points.
fn lag_chart(c: &Console, caller: &Caller, id: &str) -> Option<String> {
    let points: Vec<(i64, Vec<u64>)> = c
        .history
        .lag(id)
        .iter()
        .map(|s| {
            let total: i64 =
                s.topics.iter().filter(|(t, _)| caller.may(c, Operation::Describe, Resource::topic(t))).map(|(_, l)| *l).sum();
            (s.at_ms, vec![total.max(0) as u64])
        })
        .collect();
    (points.len() >= 2).then(|| layout::series_chart(id, &["lag"], &points))
}

async fn group_page(c: &Console, caller: &Caller, id: &str, done: Option<String>, failure: Option<&Error>) -> Result<Markup> {
    let g = one(c, caller, id).await?;
    let owners: BTreeMap<&TopicPartition, &str> = g
        .description
        .iter()
        .flat_map(|d| d.members.iter())
        .flat_map(|m| m.assignment.iter().map(move |tp| (tp, m.member_id.as_str())))
        .collect();
    let topics: BTreeSet<&str> = g.partitions.iter().map(|(tp, _, _)| tp.topic.as_str()).collect();
    let body = html! {
        h1 { "Group " span.name { (id) } }
        @if let Some(d) = &done { (notice(d)) }
        p.summary {
            "State " strong #state { (g.state) }
            @if let Some(d) = &g.description { ", " (d.members.len()) " members, assignor " (if d.protocol.is_empty() { "-" } else { d.protocol.as_str() }) }
            ", total lag " strong #total-lag { (count(g.total_lag())) }
        }
        h2 { "Lag" }
        div.chart #lag-chart {
            @match lag_chart(c, caller, id) {
                // The audit's renderer escapes the group id it draws.
                Some(svg) => (PreEscaped(svg)),
                None => p.hint { "The lag over time appears as it is sampled (every few seconds while the console is open)." },
            }
        }
        table #lag data-stream={ (BASE) "/groups/" (enc(id)) "/lag" } {
            thead { tr { th { "topic" } th.num { "partition" } th.num { "committed" } th.num { "log end" } th.num { "lag" } th { "member" } } }
            tbody {
                @for (tp, committed, end) in &g.partitions {
                    tr data-tp={ (tp.topic) "/" (tp.partition) } {
                        td { a href={ (BASE) "/topics/" (enc(&tp.topic)) } { (tp.topic) } }
                        td.num { (tp.partition) }
                        td.num.committed { (committed) }
                        td.num.end { @if *end >= 0 { (end) } @else { "?" } }
                        td.num.lag { (lag(*committed, *end)) }
                        td { (owners.get(tp).copied().unwrap_or("-")) }
                    }
                }
            }
        }
        @if g.partitions.is_empty() { p { "No committed offsets." } }
        h2 { "Members" }
        @match &g.description {
            Some(d) if !d.members.is_empty() => {
                table #members {
                    thead { tr { th { "member" } th { "client id" } th { "host" } th { "assignment" } } }
                    tbody {
                        @for m in &d.members {
                            tr {
                                td { (m.member_id) @if let Some(i) = &m.group_instance_id { " (static: " (i) ")" } }
                                td { (m.client_id) }
                                td { (m.client_host) }
                                td { (m.assignment.iter().map(|tp| format!("{}-{}", tp.topic, tp.partition)).collect::<Vec<_>>().join(", ")) }
                            }
                        }
                    }
                }
            }
            _ => p { "No active members." },
        }
        h2 #reset { "Reset offsets" }
        @if let Some(e) = failure { (error_box(&e.to_string())) }
        p.hint { "Only while the group has no active members: stop its consumers first." }
        form.reset method="post" action={ (BASE) "/groups/" (enc(id)) "/reset" } data-confirm="Overwrite this group's committed offsets?" {
            label { "Topic "
                select name="topic" {
                    option value="" { "all of the group's topics" }
                    @for t in &topics { option value=(t) { (t) } }
                }
            }
            label { "To "
                select name="to" {
                    option value="earliest" { "earliest" }
                    option value="latest" { "latest" }
                    option value="timestamp" { "timestamp (ms)" }
                    option value="offset" { "offset" }
                }
            }
            label { "Value " input name="value" type="number" placeholder="for timestamp or offset"; }
            button.danger type="submit" { "Reset" }
        }
    };
    Ok(page(&format!("Group {id}"), Nav::Groups, body))
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ResetForm {
    #[serde(default)]
    topic: String,
    to: String,
    #[serde(default)]
    value: String,
}

/// What a reset asks for, checked.
fn reset_spec(form: &ResetForm) -> Result<ResetTo> {
    let value =
        || -> Result<i64> {
            form.value.trim().parse::<i64>().ok().filter(|v| *v >= 0).ok_or_else(|| Error::BadInput {
                field: "value",
                reason: format!("{:?} is not a non-negative number", form.value),
            })
        };
    Ok(match form.to.as_str() {
        "earliest" => ResetTo::Spec(OffsetSpec::Earliest),
        "latest" => ResetTo::Spec(OffsetSpec::Latest),
        "timestamp" => ResetTo::Spec(OffsetSpec::Timestamp(value()?)),
        "offset" => ResetTo::Offset(value()?),
        other => {
            return Err(Error::BadInput {
                field: "to",
                reason: format!("{other:?} is not earliest, latest, timestamp or offset"),
            })
        }
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ResetTo {
    Spec(OffsetSpec),
    Offset(i64),
}

pub(crate) async fn reset(
    State(c): State<Arc<Console>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Form(form): Form<ResetForm>,
) -> Response {
    let attempt = async {
        // Kafka's OffsetCommit rule: Read on the group and on each topic.
        caller.check(&c, Operation::Read, Resource::group(&id))?;
        let to = reset_spec(&form)?;
        let g = one(&c, &caller, &id).await?;
        let mut topics: BTreeSet<String> = g.partitions.iter().map(|(tp, _, _)| tp.topic.clone()).collect();
        let wanted = form.topic.trim();
        if !wanted.is_empty() {
            topics.retain(|t| t == wanted);
            if topics.is_empty() {
                topics.insert(wanted.to_string());
            }
        }
        if topics.is_empty() {
            return Err(Error::BadInput { field: "topic", reason: "the group has no committed offsets; name a topic".into() });
        }
        let mut offsets: Vec<(TopicPartition, i64)> = Vec::new();
        for t in &topics {
            caller.check(&c, Operation::Read, Resource::topic(t))?;
            match to {
                ResetTo::Spec(spec) => offsets.extend(c.brokers.topic_offsets(t, spec).await?),
                ResetTo::Offset(o) => {
                    offsets.extend(c.brokers.topic_offsets(t, OffsetSpec::Latest).await?.into_iter().map(|(tp, _)| (tp, o)))
                }
            }
        }
        c.brokers.reset_offsets(&id, &offsets).await?;
        Ok::<_, Error>(offsets.len())
    };
    match attempt.await {
        Ok(n) => Redirect::to(&format!("{BASE}/groups/{}?reset={n}", enc(&id))).into_response(),
        Err(e) => {
            let status = e.status();
            match group_page(&c, &caller, &id, None, Some(&e)).await {
                Ok(page) => (status, page).into_response(),
                Err(_) => e.into_response(),
            }
        }
    }
}

/// The live lag: an event `lag` every [`LAG_INTERVAL`] with the group's partitions as
/// JSON (`{"total":N,"state":S,"partitions":[{"tp":"topic/0","committed":..,"end":..,"lag":..}],"chart":SVG}`,
/// the chart null before it has two points),
/// or an event `failure` with the error's text when a round failed.
pub(crate) async fn lag_stream(
    State(c): State<Arc<Console>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Sse<impl Stream<Item = std::result::Result<Event, Infallible>>>> {
    caller.check(&c, Operation::Describe, Resource::group(&id))?;
    let started = tokio::time::Instant::now();
    let stream = futures::stream::unfold((c, caller, id, true), move |(c, caller, id, first)| async move {
        if started.elapsed() > LAG_STREAM_LIFETIME {
            return None;
        }
        if !first {
            tokio::time::sleep(LAG_INTERVAL).await;
        }
        let event = match one(&c, &caller, &id).await {
            Ok(g) => {
                let partitions: Vec<serde_json::Value> = g
                    .partitions
                    .iter()
                    .map(|(tp, committed, end)| {
                        serde_json::json!({
                            "tp": format!("{}/{}", tp.topic, tp.partition),
                            "committed": committed,
                            "end": end,
                            "lag": lag(*committed, *end),
                        })
                    })
                    .collect();
                let chart = lag_chart(&c, &caller, &id);
                let doc =
                    serde_json::json!({ "total": g.total_lag(), "state": g.state, "partitions": partitions, "chart": chart });
                Event::default().event("lag").data(doc.to_string())
            }
            Err(e) => Event::default().event("failure").data(e.to_string()),
        };
        Some((Ok(event), (c, caller, id, false)))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_forms_are_checked() {
        let f = |to: &str, value: &str| ResetForm { topic: String::new(), to: to.into(), value: value.into() };
        assert_eq!(reset_spec(&f("earliest", "")).unwrap(), ResetTo::Spec(OffsetSpec::Earliest));
        assert_eq!(
            reset_spec(&f("timestamp", "1700000000000")).unwrap(),
            ResetTo::Spec(OffsetSpec::Timestamp(1_700_000_000_000))
        );
        assert_eq!(reset_spec(&f("offset", "5")).unwrap(), ResetTo::Offset(5));
        assert!(matches!(reset_spec(&f("offset", "-1")), Err(Error::BadInput { field: "value", .. })));
        assert!(matches!(reset_spec(&f("offset", "")), Err(Error::BadInput { field: "value", .. })));
        assert!(matches!(reset_spec(&f("yesterday", "")), Err(Error::BadInput { field: "to", .. })));
    }
}
