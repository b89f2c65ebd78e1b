//! DescribeClientQuotas (API key 48) and AlterClientQuotas (49, KIP-546): the client
//! quotas of `crate::quota`, read from and written to the metadata store
//! (`crate::quota::store`), so any broker answers and every broker enforces them.
//!
//! Kafka's checks, each answered with INVALID_REQUEST and changing nothing for that
//! entity: an empty entity, an entity type given twice, an entity type other than `user`,
//! `client-id` (and `ip`, which Fjord does not enforce), an empty name, a key given twice,
//! a key other than `producer_byte_rate`, `consumer_byte_rate` and `request_percentage`,
//! a byte rate that is not a whole number. Fjord also refuses a value that is not
//! positive: a rate of zero or less has no throttle time (Kafka's formula divides by it).
//! Authorization (in `authz`) is Kafka's: DescribeConfigs on the cluster to describe,
//! AlterConfigs on the cluster to alter.
//!
//! [`check_alteration`] and [`describe`] are pure, tested below without a store.

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::messages::alter_client_quotas_request::EntryData as AlterEntry;
use kafka_protocol::messages::alter_client_quotas_response::{EntityData as AlterEntityData, EntryData as AlterResultEntry};
use kafka_protocol::messages::describe_client_quotas_request::ComponentData;
use kafka_protocol::messages::describe_client_quotas_response::{EntityData, EntryData, ValueData};
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, DescribeClientQuotasRequest, DescribeClientQuotasResponse, ResponseKind,
};
use kafka_protocol::protocol::StrBytes;

use crate::codec::error_code;
use crate::handler::Broker;
use crate::quota::{EntityName, QuotaConfigs, QuotaEntity, QuotaKey};

/// Kafka's entity type names.
pub(crate) const USER: &str = "user";
pub(crate) const CLIENT_ID: &str = "client-id";
const IP: &str = "ip";
/// Kafka's quota keys that Fjord does not enforce, refused by name.
const NOT_ENFORCED: &[&str] = &["controller_mutation_rate", "connection_creation_rate"];

/// DescribeClientQuotas match types.
const MATCH_EXACT: i8 = 0;
const MATCH_DEFAULT: i8 = 1;
const MATCH_SPECIFIED: i8 = 2;

type Refusal = (i16, String);

fn invalid(message: impl Into<String>) -> Refusal {
    (error_code::INVALID_REQUEST, message.into())
}

impl Broker {
    pub(crate) async fn describe_client_quotas(&self, request: DescribeClientQuotasRequest) -> ResponseKind {
        let response = match crate::quota::store::read_all(&**self.topics.store()).await {
            Ok(configs) => describe(&request, &configs),
            Err(e) => {
                tracing::error!(error = %e, "reading the client quotas failed");
                DescribeClientQuotasResponse::default()
                    .with_error_code(error_code::UNKNOWN_SERVER_ERROR)
                    .with_error_message(Some(StrBytes::from_string(format!("metadata store: {e}"))))
            }
        };
        ResponseKind::DescribeClientQuotas(response)
    }

    pub(crate) async fn alter_client_quotas(&self, request: AlterClientQuotasRequest) -> ResponseKind {
        let store = self.topics.store();
        let mut seen = BTreeSet::new();
        let mut entries = Vec::with_capacity(request.entries.len());
        let mut altered = false;
        for entry in &request.entries {
            let outcome = match check_alteration(entry) {
                Ok((entity, _)) if !seen.insert(entity.clone()) => Err(invalid(format!("ignoring duplicate entity {entity:?}"))),
                Ok(_) if request.validate_only => Ok(()),
                Ok((entity, changes)) => match crate::quota::store::alter(&**store, &entity, &changes).await {
                    Ok(()) => {
                        altered = true;
                        Ok(())
                    }
                    Err(e) => {
                        tracing::error!(?entity, error = %e, "storing client quotas failed");
                        Err((error_code::UNKNOWN_SERVER_ERROR, format!("metadata store: {e}")))
                    }
                },
                Err(refusal) => Err(refusal),
            };
            entries.push(alter_result(entry, outcome));
        }
        if altered {
            // This broker applies the change now; the others when their watch fires.
            match crate::quota::store::read_all(&**store).await {
                Ok(configs) => self.quotas.set_configs(configs),
                Err(e) => tracing::warn!(error = %e, "cannot read the client quotas back; the watch will"),
            }
        }
        ResponseKind::AlterClientQuotas(AlterClientQuotasResponse::default().with_entries(entries))
    }
}

