//! Publishing over HTTP: Kafka REST Proxy v2 produce (`POST /topics/{topic}` and
//! `.../partitions/{p}`, embedded formats json, binary and avro) and bulk NDJSON
//! (`POST /v1/events/{topic}`).
//!
//! Both parse and check the whole body first (every record converted to its final bytes)
//! and publish only then, so a bad record anywhere refuses the request with nothing
//! produced. With `?atomic=true` the publish itself is all or nothing too: one
//! transaction over every partition the events go to (see `crate::atomic`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use bytes::Bytes;
use fjord_client::Acks;
use serde_json::{json, Value as Json};

use super::auth::Caller;
use super::{read_body, respond, Answer, V2_CONTENT_TYPE};
use crate::backend::{Delivered, Event};
use crate::idempotency::{self, Outcome, RequestHash};
use crate::service::{check_topic_name, parse_acks, Gateway};
use crate::{avro, Error, Result};

/// The embedded format of a v2 produce request, from its content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EmbeddedFormat {
    Json,
    Binary,
    Avro,
}

pub(crate) fn embedded_format(headers: &HeaderMap) -> Result<EmbeddedFormat> {
    let raw = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let media = raw.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    match media.as_str() {
        "application/vnd.kafka.json.v2+json" => Ok(EmbeddedFormat::Json),
        "application/vnd.kafka.binary.v2+json" => Ok(EmbeddedFormat::Binary),
        "application/vnd.kafka.avro.v2+json" => Ok(EmbeddedFormat::Avro),
        _ => Err(Error::UnsupportedMediaType(raw.to_string())),
    }
}

pub(crate) async fn v2_topic(
    State(g): State<Arc<Gateway>>,
    caller: Option<Extension<Caller>>,
    Path(topic): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let fut =
        keyed(&g, scope(&caller), "v2", &topic, None, &q, &headers, body, |body| v2(&g, topic.clone(), None, &q, &headers, body));
    respond(&g, "http_v2", fut).await
}

pub(crate) async fn v2_partition(
    State(g): State<Arc<Gateway>>,
    caller: Option<Extension<Caller>>,
    Path((topic, partition)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let fut = async {
        let p = Some(parse_partition(&topic, &partition)?);
        keyed(&g, scope(&caller), "v2", &topic, p, &q, &headers, body, |body| v2(&g, topic.clone(), p, &q, &headers, body)).await
    };
    respond(&g, "http_v2", fut).await
}

pub(crate) fn parse_partition(topic: &str, s: &str) -> Result<i32> {
    match s.parse::<i32>() {
        Ok(p) if p >= 0 => Ok(p),
        _ => Err(Error::UnknownPartition { topic: topic.to_string(), partition: s.parse().unwrap_or(-1) }),
    }
}

/// The parts of a v2 request body other than the records.
#[derive(Default)]
struct SchemaSpec {
    key_schema: Option<String>,
    key_schema_id: Option<i32>,
    value_schema: Option<String>,
    value_schema_id: Option<i32>,
}

fn opt_str(doc: &serde_json::Map<String, Json>, field: &str) -> Result<Option<String>> {
    match doc.get(field) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(Error::BadRequest { index: None, reason: format!("{field} must be a string, got {other}") }),
    }
}

fn opt_id(doc: &serde_json::Map<String, Json>, field: &str) -> Result<Option<i32>> {
    match doc.get(field) {
        None | Some(Json::Null) => Ok(None),
        Some(v) => match v.as_i64().and_then(|n| i32::try_from(n).ok()) {
            Some(id) => Ok(Some(id)),
            None => Err(Error::BadRequest { index: None, reason: format!("{field} must be an integer schema id, got {v}") }),
        },
    }
}

/// Resolves one side (key or value) of an Avro request to (id, schema), registering an
/// inline schema under `{topic}-{side}` as Confluent's REST Proxy does.
async fn avro_schema(
    g: &Gateway,
    topic: &str,
    side: &str,
    inline: Option<&str>,
    id: Option<i32>,
) -> Result<Option<(i32, Arc<apache_avro::Schema>)>> {
    match (id, inline) {
        (Some(id), _) => Ok(Some((id, g.schema_by_id(id).await?))),
        (None, Some(text)) => Ok(Some(g.register(&format!("{topic}-{side}"), text).await?)),
        (None, None) => Ok(None),
    }
}

