//! Kafka's security admin APIs over `fjord_auth::store`: CreateAcls, DescribeAcls,
//! DeleteAcls (v1-v3) and DescribeUserScramCredentials, AlterUserScramCredentials (v0).
//!
//! Every broker answers them by reading and writing the metadata store; brokers' ACL
//! watchers pick the changes up from there. AlterUserScramCredentials carries a
//! `SaltedPassword` the client derived; the broker keeps only StoredKey and ServerKey.
//! Who may call these APIs (Alter / Describe on the cluster, as Kafka) is checked with
//! the rest of request authorization, not here.

use std::collections::{BTreeMap, HashSet};

use fjord_auth::acl::{AccessControlEntryFilter, PatternTypeFilter, ResourcePatternFilter};
use fjord_auth::scram::ScramMechanism;
use fjord_auth::{
    store, AccessControlEntry, AclBinding, AclBindingFilter, Operation, PatternType, Permission, Principal, ResourcePattern,
    ResourceType, ScramCredential,
};
use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::{DeleteAclsFilterResult, DeleteAclsMatchingAcl};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::describe_user_scram_credentials_response::{CredentialInfo, DescribeUserScramCredentialsResult};
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse, CreateAclsRequest, CreateAclsResponse,
    DeleteAclsRequest, DeleteAclsResponse, DescribeAclsRequest, DescribeAclsResponse, DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse, ResponseKind,
};
use kafka_protocol::protocol::StrBytes;

use crate::codec::error_code;
use crate::handler::Broker;

/// Kafka's ANY in filter fields.
const ANY: i8 = 1;

fn text(s: impl Into<String>) -> StrBytes {
    StrBytes::from_string(s.into())
}

/// The store failed: logged once here, answered as UNKNOWN_SERVER_ERROR.
fn store_failure(api: &str, error: &fjord_auth::Error) -> (i16, Option<StrBytes>) {
    tracing::warn!(api, %error, "metadata store failed");
    (error_code::UNKNOWN_SERVER_ERROR, Some(text("the metadata store failed")))
}

fn code<T>(value: i8, what: &str, from_code: impl Fn(i8) -> Option<T>) -> Result<T, String> {
    from_code(value).ok_or_else(|| format!("unsupported {what} code {value}"))
}

/// A filter field: `None` for ANY, else the value of the code.
fn any_or<T>(value: i8, what: &str, from_code: impl Fn(i8) -> Option<T>) -> Result<Option<T>, String> {
    if value == ANY {
        Ok(None)
    } else {
        code(value, what, from_code).map(Some)
    }
}

/// An ACL to create, checked as Kafka checks one.
fn creation_binding(c: &AclCreation) -> Result<AclBinding, String> {
    let pattern = ResourcePattern::new(
        code(c.resource_type, "resource type", ResourceType::from_code)?,
        c.resource_name.to_string(),
        code(c.resource_pattern_type, "pattern type", PatternType::from_code)?,
    )
    .map_err(|e| e.to_string())?;
    let entry = AccessControlEntry::new(
        c.principal.parse::<Principal>().map_err(|e| e.to_string())?,
        c.host.to_string(),
        code(c.operation, "operation", Operation::from_code)?,
        code(c.permission_type, "permission type", Permission::from_code)?,
    )
    .map_err(|e| e.to_string())?;
    Ok(AclBinding { pattern, entry })
}

/// `filter` as filters of Kafka's resource types only: itself when it names a type, one
/// per Kafka type when its type is ANY.
fn kafka_types(filter: &AclBindingFilter) -> Vec<AclBindingFilter> {
    if filter.pattern.resource_type.is_some() {
        return vec![filter.clone()];
    }
    ResourceType::ALL
        .iter()
        .filter(|t| t.is_kafka())
        .map(|t| {
            let mut one = filter.clone();
            one.pattern.resource_type = Some(*t);
            one
        })
        .collect()
}

/// A DescribeAcls / DeleteAcls filter: ANY (1) and null mean "any".
#[allow(clippy::too_many_arguments)]
fn binding_filter(
    resource_type: i8,
    name: Option<&StrBytes>,
    pattern_type: i8,
    principal: Option<&StrBytes>,
    host: Option<&StrBytes>,
    operation: i8,
    permission: i8,
) -> Result<AclBindingFilter, String> {
    Ok(AclBindingFilter {
        pattern: ResourcePatternFilter {
            resource_type: any_or(resource_type, "resource type", ResourceType::from_code)?,
            name: name.map(ToString::to_string),
            pattern_type: code(pattern_type, "pattern type", PatternTypeFilter::from_code)?,
        },
        entry: AccessControlEntryFilter {
            principal: principal.map(|p| p.parse::<Principal>()).transpose().map_err(|e| e.to_string())?,
            host: host.map(ToString::to_string),
            operation: any_or(operation, "operation", Operation::from_code)?,
            permission: any_or(permission, "permission type", Permission::from_code)?,
        },
    })
}

