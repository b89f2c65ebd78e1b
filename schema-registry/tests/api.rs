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
