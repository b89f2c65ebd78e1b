//! The authorizer: Kafka's `AclAuthorizer` decision over an immutable, indexed ACL set.
//!
//! # The decision
//! For a principal, a client host, an operation and a resource:
//! 1. a super user (`super.users`) may do everything;
//! 2. the ACLs that cover the resource are the literal ones on its name, the literal
//!    `*` ones, and the prefixed ones on any prefix of its name;
//! 3. none at all: allowed only with `allow.everyone.if.no.acl.found` (default false);
//! 4. one that applies to the principal (`User:<name>` or `User:*`) and host (or `*`)
//!    and denies the operation (or `All`): denied; deny wins;
//! 5. one that applies and allows the operation, `All`, or an operation implying it
//!    ([`Operation::allows`]): allowed; otherwise denied.
//!
//! # Cost
//! Each check hashes the resource name once per distinct prefix length in use plus two
//! literal lookups, and walks only the ACLs of those keys: no scan of the whole set. The
//! `every_check_is_cheap` test prints the time per check over 10,000 ACLs.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::acl::{
    AccessControlEntry, AclBinding, AclBindingFilter, PatternType, Permission, ResourcePattern, CLUSTER_NAME, WILDCARD,
};
use crate::{Operation, Principal, ResourceType, Result};

/// The authorizer's settings (Kafka's broker keys).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthorizerConfig {
    /// `super.users`: principals allowed everything.
    pub super_users: Vec<Principal>,
    /// `allow.everyone.if.no.acl.found`: allow when no ACL covers the resource (default false).
    pub allow_everyone_if_no_acl_found: bool,
}

impl AuthorizerConfig {
    /// Parses `super.users` as Kafka writes it: `User:a;User:b` (blanks around entries
    /// ignored, empty string for none).
    pub fn parse_super_users(value: &str) -> Result<Vec<Principal>> {
        value.split(';').map(str::trim).filter(|s| !s.is_empty()).map(str::parse).collect()
    }
}

/// The resource a request touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resource<'a> {
    /// Its type.
    pub resource_type: ResourceType,
    /// Its name.
    pub name: &'a str,
}

impl<'a> Resource<'a> {
    /// A topic.
    pub fn topic(name: &'a str) -> Self {
        Self { resource_type: ResourceType::Topic, name }
    }

    /// A consumer group.
    pub fn group(name: &'a str) -> Self {
        Self { resource_type: ResourceType::Group, name }
    }

    /// A transactional id.
    pub fn transactional_id(name: &'a str) -> Self {
        Self { resource_type: ResourceType::TransactionalId, name }
    }

    /// A schema registry subject.
    pub fn subject(name: &'a str) -> Self {
        Self { resource_type: ResourceType::Subject, name }
    }

    /// The cluster.
    pub fn cluster() -> Self {
        Self { resource_type: ResourceType::Cluster, name: CLUSTER_NAME }
    }
}

/// ACLs of one resource type, indexed for lookups by resource name.
#[derive(Debug, Default)]
struct TypeIndex {
    /// Literal patterns by name (`*` included).
    literal: HashMap<String, Vec<AccessControlEntry>>,
    /// Prefixed patterns by prefix.
    prefixed: HashMap<String, Vec<AccessControlEntry>>,
    /// The distinct prefix lengths in `prefixed`, ascending: a check looks up only these.
    prefix_lengths: Vec<usize>,
}

fn type_slot(resource_type: ResourceType) -> usize {
    match resource_type {
        ResourceType::Topic => 0,
        ResourceType::Group => 1,
        ResourceType::Cluster => 2,
        ResourceType::TransactionalId => 3,
        ResourceType::Subject => 4,
    }
}

/// An immutable ACL set and settings; cheap to query from every request. Changes build a
/// new one ([`Authorizer::with_acls`]); [`crate::AclWatcher`] swaps it in.
#[derive(Debug, Default)]
pub struct Authorizer {
    config: AuthorizerConfig,
    acls: BTreeMap<ResourcePattern, BTreeSet<AccessControlEntry>>,
    index: [TypeIndex; 5],
}

impl Authorizer {
    /// An authorizer over `acls` (duplicates collapse).
    pub fn new(config: AuthorizerConfig, acls: impl IntoIterator<Item = AclBinding>) -> Self {
        let mut by_pattern: BTreeMap<ResourcePattern, BTreeSet<AccessControlEntry>> = BTreeMap::new();
        for binding in acls {
            by_pattern.entry(binding.pattern).or_default().insert(binding.entry);
        }
        Self::from_patterns(config, by_pattern)
    }