async fn v2(
    g: &Gateway,
    topic: String,
    partition: Option<i32>,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Answer> {
    let format = embedded_format(headers)?;
    let acks = parse_acks(q.get("acks").map(String::as_str))?;
    let atomic = parse_atomic(q, acks)?;
    let doc: Json =
        serde_json::from_slice(&body).map_err(|e| Error::BadRequest { index: None, reason: format!("malformed JSON: {e}") })?;
    let Json::Object(doc) = doc else {
        return Err(Error::BadRequest { index: None, reason: "the body must be a JSON object with \"records\"".into() });
    };
    let records = match doc.get("records") {
        Some(Json::Array(r)) => r,
        _ => return Err(Error::BadRequest { index: None, reason: "\"records\" must be an array".into() }),
    };
    let spec = SchemaSpec {
        key_schema: opt_str(&doc, "key_schema")?,
        key_schema_id: opt_id(&doc, "key_schema_id")?,
        value_schema: opt_str(&doc, "value_schema")?,
        value_schema_id: opt_id(&doc, "value_schema_id")?,
    };
    let (mut key_schema, mut value_schema) = (None, None);
    if format == EmbeddedFormat::Avro {
        let any = |field: &str| records.iter().any(|r| r.get(field).is_some_and(|v| !v.is_null()));
        key_schema = avro_schema(g, &topic, "key", spec.key_schema.as_deref(), spec.key_schema_id).await?;
        value_schema = avro_schema(g, &topic, "value", spec.value_schema.as_deref(), spec.value_schema_id).await?;
        if any("key") && key_schema.is_none() {
            return Err(Error::Unprocessable {
                index: None,
                reason: "records have keys but neither key_schema nor key_schema_id is given".into(),
            });
        }
        if any("value") && value_schema.is_none() {
            return Err(Error::Unprocessable {
                index: None,
                reason: "records have values but neither value_schema nor value_schema_id is given".into(),
            });
        }
    }
    let mut events = Vec::with_capacity(records.len());
    for (i, record) in records.iter().enumerate() {
        let Json::Object(record) = record else {
            return Err(Error::BadRequest { index: Some(i), reason: "a record must be a JSON object".into() });
        };
        let encode = |side: &str, schema: &Option<(i32, Arc<apache_avro::Schema>)>| -> Result<Option<Bytes>> {
            let v = match record.get(side) {
                None | Some(Json::Null) => return Ok(None),
                Some(v) => v,
            };
            Ok(Some(Bytes::from(match format {
                EmbeddedFormat::Json => {
                    serde_json::to_vec(v).map_err(|e| Error::BadRequest { index: Some(i), reason: e.to_string() })?
                }
                EmbeddedFormat::Binary => match v {
                    Json::String(s) => avro::base64_decode(s)
                        .map_err(|reason| Error::Unprocessable { index: Some(i), reason: format!("{side}: {reason}") })?,
                    other => {
                        return Err(Error::Unprocessable {
                            index: Some(i),
                            reason: format!("{side} must be a base64 string, got {other}"),
                        })
                    }
                },
                EmbeddedFormat::Avro => {
                    let (id, schema) = schema.as_ref().expect("checked above: a schema exists when a record has this side");
                    avro::encode(*id, schema, v, i)?
                }
            })))
        };
        let record_partition = match record.get("partition") {
            None | Some(Json::Null) => None,
            Some(v) => match v.as_i64().and_then(|n| i32::try_from(n).ok()) {
                Some(p) => Some(p),
                None => {
                    return Err(Error::Unprocessable { index: Some(i), reason: format!("partition must be an integer, got {v}") })
                }
            },
        };
        events.push(Event {
            key: encode("key", &key_schema)?,
            value: encode("value", &value_schema)?,
            headers: Vec::new(),
            timestamp_ms: None,
            partition: partition.or(record_partition),
        });
    }
    let bytes = events.iter().map(Event::encoded_size).sum();
    let count = events.len();
    let results = publish_events(g, &topic, events, acks, atomic).await?;
    let offsets: Vec<Json> = results
        .iter()
        .map(|r| match r {
            Ok(d) => json!({ "partition": d.partition, "offset": d.offset, "error_code": null, "error": null }),
            // v2's per-record error: 1 retriable, 2 not.
            Err(e) => json!({
                "partition": null, "offset": null,
                "error_code": if e.http_status() == 503 { 1 } else { 2 },
                "error": e.to_string(),
            }),
        })
        .collect();
    let body = json!({
        "offsets": offsets,
        "key_schema_id": key_schema.map(|(id, _)| id),
        "value_schema_id": value_schema.map(|(id, _)| id),
    });
    Ok(Answer { body, content_type: V2_CONTENT_TYPE, events: count, bytes })
}

pub(crate) async fn ndjson(
    State(g): State<Arc<Gateway>>,
    caller: Option<Extension<Caller>>,
    Path(topic): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let fut =
        keyed(&g, scope(&caller), "ndjson", &topic, None, &q, &headers, body, |body| bulk(&g, topic.clone(), &q, &headers, body));
    respond(&g, "http_ndjson", fut).await
}

/// `POST /v1/beacon/{topic}`: what `navigator.sendBeacon` sends when a page closes, an
/// NDJSON body as `text/plain` (the one type a beacon sends without a preflight). The
/// same parsing and options as `/v1/events`; a success is 204 with no body, since no page
/// reads a beacon's answer.
pub(crate) async fn beacon(
    State(g): State<Arc<Gateway>>,
    caller: Option<Extension<Caller>>,
    Path(topic): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let fut =
        keyed(&g, scope(&caller), "beacon", &topic, None, &q, &headers, body, |body| bulk(&g, topic.clone(), &q, &headers, body));
    let r = respond(&g, "http_beacon", fut).await;
    if r.status().is_success() {
        // Keep CORS headers the middleware adds later; drop only the JSON.
        return axum::http::StatusCode::NO_CONTENT.into_response();
    }
    r
}

/// Finds a dotted field path (`user.id`) in a JSON object.
fn field<'a>(doc: &'a Json, path: &str) -> Option<&'a Json> {
    path.split('.').try_fold(doc, |v, part| v.get(part))
}

