//! Issue #26 case 7 against a running registry: schemas beyond a limit get a precise 422 and
//! store nothing, and expensive parses and checks leave the runtime's async workers free
//! (in `fjord dev` those serve the brokers too).

mod support;

use std::time::{Duration, Instant};

use fjord_schema_registry::RegistryConfig;
use serde_json::json;
use support::{embedded_store, register, Http, Registry};

/// Asserts a 422 / 42201 whose message names the config key of the limit.
#[track_caller]
fn assert_limit(reply: &support::Reply, key: &str) {
    reply.assert_error(422, 42201);
    let message = reply.body["message"].as_str().unwrap_or_default();
    assert!(message.contains(key), "{key}: {message}");
}

#[tokio::test]
async fn schemas_beyond_a_limit_get_a_422_naming_it_and_store_nothing() {
    let (_dir, store) = embedded_store();
    let registry = Registry::start(store).await;
    let http = Http::new(&registry.url);

    // The schema of the 13-byte record that aborted `fjord load`: a fixed of 2^62.
    let huge_fixed = r#"{"type":"record","name":"Boom","fields":[{"name":"f","type":{"type":"fixed","name":"Huge","size":4611686018427387904}}]}"#;
    assert_limit(&register(&http, "boom", huge_fixed).await, "max_fixed_size");
    let decimal = r#"{"type":"fixed","name":"D","size":268435456,"logicalType":"decimal","precision":9}"#;
    assert_limit(&register(&http, "boom", decimal).await, "max_fixed_size");

    // Over 1 MiB of text (under the 4 MiB body limit).
    let long_doc = format!(r#"{{"type":"record","name":"R","doc":"{}","fields":[]}}"#, "x".repeat(1_100_000));
    assert_limit(&register(&http, "big", &long_doc).await, "max_schema_bytes");

    // 10,001 named types.
    let enums: Vec<String> = (0..10_001).map(|i| format!(r#"{{"type":"enum","name":"E{i}","symbols":["A"]}}"#)).collect();
    assert_limit(&register(&http, "many", &format!("[{}]", enums.join(","))).await, "max_named_types");

    // 40 records, each holding the previous by reference: a flat document, 40 levels deep.
    let mut chain = vec![r#"{"type":"record","name":"C0","fields":[]}"#.to_string()];
    for i in 1..40 {
        chain.push(format!(r#"{{"type":"record","name":"C{i}","fields":[{{"name":"f","type":"C{}"}}]}}"#, i - 1));
    }
    assert_limit(&register(&http, "deep", &format!("[{}]", chain.join(","))).await, "max_depth");

    // The compatibility endpoints and lookups refuse them the same way.
    register(&http, "ok", r#"{"type":"record","name":"Boom","fields":[]}"#).await.ok();
    let check = http.post("/compatibility/subjects/ok/versions/latest", json!({ "schema": huge_fixed })).await;
    assert_limit(&check, "max_fixed_size");
    assert_limit(&http.post("/subjects/ok", json!({ "schema": huge_fixed })).await, "max_fixed_size");

    // Nothing of the refused ones was stored.
    assert_eq!(http.get("/subjects").await.ok(), json!(["ok"]));
    assert_eq!(http.get("/schemas/ids/2").await.status, 404);

    // A raised limit lets such a schema through, for whoever needs it.
    let (_dir2, store2) = embedded_store();
    let lenient = Registry::start_with(RegistryConfig { max_depth: 64, ..RegistryConfig::default() }, store2).await;
    register(&Http::new(&lenient.url), "deep", &format!("[{}]", chain.join(","))).await.ok();
    lenient.stop().await;
    registry.stop().await;
}

/// `n` one-field records as one union (about 90 bytes each).
fn union_of_records(n: usize) -> String {
    let branches: Vec<String> =
        (0..n).map(|i| format!(r#"{{"type":"record","name":"R{i}","fields":[{{"name":"f","type":"int"}}]}}"#)).collect();
    format!("[{}]", branches.join(","))
}

/// Issue #26 case 7: two concurrent checks of 0.9 MB schemas froze `fjord dev`'s Kafka
/// listener (ApiVersions took 6.3 s), because parsing and checking ran on the async workers
/// that every service of the process shares. Here the registry runs on a runtime of two
/// workers, as small as the machine it was found on: while two checks of 2 MB schemas (each
/// seconds of CPU in a debug build) run, a cheap request must still answer at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expensive_checks_leave_cheap_requests_fast() {
    let (_dir, store) = embedded_store();
    let config = RegistryConfig {
        max_body_bytes: 8 * 1024 * 1024,
        max_schema_bytes: 8 * 1024 * 1024,
        max_named_types: 100_000,
        cpu_tasks: 2,
        ..RegistryConfig::default()
    };
    let registry = Registry::start_with(config, store).await;
    let http = Http::new(&registry.url);
    register(&http, "big", &union_of_records(20_000)).await.ok();

    let mut checks = Vec::new();
    for extra in 1..=2 {
        let url = registry.url.clone();
        let schema = union_of_records(20_000 + extra);
        checks.push(tokio::spawn(async move {
            let http = Http::new(&url);
            let started = Instant::now();
            let reply = http.post("/compatibility/subjects/big/versions/latest", json!({ "schema": schema })).await;
            (reply, started.elapsed())
        }));
    }
    let mut slowest = Duration::ZERO;
    let mut samples = 0;
    // The pause is part of what is timed: the runtime's timers run on its workers too, so a
    // blocked runtime shows as a pause that does not end, before the request is even sent.
    let pause = Duration::from_millis(20);
    while checks.iter().any(|c| !c.is_finished()) {
        let started = Instant::now();
        tokio::time::sleep(pause).await;
        assert_eq!(http.get("/subjects").await.ok(), json!(["big"]));
        slowest = slowest.max(started.elapsed() - pause);
        samples += 1;
    }
    let mut check_times = Vec::new();
    for c in checks {
        let (reply, took) = c.await.unwrap();
        // A union that gains branches reads the old data (backward compatible).
        assert_eq!(reply.ok(), json!({ "is_compatible": true }));
        check_times.push(took);
    }
    assert!(
        slowest < Duration::from_millis(500),
        "a 20 ms pause and GET /subjects took {slowest:?} more than the pause while checks ran ({check_times:?})"
    );
    // The checks must have been expensive for the comparison to mean anything.
    assert!(
        samples >= 3 && check_times.iter().all(|t| *t > Duration::from_millis(500)),
        "{samples} samples, checks {check_times:?}"
    );
    registry.stop().await;
}