/// The answer for one alteration entry: its entity as sent, and the outcome.
pub(crate) fn alter_result(entry: &AlterEntry, outcome: Result<(), Refusal>) -> AlterResultEntry {
    let entity = entry
        .entity
        .iter()
        .map(|e| AlterEntityData::default().with_entity_type(e.entity_type.clone()).with_entity_name(e.entity_name.clone()))
        .collect();
    let (code, message) = match outcome {
        Ok(()) => (error_code::NONE, None),
        Err((code, message)) => (code, Some(StrBytes::from_string(message))),
    };
    AlterResultEntry::default().with_error_code(code).with_error_message(message).with_entity(entity)
}

/// Checks one alteration as Kafka does (module docs): its entity, and the changes
/// (`None` removes a key). Removing a key that is not a quota key is no error, as in
/// Kafka: there is nothing to remove.
pub(crate) fn check_alteration(entry: &AlterEntry) -> Result<(QuotaEntity, BTreeMap<QuotaKey, Option<f64>>), Refusal> {
    let mut keys = BTreeSet::new();
    for op in &entry.ops {
        if !keys.insert(op.key.as_str()) {
            return Err(invalid(format!("duplicate quota key {}", op.key.as_str())));
        }
    }
    if entry.entity.is_empty() {
        return Err(invalid("Invalid empty client quota entity"));
    }
    let (mut user, mut client_id, mut types) = (None, None, BTreeSet::new());
    for e in &entry.entity {
        let entity_type = e.entity_type.as_str();
        if !types.insert(entity_type) {
            return Err(invalid(format!("Invalid client quota entity: duplicate entity entry {entity_type}")));
        }
        let name = e.entity_name.as_deref();
        if name == Some("") {
            return Err(invalid(format!("Empty {entity_type} not supported")));
        }
        match entity_type {
            USER => user = Some(EntityName::from_wire(name)),
            CLIENT_ID => client_id = Some(EntityName::from_wire(name)),
            IP => return Err(invalid("ip quotas (connection_creation_rate) are not supported by Fjord")),
            other => return Err(invalid(format!("Unhandled client quota entity type: {other}"))),
        }
    }
    let mut changes = BTreeMap::new();
    for op in &entry.ops {
        let name = op.key.as_str();
        let key = QuotaKey::parse(name);
        if op.remove {
            if let Some(key) = key {
                changes.insert(key, None);
            }
            continue;
        }
        let Some(key) = key else {
            return Err(match NOT_ENFORCED.contains(&name) {
                true => invalid(format!("Invalid configuration key {name}: Fjord does not enforce it")),
                false => invalid(format!("Invalid configuration key {name}")),
            });
        };
        let value = op.value;
        if key.is_long() && (value - value.round()).abs() > 1e-6 {
            return Err(invalid(format!("Configuration {name} must be a Long value")));
        }
        if !value.is_finite() || value <= 0.0 {
            return Err(invalid(format!("Configuration {name} must be positive, not {value}")));
        }
        changes.insert(key, Some(value));
    }
    Ok((QuotaEntity { user, client_id }, changes))
}

/// How one filter component matches one part (user or client id) of an entity.
enum Matcher {
    Exact(String),
    Default,
    Specified,
}

impl Matcher {
    fn matches(&self, name: Option<&EntityName>) -> bool {
        match (self, name) {
            (_, None) => false,
            (Matcher::Exact(wanted), Some(EntityName::Named(name))) => wanted == name,
            (Matcher::Exact(_), Some(EntityName::Default)) => false,
            (Matcher::Default, Some(name)) => *name == EntityName::Default,
            (Matcher::Specified, Some(_)) => true,
        }
    }
}

fn matcher(component: &ComponentData) -> Result<Matcher, String> {
    let wanted = component._match.as_ref().map(|m| m.to_string());
    match (component.match_type, wanted) {
        (MATCH_EXACT, Some(name)) => Ok(Matcher::Exact(name)),
        (MATCH_EXACT, None) => Err("Request specified MATCH_EXACT, but set match string to null".into()),
        (MATCH_DEFAULT, None) => Ok(Matcher::Default),
        (MATCH_SPECIFIED, None) => Ok(Matcher::Specified),
        (MATCH_DEFAULT | MATCH_SPECIFIED, Some(_)) => {
            Err("Request specified a match type other than MATCH_EXACT but set a match string".into())
        }
        (other, _) => Err(format!("Unexpected match type: {other}")),
    }
}