/// Parses an NDJSON body into events: one JSON document per line (blank lines are
/// skipped, `\r\n` is accepted). Values keep the line's exact bytes unless a schema id asks
/// for Avro. Errors name the 0-based line.
pub(crate) fn parse_ndjson(
    body: &[u8],
    key_field: Option<&str>,
    schema: Option<(i32, &apache_avro::Schema)>,
    partition: Option<i32>,
) -> Result<Vec<Event>> {
    let events = parse_ndjson_with(body, key_field, schema, partition, |_, _, e| Err(e))?;
    if events.is_empty() {
        return Err(Error::BadRequest { index: None, reason: "the body holds no events".into() });
    }
    Ok(events)
}

/// [`parse_ndjson`] that hands each invalid line (0-based index, its bytes, why) to
/// `invalid`, which refuses the body by returning the error or sets the line aside.
pub(crate) fn parse_ndjson_with(
    body: &[u8],
    key_field: Option<&str>,
    schema: Option<(i32, &apache_avro::Schema)>,
    partition: Option<i32>,
    mut invalid: impl FnMut(usize, &[u8], Error) -> Result<()>,
) -> Result<Vec<Event>> {
    let mut events = Vec::new();
    for (i, line) in lines(body).enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match parse_line(i, line, key_field, schema, partition) {
            Ok(event) => events.push(event),
            Err(e) => invalid(i, line, e)?,
        }
    }
    Ok(events)
}

fn parse_line(
    i: usize,
    line: &[u8],
    key_field: Option<&str>,
    schema: Option<(i32, &apache_avro::Schema)>,
    partition: Option<i32>,
) -> Result<Event> {
    let malformed = |e: serde_json::Error| Error::BadRequest { index: Some(i), reason: format!("malformed JSON: {e}") };
    if key_field.is_none() && schema.is_none() {
        // Only the syntax matters: check it without building the document.
        serde_json::from_slice::<serde::de::IgnoredAny>(line).map_err(malformed)?;
        return Ok(Event { value: Some(Bytes::copy_from_slice(line.trim_ascii())), partition, ..Event::default() });
    }
    let doc: Json = serde_json::from_slice(line).map_err(malformed)?;
    let key = match key_field {
        None => None,
        Some(path) => match field(&doc, path) {
            None => return Err(Error::Unprocessable { index: Some(i), reason: format!("key field {path:?} is missing") }),
            Some(Json::Null) => None,
            Some(Json::String(s)) => Some(Bytes::from(s.clone())),
            Some(other) => Some(Bytes::from(other.to_string())),
        },
    };
    let value = match schema {
        Some((id, schema)) => Bytes::from(avro::encode(id, schema, &doc, i)?),
        None => Bytes::copy_from_slice(line.trim_ascii()),
    };
    Ok(Event { key, value: Some(value), headers: Vec::new(), timestamp_ms: None, partition })
}

/// The lines of `body`, found with memchr: a bytewise split was the gateway's largest
/// NDJSON cost in a profile (12% of `fjord dev` under 8 bulk posters).
fn lines(body: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut start = 0;
    memchr::memchr_iter(b'\n', body).map(Some).chain([None]).map(move |newline| {
        let end = newline.unwrap_or(body.len());
        let line = &body[start..end];
        start = end + 1;
        line
    })
}

