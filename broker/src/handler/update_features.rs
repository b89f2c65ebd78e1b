//! UpdateFeatures (API 57, v0-v1, KIP-584): finalize, upgrade, downgrade or delete
//! cluster-wide feature versions. Answered as a ZooKeeper-mode Kafka 2.7-3.9 broker
//! answers it: Alter on the cluster (else CLUSTER_AUTHORIZATION_FAILED, top level), only
//! the controller takes it (else NOT_CONTROLLER), then each feature is checked on its own.
//!
//! Fjord supports no feature and so finalizes none (ApiVersions lists neither), which
//! leaves every update refused per feature with INVALID_REQUEST and Kafka's message:
//! an empty name, an unknown upgrade type, a deletion (a level below 1 with a downgrade
//! type) of a feature that is not finalized, a level below 1 with the upgrade type, and
//! otherwise a feature the broker does not support. Nothing is ever stored, so
//! `validate_only` (v1; Kafka's ZooKeeper controller ignores it too) changes nothing.
//!
//! A feature named twice gets one result, as in Kafka: its request keys the updates by
//! name, the controller looks each name up (finding the first update of that name) and
//! answers one result per name.

use kafka_protocol::messages::update_features_request::FeatureUpdateKey;
use kafka_protocol::messages::update_features_response::UpdatableFeatureResult;
use kafka_protocol::messages::{ResponseKind, UpdateFeaturesRequest, UpdateFeaturesResponse};
use kafka_protocol::protocol::StrBytes;

use crate::codec::error_code;
use crate::connection::Session;
use crate::handler::Broker;
use fjord_auth::{Operation, Resource};

/// Kafka's `FeatureUpdate.UpgradeType`, from v1's code or v0's `allow_downgrade`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum UpgradeType {
    Upgrade,
    SafeDowngrade,
    UnsafeDowngrade,
    Unknown,
}

fn upgrade_type(update: &FeatureUpdateKey, version: i16) -> UpgradeType {
    if version == 0 {
        return if update.allow_downgrade { UpgradeType::SafeDowngrade } else { UpgradeType::Upgrade };
    }
    match update.upgrade_type {
        1 => UpgradeType::Upgrade,
        2 => UpgradeType::SafeDowngrade,
        3 => UpgradeType::UnsafeDowngrade,
        _ => UpgradeType::Unknown,
    }
}

/// Why the controller refuses an update of `feature` to `level`, in Kafka's words and
/// order of checks, given that no feature is supported or finalized; the error code is
/// always INVALID_REQUEST.
fn refusal(feature: &str, level: i16, kind: UpgradeType) -> String {
    if feature.is_empty() {
        "Feature name can not be empty.".to_owned()
    } else if kind == UpgradeType::Unknown {
        "Received unknown upgrade type.".to_owned()
    } else if level < 1 && kind != UpgradeType::Upgrade {
        // A deletion; there is nothing finalized to delete.
        "Can not delete non-existing finalized feature.".to_owned()
    } else if level < 1 {
        format!("Can not provide versionLevel: {level} less than 1 without setting the SAFE downgradeType in the request.")
    } else {
        "Could not apply finalized feature update because the provided feature is not supported.".to_owned()
    }
}

/// One (feature, error code, message) per distinct feature name, in the order the names
/// first appear, each judged by its first update.
fn results(updates: &[FeatureUpdateKey], version: i16) -> Vec<(String, i16, String)> {
    let mut results: Vec<(String, i16, String)> = Vec::new();
    for update in updates {
        let feature = update.feature.as_str();
        if results.iter().any(|(name, _, _)| name == feature) {
            continue;
        }
        let message = refusal(feature, update.max_version_level, upgrade_type(update, version));
        results.push((feature.to_owned(), error_code::INVALID_REQUEST, message));
    }
    results
}

