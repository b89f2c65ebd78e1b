//! Kafka's ACL model: an [`AclBinding`] grants or denies a principal, from a host, an
//! [`Operation`] on the resources a [`ResourcePattern`] names; an [`AclBindingFilter`]
//! selects bindings for DescribeAcls and DeleteAcls.
//!
//! Names and wire codes are Kafka's (`org.apache.kafka.common.acl` and
//! `org.apache.kafka.common.resource`), so the admin APIs and the stored JSON need no
//! translation tables elsewhere.

use std::fmt;
use std::str::FromStr;

use crate::{Error, Principal, Result};

/// The name that, in a literal pattern, an ACL host or principal, matches everything.
pub const WILDCARD: &str = "*";
/// The one cluster resource's name (Kafka's `kafka-cluster`).
pub const CLUSTER_NAME: &str = "kafka-cluster";

/// Defines a Kafka enum with its wire codes and its names (`as_str` is the name Kafka's
/// JSON and tools use; parsing also accepts Kafka's upper-snake `toString` form).
macro_rules! kafka_enum {
    ($(#[$meta:meta])* $name:ident, $field:literal { $($(#[$vmeta:meta])* $variant:ident = $code:literal, $text:literal, $snake:literal;)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            /// Every value.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            /// Kafka's wire code.
            pub fn code(self) -> i8 {
                match self { $($name::$variant => $code,)* }
            }

            /// The value of a Kafka wire code; `None` for UNKNOWN, ANY, MATCH and codes
            /// this model does not have.
            pub fn from_code(code: i8) -> Option<Self> {
                match code { $($code => Some($name::$variant),)* _ => None }
            }

            /// Kafka's name, as in the stored JSON (`Topic`, `Read`, `Allow`, `LITERAL`).
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text,)* }
            }
        }

        impl FromStr for $name {
            type Err = Error;

            /// Kafka's name or its upper-snake form (`ClusterAction`, `CLUSTER_ACTION`),
            /// case-insensitively.
            fn from_str(s: &str) -> Result<Self> {
                $(if s.eq_ignore_ascii_case($text) || s.eq_ignore_ascii_case($snake) { return Ok($name::$variant); })*
                Err(Error::InvalidAcl { field: $field, value: s.to_string() })
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

kafka_enum!(
    /// What an ACL protects.
    ResourceType, "resource type" {
        /// A topic.
        Topic = 2, "Topic", "TOPIC";
        /// A consumer group.
        Group = 3, "Group", "GROUP";
        /// The cluster (one resource, [`CLUSTER_NAME`]).
        Cluster = 4, "Cluster", "CLUSTER";
        /// A transactional id.
        TransactionalId = 5, "TransactionalId", "TRANSACTIONAL_ID";
        /// A schema registry subject: Describe reads its schemas and config, Write
        /// registers a version, Delete deletes versions, Alter changes its compatibility.
        /// Not a Kafka resource type: its code is outside Kafka's range (0..=7), so a Kafka
        /// client neither sends it nor is sent it by the broker's ACL APIs.
        Subject = 64, "Subject", "SUBJECT";
    }
);

impl ResourceType {
    /// Whether Kafka knows this type (Topic, Group, Cluster, TransactionalId): only these
    /// are shown to, or matched for, a Kafka client's ANY filter in DescribeAcls and
    /// DeleteAcls. A Kafka client decodes any other code as UNKNOWN (Java prints it so),
    /// and must not delete the registry's `Subject` ACLs with a filter meant for its own;
    /// those stay with the registry's and Fjord's tools, which name the type.
    pub fn is_kafka(self) -> bool {
        self != Self::Subject
    }
}

kafka_enum!(
    /// How a pattern's name matches resource names.
    PatternType, "pattern type" {
        /// The name exactly, or every resource when the name is `*`.
        Literal = 3, "LITERAL", "LITERAL";
        /// Every resource whose name starts with the pattern's name.
        Prefixed = 4, "PREFIXED", "PREFIXED";
    }
);

kafka_enum!(
    /// An operation on a resource.
    Operation, "operation" {
        /// Every operation.
        All = 2, "All", "ALL";
        /// Fetch, commit offsets, join a group.
        Read = 3, "Read", "READ";
        /// Produce.
        Write = 4, "Write", "WRITE";
        /// Create topics.
        Create = 5, "Create", "CREATE";
        /// Delete topics, groups, records.
        Delete = 6, "Delete", "DELETE";
        /// Alter partitions, ACLs.
        Alter = 7, "Alter", "ALTER";
        /// Metadata, list offsets, describe groups.
        Describe = 8, "Describe", "DESCRIBE";
        /// Broker-to-broker requests (replica fetch, controller).
        ClusterAction = 9, "ClusterAction", "CLUSTER_ACTION";
        /// DescribeConfigs.
        DescribeConfigs = 10, "DescribeConfigs", "DESCRIBE_CONFIGS";
        /// AlterConfigs, IncrementalAlterConfigs.
        AlterConfigs = 11, "AlterConfigs", "ALTER_CONFIGS";
        /// The idempotent producer's InitProducerId.
        IdempotentWrite = 12, "IdempotentWrite", "IDEMPOTENT_WRITE";
    }
);

kafka_enum!(
    /// Whether an ACL allows or denies.
    Permission, "permission type" {
        /// Denies; wins over any allow.
        Deny = 2, "Deny", "DENY";
        /// Allows.
        Allow = 3, "Allow", "ALLOW";
    }
);

impl Operation {
    /// Whether an ACL allowing `self` allows `requested`, by Kafka's implication rules:
    /// `All` allows everything; Read, Write, Delete and Alter each allow Describe;
    /// AlterConfigs allows DescribeConfigs.
    pub fn allows(self, requested: Operation) -> bool {
        self == requested
            || self == Operation::All
            || (requested == Operation::Describe
                && matches!(self, Operation::Read | Operation::Write | Operation::Delete | Operation::Alter))
            || (requested == Operation::DescribeConfigs && self == Operation::AlterConfigs)
    }

    /// Whether an ACL denying `self` denies `requested`: only the operation itself and
    /// `All` (Kafka: denying Read does not deny Describe).
    pub fn denies(self, requested: Operation) -> bool {
        self == requested || self == Operation::All
    }
}

/// Which resources an ACL applies to: a type, a name and how the name matches.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourcePattern {
    /// The type of resource.
    pub resource_type: ResourceType,
    /// A name, a prefix, or `*` (literal only).
    pub name: String,
    /// Literal or prefixed.
    pub pattern_type: PatternType,
}

impl ResourcePattern {
    /// A pattern, checked as Kafka checks one: a non-empty name, and a `Cluster` pattern
    /// names `kafka-cluster` literally.
    pub fn new(resource_type: ResourceType, name: impl Into<String>, pattern_type: PatternType) -> Result<Self> {
        let name = name.into();
        if name.is_empty() {
            return Err(Error::InvalidAcl { field: "resource name", value: name });
        }
        if resource_type == ResourceType::Cluster && (pattern_type != PatternType::Literal || name != CLUSTER_NAME) {
            return Err(Error::InvalidAcl { field: "cluster resource", value: format!("{pattern_type}:{name}") });
        }
        Ok(Self { resource_type, name, pattern_type })
    }

    /// Whether this pattern covers the resource `resource_type`/`name`.
    pub fn matches_resource(&self, resource_type: ResourceType, name: &str) -> bool {
        self.resource_type == resource_type
            && match self.pattern_type {
                PatternType::Literal => self.name == name || self.name == WILDCARD,
                PatternType::Prefixed => name.starts_with(&self.name),
            }
    }
}

impl fmt::Display for ResourcePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.resource_type, self.pattern_type, self.name)
    }
}