/// `?atomic=true|false` (absent: false): whether the request's events are published in
/// one transaction. A transaction is acknowledged by every in-sync replica, so it needs
/// acks=all.
fn parse_atomic(q: &HashMap<String, String>, acks: Acks) -> Result<bool> {
    let atomic = match q.get("atomic").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(Error::BadRequest { index: None, reason: format!("atomic must be true or false, not {other:?}") })
        }
    };
    if atomic && acks != Acks::All {
        return Err(Error::BadRequest { index: None, reason: "atomic=true needs acks=all (the default)".into() });
    }
    Ok(atomic)
}

/// Publishes with `acks`, or in one transaction when `atomic`.
async fn publish_events(
    g: &Gateway,
    topic: &str,
    events: Vec<Event>,
    acks: Acks,
    atomic: bool,
) -> Result<Vec<Result<Delivered>>> {
    if atomic {
        Ok(g.publish_atomic(topic, events).await?.into_iter().map(Ok).collect())
    } else {
        g.publish(topic, events, acks).await
    }
}

/// Per-partition first/last offsets of a publish, for the NDJSON answer.
pub(crate) fn summarize(delivered: &[Delivered]) -> Vec<Json> {
    let mut by_partition: BTreeMap<i32, (i64, i64, usize)> = BTreeMap::new();
    for d in delivered {
        let e = by_partition.entry(d.partition).or_insert((d.offset, d.offset, 0));
        e.0 = e.0.min(d.offset);
        e.1 = e.1.max(d.offset);
        e.2 += 1;
    }
    by_partition
        .into_iter()
        .map(|(p, (first, last, count))| json!({ "partition": p, "first_offset": first, "last_offset": last, "count": count }))
        .collect()
}

/// All-or-error view of per-event results: the first failure names its event, and when
/// the broker refused some events and stored others (each event stands alone outside an
/// atomic request), the error says which were not stored, so a caller resends only those.
pub(crate) fn all_delivered(results: Vec<Result<Delivered>>) -> Result<Vec<Delivered>> {
    let total = results.len();
    let failed: Vec<usize> = results.iter().enumerate().filter(|(_, r)| r.is_err()).map(|(i, _)| i).collect();
    let mut out = Vec::with_capacity(total);
    let mut first_error = None;
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(d) => out.push(d),
            Err(e) => {
                first_error.get_or_insert((i, e));
            }
        }
    }
    let Some((i, e)) = first_error else { return Ok(out) };
    Err(match e {
        Error::Unavailable(m) => {
            Error::Unavailable(format!("event {i} (and up to {} after it) not acknowledged: {m}", failed.len() - 1))
        }
        e if out.is_empty() => Error::Unprocessable { index: Some(i), reason: format!("not produced: {e}") },
        e => {
            const NAMED: usize = 20;
            let mut list = failed.iter().take(NAMED).map(usize::to_string).collect::<Vec<_>>().join(", ");
            if failed.len() > NAMED {
                list.push_str(&format!(" and {} more", failed.len() - NAMED));
            }
            let reason =
                format!("not produced: {e} ({} of the {total} events were stored; not stored: events {list})", out.len());
            Error::Unprocessable { index: Some(i), reason }
        }
    })
}

/// The scope of the caller's idempotency keys (see [`Caller::key_scope`]); a router
/// served without the guard (unit tests) is anonymous.
fn scope(caller: &Option<Extension<Caller>>) -> String {
    caller.as_ref().map_or_else(String::new, |c| c.key_scope())
}

