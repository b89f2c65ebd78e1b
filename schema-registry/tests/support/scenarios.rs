//! The API scenarios, each against a fresh registry over the given store; run over the
//! embedded store (tests/api.rs) and over a real ZooKeeper (tests/zookeeper.rs).

use fjord_coord::Store;
use fjord_schema_registry::RegistryConfig;
use serde_json::{json, Value};

use super::{record, register, Http, Registry};

pub const V1: &str = r#"{"type":"record","name":"R","namespace":"test","fields":[{"name":"a","type":"int"}]}"#;

pub fn v2() -> String {
    record(r#"{"name":"a","type":"int"},{"name":"b","type":"string","default":""}"#)
}

/// Every node under `/schemas`, with its data: the whole registry state.
async fn snapshot(store: &Store) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec!["/schemas".to_string()];
    while let Some(path) = stack.pop() {
        let Some((data, _)) = store.get(&path).await.unwrap() else { continue };
        out.push((path.clone(), data));
        for child in store.children(&path).await.unwrap() {
            stack.push(format!("{path}/{child}"));
        }
    }
    out.sort();
    out
}

pub async fn register_lookup_and_fetch_by_subject_version_and_id(store: Store) {
    let registry = Registry::start(store).await;
    let http = Http::new(&registry.url);

    assert_eq!(http.get("/").await.ok(), json!({}));
    assert_eq!(http.get("/subjects").await.ok(), json!([]));
    assert_eq!(http.get("/schemas/types").await.ok(), json!(["AVRO"]));

    assert_eq!(register(&http, "orders-value", V1).await.ok(), json!({"id": 1}));
    // The same schema spelled differently: same id, no new version.
    let respelled =
        r#"{ "fields": [{"type": {"type": "int"}, "name": "a"}], "namespace": "test", "name": "R", "type": "record" }"#;
    assert_eq!(register(&http, "orders-value", respelled).await.ok(), json!({"id": 1}));
    assert_eq!(http.get("/subjects/orders-value/versions").await.ok(), json!([1]));
    // The same schema under another subject: same global id.
    assert_eq!(register(&http, "payments-value", V1).await.ok(), json!({"id": 1}));
    assert_eq!(register(&http, "orders-value", &v2()).await.ok(), json!({"id": 2}));

    assert_eq!(http.get("/subjects").await.ok(), json!(["orders-value", "payments-value"]));
    assert_eq!(http.get("/subjects?subjectPrefix=pay").await.ok(), json!(["payments-value"]));
    assert_eq!(http.get("/subjects?offset=1&limit=1").await.ok(), json!(["payments-value"]));
    assert_eq!(http.get("/subjects?limit=1").await.ok(), json!(["orders-value"]));
    assert_eq!(http.get("/subjects/orders-value/versions").await.ok(), json!([1, 2]));

    let canonical_v1 = http.get("/schemas/ids/1").await.ok()["schema"].as_str().unwrap().to_string();
    assert_eq!(serde_json::from_str::<Value>(&canonical_v1).unwrap(), serde_json::from_str::<Value>(V1).unwrap());
    let v = http.get("/subjects/orders-value/versions/1").await.ok();
    assert_eq!(v, json!({"subject": "orders-value", "version": 1, "id": 1, "schema": canonical_v1}));
    let latest = http.get("/subjects/orders-value/versions/latest").await.ok();
    assert_eq!((latest["version"].clone(), latest["id"].clone()), (json!(2), json!(2)));
    assert_eq!(http.get("/subjects/orders-value/versions/-1").await.ok()["version"], 2);
    // The raw schema endpoints return the schema itself as the body.
    assert_eq!(
        http.get("/subjects/orders-value/versions/1/schema").await.ok(),
        serde_json::from_str::<Value>(&canonical_v1).unwrap()
    );
    assert_eq!(http.get("/schemas/ids/1/schema").await.ok(), serde_json::from_str::<Value>(&canonical_v1).unwrap());
    assert_eq!(
        http.get("/schemas/ids/1/versions").await.ok(),
        json!([{"subject": "orders-value", "version": 1}, {"subject": "payments-value", "version": 1}])
    );

    assert_eq!(http.get("/subjects/orders-value/versions/1/referencedby").await.ok(), json!([]));
    http.get("/subjects/orders-value/versions/5/referencedby").await.assert_error(404, 40402);

    assert_eq!(http.get("/schemas/ids/1/subjects").await.ok(), json!(["orders-value", "payments-value"]));
    assert_eq!(http.get("/schemas/ids/2/subjects").await.ok(), json!(["orders-value"]));
    http.get("/schemas/ids/99/subjects").await.assert_error(404, 40403);

    // Lookup: which version of the subject is this schema?
    let found = http.post("/subjects/orders-value", json!({"schema": respelled})).await.ok();
    assert_eq!(found, json!({"subject": "orders-value", "version": 1, "id": 1, "schema": canonical_v1}));
    let unknown = record(r#"{"name":"zzz","type":"int"}"#);
    http.post("/subjects/orders-value", json!({"schema": unknown})).await.assert_error(404, 40403);
    http.post("/subjects/nope", json!({"schema": V1})).await.assert_error(404, 40401);
    // An id that exists but is not in this subject.
    http.post("/subjects/payments-value", json!({"schema": v2()})).await.assert_error(404, 40403);

    // Subjects with characters that need escaping, in URLs and in the store.
    assert_eq!(register(&http, "a%2Fb%20c", V1).await.ok(), json!({"id": 1}));
    assert_eq!(http.get("/subjects").await.ok(), json!(["a/b c", "orders-value", "payments-value"]));
    assert_eq!(http.get("/subjects/a%2Fb%20c/versions/1").await.ok()["subject"], "a/b c");
    registry.stop().await;
}

pub async fn request_content_types(store: Store) {
    let registry = Registry::start(store).await;
    let http = Http::new(&registry.url);
    let body = json!({"schema": V1}).to_string();
    let post = reqwest::Method::POST;
    for ct in [
        Some("application/vnd.schemaregistry.v1+json"),
        Some("application/vnd.schemaregistry+json"),
        Some("application/json"),
        Some("application/json; charset=utf-8"),
        Some("application/octet-stream"),
        None,
    ] {
        let reply = http.send(post.clone(), "/subjects/s/versions", Some(body.clone()), ct).await;
        assert_eq!(reply.ok(), json!({"id": 1}), "{ct:?}");
    }
    http.send(post.clone(), "/subjects/s/versions", Some(body.clone()), Some("text/plain")).await.assert_error(415, 415);
    http.send(post, "/subjects/s/versions", Some(body), Some("application/x-www-form-urlencoded")).await.assert_error(415, 415);
    registry.stop().await;
}

pub async fn error_codes_and_rejected_requests_store_nothing(store: Store) {
    let config = RegistryConfig { max_body_bytes: 4096, ..RegistryConfig::default() };
    let registry = Registry::start_with(config, store.clone()).await;
    let http = Http::new(&registry.url);
    assert_eq!(register(&http, "s", V1).await.ok(), json!({"id": 1}));
    let before = snapshot(&store).await;

    // 42201: not Avro, with the parser's message.
    let bad = register(&http, "s", r#"{"type":"record","name":"R","fields":[{"name":"a","type":"Nope"}]}"#).await;
    bad.assert_error(422, 42201);
    assert!(bad.body["message"].as_str().unwrap().contains("Nope"), "{bad:?}");
    register(&http, "t", "not json").await.assert_error(422, 42201);
    register(&http, "t", r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int","default":"x"}]}"#)
        .await
        .assert_error(422, 42201);
    register(&http, "t", "").await.assert_error(422, 42201);
    // A union default that is not of the union's first type (Java Avro refuses to parse it).
    register(&http, "t", &record(r#"{"name":"a","type":["null","int"],"default":1}"#)).await.assert_error(422, 42201);
    http.post("/subjects/t/versions", json!({})).await.assert_error(422, 42201);
    http.post("/subjects/t/versions", json!({"schema": V1, "schemaType": "PROTOBUF"})).await.assert_error(422, 42201);
    http.post("/subjects/t/versions", json!({"schema": V1, "references": [{"name": "x", "subject": "y", "version": 1}]}))
        .await
        .assert_error(422, 42201);
    // 400: the body is not JSON at all.
    let reply = http.send(reqwest::Method::POST, "/subjects/t/versions", Some("{".into()), Some("application/json")).await;
    reply.assert_error(400, 400);
    // 413: over max_body_bytes, refused before parsing.
    let big = record(&format!(r#"{{"name":"a","type":"int","doc":"{}"}}"#, "x".repeat(8192)));
    register(&http, "t", &big).await.assert_error(413, 413);
    // 409: incompatible under BACKWARD (new field without default), naming the rule.
    let incompatible = record(r#"{"name":"a","type":"int"},{"name":"b","type":"int"}"#);
    let reply = register(&http, "s", &incompatible).await;
    reply.assert_error(409, 409);
    let message = reply.body["message"].as_str().unwrap();
    assert!(message.contains("READER_FIELD_MISSING_DEFAULT_VALUE") && message.contains("/fields/b"), "{message}");
    // 42203: unknown compatibility level.
    http.put("/config", json!({"compatibility": "SIDEWAYS"})).await.assert_error(422, 42203);
    http.put("/config/s", json!({})).await.assert_error(422, 42203);

    assert_eq!(snapshot(&store).await, before, "a rejected request changed the store");

    // The 404s and 42202s of reads.
    http.get("/subjects/nope/versions").await.assert_error(404, 40401);
    http.get("/subjects/nope/versions/1").await.assert_error(404, 40401);
    http.get("/subjects/s/versions/9").await.assert_error(404, 40402);
    http.get("/subjects/s/versions/9/schema").await.assert_error(404, 40402);
    for bad in ["abc", "0", "-2", "1.5", "2147483648"] {
        http.get(&format!("/subjects/s/versions/{bad}")).await.assert_error(422, 42202);
    }
    http.get("/schemas/ids/999").await.assert_error(404, 40403);
    http.get("/schemas/ids/0").await.assert_error(404, 40403);
    http.get("/schemas/ids/x").await.assert_error(404, 40403);
    http.get("/schemas/ids/999/versions").await.assert_error(404, 40403);
    http.get("/config/s").await.assert_error(404, 40408);
    http.delete("/config/s").await.assert_error(404, 40408);
    // Unknown routes and methods, and undecodable path parameters, still answer in
    // Confluent's error format.
    http.get("/subjects/%FF/versions").await.assert_error(400, 400);
    http.get("/nope").await.assert_error(404, 404);
    http.put("/subjects", json!({})).await.assert_error(405, 405);

    // The id counter did not move for the rejected registrations: the next new schema gets 2.
    assert_eq!(register(&http, "s", &v2()).await.ok(), json!({"id": 2}));
    registry.stop().await;
}

pub async fn config_and_compatibility_endpoints(store: Store) {
    let registry = Registry::start(store).await;
    let http = Http::new(&registry.url);
    assert_eq!(http.get("/config").await.ok(), json!({"compatibilityLevel": "BACKWARD"}));
    assert_eq!(register(&http, "s", V1).await.ok()["id"], 1);

    let incompatible = record(r#"{"name":"a","type":"string"}"#);
    let check = |body: String| json!({ "schema": body });
    assert_eq!(http.post("/compatibility/subjects/s/versions/latest", check(v2())).await.ok(), json!({"is_compatible": true}));
    assert_eq!(
        http.post("/compatibility/subjects/s/versions/1", check(incompatible.clone())).await.ok(),
        json!({"is_compatible": false})
    );
    let verbose = http.post("/compatibility/subjects/s/versions/1?verbose=true", check(incompatible.clone())).await.ok();
    assert_eq!(verbose["is_compatible"], false);
    assert!(verbose["messages"][0].as_str().unwrap().contains("TYPE_MISMATCH"), "{verbose}");
    assert_eq!(
        http.post("/compatibility/subjects/s/versions", check(incompatible.clone())).await.ok(),
        json!({"is_compatible": false})
    );
    assert_eq!(
        http.post("/compatibility/subjects/fresh/versions", check(incompatible.clone())).await.ok(),
        json!({"is_compatible": true})
    );
    http.post("/compatibility/subjects/s/versions/7", check(v2())).await.assert_error(404, 40402);
    http.post("/compatibility/subjects/s/versions/x", check(v2())).await.assert_error(422, 42202);
    http.post("/compatibility/subjects/nope/versions/latest", check(v2())).await.assert_error(404, 40401);
    http.post("/compatibility/subjects/s/versions/latest", check("{".into())).await.assert_error(422, 42201);

    // Global level.
    assert_eq!(http.put("/config", json!({"compatibility": "FULL"})).await.ok(), json!({"compatibility": "FULL"}));
    assert_eq!(http.get("/config").await.ok(), json!({"compatibilityLevel": "FULL"}));
    // Subject level overrides it; defaultToGlobal falls back to it.
    http.get("/config/s").await.assert_error(404, 40408);
    assert_eq!(http.get("/config/s?defaultToGlobal=true").await.ok(), json!({"compatibilityLevel": "FULL"}));
    assert_eq!(http.put("/config/s", json!({"compatibility": "NONE"})).await.ok(), json!({"compatibility": "NONE"}));
    assert_eq!(http.get("/config/s").await.ok(), json!({"compatibilityLevel": "NONE"}));
    // Under NONE the incompatible schema registers, and the compatibility check agrees.
    assert_eq!(
        http.post("/compatibility/subjects/s/versions/latest", check(incompatible.clone())).await.ok()["is_compatible"],
        true
    );
    assert_eq!(register(&http, "s", &incompatible).await.ok()["id"], 2);
    assert_eq!(http.delete("/config/s").await.ok(), json!({"compatibilityLevel": "NONE"}));
    http.get("/config/s").await.assert_error(404, 40408);
    // Back under the global FULL: string → long is not allowed either way.
    register(&http, "s", &record(r#"{"name":"a","type":"long"}"#)).await.assert_error(409, 409);
    // DELETE /config goes back to the default and answers with what was in force.
    assert_eq!(http.delete("/config").await.ok(), json!({"compatibilityLevel": "FULL"}));
    assert_eq!(http.get("/config").await.ok(), json!({"compatibilityLevel": "BACKWARD"}));
    assert_eq!(http.delete("/config").await.ok(), json!({"compatibilityLevel": "BACKWARD"}));
    // Config for a subject that has no versions yet is allowed (set before the first schema).
    assert_eq!(
        http.put("/config/later", json!({"compatibilityLevel": "forward"})).await.ok(),
        json!({"compatibility": "FORWARD"})
    );
    assert_eq!(http.get("/subjects").await.ok(), json!(["s"]));

    // Transitive levels through the API: v1 {a}, v2 {a, b=""}, then {a, b} without default.
    http.put("/config/chain", json!({"compatibility": "BACKWARD_TRANSITIVE"})).await.ok();
    register(&http, "chain", V1).await.ok();
    register(&http, "chain", &v2()).await.ok();
    let no_default = record(r#"{"name":"a","type":"int"},{"name":"b","type":"string"}"#);
    let reply = register(&http, "chain", &no_default).await;
    reply.assert_error(409, 409);
    assert!(reply.body["message"].as_str().unwrap().contains("version 1"), "{reply:?}");
    http.put("/config/chain", json!({"compatibility": "BACKWARD"})).await.ok();
    assert!(register(&http, "chain", &no_default).await.ok()["id"].is_i64());
    registry.stop().await;
}

pub async fn soft_and_permanent_deletes(store: Store) {
    let registry = Registry::start(store).await;
    let http = Http::new(&registry.url);
    assert_eq!(register(&http, "s", V1).await.ok()["id"], 1);
    assert_eq!(register(&http, "s", &v2()).await.ok()["id"], 2);

    // Soft-delete version 1: hidden unless ?deleted=true.
    assert_eq!(http.delete("/subjects/s/versions/1").await.ok(), json!(1));
    assert_eq!(http.get("/subjects/s/versions").await.ok(), json!([2]));
    assert_eq!(http.get("/subjects/s/versions?deleted=true").await.ok(), json!([1, 2]));
    assert_eq!(http.get("/subjects/s/versions?deletedOnly=true").await.ok(), json!([1]));
    http.get("/subjects/s/versions/1").await.assert_error(404, 40402);
    assert_eq!(http.get("/subjects/s/versions/1?deleted=true").await.ok()["id"], 1);
    http.delete("/subjects/s/versions/1").await.assert_error(404, 40406);
    http.delete("/subjects/s/versions/2?permanent=true").await.assert_error(404, 40407);
    http.delete("/subjects/s/versions/7").await.assert_error(404, 40402);
    http.delete("/subjects/s/versions/x").await.assert_error(422, 42202);
    http.delete("/subjects/nope/versions/1").await.assert_error(404, 40401);
    // Ids stay resolvable after their versions go: data written with them must stay readable.
    assert_eq!(http.get("/schemas/ids/1").await.status, 200);
    assert_eq!(http.get("/schemas/ids/1/versions").await.ok(), json!([]));

    // The whole subject.
    http.delete("/subjects/s?permanent=true").await.assert_error(404, 40405);
    assert_eq!(http.delete("/subjects/s").await.ok(), json!([2]));
    assert_eq!(http.get("/subjects").await.ok(), json!([]));
    assert_eq!(http.get("/subjects?deleted=true").await.ok(), json!(["s"]));
    assert_eq!(http.get("/subjects?deletedOnly=true").await.ok(), json!(["s"]));
    http.get("/subjects/s/versions").await.assert_error(404, 40401);
    http.get("/subjects/s/versions/latest").await.assert_error(404, 40401);
    http.delete("/subjects/s").await.assert_error(404, 40404);
    http.delete("/subjects/nope").await.assert_error(404, 40401);

    // Registering into a soft-deleted subject continues the numbering.
    assert_eq!(register(&http, "s", V1).await.ok()["id"], 1);
    assert_eq!(http.get("/subjects/s/versions").await.ok(), json!([3]));
    assert_eq!(http.delete("/subjects/s").await.ok(), json!([3]));

    // Permanent delete of a soft-deleted subject removes it entirely.
    assert_eq!(http.delete("/subjects/s?permanent=true").await.ok(), json!([1, 2, 3]));
    assert_eq!(http.get("/subjects?deleted=true").await.ok(), json!([]));
    http.get("/subjects/s/versions?deleted=true").await.assert_error(404, 40401);
    // Permanent delete of a single soft-deleted version.
    register(&http, "u", V1).await.ok();
    register(&http, "u", &v2()).await.ok();
    http.delete("/subjects/u/versions/latest").await.ok();
    assert_eq!(http.delete("/subjects/u/versions/2?permanent=true").await.ok(), json!(2));
    assert_eq!(http.get("/subjects/u/versions?deleted=true").await.ok(), json!([1]));
    // The ids are still there, and the same schema gets its old id back.
    assert_eq!(register(&http, "s", &v2()).await.ok()["id"], 2);
    registry.stop().await;
}

/// Two registry instances over `store_a` and `store_b` (one store, or two handles on one
/// ZooKeeper): each serves what the other registered, config written through one is
/// enforced by the other, and concurrent registrations through both never share an id.
pub async fn two_instances(store_a: Store, store_b: Store) {
    let a = Registry::start(store_a).await;
    let b = Registry::start(store_b).await;
    let (ha, hb) = (Http::new(&a.url), Http::new(&b.url));

    assert_eq!(register(&ha, "s", V1).await.ok()["id"], 1);
    assert_eq!(hb.get("/subjects/s/versions/1").await.ok()["id"], 1);
    assert!(hb.get("/schemas/ids/1").await.ok()["schema"].as_str().unwrap().contains("\"a\""));
    assert_eq!(register(&hb, "other", V1).await.ok()["id"], 1);
    assert_eq!(register(&hb, "s", &v2()).await.ok()["id"], 2);
    assert_eq!(ha.get("/subjects/s/versions/latest").await.ok()["id"], 2);
    // Config written through one is enforced by the other.
    hb.put("/config/s", json!({"compatibility": "FULL"})).await.ok();
    register(&ha, "s", &record(r#"{"name":"a","type":"long"}"#)).await.assert_error(409, 409);

    // Concurrent registrations through both: distinct schemas get distinct ids, the same
    // schema gets one id, and racing versions in one subject all land, numbered 1..=n.
    let mut tasks = Vec::new();
    for i in 0..16 {
        let url = if i % 2 == 0 { a.url.clone() } else { b.url.clone() };
        tasks.push(tokio::spawn(async move {
            let http = Http::new(&url);
            let own = record(&format!(r#"{{"name":"f{i}","type":"int","default":0}}"#));
            let distinct = register(&http, &format!("race-{i}"), &own).await.ok()["id"].as_i64().unwrap();
            let shared = register(&http, &format!("shared-{i}"), &record(r#"{"name":"same","type":"int"}"#)).await.ok()["id"]
                .as_i64()
                .unwrap();
            let in_one_subject = register(&http, "crowded", &own).await.ok()["id"].as_i64().unwrap();
            assert_eq!(distinct, in_one_subject);
            (distinct, shared)
        }));
    }
    let mut distinct = Vec::new();
    let mut shared = Vec::new();
    for t in tasks {
        let (d, s) = t.await.unwrap();
        distinct.push(d);
        shared.push(s);
    }
    shared.sort();
    shared.dedup();
    assert_eq!(shared.len(), 1, "one schema, one id: {shared:?}");
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 16, "{distinct:?}");
    assert!(!distinct.contains(&shared[0]));
    assert_eq!(ha.get("/subjects/crowded/versions").await.ok(), json!((1..=16).collect::<Vec<_>>()));
    a.stop().await;
    b.stop().await;
}