/// Who may (or may not) do what from where.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AccessControlEntry {
    /// The principal, or `User:*` for every user.
    pub principal: Principal,
    /// The client's IP address as text, or `*` for every host.
    pub host: String,
    /// The operation.
    pub operation: Operation,
    /// Allow or deny.
    pub permission: Permission,
}

impl AccessControlEntry {
    /// An entry; the host must be non-empty (`*` for any).
    pub fn new(principal: Principal, host: impl Into<String>, operation: Operation, permission: Permission) -> Result<Self> {
        let host = host.into();
        if host.is_empty() {
            return Err(Error::InvalidAcl { field: "host", value: host });
        }
        Ok(Self { principal, host, operation, permission })
    }

    /// Whether the entry names `principal` connecting from `host`.
    pub fn applies_to(&self, principal: &Principal, host: &str) -> bool {
        let principal_matches = &self.principal == principal
            || (self.principal.is_wildcard() && self.principal.principal_type() == principal.principal_type());
        principal_matches && (self.host == host || self.host == WILDCARD)
    }
}

/// One ACL: an entry on a pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AclBinding {
    /// The resources.
    pub pattern: ResourcePattern,
    /// Who, from where, what, allow or deny.
    pub entry: AccessControlEntry,
}

impl fmt::Display for AclBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = &self.entry;
        write!(f, "{} {} {} from {} on {}", e.permission, e.principal, e.operation, e.host, self.pattern)
    }
}