/// Runs a publish handler on the request body, once per `Idempotency-Key` when the
/// request carries one (see `idempotency`): a repeat gets the stored answer.
#[allow(clippy::too_many_arguments)] // the parts of one request, as the handlers hold them
async fn keyed<F, Fut>(
    g: &Gateway,
    scope: String,
    kind: &str,
    topic: &str,
    partition: Option<i32>,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
    body: Body,
    f: F,
) -> Result<Answer>
where
    F: FnOnce(Bytes) -> Fut,
    Fut: std::future::Future<Output = Result<Answer>>,
{
    // A bad key is refused before the body is read.
    let key = match headers.get(idempotency::HEADER) {
        None => None,
        Some(v) => {
            let k = v
                .to_str()
                .map_err(|_| Error::BadRequest { index: None, reason: "Idempotency-Key must be visible ASCII".into() })?;
            idempotency::check_key(k)?;
            Some(k)
        }
    };
    let body = read_body(g, headers, body).await?;
    let Some(key) = key else {
        return f(body).await;
    };
    // The request as the gateway understood it: the decoded body, so a gzip repeat of a
    // plain post is the same request.
    let mut hash = RequestHash::new();
    hash.part(kind.as_bytes()).part(topic.as_bytes()).part(&partition.map_or(-1i64, i64::from).to_be_bytes());
    let mut params: Vec<_> = q.iter().collect();
    params.sort();
    for (k, v) in params {
        hash.part(k.as_bytes()).part(v.as_bytes());
    }
    hash.part(headers.get(header::CONTENT_TYPE).map_or(&b""[..], |v| v.as_bytes())).part(&body);
    let hash = hash.finish();
    let run = g.key_store().await?.run(&scope, key, &hash, || async {
        let answer = f(body).await?;
        // Written straight from the answer, without a copy of its tree.
        let stored = StoredAnswerRef { content_type: answer.content_type, body: &answer.body };
        let stored = serde_json::value::to_raw_value(&stored).expect("invariant: an answer is JSON with string keys");
        Ok((stored, answer))
    });
    match run.await? {
        Outcome::Fresh(answer) => Ok(answer),
        Outcome::Stored(stored) => {
            let stored: StoredAnswer = serde_json::from_str(stored.get())
                .map_err(|_| Error::Unavailable("the stored answer of this Idempotency-Key is unreadable".into()))?;
            let content_type = if stored.content_type == V2_CONTENT_TYPE { V2_CONTENT_TYPE } else { "application/json" };
            Ok(Answer { body: stored.body, content_type, events: 0, bytes: 0 })
        }
    }
}

/// A keyed request's answer as its `done` record stores it.
#[derive(serde::Serialize)]
struct StoredAnswerRef<'a> {
    content_type: &'a str,
    body: &'a Json,
}

/// [`StoredAnswerRef`] read back by a repeat.
#[derive(serde::Deserialize)]
struct StoredAnswer {
    content_type: String,
    body: Json,
}

async fn bulk(g: &Gateway, topic: String, q: &HashMap<String, String>, headers: &HeaderMap, body: Bytes) -> Result<Answer> {
    let acks = parse_acks(q.get("acks").map(String::as_str))?;
    let atomic = parse_atomic(q, acks)?;
    let partition = q.get("partition").map(|p| parse_partition(&topic, p)).transpose()?;
    let schema_id = match q.get("schema_id") {
        None => None,
        Some(s) => Some(
            s.parse::<i32>()
                .map_err(|_| Error::BadRequest { index: None, reason: format!("schema_id must be an integer, not {s:?}") })?,
        ),
    };
    let dead_letter = match q.get("on_invalid").map(String::as_str) {
        None | Some("reject") => false,
        Some("dead_letter") => true,
        Some(other) => {
            return Err(Error::BadRequest {
                index: None,
                reason: format!("on_invalid must be reject or dead_letter, not {other:?}"),
            })
        }
    };
    if atomic && dead_letter {
        return Err(Error::BadRequest {
            index: None,
            reason: "atomic=true cannot be combined with on_invalid=dead_letter: an atomic request is all or nothing".into(),
        });
    }
    let schema = match schema_id {
        Some(id) => Some((id, g.schema_by_id(id).await?)),
        None => None,
    };
    let key_field = q.get("key").map(String::as_str);
    let schema = schema.as_ref().map(|(id, s)| (*id, &**s));
    if !dead_letter {
        let events = parse_ndjson(&body, key_field, schema, partition)?;
        let bytes = events.iter().map(Event::encoded_size).sum();
        let count = events.len();
        let delivered = all_delivered(publish_events(g, &topic, events, acks, atomic).await?)?;
        let body = json!({ "count": count, "partitions": summarize(&delivered), "value_schema_id": schema_id });
        return Ok(Answer { body, content_type: "application/json", events: count, bytes });
    }
    let dlq_topic = g.config.dead_letter_topic.clone().unwrap_or_else(|| format!("{topic}.dlq"));
    check_topic_name(&dlq_topic)?;
    let request_id = request_id(g, headers);
    let mut dead = Vec::new();
    // The dead letters' creation time, stamped here so the dead-letter tier counts them in
    // the window the gateway tier counts them (under the dead-letter topic).
    let created = fjord_record::now_ms();
    let events = parse_ndjson_with(&body, key_field, schema, partition, |i, line, e| {
        dead.push(dead_letter_event(&topic, &request_id, i, line, &e, created));
        Ok(())
    })?;
    if events.is_empty() && dead.is_empty() {
        return Err(Error::BadRequest { index: None, reason: "the body holds no events".into() });
    }
    let dead_count = dead.len();
    // Dead letters first: if they cannot be written the request fails before any valid
    // event is produced, and a retry loses nothing (at worst a dead letter twice).
    if !dead.is_empty() {
        all_delivered(g.publish(&dlq_topic, dead, acks).await?)?;
        if let Some(audit) = &g.dead_letter_audit {
            audit.record_n(&topic, created, dead_count as u64);
        }
    }
    let bytes = events.iter().map(Event::encoded_size).sum();
    let count = events.len();
    let delivered = if events.is_empty() { Vec::new() } else { all_delivered(g.publish(&topic, events, acks).await?)? };
    let body = json!({
        "count": count,
        "accepted": count,
        "dead_lettered": dead_count,
        "dead_letter_topic": dlq_topic,
        "request_id": request_id,
        "partitions": summarize(&delivered),
        "value_schema_id": schema_id,
    });
    Ok(Answer { body, content_type: "application/json", events: count, bytes })
}

