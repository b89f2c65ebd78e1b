//! The OpenAPI 3.0 document of the HTTP endpoints (`GET /openapi.json`), kept beside the
//! code and checked by a test against the router's routes.

use serde_json::{json, Value};

fn error_response(description: &str) -> Value {
    json!({ "description": description, "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } })
}

fn path_param(name: &str, kind: &str, description: &str) -> Value {
    json!({ "name": name, "in": "path", "required": true, "schema": { "type": kind }, "description": description })
}

fn query_param(name: &str, kind: &str, description: &str) -> Value {
    json!({ "name": name, "in": "query", "required": false, "schema": { "type": kind }, "description": description })
}

/// The document.
pub(crate) fn document() -> Value {
    let idempotency_key = json!({
        "name": "Idempotency-Key", "in": "header", "required": false, "schema": { "type": "string", "maxLength": 255 },
        "description": "Written at most once within the idempotency window (24 h): a repeat gets the first answer and writes nothing; the same key for another request is 422.",
    });
    let topic = path_param("topic", "string", "Topic name ([a-zA-Z0-9._-], 1-249 characters).");
    let partition = path_param("partition", "integer", "Partition number.");
    let acks =
        query_param("acks", "string", "0, 1 or all (default all): how many replicas must have the events before the answer.");
    let atomic = query_param(
        "atomic",
        "boolean",
        "true: all events in one transaction, every one visible to read_committed consumers or none (needs acks=all).",
    );
    let produce_errors = json!({
        "400": error_response("Malformed JSON or request; record_index names the record."),
        "404": error_response("Unknown topic (auto-create off), partition or schema id."),
        "413": error_response("Body over the limit (default 10 MiB)."),
        "415": error_response("Unsupported Content-Type."),
        "422": error_response("A record cannot be produced (bad base64, Avro mismatch with the field path, missing key field)."),
        "429": error_response("Producer buffer full, or the client over its requests/s or bytes/s limit (error_code 42901); retry after the Retry-After header."),
        "503": error_response("Brokers unavailable within the bounded wait."),
    });
    let v2_body = json!({
        "required": true,
        "content": {
            "application/vnd.kafka.json.v2+json": { "schema": { "$ref": "#/components/schemas/V2ProduceRequest" } },
            "application/vnd.kafka.binary.v2+json": { "schema": { "$ref": "#/components/schemas/V2ProduceRequest" } },
            "application/vnd.kafka.avro.v2+json": { "schema": { "$ref": "#/components/schemas/V2ProduceRequest" } },
        }
    });
    let v2_ok = json!({ "description": "Offsets, one per record.", "content": { "application/vnd.kafka.v2+json": { "schema": { "$ref": "#/components/schemas/V2ProduceResponse" } } } });
    let mut v2_responses = produce_errors.clone();
    v2_responses["200"] = v2_ok;
    let mut ndjson_responses = produce_errors;
    ndjson_responses["200"] = json!({ "description": "Count and per-partition offsets.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/BulkResponse" } } } });
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "Fjord gateway",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Publish events into Fjord over HTTP (Kafka REST Proxy v2 and bulk NDJSON) and pull them by offset. Every event gets the headers fjord.host and fjord.created_ms unless it has them.",
        },
        "paths": {
            "/topics": { "get": {
                "summary": "List topics.",
                "responses": { "200": { "description": "Topic names.", "content": { "application/json": { "schema": { "type": "array", "items": { "type": "string" } } } } }, "503": error_response("Brokers unavailable.") },
            } },
            "/topics/{topic}": {
                "get": {
                    "summary": "Describe a topic: partitions, leaders, replicas, offsets.",
                    "parameters": [topic],
                    "responses": { "200": { "description": "The topic.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Topic" } } } }, "404": error_response("Unknown topic.") },
                },
                "post": {
                    "summary": "Kafka REST Proxy v2 produce; records are spread by key (murmur2) or their own partition.",
                    "parameters": [topic, acks, atomic, idempotency_key],
                    "requestBody": v2_body,
                    "responses": v2_responses,
                },
            },
            "/topics/{topic}/partitions/{partition}": { "post": {
                "summary": "Kafka REST Proxy v2 produce into one partition.",
                "parameters": [topic, partition, acks, atomic, idempotency_key],
                "requestBody": v2_body,
                "responses": v2_responses,
            } },
            "/v1/events/{topic}": { "post": {
                "summary": "Bulk NDJSON: one JSON event per line; the whole body is checked before anything is produced.",
                "parameters": [
                    topic,
                    acks,
                    query_param("key", "string", "Field (dotted path) whose value is the event key."),
                    query_param("schema_id", "integer", "Encode each line as Avro with this registry schema (Confluent framing)."),
                    query_param("partition", "integer", "Put every event in this partition."),
                    atomic,
                    idempotency_key,
                ],
                "requestBody": { "required": true, "content": { "application/x-ndjson": { "schema": { "type": "string" } } } },
                "responses": ndjson_responses,
            } },
            "/v1/beacon/{topic}": { "post": {
                "summary": "navigator.sendBeacon: an NDJSON body sent as text/plain, the options of /v1/events; 204 on success.",
                "parameters": [topic, acks, query_param("key", "string", "Field (dotted path) whose value is the event key."), atomic, idempotency_key],
                "requestBody": { "required": true, "content": { "text/plain": { "schema": { "type": "string" } } } },
                "responses": {
                    "204": { "description": "Every event produced." },
                    "400": error_response("A malformed line (record_index)."),
                    "403": error_response("The origin may not publish here (CORS)."),
                    "413": error_response("Body (as sent or decoded) too large."),
                },
            } },
            "/v1/topics/{topic}/partitions/{partition}/records": { "get": {
                "summary": "Stateless pull from an offset (the caller keeps its position).",
                "parameters": [
                    topic,
                    partition,
                    query_param("offset", "string", "First offset: a number, earliest (default) or latest."),
                    query_param("max_bytes", "integer", "Bound on record bytes (default 1 MiB); one record is returned even if larger."),
                    query_param("max_wait_ms", "integer", "Long poll: wait this long for a record when there is none (default 0)."),
                    query_param("format", "string", "binary (base64, default), text (UTF-8) or json (values embedded as JSON, keys and headers as text)."),
                ],
                "responses": {
                    "200": { "description": "Records and the next offset.", "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Records" } } } },
                    "400": error_response("Bad parameter."),
                    "404": error_response("Unknown topic or partition."),
                    "416": error_response("Offset out of range."),
                    "503": error_response("Brokers unavailable."),
                },
            } },
            "/healthz": { "get": { "summary": "Liveness.", "responses": { "200": { "description": "{\"status\":\"ok\"}" } } } },
            "/metrics": { "get": { "summary": "Prometheus text: requests, errors, events, bytes, latency histograms, buffer use.", "responses": { "200": { "description": "text/plain; version=0.0.4" } } } },
            "/openapi.json": { "get": { "summary": "This document.", "responses": { "200": { "description": "OpenAPI 3.0 JSON." } } } },
        },
        "components": { "schemas": {
            "Error": { "type": "object", "properties": {
                "error_code": { "type": "integer", "description": "HTTP status x 100 + detail (40300 origin refused; 40401 topic, 40402 partition, 40403 schema not found; 41501 content encoding; 42203 Avro mismatch)." },
                "message": { "type": "string" },
                "record_index": { "type": "integer", "description": "The record (v2) or 0-based line (NDJSON) at fault." },
            } },
            "V2ProduceRequest": { "type": "object", "required": ["records"], "properties": {
                "key_schema": { "type": "string" }, "key_schema_id": { "type": "integer" },
                "value_schema": { "type": "string" }, "value_schema_id": { "type": "integer" },
                "records": { "type": "array", "items": { "type": "object", "properties": {
                    "key": { "description": "JSON value, base64 string (binary) or Avro JSON." },
                    "value": { "description": "JSON value, base64 string (binary) or Avro JSON." },
                    "partition": { "type": "integer" },
                } } },
            } },
            "V2ProduceResponse": { "type": "object", "properties": {
                "offsets": { "type": "array", "items": { "type": "object", "properties": {
                    "partition": { "type": "integer", "nullable": true }, "offset": { "type": "integer", "nullable": true },
                    "error_code": { "type": "integer", "nullable": true }, "error": { "type": "string", "nullable": true },
                } } },
                "key_schema_id": { "type": "integer", "nullable": true },
                "value_schema_id": { "type": "integer", "nullable": true },
            } },
            "BulkResponse": { "type": "object", "properties": {
                "count": { "type": "integer" },
                "value_schema_id": { "type": "integer", "nullable": true },
                "partitions": { "type": "array", "items": { "type": "object", "properties": {
                    "partition": { "type": "integer" }, "first_offset": { "type": "integer" }, "last_offset": { "type": "integer" }, "count": { "type": "integer" },
                } } },
            } },
            "Records": { "type": "object", "properties": {
                "topic": { "type": "string" }, "partition": { "type": "integer" },
                "next_offset": { "type": "integer" }, "high_watermark": { "type": "integer" },
                "records": { "type": "array", "items": { "type": "object", "properties": {
                    "offset": { "type": "integer" }, "timestamp": { "type": "integer" },
                    "key": {}, "value": {},
                    "headers": { "type": "array", "items": { "type": "object", "properties": { "key": { "type": "string" }, "value": {} } } },
                } } },
            } },
            "Topic": { "type": "object", "properties": {
                "name": { "type": "string" },
                "partitions": { "type": "array", "items": { "type": "object", "properties": {
                    "partition": { "type": "integer" }, "leader": { "type": "integer" },
                    "replicas": { "type": "array", "items": { "type": "integer" } },
                    "in_sync_replicas": { "type": "array", "items": { "type": "integer" } },
                    "earliest_offset": { "type": "integer" }, "latest_offset": { "type": "integer" },
                } } },
            } },
        } },
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn documents_every_route_and_resolves_every_ref() {
        let doc = super::document();
        let paths = doc["paths"].as_object().unwrap();
        for p in [
            "/topics",
            "/topics/{topic}",
            "/topics/{topic}/partitions/{partition}",
            "/v1/events/{topic}",
            "/v1/beacon/{topic}",
            "/v1/topics/{topic}/partitions/{partition}/records",
            "/healthz",
            "/metrics",
            "/openapi.json",
        ] {
            assert!(paths.contains_key(p), "{p} is not documented");
        }
        let text = doc.to_string();
        for r in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = r.split('"').next().unwrap();
            assert!(doc["components"]["schemas"][name].is_object(), "dangling $ref {name}");
        }
    }
}