/// How a filter's name selects patterns (Kafka's `PatternType` in filters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PatternTypeFilter {
    /// Patterns of any type whose name equals the filter's.
    Any,
    /// Patterns that would match a resource with the filter's name: the literal name,
    /// the literal `*`, and every prefix of it.
    Match,
    /// Literal patterns only.
    Literal,
    /// Prefixed patterns only.
    Prefixed,
}

impl PatternTypeFilter {
    /// Kafka's wire code.
    pub fn code(self) -> i8 {
        match self {
            Self::Any => 1,
            Self::Match => 2,
            Self::Literal => 3,
            Self::Prefixed => 4,
        }
    }

    /// Kafka's wire code; `None` for UNKNOWN (0) and unknown codes.
    pub fn from_code(code: i8) -> Option<Self> {
        match code {
            1 => Some(Self::Any),
            2 => Some(Self::Match),
            3 => Some(Self::Literal),
            4 => Some(Self::Prefixed),
            _ => None,
        }
    }
}

/// Selects patterns; `None` fields match anything (Kafka's ANY / null).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourcePatternFilter {
    /// `None` = any resource type.
    pub resource_type: Option<ResourceType>,
    /// `None` = any name.
    pub name: Option<String>,
    /// How the name selects.
    pub pattern_type: PatternTypeFilter,
}

impl ResourcePatternFilter {
    /// Whether `pattern` is selected (Kafka's `ResourcePatternFilter.matches`).
    pub fn matches(&self, pattern: &ResourcePattern) -> bool {
        if self.resource_type.is_some_and(|t| t != pattern.resource_type) {
            return false;
        }
        match (self.pattern_type, pattern.pattern_type) {
            (PatternTypeFilter::Literal, PatternType::Prefixed) | (PatternTypeFilter::Prefixed, PatternType::Literal) => {
                return false
            }
            _ => {}
        }
        let Some(name) = &self.name else { return true };
        match self.pattern_type {
            PatternTypeFilter::Match => match pattern.pattern_type {
                PatternType::Literal => *name == pattern.name || pattern.name == WILDCARD,
                PatternType::Prefixed => name.starts_with(&pattern.name),
            },
            _ => *name == pattern.name,
        }
    }
}

/// Selects entries; `None` fields match anything. Values compare exactly: a filter
/// principal `User:*` selects entries for `User:*`, not every entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct AccessControlEntryFilter {
    /// `None` = any principal.
    pub principal: Option<Principal>,
    /// `None` = any host.
    pub host: Option<String>,
    /// `None` = any operation.
    pub operation: Option<Operation>,
    /// `None` = any permission.
    pub permission: Option<Permission>,
}

impl AccessControlEntryFilter {
    /// Whether `entry` is selected.
    pub fn matches(&self, entry: &AccessControlEntry) -> bool {
        self.principal.as_ref().is_none_or(|p| *p == entry.principal)
            && self.host.as_ref().is_none_or(|h| *h == entry.host)
            && self.operation.is_none_or(|o| o == entry.operation)
            && self.permission.is_none_or(|p| p == entry.permission)
    }
}

/// Kafka's `AclBindingFilter`: which bindings DescribeAcls lists and DeleteAcls removes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AclBindingFilter {
    /// Selects patterns.
    pub pattern: ResourcePatternFilter,
    /// Selects entries.
    pub entry: AccessControlEntryFilter,
}

impl AclBindingFilter {
    /// Selects every binding.
    pub fn any() -> Self {
        Self {
            pattern: ResourcePatternFilter { resource_type: None, name: None, pattern_type: PatternTypeFilter::Any },
            entry: AccessControlEntryFilter::default(),
        }
    }

