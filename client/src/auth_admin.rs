//! [`Admin`]'s ACL and SCRAM user requests: what Kafka's `kafka-acls --bootstrap-server`
//! and `kafka-configs --alter --entity-type users` send (CreateAcls, DescribeAcls,
//! DeleteAcls, AlterUserScramCredentials, DescribeUserScramCredentials), so users and
//! ACLs change while the brokers run, under the caller's own authorization (Alter or
//! Describe on the cluster).

use bytes::Bytes;
use fjord_auth::acl::{AccessControlEntryFilter, ResourcePatternFilter};
use fjord_auth::{
    AccessControlEntry, AclBinding, AclBindingFilter, Operation, PatternType, Permission, Principal, ResourcePattern,
    ResourceType, ScramCredential, ScramMechanism,
};
use kafka_protocol::messages::alter_user_scram_credentials_request::{ScramCredentialDeletion, ScramCredentialUpsertion};
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest,
    DescribeUserScramCredentialsRequest,
};
use kafka_protocol::protocol::StrBytes;

use crate::admin::Admin;
use crate::error::{Error, Result};

/// Kafka's ANY, for the filters' resource type, operation and permission.
const ANY: i8 = 1;

/// A user's SCRAM credentials as DescribeUserScramCredentials lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScramUser {
    pub name: String,
    /// Each mechanism it has a credential for, with its iterations.
    pub credentials: Vec<(ScramMechanism, u32)>,
}