impl Broker {
    pub(crate) fn update_features(&self, request: UpdateFeaturesRequest, version: i16, session: &Session) -> ResponseKind {
        let response = UpdateFeaturesResponse::default();
        let refuse = |code: i16, message: Option<&'static str>| {
            ResponseKind::UpdateFeatures(
                response.clone().with_error_code(code).with_error_message(message.map(StrBytes::from_static_str)),
            )
        };
        if !self.authorize(session, Operation::Alter, Resource::cluster()) {
            return refuse(error_code::CLUSTER_AUTHORIZATION_FAILED, None);
        }
        if self.controllership.epoch().is_none() {
            return refuse(error_code::NOT_CONTROLLER, None);
        }
        let results = results(&request.feature_updates, version)
            .into_iter()
            .map(|(feature, code, message)| {
                UpdatableFeatureResult::default()
                    .with_feature(StrBytes::from_string(feature))
                    .with_error_code(code)
                    .with_error_message(Some(StrBytes::from_string(message)))
            })
            .collect();
        ResponseKind::UpdateFeatures(response.with_results(results))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(feature: &str, level: i16, upgrade_type: i8, allow_downgrade: bool) -> FeatureUpdateKey {
        FeatureUpdateKey::default()
            .with_feature(StrBytes::from_string(feature.to_owned()))
            .with_max_version_level(level)
            .with_upgrade_type(upgrade_type)
            .with_allow_downgrade(allow_downgrade)
    }

    const UNSUPPORTED: &str = "Could not apply finalized feature update because the provided feature is not supported.";
    const NOT_FINALIZED: &str = "Can not delete non-existing finalized feature.";

    fn messages(updates: &[FeatureUpdateKey], version: i16) -> Vec<(String, String)> {
        results(updates, version)
            .into_iter()
            .map(|(feature, code, message)| {
                assert_eq!(code, error_code::INVALID_REQUEST);
                (feature, message)
            })
            .collect()
    }

    fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
        expected.iter().map(|(f, m)| (f.to_string(), m.to_string())).collect()
    }

    #[test]
    fn upgrades_of_unsupported_features_and_deletions_of_unfinalized_ones_are_invalid_requests() {
        let updates = [
            update("metadata.version", 20, 1, false),
            update("kraft.version", 0, 2, false),
            update("group.version", 0, 3, false),
            update("transaction.version", 0, 1, false),
        ];
        assert_eq!(
            messages(&updates, 1),
            pairs(&[
                ("metadata.version", UNSUPPORTED),
                ("kraft.version", NOT_FINALIZED),
                ("group.version", NOT_FINALIZED),
                (
                    "transaction.version",
                    "Can not provide versionLevel: 0 less than 1 without setting the SAFE downgradeType in the request."
                ),
            ])
        );
    }

    #[test]
    fn v0_downgrades_by_its_flag_and_v1_by_its_type() {
        // v0 reads allow_downgrade and ignores the type; v1 the reverse.
        let deletion = [update("f", 0, 1, true)];
        assert_eq!(messages(&deletion, 0), pairs(&[("f", NOT_FINALIZED)]));
        assert_eq!(
            messages(&deletion, 1)[0].1,
            "Can not provide versionLevel: 0 less than 1 without setting the SAFE downgradeType in the request."
        );
        assert_eq!(messages(&[update("f", 2, 0, false)], 1), pairs(&[("f", "Received unknown upgrade type.")]));
        assert_eq!(messages(&[update("f", 2, 0, false)], 0), pairs(&[("f", UNSUPPORTED)]));
        assert_eq!(messages(&[update("", 2, 1, false)], 1), pairs(&[("", "Feature name can not be empty.")]));
    }

    #[test]
    fn a_feature_named_twice_is_answered_once_by_its_first_update() {
        let updates = [update("f", 0, 2, false), update("g", 3, 1, false), update("f", 3, 1, false)];
        assert_eq!(messages(&updates, 1), pairs(&[("f", NOT_FINALIZED), ("g", UNSUPPORTED)]));
        assert!(results(&[], 1).is_empty());
    }
}
