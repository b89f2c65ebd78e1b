//! `/ui/topics` (the list, create, delete) and `/ui/topics/<name>` (partitions, configs
//! with their sources, and the message browser).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use fjord_auth::{Operation, Resource};
use maud::{html, Markup};
use serde::Deserialize;

use crate::brokers::{Browse, PartitionRow, Record, Sizes, Start, TopicRow, LIST_CONFIGS};
use crate::decode::{self, Shown};
use crate::history::RateSample;
use crate::layout::{self, count, enc, error_box, notice, page, Nav, BASE};
use crate::{Caller, Console, Error, Result};

/// Records shown by default, and at most, on a topic page.
const DEFAULT_LIMIT: usize = 20;
const MAX_LIMIT: usize = 200;

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ListQuery {
    /// Show internal topics too.
    #[serde(default)]
    internal: Option<String>,
    created: Option<String>,
    deleted: Option<String>,
}

/// The form of a new topic.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct NewTopicForm {
    name: String,
    #[serde(default)]
    partitions: String,
    #[serde(default)]
    replication: String,
    #[serde(default)]
    retention_ms: String,
    #[serde(default)]
    cleanup_policy: String,
}

pub(crate) async fn list(
    State(c): State<Arc<Console>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<ListQuery>,
) -> Result<Markup> {
    let mut notices = Vec::new();
    if let Some(t) = &q.created {
        notices.push(format!("Created topic {t}."));
    }
    if let Some(t) = &q.deleted {
        notices.push(format!("Deleted topic {t}."));
    }
    list_page(&c, &caller, q.internal.is_some(), &notices, None, &NewTopicForm::default()).await
}