    /// The same settings over another ACL set.
    pub fn with_acls(&self, acls: BTreeMap<ResourcePattern, BTreeSet<AccessControlEntry>>) -> Self {
        Self::from_patterns(self.config.clone(), acls)
    }

    /// An authorizer over ACLs grouped by pattern (as the store keeps them).
    pub fn from_patterns(config: AuthorizerConfig, acls: BTreeMap<ResourcePattern, BTreeSet<AccessControlEntry>>) -> Self {
        let mut index: [TypeIndex; 5] = Default::default();
        for (pattern, entries) in &acls {
            if entries.is_empty() {
                continue;
            }
            let slot = &mut index[type_slot(pattern.resource_type)];
            let map = match pattern.pattern_type {
                PatternType::Literal => &mut slot.literal,
                PatternType::Prefixed => &mut slot.prefixed,
            };
            map.entry(pattern.name.clone()).or_default().extend(entries.iter().cloned());
        }
        for slot in &mut index {
            let lengths: BTreeSet<usize> = slot.prefixed.keys().map(String::len).collect();
            slot.prefix_lengths = lengths.into_iter().collect();
        }
        let acls = acls.into_iter().filter(|(_, entries)| !entries.is_empty()).collect();
        Self { config, acls, index }
    }

    /// The settings.
    pub fn config(&self) -> &AuthorizerConfig {
        &self.config
    }

    /// The ACLs, grouped by pattern.
    pub fn acls(&self) -> &BTreeMap<ResourcePattern, BTreeSet<AccessControlEntry>> {
        &self.acls
    }

    /// Every binding `filter` selects (DescribeAcls).
    pub fn matching(&self, filter: &AclBindingFilter) -> Vec<AclBinding> {
        self.acls
            .iter()
            .filter(|(pattern, _)| filter.pattern.matches(pattern))
            .flat_map(|(pattern, entries)| {
                entries
                    .iter()
                    .filter(|entry| filter.entry.matches(entry))
                    .map(|entry| AclBinding { pattern: pattern.clone(), entry: entry.clone() })
            })
            .collect()
    }