/// The DescribeClientQuotas answer from the stored quotas: every entity the filter
/// matches, with its quota values. A component per entity type it names; with `strict`,
/// an entity must have no other type either.
pub(crate) fn describe(request: &DescribeClientQuotasRequest, configs: &QuotaConfigs) -> DescribeClientQuotasResponse {
    let refuse = |message: String| {
        DescribeClientQuotasResponse::default()
            .with_error_code(error_code::INVALID_REQUEST)
            .with_error_message(Some(StrBytes::from_string(message)))
    };
    let (mut user, mut client_id, mut ip) = (None, None, false);
    for component in &request.components {
        let slot = match component.entity_type.as_str() {
            USER => &mut user,
            CLIENT_ID => &mut client_id,
            IP => {
                // Fjord stores no ip quotas: a filter on them matches nothing.
                if ip {
                    return refuse("Duplicate ip filter component entity type".into());
                }
                ip = true;
                continue;
            }
            other => return refuse(format!("Custom entity type '{other}' not supported")),
        };
        if slot.is_some() {
            return refuse(format!("Duplicate {} filter component entity type", component.entity_type.as_str()));
        }
        match matcher(component) {
            Ok(m) => *slot = Some(m),
            Err(message) => return refuse(message),
        }
    }
    if ip && (user.is_some() || client_id.is_some()) {
        return refuse("Invalid entity filter component combination, IP filter component should not be used with user or clientId filter component.".into());
    }
    let part_matches = |filter: &Option<Matcher>, name: Option<&EntityName>| match filter {
        Some(m) => m.matches(name),
        // Not filtered on: any, or (strict) only an entity without this part.
        None => !request.strict || name.is_none(),
    };
    let entries = configs
        .entities
        .iter()
        .filter(|_| !ip)
        .filter(|(entity, _)| part_matches(&user, entity.user.as_ref()) && part_matches(&client_id, entity.client_id.as_ref()))
        .map(|(entity, values)| {
            let mut parts = Vec::new();
            for (entity_type, name) in [(USER, &entity.user), (CLIENT_ID, &entity.client_id)] {
                if let Some(name) = name {
                    parts.push(
                        EntityData::default()
                            .with_entity_type(StrBytes::from_static_str(entity_type))
                            .with_entity_name(name.to_wire().map(|n| StrBytes::from_string(n.to_owned()))),
                    );
                }
            }
            let values = values
                .iter()
                .map(|(key, value)| ValueData::default().with_key(StrBytes::from_static_str(key.name())).with_value(*value))
                .collect();
            EntryData::default().with_entity(parts).with_values(values)
        })
        .collect();
    DescribeClientQuotasResponse::default().with_entries(Some(entries))
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::alter_client_quotas_request::{EntityData as AlterEntity, OpData};

    use super::*;

    fn s(v: &str) -> StrBytes {
        StrBytes::from_string(v.to_owned())
    }

    fn entry(entity: &[(&str, Option<&str>)], ops: &[(&str, f64, bool)]) -> AlterEntry {
        AlterEntry::default()
            .with_entity(
                entity.iter().map(|(t, n)| AlterEntity::default().with_entity_type(s(t)).with_entity_name(n.map(s))).collect(),
            )
            .with_ops(ops.iter().map(|(k, v, r)| OpData::default().with_key(s(k)).with_value(*v).with_remove(*r)).collect())
    }

    fn refused(e: &AlterEntry) -> String {
        let (code, message) = check_alteration(e).unwrap_err();
        assert_eq!(code, error_code::INVALID_REQUEST, "{message}");
        message
    }

    #[test]
    fn alterations_are_checked_as_kafka_checks_them() {
        let ok = check_alteration(&entry(
            &[("user", Some("alice")), ("client-id", None)],
            &[("producer_byte_rate", 5242880.0, false), ("request_percentage", 12.5, false), ("consumer_byte_rate", 0.0, true)],
        ))
        .unwrap();
        assert_eq!(ok.0, QuotaEntity { user: Some(EntityName::Named("alice".into())), client_id: Some(EntityName::Default) });
        assert_eq!(
            ok.1,
            BTreeMap::from([
                (QuotaKey::ProducerByteRate, Some(5242880.0)),
                (QuotaKey::RequestPercentage, Some(12.5)),
                (QuotaKey::ConsumerByteRate, None)
            ])
        );
        assert!(refused(&entry(&[("group", Some("g"))], &[("producer_byte_rate", 1.0, false)])).contains("entity type: group"));
        assert!(refused(&entry(&[], &[("producer_byte_rate", 1.0, false)])).contains("empty"));
        assert!(refused(&entry(&[("user", Some("a")), ("user", Some("b"))], &[])).contains("duplicate"));
        assert!(refused(&entry(&[("user", Some(""))], &[])).contains("Empty user"));
        assert!(refused(&entry(&[("user", Some("a"))], &[("fetch_rate", 1.0, false)])).contains("Invalid configuration key"));
        assert!(refused(&entry(&[("user", Some("a"))], &[("controller_mutation_rate", 1.0, false)])).contains("does not enforce"));
        assert!(refused(&entry(&[("user", Some("a"))], &[("producer_byte_rate", 1.5, false)])).contains("Long"));
        assert!(refused(&entry(&[("user", Some("a"))], &[("producer_byte_rate", -5.0, false)])).contains("positive"));
        assert!(refused(&entry(&[("user", Some("a"))], &[("request_percentage", 0.0, false)])).contains("positive"));
        let twice = entry(&[("user", Some("a"))], &[("producer_byte_rate", 1.0, false), ("producer_byte_rate", 2.0, false)]);
        assert!(refused(&twice).contains("duplicate quota key"));
        assert!(refused(&entry(&[("ip", Some("1.2.3.4"))], &[])).contains("ip"));
        // Removing a key that is no quota key removes nothing, and is fine.
        assert!(check_alteration(&entry(&[("user", Some("a"))], &[("no_such_key", 0.0, true)])).unwrap().1.is_empty());
    }

    fn stored() -> QuotaConfigs {
        let mut configs = QuotaConfigs::default();
        let named = |n: &str| Some(EntityName::Named(n.to_owned()));
        for (user, client_id) in [
            (named("alice"), None),
            (named("alice"), named("app")),
            (Some(EntityName::Default), None),
            (None, named("app")),
            (None, Some(EntityName::Default)),
        ] {
            configs.entities.entry(QuotaEntity { user, client_id }).or_default().insert(QuotaKey::ProducerByteRate, 100.0);
        }
        configs
    }

    fn component(entity_type: &str, match_type: i8, name: Option<&str>) -> ComponentData {
        ComponentData::default().with_entity_type(s(entity_type)).with_match_type(match_type).with_match(name.map(s))
    }

    /// The described entities as `user/client-id` strings (`-`: no such part, `*`: default).
    fn described(components: Vec<ComponentData>, strict: bool) -> Vec<String> {
        let request = DescribeClientQuotasRequest::default().with_components(components).with_strict(strict);
        let response = describe(&request, &stored());
        assert_eq!(response.error_code, 0, "{:?}", response.error_message);
        let name = |entry: &EntryData, t: &str| {
            entry
                .entity
                .iter()
                .find(|e| e.entity_type.as_str() == t)
                .map_or("-".to_owned(), |e| e.entity_name.as_ref().map_or("*".to_owned(), |n| n.to_string()))
        };
        let mut entities: Vec<String> =
            response.entries.unwrap().iter().map(|e| format!("{}/{}", name(e, USER), name(e, CLIENT_ID))).collect();
        entities.sort();
        entities
    }

    #[test]
    fn filters_match_as_in_kafka() {
        assert_eq!(described(vec![], false).len(), 5);
        assert_eq!(described(vec![component("user", MATCH_EXACT, Some("alice"))], false), ["alice/-", "alice/app"]);
        assert_eq!(described(vec![component("user", MATCH_EXACT, Some("alice"))], true), ["alice/-"]);
        assert_eq!(described(vec![component("user", MATCH_DEFAULT, None)], true), ["*/-"]);
        assert_eq!(described(vec![component("user", MATCH_SPECIFIED, None)], true), ["*/-", "alice/-"]);
        assert_eq!(described(vec![component("client-id", MATCH_SPECIFIED, None)], true), ["-/*", "-/app"]);
        assert_eq!(described(vec![component("client-id", MATCH_EXACT, Some("app"))], false), ["-/app", "alice/app"]);
        assert_eq!(described(vec![component("ip", MATCH_SPECIFIED, None)], false), Vec::<String>::new());
        let bad = |components: Vec<ComponentData>| {
            let request = DescribeClientQuotasRequest::default().with_components(components);
            describe(&request, &stored()).error_code
        };
        assert_eq!(bad(vec![component("group", MATCH_SPECIFIED, None)]), error_code::INVALID_REQUEST);
        assert_eq!(bad(vec![component("user", MATCH_EXACT, None)]), error_code::INVALID_REQUEST);
        assert_eq!(bad(vec![component("user", MATCH_DEFAULT, Some("x"))]), error_code::INVALID_REQUEST);
        assert_eq!(bad(vec![component("user", 7, None)]), error_code::INVALID_REQUEST);
        let twice = vec![component("user", MATCH_DEFAULT, None), component("user", MATCH_SPECIFIED, None)];
        assert_eq!(bad(twice), error_code::INVALID_REQUEST);
    }
}