/// The topic list, with `failure` (a refused create) above the form that caused it.
async fn list_page(
    c: &Console,
    caller: &Caller,
    internal: bool,
    notices: &[String],
    failure: Option<&Error>,
    form: &NewTopicForm,
) -> Result<Markup> {
    let metadata = c.brokers.metadata().await?;
    let mut visible: Vec<_> = metadata
        .topics
        .values()
        .filter(|t| {
            (internal || !is_internal(&t.name, t.is_internal)) && caller.may(c, Operation::Describe, Resource::topic(&t.name))
        })
        .cloned()
        .collect();
    visible.sort_by(|a, b| a.name.cmp(&b.name));
    let hidden = metadata.topics.values().filter(|t| is_internal(&t.name, t.is_internal)).count();
    let rows = c.brokers.with_offsets(&visible).await?;
    let names: Vec<String> = rows.iter().map(|r| r.name.clone()).collect();
    // Configs and sizes at once: each is bounded, and neither needs the other.
    let (configs, sizes) = tokio::join!(c.brokers.configs(&names, Some(&LIST_CONFIGS)), c.brokers.sizes(&metadata, &rows, false));
    let rates = c.history.rates().pop();
    let configs: HashMap<String, BTreeMap<String, String>> = match configs {
        Ok(all) => all
            .into_iter()
            .filter_map(|(t, r)| r.ok().map(|e| (t, e.into_iter().filter_map(|e| Some((e.name, e.value?))).collect())))
            .collect(),
        Err(e) => {
            tracing::debug!(error = %e, "topic configs for the list");
            HashMap::new()
        }
    };
    let body = html! {
        h1 { "Topics" }
        @for n in notices { (notice(n)) }
        p.tools {
            input #filter type="search" placeholder="Filter topics" aria-label="Filter topics" data-filter="topics";
            " "
            @if internal {
                a href={ (BASE) "/topics" } { "Hide internal topics" }
            } @else if hidden > 0 {
                a href={ (BASE) "/topics?internal=1" } { "Show " (hidden) " internal topics" }
            }
        }
        (sizes_failed(&sizes))
        table #topics {
            thead { tr {
                th { "topic" } th.num { "partitions" } th.num { "replication" } th.num { "records" }
                th.num { "size (leader copies)" } th.num { "messages/s" }
                th { "retention" } th { "cleanup" } th { "status" } th { span.sr { "actions" } }
            } }
            tbody {
                @for t in &rows {
                    @let cfg = configs.get(&t.name);
                    @let under = t.partitions.iter().filter(|p| p.under_replicated()).count();
                    @let offline = t.partitions.iter().filter(|p| p.offline()).count();
                    tr data-name=(t.name) {
                        td { a href={ (BASE) "/topics/" (enc(&t.name)) } { (t.name) } }
                        td.num { (t.partitions.len()) }
                        td.num { (t.replication()) }
                        td.num { (count(t.records())) }
                        td.num.size { (layout::size(sizes.topic(t))) }
                        td.num.rate { (messages_per_second(rates.as_ref(), &t.name)) }
                        td { (retention(cfg)) }
                        td { (cfg.and_then(|c| c.get("cleanup.policy")).map(String::as_str).unwrap_or("")) }
                        td {
                            @if offline > 0 { span.badge.bad { (offline) " offline" } }
                            @if under > 0 { span.badge.warn { (under) " under-replicated" } }
                            @if offline == 0 && under == 0 { span.badge.ok { "ok" } }
                        }
                        td {
                            @if caller.may(c, Operation::Delete, Resource::topic(&t.name)) {
                                form method="post" action={ (BASE) "/topics/" (enc(&t.name)) "/delete" } data-confirm={ "Delete topic " (t.name) " and all its records?" } {
                                    button.danger type="submit" { "Delete" }
                                }
                            }
                        }
                    }
                }
            }
        }
        @if rows.is_empty() { p { "No topics." } }
        h2 #create { "Create a topic" }
        @if let Some(e) = failure { (error_box(&e.to_string())) }
        form.create method="post" action={ (BASE) "/topics" } {
            label { "Name " input name="name" required pattern="[a-zA-Z0-9._\\-]{1,249}" value=(form.name); }
            label { "Partitions " input name="partitions" type="number" min="1" placeholder="broker default" value=(form.partitions); }
            label { "Replication " input name="replication" type="number" min="1" placeholder="broker default" value=(form.replication); }
            label { "Retention (ms) " input name="retention_ms" type="number" min="-1" placeholder="broker default" value=(form.retention_ms); }
            label { "Cleanup "
                select name="cleanup_policy" {
                    option value="" { "broker default" }
                    @for p in ["delete", "compact", "compact,delete"] {
                        option value=(p) selected[form.cleanup_policy == p] { (p) }
                    }
                }
            }
            button type="submit" { "Create" }
        }
    };
    Ok(page("Topics", Nav::Topics, body))
}

/// Records/s produced to `topic` in the latest rate sample; "—" until the sampler has
/// two samples (or when the topic is newer than the previous one).
fn messages_per_second(latest: Option<&RateSample>, topic: &str) -> String {
    match latest.and_then(|s| s.topics.get(topic)) {
        Some(r) if r.produce >= 10.0 => format!("{:.0}", r.produce),
        Some(r) => format!("{:.1}", r.produce),
        None => "—".into(),
    }
}

/// Which brokers' sizes are missing and why, above the table that shows "—" for them.
fn sizes_failed(sizes: &Sizes) -> Markup {
    html! {
        @for (broker, e) in &sizes.failed {
            @if *broker >= 0 {
                (error_box(&format!("Sizes of the partitions led by broker {broker} are not shown: {e}")))
            } @else {
                (error_box(&format!("Sizes are not shown: {e}")))
            }
        }
    }
}

/// Internal topics: flagged by the broker, or Fjord's own (`_audit`, `_gateway_idempotency`).
fn is_internal(name: &str, flagged: bool) -> bool {
    flagged || name.starts_with('_')
}

fn retention(cfg: Option<&BTreeMap<String, String>>) -> String {
    let Some(cfg) = cfg else { return String::new() };
    let time = cfg.get("retention.ms").map(|v| layout::millis(v));
    let size = cfg.get("retention.bytes").filter(|v| v.as_str() != "-1").map(|v| layout::bytes(v));
    match (time, size) {
        (Some(t), Some(s)) => format!("{t} / {s}"),
        (Some(t), None) => t,
        (None, Some(s)) => s,
        (None, None) => String::new(),
    }
}

