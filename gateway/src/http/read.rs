//! Reading over HTTP: the paper's stateless pull
//! (`GET /v1/topics/{topic}/partitions/{p}/records?offset=&max_bytes=&max_wait_ms=&format=`)
//! and topic metadata (`GET /topics`, `GET /topics/{topic}`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::response::Response;
use base64::Engine;
use bytes::Bytes;
use serde_json::{json, Value as Json};

use super::produce::parse_partition;
use super::{respond, Answer};
use crate::backend::{FetchQuery, Fetched};
use crate::service::{check_topic_name, Gateway};
use crate::{Error, Result};

/// Default `max_bytes` of a fetch.
pub(crate) const DEFAULT_FETCH_BYTES: usize = 1024 * 1024;

/// How record bytes are shown in the JSON answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// base64 (the default: any bytes).
    Binary,
    /// UTF-8 text.
    Text,
    /// The value embedded as JSON (for events published as JSON); keys and headers as text.
    Json,
}

fn bad(reason: String) -> Error {
    Error::BadRequest { index: None, reason }
}

/// Parses a fetch's query string. Offsets: a number, `earliest` (-2) or `latest` (-1).
fn fetch_query(g: &Gateway, topic: String, partition: i32, q: &HashMap<String, String>) -> Result<(FetchQuery, Format)> {
    let offset = match q.get("offset").map(String::as_str) {
        None | Some("earliest") => -2,
        Some("latest") => -1,
        Some(s) => match s.parse::<i64>() {
            Ok(o) if o >= 0 => o,
            _ => return Err(bad(format!("offset must be a non-negative integer, earliest or latest, not {s:?}"))),
        },
    };
    let max_bytes = match q.get("max_bytes") {
        None => DEFAULT_FETCH_BYTES.min(g.config.max_fetch_bytes),
        Some(s) => match s.parse::<usize>() {
            Ok(n) if n > 0 && n <= g.config.max_fetch_bytes => n,
            _ => return Err(bad(format!("max_bytes must be in 1..={}, not {s:?}", g.config.max_fetch_bytes))),
        },
    };
    let max_wait = match q.get("max_wait_ms") {
        None => Duration::ZERO,
        Some(s) => match s.parse::<u64>().map(Duration::from_millis) {
            Ok(d) if d <= g.config.max_fetch_wait => d,
            _ => return Err(bad(format!("max_wait_ms must be in 0..={}, not {s:?}", g.config.max_fetch_wait.as_millis()))),
        },
    };
    let format = match q.get("format").map(String::as_str) {
        None | Some("binary") => Format::Binary,
        Some("text") => Format::Text,
        Some("json") => Format::Json,
        Some(other) => return Err(bad(format!("format must be binary, text or json, not {other:?}"))),
    };
    Ok((FetchQuery { topic, partition, offset, max_bytes, max_wait }, format))
}

fn show(bytes: &Option<Bytes>, format: Format, offset: i64, what: &str) -> Result<Json> {
    let Some(b) = bytes else {
        return Ok(Json::Null);
    };
    let not = |kind: &str, e: &dyn std::fmt::Display| Error::Unprocessable {
        index: None,
        reason: format!("{what} of the record at offset {offset} is not {kind} ({e}); ask with format=binary"),
    };
    Ok(match format {
        Format::Binary => Json::String(base64::engine::general_purpose::STANDARD.encode(b)),
        Format::Text => Json::String(std::str::from_utf8(b).map_err(|e| not("UTF-8", &e))?.to_string()),
        Format::Json => serde_json::from_slice(b).map_err(|e| not("JSON", &e))?,
    })
}

fn render(topic: &str, partition: i32, fetched: &Fetched, format: Format) -> Result<Json> {
    let mut records = Vec::with_capacity(fetched.records.len());
    for r in &fetched.records {
        // json embeds values; keys and headers are shown as text then (a key taken from an
        // NDJSON field is plain text, not JSON).
        let text_format = if format == Format::Json { Format::Text } else { format };
        let headers = r
            .headers
            .iter()
            .map(|(k, v)| Ok(json!({ "key": k, "value": show(v, text_format, r.offset, "a header")? })))
            .collect::<Result<Vec<_>>>()?;
        records.push(json!({
            "offset": r.offset,
            "timestamp": r.timestamp_ms,
            "key": show(&r.key, text_format, r.offset, "the key")?,
            "value": show(&r.value, format, r.offset, "the value")?,
            "headers": headers,
        }));
    }
    Ok(json!({
        "topic": topic,
        "partition": partition,
        "records": records,
        "next_offset": fetched.next_offset,
        "high_watermark": fetched.high_watermark,
    }))
}