/// Header names of a dead-letter record (its value is the line's raw bytes).
pub(crate) const DLQ_REASON: &str = fjord_audit::DEAD_LETTER_REASON_HEADER;
pub(crate) const DLQ_LINE: &str = "fjord.dlq.line";
pub(crate) const DLQ_REQUEST_ID: &str = "fjord.dlq.request_id";
pub(crate) const DLQ_TOPIC: &str = fjord_audit::DEAD_LETTER_TOPIC_HEADER;

/// The dead-letter record of line `index` (0-based; the header holds the 1-based line
/// number, as editors count): the raw bytes as value, the rest as headers, so the line is
/// kept byte for byte whatever it holds.
fn dead_letter_event(topic: &str, request_id: &str, index: usize, line: &[u8], e: &Error, created_ms: i64) -> Event {
    // The reason without the "record N: " prefix: the line has its own header.
    let reason = match e {
        Error::BadRequest { reason, .. } | Error::Unprocessable { reason, .. } => reason.clone(),
        e => e.to_string(),
    };
    let header = |k: &str, v: String| (k.to_string(), Some(Bytes::from(v)));
    Event {
        key: None,
        value: Some(Bytes::copy_from_slice(line)),
        headers: vec![
            header(DLQ_REASON, reason),
            header(DLQ_LINE, (index + 1).to_string()),
            header(DLQ_REQUEST_ID, request_id.to_string()),
            header(DLQ_TOPIC, topic.to_string()),
        ],
        timestamp_ms: Some(created_ms),
        partition: None,
    }
}

