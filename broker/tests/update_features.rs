//! UpdateFeatures (API 57, KIP-584, issue #22) over the raw protocol, answered as a
//! ZooKeeper-mode Kafka 2.7-3.9 controller answers it when no feature is supported or
//! finalized: each update is refused on its own with INVALID_REQUEST and Kafka's message
//! (an upgrade of a feature the broker does not support, a deletion of a feature that is
//! not finalized), validate_only answers the same, a feature named twice gets one result,
//! and nothing is finalized afterwards (ApiVersions v3 lists no finalized features).
//! Only the controller takes it: another broker of a cluster answers NOT_CONTROLLER.
//! Without Alter on the cluster: tests/authorization.

mod common;

use common::{RawClient, TestBroker};
use fjord_testkit::Cluster;
use kafka_protocol::messages::update_features_request::FeatureUpdateKey;
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ApiVersionsResponse, UpdateFeaturesRequest, UpdateFeaturesResponse};
use kafka_protocol::protocol::StrBytes;

const NOT_CONTROLLER: i16 = 41;
const INVALID_REQUEST: i16 = 42;
const UNSUPPORTED: &str = "Could not apply finalized feature update because the provided feature is not supported.";
const NOT_FINALIZED: &str = "Can not delete non-existing finalized feature.";

/// v1's update of `feature` to `level` with `upgrade_type` (1 upgrade, 2 safe downgrade,
/// 3 unsafe downgrade).
fn update(feature: &str, level: i16, upgrade_type: i8) -> FeatureUpdateKey {
    FeatureUpdateKey::default()
        .with_feature(StrBytes::from_string(feature.to_owned()))
        .with_max_version_level(level)
        .with_upgrade_type(upgrade_type)
}

/// The top-level error and (feature, error code, message) of each result.
async fn send(
    client: &mut RawClient,
    version: i16,
    updates: Vec<FeatureUpdateKey>,
    validate_only: bool,
) -> (i16, Vec<(String, i16, String)>) {
    let request =
        UpdateFeaturesRequest::default().with_timeout_ms(5_000).with_feature_updates(updates).with_validate_only(validate_only);
    let response: UpdateFeaturesResponse = client.call(ApiKey::UpdateFeatures, version, &request).await.unwrap();
    let results = response
        .results
        .iter()
        .map(|r| (r.feature.to_string(), r.error_code, r.error_message.as_ref().map(|m| m.to_string()).unwrap_or_default()))
        .collect();
    (response.error_code, results)
}

/// Waits until the broker behind `client` acts as the controller: until then it answers
/// NOT_CONTROLLER, which clients retry on (a broker elected through `/controller` answers
/// so too until it has loaded the cluster state). An empty update changes nothing.
async fn wait_until_controller(client: &mut RawClient) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while send(client, 1, Vec::new(), false).await.0 == NOT_CONTROLLER {
        assert!(std::time::Instant::now() < deadline, "the broker never became the controller");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

fn refused(expected: &[(&str, &str)]) -> (i16, Vec<(String, i16, String)>) {
    (0, expected.iter().map(|(f, m)| (f.to_string(), INVALID_REQUEST, m.to_string())).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_update_is_refused_per_feature_and_nothing_is_finalized() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    wait_until_controller(&mut client).await;

    let upgrade_and_deletions =
        || vec![update("metadata.version", 20, 1), update("group.version", 0, 2), update("kraft.version", 0, 3)];
    let expected =
        refused(&[("metadata.version", UNSUPPORTED), ("group.version", NOT_FINALIZED), ("kraft.version", NOT_FINALIZED)]);
    assert_eq!(send(&mut client, 1, upgrade_and_deletions(), false).await, expected);
    assert_eq!(send(&mut client, 1, upgrade_and_deletions(), true).await, expected, "validate_only answers the same");
    // v0: allow_downgrade makes a level below 1 a deletion.
    let v0_deletion = FeatureUpdateKey::default().with_feature(StrBytes::from_static_str("f")).with_allow_downgrade(true);
    assert_eq!(send(&mut client, 0, vec![v0_deletion], false).await, refused(&[("f", NOT_FINALIZED)]));
    // The upgrade type rather than a deletion: Kafka asks for a downgrade type.
    assert_eq!(
        send(&mut client, 1, vec![update("f", 0, 1)], false).await,
        refused(&[("f", "Can not provide versionLevel: 0 less than 1 without setting the SAFE downgradeType in the request.")])
    );
    assert_eq!(send(&mut client, 1, vec![update("f", 2, 7)], false).await, refused(&[("f", "Received unknown upgrade type.")]));
    // Named twice: one result, from the first update.
    assert_eq!(
        send(&mut client, 1, vec![update("f", 0, 2), update("g", 1, 1), update("f", 3, 1)], false).await,
        refused(&[("f", NOT_FINALIZED), ("g", UNSUPPORTED)])
    );
    assert_eq!(send(&mut client, 1, Vec::new(), false).await, (0, Vec::new()));

    // Nothing was finalized: the same upgrade is refused again and ApiVersions lists none.
    assert_eq!(
        send(&mut client, 1, vec![update("metadata.version", 20, 1)], false).await,
        refused(&[("metadata.version", UNSUPPORTED)])
    );
    let versions: ApiVersionsResponse = client.call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default()).await.unwrap();
    assert!(versions.finalized_features.is_empty(), "{:?}", versions.finalized_features);
    assert!(versions.supported_features.is_empty(), "{:?}", versions.supported_features);
    let update_features = versions.api_keys.iter().find(|k| k.api_key == ApiKey::UpdateFeatures as i16).expect("advertised");
    assert_eq!((update_features.min_version, update_features.max_version), (0, 1));
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_controller_takes_feature_updates() {
    let cluster = Cluster::builder().brokers(2).start().await.unwrap();
    let controller = cluster.wait_for_controller(&[], std::time::Duration::from_secs(20)).await.unwrap();
    let follower = *cluster.ids().iter().find(|&&id| id != controller).unwrap();
    let addr = |id: i32| cluster.addr(id).parse::<std::net::SocketAddr>().unwrap();
    let upgrade = || vec![update("metadata.version", 20, 1)];

    let mut elsewhere = RawClient::connect(addr(follower)).await.unwrap();
    for version in 0..=1 {
        assert_eq!(send(&mut elsewhere, version, upgrade(), false).await, (NOT_CONTROLLER, Vec::new()), "v{version}");
    }
    let mut client = RawClient::connect(addr(controller)).await.unwrap();
    wait_until_controller(&mut client).await;
    assert_eq!(send(&mut client, 1, upgrade(), false).await, refused(&[("metadata.version", UNSUPPORTED)]));
}