fn parse_opt<T: std::str::FromStr>(field: &'static str, v: &str) -> Result<Option<T>> {
    let v = v.trim();
    if v.is_empty() {
        return Ok(None);
    }
    v.parse().map(Some).map_err(|_| Error::BadInput { field, reason: format!("{v:?} is not a number") })
}

fn new_topic(form: &NewTopicForm) -> Result<fjord_client::NewTopic> {
    let name = form.name.trim();
    if name.is_empty() || name.len() > 249 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(Error::BadInput {
            field: "name",
            reason: format!("{name:?} is not a topic name: 1 to 249 of a-z, A-Z, 0-9, '.', '_', '-'"),
        });
    }
    if name == "." || name == ".." {
        return Err(Error::BadInput { field: "name", reason: "\".\" and \"..\" are not topic names".into() });
    }
    let mut topic = fjord_client::NewTopic::new(name, parse_opt::<i32>("partitions", &form.partitions)?.unwrap_or(-1));
    topic.replication_factor = parse_opt::<i16>("replication", &form.replication)?.unwrap_or(-1);
    if let Some(ms) = parse_opt::<i64>("retention_ms", &form.retention_ms)? {
        topic.configs.insert("retention.ms".into(), ms.to_string());
    }
    let policy = form.cleanup_policy.trim();
    if !policy.is_empty() {
        if !matches!(policy, "delete" | "compact" | "compact,delete") {
            return Err(Error::BadInput { field: "cleanup_policy", reason: format!("{policy:?} is not a cleanup policy") });
        }
        topic.configs.insert("cleanup.policy".into(), policy.into());
    }
    Ok(topic)
}

pub(crate) async fn create(
    State(c): State<Arc<Console>>,
    Extension(caller): Extension<Caller>,
    Form(form): Form<NewTopicForm>,
) -> Response {
    let attempt = async {
        let topic = new_topic(&form)?;
        // Kafka's rule: Create on the cluster or on the topic.
        if !caller.may(&c, Operation::Create, Resource::cluster()) {
            caller.check(&c, Operation::Create, Resource::topic(&topic.name))?;
        }
        c.brokers.create_topic(topic.clone()).await?;
        Ok::<_, Error>(topic.name)
    };
    match attempt.await {
        Ok(name) => Redirect::to(&format!("{BASE}/topics/{}?created=1", enc(&name))).into_response(),
        Err(e) => {
            let status = e.status();
            match list_page(&c, &caller, false, &[], Some(&e), &form).await {
                Ok(page) => (status, page).into_response(),
                // The list itself failed too (the brokers are down): the create's error.
                Err(_) => e.into_response(),
            }
        }
    }
}

pub(crate) async fn delete(
    State(c): State<Arc<Console>>,
    Extension(caller): Extension<Caller>,
    Path(topic): Path<String>,
) -> Result<Response> {
    caller.check(&c, Operation::Delete, Resource::topic(&topic))?;
    c.brokers.delete_topic(&topic).await?;
    Ok(Redirect::to(&format!("{BASE}/topics?deleted={}", enc(&topic))).into_response())
}

/// A topic config to set.
#[derive(Debug, Deserialize)]
pub(crate) struct ConfigForm {
    name: String,
    value: String,
}