pub(crate) async fn records(
    State(g): State<Arc<Gateway>>,
    Path((topic, partition)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let fut = async {
        check_topic_name(&topic)?;
        let partition = parse_partition(&topic, &partition)?;
        let (query, format) = fetch_query(&g, topic.clone(), partition, &q)?;
        let fetched = g.backend.fetch(query).await?;
        Ok(Answer::json(render(&topic, partition, &fetched, format)?))
    };
    respond(&g, "http_fetch", fut).await
}

pub(crate) async fn list_topics(State(g): State<Arc<Gateway>>, caller: Option<axum::Extension<super::auth::Caller>>) -> Response {
    respond(&g, "http_topics", async {
        let mut topics = g.backend.topics().await?;
        // As Kafka's Metadata: only the topics the caller may Describe.
        if let Some(axum::Extension(caller)) = &caller {
            topics.retain(|t| caller.may(&g, fjord_auth::Operation::Describe, t));
        }
        Ok(Answer::json(json!(topics)))
    })
    .await
}

pub(crate) async fn describe_topic(State(g): State<Arc<Gateway>>, Path(topic): Path<String>) -> Response {
    let fut = async {
        check_topic_name(&topic)?;
        let partitions: Vec<Json> = g
            .backend
            .describe(&topic)
            .await?
            .into_iter()
            .map(|p| {
                json!({
                    "partition": p.partition,
                    "leader": p.leader,
                    "replicas": p.replicas,
                    "in_sync_replicas": p.in_sync_replicas,
                    "earliest_offset": p.earliest_offset,
                    "latest_offset": p.latest_offset,
                })
            })
            .collect();
        Ok(Answer::json(json!({ "name": topic, "partitions": partitions })))
    };
    respond(&g, "http_topics", fut).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::tests::serve;
    use crate::GatewayConfig;

    #[tokio::test]
    async fn pull_by_offset_with_max_bytes_and_formats() {
        let (url, _g) = serve(GatewayConfig::default()).await;
        let http = reqwest::Client::new();
        let body = "{\"n\":0}\n{\"n\":1}\n{\"n\":2}\n";
        assert_eq!(http.post(format!("{url}/v1/events/p?partition=1")).body(body).send().await.unwrap().status(), 200);
        let get = |q: &str| http.get(format!("{url}/v1/topics/p/partitions/1/records?{q}")).send();
        let doc: Json = get("offset=0&format=json").await.unwrap().json().await.unwrap();
        assert_eq!(doc["records"].as_array().unwrap().len(), 3);
        assert_eq!(doc["records"][2]["value"], json!({"n":2}));
        assert_eq!(doc["next_offset"], 3);
        let host = doc["records"][0]["headers"].as_array().unwrap().iter().find(|h| h["key"] == "fjord.host").unwrap().clone();
        assert_eq!(host["value"], "gw-test");
        // max_bytes bounds the answer but one record always comes back.
        let doc: Json = get("offset=1&max_bytes=1&format=text").await.unwrap().json().await.unwrap();
        assert_eq!((doc["records"].as_array().unwrap().len(), doc["next_offset"].as_i64()), (1, Some(2)));
        assert_eq!(doc["records"][0]["value"], "{\"n\":1}");
        let doc: Json = get("offset=2").await.unwrap().json().await.unwrap();
        assert_eq!(doc["records"][0]["value"], base64::engine::general_purpose::STANDARD.encode("{\"n\":2}"));
        let doc: Json = get("offset=latest").await.unwrap().json().await.unwrap();
        assert_eq!((doc["records"].as_array().unwrap().len(), doc["next_offset"].as_i64()), (0, Some(3)));
        for (q, status) in
            [("offset=-5", 400), ("max_bytes=0", 400), ("max_wait_ms=999999999", 400), ("format=xml", 400), ("offset=99", 416)]
        {
            assert_eq!(get(q).await.unwrap().status().as_u16(), status, "{q}");
        }
        let topics: Json = http.get(format!("{url}/topics")).send().await.unwrap().json().await.unwrap();
        assert_eq!(topics, json!(["p"]));
        let t: Json = http.get(format!("{url}/topics/p")).send().await.unwrap().json().await.unwrap();
        assert_eq!(t["partitions"][1]["latest_offset"], 3);
    }
}