    /// Whether `principal`, connecting from `host` (the client's IP address as text, as
    /// `IpAddr`'s `Display` writes it), may perform `operation` on `resource`. See the
    /// module docs for the rules.
    pub fn authorize(&self, principal: &Principal, host: &str, operation: Operation, resource: Resource<'_>) -> bool {
        if self.config.super_users.iter().any(|s| s == principal) {
            return true;
        }
        let slot = &self.index[type_slot(resource.resource_type)];
        let name = resource.name;
        let literal = slot.literal.get(name).into_iter();
        let wildcard = if name == WILDCARD { None } else { slot.literal.get(WILDCARD) };
        let prefixed = slot
            .prefix_lengths
            .iter()
            .take_while(|&&len| len <= name.len())
            .filter_map(|&len| name.get(..len).and_then(|prefix| slot.prefixed.get(prefix)));
        let mut found = false;
        let mut allowed = false;
        for entries in literal.chain(wildcard).chain(prefixed) {
            found |= !entries.is_empty();
            for entry in entries {
                if !entry.applies_to(principal, host) {
                    continue;
                }
                match entry.permission {
                    Permission::Deny if entry.operation.denies(operation) => return false,
                    Permission::Allow if entry.operation.allows(operation) => allowed = true,
                    _ => {}
                }
            }
        }
        if !found {
            return self.config.allow_everyone_if_no_acl_found;
        }
        allowed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::PatternType::{Literal, Prefixed};
    use crate::acl::Permission::{Allow, Deny};
    use crate::Operation::*;

    fn acl(
        principal: &str,
        host: &str,
        op: Operation,
        perm: Permission,
        rt: ResourceType,
        name: &str,
        pt: PatternType,
    ) -> AclBinding {
        AclBinding {
            pattern: ResourcePattern::new(rt, name, pt).unwrap(),
            entry: AccessControlEntry::new(principal.parse().unwrap(), host, op, perm).unwrap(),
        }
    }

    fn topic(principal: &str, op: Operation, perm: Permission, name: &str, pt: PatternType) -> AclBinding {
        acl(principal, "*", op, perm, ResourceType::Topic, name, pt)
    }

    fn user(name: &str) -> Principal {
        Principal::user(name)
    }

    #[test]
    fn no_acl_denies_unless_configured() {
        let closed = Authorizer::new(AuthorizerConfig::default(), []);
        assert!(!closed.authorize(&user("a"), "10.0.0.1", Read, Resource::topic("t")));
        let open = Authorizer::new(AuthorizerConfig { allow_everyone_if_no_acl_found: true, ..Default::default() }, []);
        assert!(open.authorize(&user("a"), "10.0.0.1", Read, Resource::topic("t")));
        // An ACL on the resource for someone else: no longer "no ACL found".
        let open = Authorizer::new(
            AuthorizerConfig { allow_everyone_if_no_acl_found: true, ..Default::default() },
            [topic("User:b", Read, Allow, "t", Literal)],
        );
        assert!(!open.authorize(&user("a"), "10.0.0.1", Read, Resource::topic("t")));
        assert!(open.authorize(&user("a"), "10.0.0.1", Read, Resource::topic("other")));
    }

    #[test]
    fn super_users_may_do_everything() {
        let config = AuthorizerConfig {
            super_users: AuthorizerConfig::parse_super_users(" User:admin ; User:broker").unwrap(),
            ..Default::default()
        };
        let authorizer = Authorizer::new(config, [topic("User:admin", All, Deny, "t", Literal)]);
        assert!(authorizer.authorize(&user("admin"), "h", Delete, Resource::topic("t")));
        assert!(authorizer.authorize(&user("broker"), "h", ClusterAction, Resource::cluster()));
        assert!(!authorizer.authorize(&user("alice"), "h", ClusterAction, Resource::cluster()));
        assert!(AuthorizerConfig::parse_super_users("").unwrap().is_empty());
        assert!(AuthorizerConfig::parse_super_users("admin").is_err());
    }

    #[test]
    fn literal_wildcard_and_prefixed_patterns() {
        let authorizer = Authorizer::new(
            AuthorizerConfig::default(),
            [
                topic("User:a", Read, Allow, "orders", Literal),
                topic("User:b", Write, Allow, "*", Literal),
                topic("User:c", Read, Allow, "pay", Prefixed),
                topic("User:c", Read, Allow, "payments-", Prefixed),
                acl("User:d", "*", Read, Allow, ResourceType::Group, "orders", Literal),
            ],
        );
        assert!(authorizer.authorize(&user("a"), "h", Read, Resource::topic("orders")));
        assert!(!authorizer.authorize(&user("a"), "h", Read, Resource::topic("orders2")));
        assert!(!authorizer.authorize(&user("a"), "h", Write, Resource::topic("orders")));
        assert!(authorizer.authorize(&user("b"), "h", Write, Resource::topic("anything")));
        assert!(authorizer.authorize(&user("c"), "h", Read, Resource::topic("payments-eu")));
        assert!(authorizer.authorize(&user("c"), "h", Read, Resource::topic("pay")));
        assert!(!authorizer.authorize(&user("c"), "h", Read, Resource::topic("pa")));
        // Resource types are separate: a group ACL says nothing about the topic of that name.
        assert!(!authorizer.authorize(&user("d"), "h", Read, Resource::topic("orders")));
        assert!(authorizer.authorize(&user("d"), "h", Read, Resource::group("orders")));
        // Multi-byte names: prefix lengths that fall inside a character are skipped, not a panic.
        let authorizer = Authorizer::new(
            AuthorizerConfig::default(),
            [topic("User:a", Read, Allow, "é", Prefixed), topic("User:a", Read, Allow, "x", Prefixed)],
        );
        assert!(authorizer.authorize(&user("a"), "h", Read, Resource::topic("éa")));
        assert!(!authorizer.authorize(&user("a"), "h", Read, Resource::topic("ü")));
    }

    #[test]
    fn deny_wins_and_implications_hold() {
        let authorizer = Authorizer::new(
            AuthorizerConfig::default(),
            [
                topic("User:*", Read, Allow, "t", Literal),
                topic("User:mallory", Read, Deny, "t", Prefixed),
                topic("User:w", Write, Allow, "t", Literal),
                topic("User:cfg", AlterConfigs, Allow, "t", Literal),
                topic("User:all", All, Allow, "t", Literal),
                topic("User:all", Delete, Deny, "t", Literal),
            ],
        );
        assert!(authorizer.authorize(&user("anyone"), "h", Read, Resource::topic("t")));
        assert!(authorizer.authorize(&user("anyone"), "h", Describe, Resource::topic("t")));
        assert!(!authorizer.authorize(&user("mallory"), "h", Read, Resource::topic("t")));
        // Denying Read does not deny Describe, and the wildcard Read still implies it.
        assert!(authorizer.authorize(&user("mallory"), "h", Describe, Resource::topic("t")));
        assert!(authorizer.authorize(&user("w"), "h", Describe, Resource::topic("t")));
        assert!(!authorizer.authorize(&user("w"), "h", Create, Resource::topic("t")));
        assert!(authorizer.authorize(&user("cfg"), "h", DescribeConfigs, Resource::topic("t")));
        assert!(authorizer.authorize(&user("all"), "h", IdempotentWrite, Resource::topic("t")));
        assert!(!authorizer.authorize(&user("all"), "h", Delete, Resource::topic("t")));
        // A deny All denies everything, including what another ACL allows.
        let authorizer = Authorizer::new(
            AuthorizerConfig::default(),
            [topic("User:a", Read, Allow, "t", Literal), topic("User:*", All, Deny, "*", Literal)],
        );
        assert!(!authorizer.authorize(&user("a"), "h", Read, Resource::topic("t")));
        // `User:*` does not match other principal types.
        assert!(!authorizer.authorize(&"Group:x".parse().unwrap(), "h", Read, Resource::topic("u")));
    }

    #[test]
    fn hosts_match_exactly_or_by_wildcard() {
        let authorizer = Authorizer::new(
            AuthorizerConfig::default(),
            [
                acl("User:a", "10.0.0.1", Read, Allow, ResourceType::Topic, "t", Literal),
                acl("User:a", "10.0.0.9", Read, Deny, ResourceType::Topic, "t", Literal),
            ],
        );
        assert!(authorizer.authorize(&user("a"), "10.0.0.1", Read, Resource::topic("t")));
        assert!(!authorizer.authorize(&user("a"), "10.0.0.2", Read, Resource::topic("t")));
        assert!(!authorizer.authorize(&user("a"), "10.0.0.9", Read, Resource::topic("t")));
    }

    #[test]
    fn describe_filters_select_bindings() {
        let bindings = [
            topic("User:a", Read, Allow, "orders", Literal),
            topic("User:b", Write, Allow, "ord", Prefixed),
            acl("User:a", "*", Read, Allow, ResourceType::Group, "g", Literal),
        ];
        let authorizer = Authorizer::new(AuthorizerConfig::default(), bindings.clone());
        assert_eq!(authorizer.matching(&AclBindingFilter::any()).len(), 3);
        let mut filter = AclBindingFilter::any();
        filter.entry.principal = Some(user("a"));
        assert_eq!(authorizer.matching(&filter).len(), 2);
        filter.pattern.resource_type = Some(ResourceType::Topic);
        assert_eq!(authorizer.matching(&filter), [bindings[0].clone()]);
    }

    /// Prints the cost of one check over 10,000 ACLs (1,000 prefixed) and bounds it
    /// loosely, so a change that made checks scan the whole set fails here.
    #[test]
    fn every_check_is_cheap() {
        let mut bindings = Vec::new();
        for i in 0..9_000 {
            bindings.push(topic(&format!("User:u{}", i % 100), Read, Allow, &format!("topic-{i}"), Literal));
        }
        for i in 0..1_000 {
            bindings.push(topic(&format!("User:u{}", i % 100), Write, Allow, &format!("team{i}-"), Prefixed));
        }
        let authorizer = Authorizer::new(AuthorizerConfig { super_users: vec![user("admin")], ..Default::default() }, bindings);
        let principal = user("u7");
        let names: Vec<String> = (0..1000).map(|i| format!("topic-{}", i * 9)).collect();
        let checks = 200_000;
        let started = std::time::Instant::now();
        let mut allowed = 0;
        for i in 0..checks {
            let name = &names[i % names.len()];
            allowed += usize::from(authorizer.authorize(&principal, "10.1.2.3", Describe, Resource::topic(name)));
        }
        let per_check = started.elapsed() / checks as u32;
        println!("authorize: {per_check:?} per check over 10,000 ACLs ({allowed} allowed)");
        assert!(allowed > 0);
        // Debug builds are slow; a full scan of 10,000 ACLs per check would take far longer.
        assert!(per_check < std::time::Duration::from_micros(50), "{per_check:?} per check");
    }
}