pub(crate) async fn alter_config(
    State(c): State<Arc<Console>>,
    Extension(caller): Extension<Caller>,
    Path(topic): Path<String>,
    Form(form): Form<ConfigForm>,
) -> Result<Response> {
    caller.check(&c, Operation::AlterConfigs, Resource::topic(&topic))?;
    let name = form.name.trim();
    if name.is_empty() {
        return Err(Error::BadInput { field: "name", reason: "a config name is required".into() });
    }
    c.brokers.alter_config(&topic, name, form.value.trim()).await?;
    Ok(Redirect::to(&format!("{BASE}/topics/{}?altered={}", enc(&topic), enc(name))).into_response())
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct TopicQuery {
    #[serde(default)]
    partition: String,
    #[serde(default)]
    offset: String,
    #[serde(default)]
    limit: String,
    #[serde(default)]
    timestamp: String,
    #[serde(default)]
    key: String,
    created: Option<String>,
    altered: Option<String>,
}

/// Where the browse starts: an offset, else a timestamp (ms since the epoch or
/// `YYYY-MM-DDTHH:MM[:SS]Z`), else the newest records.
fn start(q: &TopicQuery) -> Result<Start> {
    if let Some(o) = parse_opt::<i64>("offset", &q.offset)? {
        return Ok(Start::Offset(o));
    }
    let ts = q.timestamp.trim();
    if ts.is_empty() {
        return Ok(Start::Newest);
    }
    ts.parse::<i64>().ok().or_else(|| fjord_audit::time::parse_utc(ts)).map(Start::Timestamp).ok_or_else(|| Error::BadInput {
        field: "timestamp",
        reason: format!("{ts:?} is neither ms since the epoch nor YYYY-MM-DDTHH:MM[:SS]Z"),
    })
}

pub(crate) async fn topic(
    State(c): State<Arc<Console>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    Query(q): Query<TopicQuery>,
) -> Result<Response> {
    caller.check(&c, Operation::Describe, Resource::topic(&name))?;
    let metadata = c.brokers.topic(&name).await?;
    let row =
        c.brokers.with_offsets(&[metadata]).await?.pop().ok_or_else(|| Error::NotFound { kind: "topic", name: name.clone() })?;
    let sizes = c.brokers.sizes(&*c.brokers.metadata().await?, std::slice::from_ref(&row), true).await;
    let browse = Browse {
        partition: parse_opt::<i32>("partition", &q.partition)?,
        start: start(&q)?,
        limit: parse_opt::<usize>("limit", &q.limit)?.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT),
    };
    let configs = if caller.may(&c, Operation::DescribeConfigs, Resource::topic(&name)) {
        c.brokers.configs(std::slice::from_ref(&name), None).await.and_then(|mut v| {
            v.pop().map(|(_, r)| r.map_err(Error::broker("describe the topic's configs"))).unwrap_or_else(|| Ok(Vec::new()))
        })
    } else {
        Err(Error::Forbidden {
            principal: caller.principal.to_string(),
            operation: Operation::DescribeConfigs,
            kind: "topic",
            name: name.clone(),
        })
    };
    let records = if caller.may(&c, Operation::Read, Resource::topic(&name)) {
        match c.brokers.browse(&row, &browse).await {
            Ok(records) => Ok(shown(&c, records, q.key.trim()).await),
            Err(e) => Err(e),
        }
    } else {
        Err(Error::Forbidden {
            principal: caller.principal.to_string(),
            operation: Operation::Read,
            kind: "topic",
            name: name.clone(),
        })
    };
    let body = html! {
        h1 { "Topic " span.name { (row.name) } }
        @if q.created.is_some() { (notice(&format!("Created topic {}.", row.name))) }
        @if let Some(k) = &q.altered { (notice(&format!("Set {k}."))) }
        p.summary {
            (row.partitions.len()) " partitions, replication " (row.replication()) ", " (count(row.records())) " records"
        }
        h2 { "Partitions" }
        (sizes_failed(&sizes))
        (partitions_table(&row, &sizes))
        h2 #messages { "Messages" }
        (browser_form(&row, &browse, &q))
        @match &records {
            Ok(records) => (records_table(records, &row, &browse)),
            Err(e) => (error_box(&e.to_string())),
        }
        h2 { "Configs" }
        @match &configs {
            Ok(entries) => {
                table #configs {
                    thead { tr { th { "name" } th { "value" } th { "source" } } }
                    tbody {
                        @for e in entries {
                            tr.(if e.is_default { "default" } else { "override" }) {
                                td { (e.name) }
                                td { (e.value.as_deref().unwrap_or("(sensitive or unset)")) }
                                td { (e.source) }
                            }
                        }
                    }
                }
            }
            Err(e) => (error_box(&e.to_string())),
        }
        @if caller.may(&c, Operation::AlterConfigs, Resource::topic(&name)) {
            form.create method="post" action={ (BASE) "/topics/" (enc(&name)) "/configs" } {
                label { "Config " input name="name" required placeholder="retention.ms"; }
                label { "Value " input name="value" required; }
                button type="submit" { "Set" }
            }
        }
        @if caller.may(&c, Operation::Delete, Resource::topic(&name)) {
            form method="post" action={ (BASE) "/topics/" (enc(&name)) "/delete" } data-confirm={ "Delete topic " (name) " and all its records?" } {
                button.danger type="submit" { "Delete topic" }
            }
        }
    };
    let status = match &records {
        Err(e) if !matches!(e, Error::Forbidden { .. }) => e.status(),
        _ => StatusCode::OK,
    };
    Ok((status, page(&format!("Topic {name}"), Nav::Topics, body)).into_response())
}