/// The caller's `X-Request-Id` when it sent a usable one, else one made here: this
/// gateway's host, the time and a counter, unique across gateways and restarts.
fn request_id(g: &Gateway, headers: &HeaderMap) -> String {
    if let Some(id) = headers.get("x-request-id").and_then(|v| v.to_str().ok()) {
        if !id.is_empty() && id.len() <= 128 {
            return id.to_string();
        }
    }
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}-{:x}-{n:x}", String::from_utf8_lossy(g.host()), fjord_record::now_ms())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::tests::serve;
    use crate::GatewayConfig;

    #[test]
    fn ndjson_lines_keys_and_errors() {
        let body = b"{\"user\":{\"id\":7},\"x\":1}\r\n\n  \n{\"user\":{\"id\":\"u8\"}}\n";
        let events = parse_ndjson(body, Some("user.id"), None, None).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].key.as_deref(), Some(&b"7"[..]));
        assert_eq!(events[1].key.as_deref(), Some(&b"u8"[..]));
        assert_eq!(events[0].value.as_deref(), Some(&b"{\"user\":{\"id\":7},\"x\":1}"[..]));
        let e = parse_ndjson(b"{}\n{}\n{bad\n", None, None, None).unwrap_err();
        assert_eq!((e.http_status(), e.record_index()), (400, Some(2)));
        let e = parse_ndjson(b"{\"a\":1}\n{\"b\":1}\n", Some("a"), None, None).unwrap_err();
        assert_eq!((e.http_status(), e.record_index()), (422, Some(1)));
        assert_eq!(parse_ndjson(b"\n\n", None, None, None).unwrap_err().http_status(), 400);
    }

    #[test]
    fn lines_split_at_every_newline_like_a_bytewise_split() {
        for body in [&b""[..], b"a", b"a\n", b"\n\n", b"a\r\nbc\n\nd", b"\nx"] {
            assert_eq!(lines(body).collect::<Vec<_>>(), body.split(|b| *b == b'\n').collect::<Vec<_>>(), "{body:?}");
        }
    }

    #[test]
    fn summary_gives_first_and_last_offsets_per_partition() {
        let d = |partition, offset| Delivered { partition, offset };
        let s = summarize(&[d(1, 10), d(0, 3), d(1, 11), d(1, 12)]);
        assert_eq!(
            s,
            vec![
                json!({"partition":0,"first_offset":3,"last_offset":3,"count":1}),
                json!({"partition":1,"first_offset":10,"last_offset":12,"count":3}),
            ]
        );
        let e = all_delivered(vec![Ok(d(0, 1)), Err(Error::Unavailable("x".into())), Err(Error::Unavailable("x".into()))])
            .unwrap_err();
        assert!(e.to_string().contains("event 1 (and up to 1 after it)"), "{e}");
        // Refused events among stored ones: the error names every one not stored.
        let refused = || Err(Error::Unprocessable { index: None, reason: "refused".into() });
        let e = all_delivered(vec![Ok(d(0, 1)), refused(), Ok(d(0, 2)), refused()]).unwrap_err();
        assert!(matches!(e, Error::Unprocessable { index: Some(1), .. }), "{e:?}");
        assert!(e.to_string().contains("2 of the 4 events were stored; not stored: events 1, 3"), "{e}");
        let e = all_delivered(vec![refused(), refused()]).unwrap_err();
        assert!(!e.to_string().contains("stored"), "nothing stored, nothing to say: {e}");
        let many: Vec<_> = (0..30).map(|i| if i == 0 { Ok(d(0, 0)) } else { refused() }).collect();
        assert!(all_delivered(many)
            .unwrap_err()
            .to_string()
            .contains("events 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20 and 9 more"));
    }

    #[tokio::test]
    async fn v2_formats_and_statuses() {
        let (url, g) = serve(GatewayConfig::default()).await;
        let http = reqwest::Client::new();
        let post = |path: &str, ct: &str, body: Json| {
            http.post(format!("{url}{path}")).header("content-type", ct).body(body.to_string()).send()
        };
        let json_ct = "application/vnd.kafka.json.v2+json";
        let r = post("/topics/t", json_ct, json!({"records":[{"key":"k","value":{"a":1}},{"value":[1,2]}]})).await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], V2_CONTENT_TYPE);
        let doc: Json = r.json().await.unwrap();
        assert_eq!(doc["offsets"].as_array().unwrap().len(), 2);
        assert_eq!(doc["offsets"][0]["error"], Json::Null);
        assert_eq!(doc["value_schema_id"], Json::Null);
        let r = post("/topics/t/partitions/2", "application/vnd.kafka.binary.v2+json", json!({"records":[{"value":"aGVsbG8="}]}))
            .await
            .unwrap();
        let doc: Json = r.json().await.unwrap();
        assert_eq!(doc["offsets"][0]["partition"], 2);
        let offset = doc["offsets"][0]["offset"].as_i64().unwrap();
        let stored = g
            .backend
            .fetch(crate::backend::FetchQuery {
                topic: "t".into(),
                partition: 2,
                offset,
                max_bytes: 100,
                max_wait: Default::default(),
            })
            .await
            .unwrap();
        assert_eq!(stored.records[0].value.as_deref(), Some(&b"hello"[..]));

        // Bad input: the status, the record index, and nothing produced.
        let before = g.backend.describe("t").await.unwrap();
        let cases: Vec<(&str, &str, String, u16, Option<usize>)> = vec![
            ("/topics/t", json_ct, "{\"records\":[".into(), 400, None),
            (
                "/topics/t",
                "application/vnd.kafka.binary.v2+json",
                json!({"records":[{"value":"aGk="},{"value":"***"}]}).to_string(),
                422,
                Some(1),
            ),
            ("/topics/t", "application/vnd.kafka.binary.v2+json", json!({"records":[{"value":5}]}).to_string(), 422, Some(0)),
            ("/topics/t", json_ct, json!({"records":[{"value":1}, 7]}).to_string(), 400, Some(1)),
            ("/topics/t", "text/plain", json!({"records":[]}).to_string(), 415, None),
            (
                "/topics/t",
                "application/vnd.kafka.avro.v2+json",
                json!({"value_schema":"\"string\"","records":[{"value":"x"}]}).to_string(),
                422,
                None,
            ),
            ("/topics/t/partitions/9", json_ct, json!({"records":[{"value":1}]}).to_string(), 404, None),
            ("/topics/t/partitions/x", json_ct, json!({"records":[{"value":1}]}).to_string(), 404, None),
            ("/topics/missing", json_ct, json!({"records":[{"value":1}]}).to_string(), 404, None),
        ];
        for (path, ct, body, status, index) in cases {
            let r = http.post(format!("{url}{path}")).header("content-type", ct).body(body.clone()).send().await.unwrap();
            assert_eq!(r.status().as_u16(), status, "{path} {ct} {body}");
            let doc: Json = r.json().await.unwrap();
            assert_eq!(doc["record_index"].as_u64().map(|i| i as usize), index, "{body}: {doc}");
            assert!(doc["error_code"].as_u64().unwrap() / 100 == u64::from(status), "{doc}");
        }
        assert_eq!(g.backend.describe("t").await.unwrap(), before, "nothing of the bad requests was produced");
    }

    #[tokio::test]
    async fn ndjson_endpoint_answers_count_and_offsets() {
        let (url, g) = serve(GatewayConfig::default()).await;
        let http = reqwest::Client::new();
        let body = "{\"id\":\"a\"}\n{\"id\":\"b\"}\n{\"id\":\"a\"}\n";
        let r = http.post(format!("{url}/v1/events/clicks?key=id")).body(body).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let doc: Json = r.json().await.unwrap();
        assert_eq!(doc["count"], 3);
        let total: u64 = doc["partitions"].as_array().unwrap().iter().map(|p| p["count"].as_u64().unwrap()).sum();
        assert_eq!(total, 3);
        let r = http.post(format!("{url}/v1/events/clicks?key=id")).body("{\"id\":1}\n{\"nokey\":1}\n").send().await.unwrap();
        assert_eq!(r.status(), 422);
        let r = http.post(format!("{url}/v1/events/clicks?schema_id=3")).body("{}").send().await.unwrap();
        assert_eq!(r.status(), 422, "no registry configured");
        let r = http.post(format!("{url}/v1/events/clicks?acks=7")).body("{}").send().await.unwrap();
        assert_eq!(r.status(), 400);
        let latest: i64 = g.backend.describe("clicks").await.unwrap().iter().map(|p| p.latest_offset).sum();
        assert_eq!(latest, 3);
    }

    #[tokio::test]
    async fn beacon_answers_204_and_dead_letter_mode_sets_bad_lines_aside() {
        let (url, g) = serve(GatewayConfig::default()).await;
        let http = reqwest::Client::new();
        let r = http
            .post(format!("{url}/v1/beacon/pages"))
            .header("content-type", "text/plain;charset=UTF-8")
            .body("{\"p\":\"/a\"}\n{\"p\":\"/b\"}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204);
        assert!(r.bytes().await.unwrap().is_empty());
        let r = http.post(format!("{url}/v1/beacon/pages")).body("{bad").send().await.unwrap();
        assert_eq!(r.status(), 400, "a beacon's errors are answered like /v1/events'");

        let body = "{\"a\":1}\n{oops\n\n{\"a\":2}\n[1,\n";
        let r = http.post(format!("{url}/v1/events/dl?on_invalid=dead_letter")).body(body).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let doc: Json = r.json().await.unwrap();
        assert_eq!((doc["accepted"].as_u64(), doc["dead_lettered"].as_u64()), (Some(2), Some(2)), "{doc}");
        let log = g.backend.fetch(crate::backend::FetchQuery {
            topic: "dl.dlq".into(),
            partition: 0,
            offset: -2,
            max_bytes: 1 << 20,
            max_wait: std::time::Duration::ZERO,
        });
        let dead = log.await.unwrap().records;
        let header = |r: &crate::backend::FetchedRecord, k: &str| {
            r.headers.iter().find(|(n, _)| n == k).and_then(|(_, v)| v.clone()).map(|v| String::from_utf8(v.to_vec()).unwrap())
        };
        assert_eq!(dead.len(), 2);
        assert_eq!(dead[0].value.as_deref(), Some(&b"{oops"[..]));
        assert_eq!(header(&dead[0], DLQ_LINE).as_deref(), Some("2"));
        assert_eq!(header(&dead[1], DLQ_LINE).as_deref(), Some("5"));
        assert!(header(&dead[1], DLQ_REASON).unwrap().starts_with("malformed JSON"));
        assert_eq!(header(&dead[0], DLQ_REQUEST_ID).as_deref(), doc["request_id"].as_str());
        // Only bad lines: nothing for the topic, both set aside, still a 200.
        let r = http.post(format!("{url}/v1/events/dl?on_invalid=dead_letter")).body("x\ny\n").send().await.unwrap();
        let doc: Json = r.json().await.unwrap();
        assert_eq!((doc["accepted"].as_u64(), doc["dead_lettered"].as_u64()), (Some(0), Some(2)), "{doc}");
        let r = http.post(format!("{url}/v1/events/dl?on_invalid=dead_letter")).body("\n").send().await.unwrap();
        assert_eq!(r.status(), 400, "an empty body is still an error");
    }
}