impl Broker {
    pub(crate) async fn create_acls(&self, request: CreateAclsRequest) -> ResponseKind {
        let checked: Vec<Result<AclBinding, String>> = request.creations.iter().map(creation_binding).collect();
        let valid: Vec<AclBinding> = checked.iter().filter_map(|c| c.as_ref().ok().cloned()).collect();
        let written = store::create_acls(&**self.topics.store(), &valid).await;
        let failure = written.as_ref().err().map(|e| store_failure("CreateAcls", e));
        let results = checked
            .into_iter()
            .map(|c| {
                let (error_code, error_message) = match (c, &failure) {
                    (Err(why), _) => (error_code::INVALID_REQUEST, Some(text(why))),
                    (Ok(_), Some(failure)) => failure.clone(),
                    (Ok(binding), None) => {
                        tracing::info!(acl = %binding, "created ACL");
                        (error_code::NONE, None)
                    }
                };
                AclCreationResult::default().with_error_code(error_code).with_error_message(error_message)
            })
            .collect();
        ResponseKind::CreateAcls(CreateAclsResponse::default().with_results(results))
    }

    pub(crate) async fn describe_acls(&self, r: DescribeAclsRequest) -> ResponseKind {
        let response = DescribeAclsResponse::default();
        let filter = match binding_filter(
            r.resource_type_filter,
            r.resource_name_filter.as_ref(),
            r.pattern_type_filter,
            r.principal_filter.as_ref(),
            r.host_filter.as_ref(),
            r.operation,
            r.permission_type,
        ) {
            Ok(filter) => filter,
            Err(why) => {
                return ResponseKind::DescribeAcls(
                    response.with_error_code(error_code::INVALID_REQUEST).with_error_message(Some(text(why))),
                )
            }
        };
        let acls = match store::read_acls(&**self.topics.store()).await {
            Ok(acls) => acls,
            Err(e) => {
                let (code, message) = store_failure("DescribeAcls", &e);
                return ResponseKind::DescribeAcls(response.with_error_code(code).with_error_message(message));
            }
        };
        let resources = acls
            .into_iter()
            // ANY means any Kafka resource type (see `ResourceType::is_kafka`).
            .filter(|(pattern, _)| filter.pattern.resource_type.is_some() || pattern.resource_type.is_kafka())
            .filter(|(pattern, _)| filter.pattern.matches(pattern))
            .filter_map(|(pattern, entries)| {
                let acls: Vec<AclDescription> = entries
                    .iter()
                    .filter(|entry| filter.entry.matches(entry))
                    .map(|e| {
                        AclDescription::default()
                            .with_principal(text(e.principal.to_string()))
                            .with_host(text(e.host.clone()))
                            .with_operation(e.operation.code())
                            .with_permission_type(e.permission.code())
                    })
                    .collect();
                (!acls.is_empty()).then(|| {
                    DescribeAclsResource::default()
                        .with_resource_type(pattern.resource_type.code())
                        .with_resource_name(text(pattern.name))
                        .with_pattern_type(pattern.pattern_type.code())
                        .with_acls(acls)
                })
            })
            .collect();
        ResponseKind::DescribeAcls(response.with_resources(resources))
    }