fn partitions_table(topic: &TopicRow, sizes: &Sizes) -> Markup {
    let partitions: &[PartitionRow] = &topic.partitions;
    html! {
        table #partitions {
            thead { tr {
                th.num { "partition" } th.num { "leader" } th { "replicas" } th { "in sync" }
                th.num { "log start" } th.num { "log end" } th.num { "records" } th.num { "size (leader copy)" } th { "status" }
            } }
            tbody {
                @for p in partitions {
                    tr.(if p.offline() { "bad" } else if p.under_replicated() { "warn" } else { "" }) {
                        td.num { (p.partition) }
                        td.num { @if p.leader >= 0 { (p.leader) } @else { "none" } }
                        td { (layout::ids(&p.replicas)) }
                        td { (layout::ids(&p.isr)) }
                        @match p.offsets {
                            Some((s, e)) => { td.num { (s) } td.num { (e) } td.num { (count(e - s)) } }
                            None => { td.num { "-" } td.num { "-" } td.num { "-" } }
                        }
                        td.num.size { (layout::size(sizes.partition(&topic.name, p.partition))) }
                        td {
                            @if p.offline() {
                                "offline"
                                @if !p.offline_replicas.is_empty() { " (offline replicas " (layout::ids(&p.offline_replicas)) ")" }
                            } @else if p.under_replicated() { "under-replicated" } @else { "ok" }
                        }
                    }
                }
            }
        }
    }
}

fn browser_form(row: &TopicRow, browse: &Browse, q: &TopicQuery) -> Markup {
    html! {
        form.browse method="get" action={ (BASE) "/topics/" (enc(&row.name)) "#messages" } {
            label { "Partition "
                select name="partition" {
                    option value="" { "all" }
                    @for p in &row.partitions {
                        option value=(p.partition) selected[browse.partition == Some(p.partition)] { (p.partition) }
                    }
                }
            }
            label { "From offset " input name="offset" type="number" min="0" placeholder="newest" value=(q.offset); }
            label { "or from time " input name="timestamp" placeholder="2026-01-01T00:00Z or ms" value=(q.timestamp); }
            label { "Show " input name="limit" type="number" min="1" max=(MAX_LIMIT) value=(browse.limit); }
            label { "Key contains " input name="key" type="search" value=(q.key); }
            button type="submit" { "Browse" }
        }
    }
}

/// A record with its key, value and headers decoded for display.
pub(crate) struct ShownRecord {
    record: Record,
    key: Shown,
    value: Shown,
}

async fn shown(c: &Console, records: Vec<Record>, key_filter: &str) -> Vec<ShownRecord> {
    let mut out = Vec::with_capacity(records.len());
    for r in records {
        let key = decode::plain(r.key.as_deref());
        if !key_filter.is_empty() {
            let text = match &key {
                Shown::Text(s) | Shown::Json(s) => s.as_str(),
                _ => "",
            };
            if !text.contains(key_filter) {
                continue;
            }
        }
        let value = decode::value(c.registry.as_ref(), r.value.as_deref()).await;
        out.push(ShownRecord { record: r, key, value });
    }
    out
}

