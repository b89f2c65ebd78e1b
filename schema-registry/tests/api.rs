//! The REST API against a running registry (the production `run` on 127.0.0.1:0) over an
//! embedded metadata store: every endpoint and every error code, and that rejected
//! requests store nothing. tests/zookeeper.rs runs the same scenarios on ZooKeeper.

mod support;

use support::{embedded_store, scenarios};

#[tokio::test]
async fn register_lookup_and_fetch_by_subject_version_and_id() {
    let (_dir, store) = embedded_store();
    scenarios::register_lookup_and_fetch_by_subject_version_and_id(store).await;
}

#[tokio::test]
async fn request_content_types() {
    let (_dir, store) = embedded_store();
    scenarios::request_content_types(store).await;
}

#[tokio::test]
async fn error_codes_and_rejected_requests_store_nothing() {
    let (_dir, store) = embedded_store();
    scenarios::error_codes_and_rejected_requests_store_nothing(store).await;
}

#[tokio::test]
async fn config_and_compatibility_endpoints() {
    let (_dir, store) = embedded_store();
    scenarios::config_and_compatibility_endpoints(store).await;
}

#[tokio::test]
async fn soft_and_permanent_deletes() {
    let (_dir, store) = embedded_store();
    scenarios::soft_and_permanent_deletes(store).await;
}

#[tokio::test]
async fn two_instances_on_one_store_serve_each_others_schemas_and_never_share_ids() {
    let (_dir, store) = embedded_store();
    scenarios::two_instances(store.clone(), store).await;
}

#[tokio::test]
async fn requests_over_the_concurrency_limit_wait_their_turn() {
    let (_dir, store) = embedded_store();
    let config = fjord_schema_registry::RegistryConfig { max_concurrent_requests: 1, ..Default::default() };
    let registry = support::Registry::start_with(config, store).await;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let url = registry.url.clone();
        tasks.push(tokio::spawn(async move {
            let http = support::Http::new(&url);
            let schema = support::record(&format!(r#"{{"name":"f{i}","type":"int"}}"#));
            support::register(&http, &format!("s{i}"), &schema).await.ok()["id"].as_i64().unwrap()
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap());
    }
    ids.sort();
    assert_eq!(ids, (1..=20).collect::<Vec<_>>());
    registry.stop().await;
}