    pub(crate) async fn delete_acls(&self, request: DeleteAclsRequest) -> ResponseKind {
        let checked: Vec<Result<AclBindingFilter, String>> = request
            .filters
            .iter()
            .map(|f| {
                binding_filter(
                    f.resource_type_filter,
                    f.resource_name_filter.as_ref(),
                    f.pattern_type_filter,
                    f.principal_filter.as_ref(),
                    f.host_filter.as_ref(),
                    f.operation,
                    f.permission_type,
                )
            })
            .collect();
        let valid: Vec<AclBindingFilter> = checked.iter().filter_map(|c| c.as_ref().ok().cloned()).collect();
        // A filter with ANY resource type deletes from Kafka's types only (see
        // `ResourceType::is_kafka`): it goes to the store as one filter per Kafka type,
        // and what those deleted is answered as that filter's.
        let expanded: Vec<Vec<AclBindingFilter>> = valid.iter().map(kafka_types).collect();
        let flat: Vec<AclBindingFilter> = expanded.iter().flatten().cloned().collect();
        let deleted = store::delete_acls(&**self.topics.store(), &flat).await;
        let failure = deleted.as_ref().err().map(|e| store_failure("DeleteAcls", e));
        let mut per_store_filter = deleted.unwrap_or_default().into_iter();
        let mut deleted = expanded
            .iter()
            .map(|parts| per_store_filter.by_ref().take(parts.len()).flatten().collect::<Vec<AclBinding>>())
            .collect::<Vec<_>>()
            .into_iter();
        let results = checked
            .into_iter()
            .map(|c| {
                let result = DeleteAclsFilterResult::default();
                match (c, &failure) {
                    (Err(why), _) => result.with_error_code(error_code::INVALID_REQUEST).with_error_message(Some(text(why))),
                    (Ok(_), Some((code, message))) => result.with_error_code(*code).with_error_message(message.clone()),
                    (Ok(_), None) => {
                        let matching = deleted.next().unwrap_or_default();
                        for binding in &matching {
                            tracing::info!(acl = %binding, "deleted ACL");
                        }
                        result.with_matching_acls(
                            matching
                                .into_iter()
                                .map(|b| {
                                    DeleteAclsMatchingAcl::default()
                                        .with_resource_type(b.pattern.resource_type.code())
                                        .with_resource_name(text(b.pattern.name))
                                        .with_pattern_type(b.pattern.pattern_type.code())
                                        .with_principal(text(b.entry.principal.to_string()))
                                        .with_host(text(b.entry.host))
                                        .with_operation(b.entry.operation.code())
                                        .with_permission_type(b.entry.permission.code())
                                })
                                .collect(),
                        )
                    }
                }
            })
            .collect();
        ResponseKind::DeleteAcls(DeleteAclsResponse::default().with_filter_results(results))
    }

    pub(crate) async fn describe_user_scram_credentials(&self, request: DescribeUserScramCredentialsRequest) -> ResponseKind {
        let store = &**self.topics.store();
        let response = DescribeUserScramCredentialsResponse::default();
        let infos = |credentials: BTreeMap<ScramMechanism, u32>| -> Vec<CredentialInfo> {
            credentials
                .into_iter()
                .map(|(m, iterations)| CredentialInfo::default().with_mechanism(m.code()).with_iterations(iterations as i32))
                .collect()
        };
        let asked: Vec<String> = request.users.unwrap_or_default().into_iter().map(|u| u.name.to_string()).collect();
        // No names (null or empty) describes every user, as Kafka.
        if asked.is_empty() {
            return match store::list_users(store).await {
                Ok(users) => ResponseKind::DescribeUserScramCredentials(
                    response.with_results(
                        users
                            .into_iter()
                            .map(|(user, credentials)| {
                                DescribeUserScramCredentialsResult::default()
                                    .with_user(text(user))
                                    .with_credential_infos(infos(credentials))
                            })
                            .collect(),
                    ),
                ),
                Err(e) => {
                    let (code, message) = store_failure("DescribeUserScramCredentials", &e);
                    ResponseKind::DescribeUserScramCredentials(response.with_error_code(code).with_error_message(message))
                }
            };
        }
        let mut seen = HashSet::new();
        let duplicated: HashSet<&String> = asked.iter().filter(|u| !seen.insert(*u)).collect();
        let mut results = Vec::new();
        let mut answered = HashSet::new();
        for user in &asked {
            if !answered.insert(user) {
                continue;
            }
            let result = DescribeUserScramCredentialsResult::default().with_user(text(user.clone()));
            let result = if duplicated.contains(user) {
                result.with_error_code(error_code::DUPLICATE_RESOURCE).with_error_message(Some(text(
                    "Cannot describe SCRAM credentials for the same user twice in a single request",
                )))
            } else {
                match store::user_credentials(store, user).await {
                    Ok(credentials) if credentials.is_empty() => result
                        .with_error_code(error_code::RESOURCE_NOT_FOUND)
                        .with_error_message(Some(text("Attempt to describe a user credential that does not exist"))),
                    Ok(credentials) => {
                        result.with_credential_infos(infos(credentials.into_iter().map(|(m, c)| (m, c.iterations)).collect()))
                    }
                    Err(fjord_auth::Error::InvalidUserName(_)) => result
                        .with_error_code(error_code::RESOURCE_NOT_FOUND)
                        .with_error_message(Some(text("Attempt to describe a user credential that does not exist"))),
                    Err(e) => {
                        let (code, message) = store_failure("DescribeUserScramCredentials", &e);
                        result.with_error_code(code).with_error_message(message)
                    }
                }
            };
            results.push(result);
        }
        ResponseKind::DescribeUserScramCredentials(response.with_results(results))
    }