fn text(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

/// An ACL `broker` described, or `Err` naming what this client cannot model.
fn binding(
    broker: &str,
    resource: (i8, &str, i8),
    principal: &str,
    host: &str,
    operation: i8,
    permission: i8,
) -> Result<AclBinding> {
    let protocol = |detail: String| Error::Protocol { broker: broker.to_owned(), detail };
    let bad = |what: &str, code: i8| protocol(format!("an ACL of unknown {what} {code}"));
    let (resource_type, name, pattern_type) = resource;
    let resource_type = ResourceType::from_code(resource_type).ok_or_else(|| bad("resource type", resource_type))?;
    let pattern_type = PatternType::from_code(pattern_type).ok_or_else(|| bad("pattern type", pattern_type))?;
    let invalid = |e: fjord_auth::Error| protocol(format!("an invalid ACL: {e}"));
    Ok(AclBinding {
        pattern: ResourcePattern::new(resource_type, name.to_owned(), pattern_type).map_err(invalid)?,
        entry: AccessControlEntry::new(
            principal.parse::<Principal>().map_err(invalid)?,
            host,
            Operation::from_code(operation).ok_or_else(|| bad("operation", operation))?,
            Permission::from_code(permission).ok_or_else(|| bad("permission", permission))?,
        )
        .map_err(invalid)?,
    })
}

/// `filter` on the wire. DescribeAcls carries the same seven fields at its top level.
fn wire_filter(filter: &AclBindingFilter) -> DeleteAclsFilter {
    let AclBindingFilter { pattern: ResourcePatternFilter { resource_type, name, pattern_type }, entry } = filter;
    let AccessControlEntryFilter { principal, host, operation, permission } = entry;
    DeleteAclsFilter::default()
        .with_resource_type_filter(resource_type.map_or(ANY, ResourceType::code))
        .with_resource_name_filter(name.as_deref().map(text))
        .with_pattern_type_filter(pattern_type.code())
        .with_principal_filter(principal.as_ref().map(|p| text(&p.to_string())))
        .with_host_filter(host.as_deref().map(text))
        .with_operation(operation.map_or(ANY, Operation::code))
        .with_permission_type(permission.map_or(ANY, Permission::code))
}

impl Admin {
    /// Creates ACLs (CreateAcls); fails on the first the broker refused.
    pub async fn create_acls(&self, bindings: &[AclBinding]) -> Result<()> {
        let conn = self.cluster.controller().await?;
        let version = conn.version::<CreateAclsRequest>(3)?;
        let creations = bindings
            .iter()
            .map(|b| {
                AclCreation::default()
                    .with_resource_type(b.pattern.resource_type.code())
                    .with_resource_name(text(&b.pattern.name))
                    .with_resource_pattern_type(b.pattern.pattern_type.code())
                    .with_principal(text(&b.entry.principal.to_string()))
                    .with_host(text(&b.entry.host))
                    .with_operation(b.entry.operation.code())
                    .with_permission_type(b.entry.permission.code())
            })
            .collect();
        let response = conn.request_at(&CreateAclsRequest::default().with_creations(creations), version).await?;
        for (result, binding) in response.results.iter().zip(bindings) {
            Error::check_kafka(
                result.error_code,
                format!("create ACL {binding}"),
                result.error_message.as_ref().map(|m| m.to_string()),
            )?;
        }
        Ok(())
    }

    /// The ACLs `filter` selects (DescribeAcls).
    pub async fn describe_acls(&self, filter: &AclBindingFilter) -> Result<Vec<AclBinding>> {
        let conn = self.cluster.controller().await?;
        let version = conn.version::<DescribeAclsRequest>(3)?;
        let f = wire_filter(filter);
        let request = DescribeAclsRequest::default()
            .with_resource_type_filter(f.resource_type_filter)
            .with_resource_name_filter(f.resource_name_filter)
            .with_pattern_type_filter(f.pattern_type_filter)
            .with_principal_filter(f.principal_filter)
            .with_host_filter(f.host_filter)
            .with_operation(f.operation)
            .with_permission_type(f.permission_type);
        let response = conn.request_at(&request, version).await?;
        Error::check_kafka(response.error_code, "describe ACLs", response.error_message.map(|m| m.to_string()))?;
        let mut out = Vec::new();
        for resource in &response.resources {
            for acl in &resource.acls {
                out.push(binding(
                    conn.addr(),
                    (resource.resource_type, resource.resource_name.as_str(), resource.pattern_type),
                    acl.principal.as_str(),
                    acl.host.as_str(),
                    acl.operation,
                    acl.permission_type,
                )?);
            }
        }
        Ok(out)
    }

    /// Deletes the ACLs each filter selects (DeleteAcls); the deleted ones, per filter.
    pub async fn delete_acls(&self, filters: &[AclBindingFilter]) -> Result<Vec<Vec<AclBinding>>> {
        let conn = self.cluster.controller().await?;
        let version = conn.version::<DeleteAclsRequest>(3)?;
        let filters = filters.iter().map(wire_filter).collect();
        let response = conn.request_at(&DeleteAclsRequest::default().with_filters(filters), version).await?;
        let mut out = Vec::new();
        for result in &response.filter_results {
            Error::check_kafka(result.error_code, "delete ACLs", result.error_message.as_ref().map(|m| m.to_string()))?;
            let mut deleted = Vec::new();
            for acl in &result.matching_acls {
                Error::check_kafka(acl.error_code, "delete ACL", acl.error_message.as_ref().map(|m| m.to_string()))?;
                deleted.push(binding(
                    conn.addr(),
                    (acl.resource_type, acl.resource_name.as_str(), acl.pattern_type),
                    acl.principal.as_str(),
                    acl.host.as_str(),
                    acl.operation,
                    acl.permission_type,
                )?);
            }
            out.push(deleted);
        }
        Ok(out)
    }

    /// Sets `user`'s password for `mechanism` (AlterUserScramCredentials): the salted
    /// password is derived here, with a fresh salt; the password never leaves.
    pub async fn set_scram_password(&self, user: &str, mechanism: ScramMechanism, password: &str, iterations: u32) -> Result<()> {
        let (salt, salted) = ScramCredential::client_salted_password(mechanism, password, iterations)
            .map_err(|e| Error::InvalidConfig(format!("SCRAM credential of {user}: {e}")))?;
        let upsertion = ScramCredentialUpsertion::default()
            .with_name(text(user))
            .with_mechanism(mechanism.code())
            .with_iterations(iterations as i32)
            .with_salt(Bytes::from(salt))
            .with_salted_password(Bytes::from(salted));
        self.alter_scram(AlterUserScramCredentialsRequest::default().with_upsertions(vec![upsertion]), user).await
    }

    /// Deletes `user`'s credential for `mechanism` (AlterUserScramCredentials).
    pub async fn delete_scram_credential(&self, user: &str, mechanism: ScramMechanism) -> Result<()> {
        let deletion = ScramCredentialDeletion::default().with_name(text(user)).with_mechanism(mechanism.code());
        self.alter_scram(AlterUserScramCredentialsRequest::default().with_deletions(vec![deletion]), user).await
    }

    async fn alter_scram(&self, request: AlterUserScramCredentialsRequest, user: &str) -> Result<()> {
        let conn = self.cluster.controller().await?;
        let response = conn.request(&request, 0).await?;
        for result in response.results {
            Error::check_kafka(
                result.error_code,
                format!("SCRAM credentials of {user}"),
                result.error_message.map(|m| m.to_string()),
            )?;
        }
        Ok(())
    }

    /// Every user with SCRAM credentials (DescribeUserScramCredentials), by name.
    pub async fn describe_scram_users(&self) -> Result<Vec<ScramUser>> {
        let conn = self.cluster.controller().await?;
        let response = conn.request(&DescribeUserScramCredentialsRequest::default().with_users(None), 0).await?;
        Error::check_kafka(response.error_code, "describe SCRAM users", response.error_message.map(|m| m.to_string()))?;
        let mut users = Vec::new();
        for result in response.results {
            let name = result.user.to_string();
            Error::check_kafka(
                result.error_code,
                format!("SCRAM credentials of {name}"),
                result.error_message.map(|m| m.to_string()),
            )?;
            let credentials = result
                .credential_infos
                .iter()
                .filter_map(|c| Some((ScramMechanism::from_code(c.mechanism)?, u32::try_from(c.iterations).ok()?)))
                .collect();
            users.push(ScramUser { name, credentials });
        }
        users.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(users)
    }
}