fn records_table(records: &[ShownRecord], row: &TopicRow, browse: &Browse) -> Markup {
    let newest_first = "newest first";
    html! {
        @if records.is_empty() {
            p { "No records in this range." }
        } @else {
            p.hint { (records.len()) " records, " (newest_first) "." }
            table #records {
                thead { tr { th.num { "partition" } th.num { "offset" } th { "timestamp (UTC)" } th { "key" } th { "value" } th { "headers" } } }
                tbody {
                    @for r in records {
                        tr {
                            td.num { (r.record.partition) }
                            td.num { (r.record.offset) }
                            td { (layout::time(r.record.timestamp)) }
                            td { (shown_cell(&r.key)) }
                            td.value data-kind=(r.value.kind()) { (shown_cell(&r.value)) }
                            td {
                                @if !r.record.headers.is_empty() {
                                    dl.headers {
                                        @for (k, v) in &r.record.headers {
                                            dt { (k) } dd { (decode::header(v.as_deref())) }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        @if let Some(p) = browse.partition {
            @if let Some(Some((start, end))) = row.partitions.iter().find(|x| x.partition == p).map(|x| x.offsets) {
                @let first = match browse.start {
                    Start::Offset(o) => o.clamp(start, end),
                    _ => records.iter().map(|r| r.record.offset).min().unwrap_or((end - browse.limit as i64).max(start)),
                };
                p.pager {
                    @if first > start {
                        a href={ (BASE) "/topics/" (enc(&row.name)) "?partition=" (p) "&offset=" ((first - browse.limit as i64).max(start)) "&limit=" (browse.limit) "#messages" } { "← older" }
                    }
                    " "
                    @if first + (browse.limit as i64) < end {
                        a href={ (BASE) "/topics/" (enc(&row.name)) "?partition=" (p) "&offset=" (first + browse.limit as i64) "&limit=" (browse.limit) "#messages" } { "newer →" }
                    }
                }
            }
        }
    }
}

fn shown_cell(s: &Shown) -> Markup {
    html! {
        @match s {
            Shown::Null => span.null { "null" },
            Shown::Avro { schema_id, json } => {
                span.kind { "avro · schema " (schema_id) }
                pre.avro { (json) }
            }
            Shown::BadAvro { schema_id, error, hex } => {
                span.kind.bad { "avro · schema " (schema_id) " · " (error) }
                pre.hex { (hex) }
            }
            Shown::Json(j) => { span.kind { "json" } pre.json { (j) } }
            Shown::Text(t) => { pre.text { (t) } }
            Shown::Hex(h) => { span.kind { "hex" } pre.hex { (h) } }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_topic_forms_are_checked() {
        let form = |name: &str, partitions: &str| NewTopicForm {
            name: name.into(),
            partitions: partitions.into(),
            ..Default::default()
        };
        assert_eq!(new_topic(&form("orders", "3")).unwrap().partitions, 3);
        assert_eq!(new_topic(&form("orders", "")).unwrap().partitions, -1);
        assert!(matches!(new_topic(&form("a b", "")), Err(Error::BadInput { field: "name", .. })));
        assert!(matches!(new_topic(&form("<script>", "")), Err(Error::BadInput { field: "name", .. })));
        assert!(matches!(new_topic(&form("..", "")), Err(Error::BadInput { field: "name", .. })));
        assert!(matches!(new_topic(&form("x", "three")), Err(Error::BadInput { field: "partitions", .. })));
        let t = new_topic(&NewTopicForm {
            name: "c".into(),
            retention_ms: "60000".into(),
            cleanup_policy: "compact".into(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(t.configs.get("retention.ms").map(String::as_str), Some("60000"));
        assert_eq!(t.configs.get("cleanup.policy").map(String::as_str), Some("compact"));
        let bad = NewTopicForm { name: "c".into(), cleanup_policy: "shred".into(), ..Default::default() };
        assert!(matches!(new_topic(&bad), Err(Error::BadInput { field: "cleanup_policy", .. })));
    }
}