    pub(crate) async fn alter_user_scram_credentials(&self, request: AlterUserScramCredentialsRequest) -> ResponseKind {
        let store = &**self.topics.store();
        // Users in order of first mention; per user, the first error found, or the changes.
        let mut users: Vec<String> = Vec::new();
        let mut errors: BTreeMap<String, (i16, &'static str)> = BTreeMap::new();
        let mut deletions: BTreeMap<String, Vec<ScramMechanism>> = BTreeMap::new();
        let mut upsertions: BTreeMap<String, Vec<(ScramMechanism, ScramCredential)>> = BTreeMap::new();
        let mut seen: HashSet<(String, i8)> = HashSet::new();
        let mentions = request
            .deletions
            .iter()
            .map(|d| (d.name.to_string(), d.mechanism, None))
            .chain(request.upsertions.iter().map(|u| (u.name.to_string(), u.mechanism, Some(u))));
        for (user, mechanism_code, upsertion) in mentions {
            if !users.contains(&user) {
                users.push(user.clone());
            }
            let checked = if user.is_empty() {
                Err((error_code::UNACCEPTABLE_CREDENTIAL, "Username must not be empty"))
            } else if !seen.insert((user.clone(), mechanism_code)) {
                Err((error_code::DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request"))
            } else if let Some(mechanism) = ScramMechanism::from_code(mechanism_code) {
                match upsertion {
                    None => Ok((mechanism, None)),
                    Some(u) => {
                        let iterations = u32::try_from(u.iterations).unwrap_or(0);
                        ScramCredential::from_client_salted_password(mechanism, &u.salted_password, u.salt.to_vec(), iterations)
                            .map(|c| (mechanism, Some(c)))
                            .map_err(|e| match e {
                                fjord_auth::Error::InvalidIterations { .. } => {
                                    (error_code::UNACCEPTABLE_CREDENTIAL, "Iterations must be between 4096 and 16384")
                                }
                                _ => (
                                    error_code::UNACCEPTABLE_CREDENTIAL,
                                    "Salt and salted password must be set for the mechanism",
                                ),
                            })
                    }
                }
            } else {
                Err((error_code::UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"))
            };
            match checked {
                Err(error) => {
                    errors.entry(user).or_insert(error);
                }
                Ok((mechanism, None)) => deletions.entry(user).or_default().push(mechanism),
                Ok((mechanism, Some(credential))) => upsertions.entry(user).or_default().push((mechanism, credential)),
            }
        }
        let mut results = Vec::new();
        for user in users {
            let outcome = match errors.get(&user) {
                Some(&(code, message)) => Err((code, Some(text(message)))),
                None => {
                    self.alter_user(
                        store,
                        &user,
                        deletions.remove(&user).unwrap_or_default(),
                        upsertions.remove(&user).unwrap_or_default(),
                    )
                    .await
                }
            };
            let (error_code, error_message) = outcome.err().unwrap_or((error_code::NONE, None));
            results.push(
                AlterUserScramCredentialsResult::default()
                    .with_user(text(user))
                    .with_error_code(error_code)
                    .with_error_message(error_message),
            );
        }
        ResponseKind::AlterUserScramCredentials(AlterUserScramCredentialsResponse::default().with_results(results))
    }

    /// Applies one user's checked changes; a deletion of a missing credential fails the
    /// user before anything is written.
    async fn alter_user(
        &self,
        store: &dyn fjord_coord::MetadataStore,
        user: &str,
        deletions: Vec<ScramMechanism>,
        upsertions: Vec<(ScramMechanism, ScramCredential)>,
    ) -> Result<(), (i16, Option<StrBytes>)> {
        let failure = |e: fjord_auth::Error| store_failure("AlterUserScramCredentials", &e);
        let existing = store::user_credentials(store, user).await.map_err(failure)?;
        if deletions.iter().any(|m| !existing.contains_key(m)) {
            return Err((error_code::RESOURCE_NOT_FOUND, Some(text("Attempt to delete a user credential that does not exist"))));
        }
        for mechanism in deletions {
            store::delete_credential(store, user, mechanism).await.map_err(failure)?;
            tracing::info!(user, %mechanism, "deleted SCRAM credential");
        }
        for (mechanism, credential) in upsertions {
            store::set_credential(store, user, mechanism, &credential).await.map_err(failure)?;
            tracing::info!(user, %mechanism, iterations = credential.iterations, "stored SCRAM credential");
        }
        Ok(())
    }
}