    /// Whether `binding` is selected.
    pub fn matches(&self, binding: &AclBinding) -> bool {
        self.pattern.matches(&binding.pattern) && self.entry.matches(&binding.entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(t: ResourceType, name: &str, p: PatternType) -> ResourcePattern {
        ResourcePattern::new(t, name, p).unwrap()
    }

    #[test]
    fn names_and_codes_are_kafkas() {
        assert_eq!(Operation::from_code(9), Some(Operation::ClusterAction));
        assert_eq!("CLUSTER_ACTION".parse::<Operation>().unwrap(), Operation::ClusterAction);
        assert_eq!("idempotentwrite".parse::<Operation>().unwrap(), Operation::IdempotentWrite);
        assert_eq!(ResourceType::TransactionalId.code(), 5);
        assert_eq!("Topic".parse::<ResourceType>().unwrap(), ResourceType::Topic);
        assert_eq!(PatternType::Prefixed.code(), 4);
        assert_eq!(Permission::from_code(2), Some(Permission::Deny));
        assert_eq!(Operation::from_code(1), None); // ANY is a filter value, not an operation
        assert!(matches!("Fly".parse::<Operation>(), Err(Error::InvalidAcl { field: "operation", .. })));
        for op in Operation::ALL {
            assert_eq!(Operation::from_code(op.code()), Some(*op));
            assert_eq!(op.as_str().parse::<Operation>().unwrap(), *op);
        }
    }

    #[test]
    fn implication_rules() {
        use Operation::*;
        for op in [Read, Write, Delete, Alter] {
            assert!(op.allows(Describe));
            assert!(!op.denies(Describe));
        }
        assert!(AlterConfigs.allows(DescribeConfigs));
        assert!(!DescribeConfigs.allows(AlterConfigs));
        assert!(!Create.allows(Describe));
        assert!(!Describe.allows(Read));
        assert!(All.allows(ClusterAction) && All.denies(IdempotentWrite));
        assert!(!Write.allows(IdempotentWrite));
    }

    #[test]
    fn patterns_are_checked() {
        assert!(ResourcePattern::new(ResourceType::Topic, "", PatternType::Literal).is_err());
        assert!(ResourcePattern::new(ResourceType::Cluster, "x", PatternType::Literal).is_err());
        assert!(ResourcePattern::new(ResourceType::Cluster, CLUSTER_NAME, PatternType::Prefixed).is_err());
        let p = pattern(ResourceType::Topic, "orders-", PatternType::Prefixed);
        assert!(p.matches_resource(ResourceType::Topic, "orders-eu"));
        assert!(!p.matches_resource(ResourceType::Group, "orders-eu"));
        assert!(!p.matches_resource(ResourceType::Topic, "order"));
        assert!(pattern(ResourceType::Topic, "*", PatternType::Literal).matches_resource(ResourceType::Topic, "x"));
        // `*` is only a wildcard in literal patterns: a prefixed `*` is a plain prefix.
        assert!(!pattern(ResourceType::Topic, "*", PatternType::Prefixed).matches_resource(ResourceType::Topic, "x"));
        assert!(AccessControlEntry::new(Principal::user("a"), "", Operation::Read, Permission::Allow).is_err());
    }

    #[test]
    fn filters_follow_kafkas_any_and_match_semantics() {
        use PatternType::{Literal, Prefixed};
        use ResourceType::{Group, Topic};
        let patterns = [
            pattern(Topic, "orders", Literal),
            pattern(Topic, "*", Literal),
            pattern(Topic, "ord", Prefixed),
            pattern(Topic, "orders", Prefixed),
            pattern(Topic, "pay", Prefixed),
            pattern(Group, "orders", Literal),
        ];
        let select = |resource_type, name: Option<&str>, pattern_type| -> Vec<String> {
            let f = ResourcePatternFilter { resource_type, name: name.map(str::to_string), pattern_type };
            patterns.iter().filter(|p| f.matches(p)).map(ToString::to_string).collect()
        };
        assert_eq!(
            select(Some(Topic), Some("orders"), PatternTypeFilter::Any),
            ["Topic:LITERAL:orders", "Topic:PREFIXED:orders"]
        );
        assert_eq!(
            select(Some(Topic), Some("orders"), PatternTypeFilter::Match),
            ["Topic:LITERAL:orders", "Topic:LITERAL:*", "Topic:PREFIXED:ord", "Topic:PREFIXED:orders"]
        );
        assert_eq!(select(Some(Topic), Some("orders"), PatternTypeFilter::Literal), ["Topic:LITERAL:orders"]);
        assert_eq!(select(Some(Topic), None, PatternTypeFilter::Prefixed).len(), 3);
        assert_eq!(select(None, None, PatternTypeFilter::Any).len(), 6);
        assert_eq!(select(None, Some("orders"), PatternTypeFilter::Literal).len(), 2);

        let entry = AccessControlEntry::new(Principal::user("a"), "*", Operation::Read, Permission::Allow).unwrap();
        let mut f = AccessControlEntryFilter::default();
        assert!(f.matches(&entry));
        f.principal = Some(Principal::wildcard_user());
        assert!(!f.matches(&entry), "a filter's User:* is exact, not a wildcard");
        f.principal = Some(Principal::user("a"));
        f.operation = Some(Operation::Read);
        f.permission = Some(Permission::Deny);
        assert!(!f.matches(&entry));
    }
}
