//! Kafka principals: `<type>:<name>`, in practice `User:<name>`.
//!
//! A SASL or TLS connection authenticates as `User:<name>`; a connection without
//! authentication is `User:ANONYMOUS`. ACLs name principals the same way, with `User:*`
//! matching every user.

use std::fmt;
use std::str::FromStr;

use crate::Error;

/// The principal type of users (Kafka's `KafkaPrincipal.USER_TYPE`).
pub const USER_TYPE: &str = "User";
/// The name of the principal of unauthenticated connections.
pub const ANONYMOUS: &str = "ANONYMOUS";
/// The name that matches every principal of its type in an ACL.
pub const WILDCARD: &str = "*";

/// A principal: its type (`User`) and name. Compared exactly, case-sensitively, as Kafka does.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Principal {
    principal_type: String,
    name: String,
}

impl Principal {
    /// `User:<name>`.
    pub fn user(name: impl Into<String>) -> Self {
        Self { principal_type: USER_TYPE.to_string(), name: name.into() }
    }

    /// `User:ANONYMOUS`, the principal of connections that did not authenticate.
    pub fn anonymous() -> Self {
        Self::user(ANONYMOUS)
    }

    /// `User:*`, which in an ACL matches every user.
    pub fn wildcard_user() -> Self {
        Self::user(WILDCARD)
    }

    /// The type, `User` for everything Fjord authenticates.
    pub fn principal_type(&self) -> &str {
        &self.principal_type
    }

    /// The name after the colon.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this is a wildcard (`<type>:*`).
    pub fn is_wildcard(&self) -> bool {
        self.name == WILDCARD
    }
}

impl FromStr for Principal {
    type Err = Error;

    /// Parses `<type>:<name>`, splitting at the first colon as Kafka's
    /// `SecurityUtils.parseKafkaPrincipal` does (so a name may contain colons, a TLS
    /// subject for instance).
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.split_once(':') {
            Some((principal_type, name)) if !principal_type.is_empty() && !name.is_empty() => {
                Ok(Self { principal_type: principal_type.to_string(), name: name.to_string() })
            }
            _ => Err(Error::InvalidPrincipal(s.to_string())),
        }
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.principal_type, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_like_kafka() {
        let alice: Principal = "User:alice".parse().unwrap();
        assert_eq!(alice, Principal::user("alice"));
        assert_eq!(alice.to_string(), "User:alice");
        assert_eq!(Principal::anonymous().to_string(), "User:ANONYMOUS");
        let subject: Principal = "User:CN=host,O=org:x".parse().unwrap();
        assert_eq!(subject.name(), "CN=host,O=org:x");
        assert!("User:*".parse::<Principal>().unwrap().is_wildcard());
        for bad in ["", "alice", "User:", ":alice", ":"] {
            assert!(matches!(bad.parse::<Principal>(), Err(Error::InvalidPrincipal(_))), "{bad:?} accepted");
        }
        // Case matters, as in Kafka.
        assert_ne!("user:alice".parse::<Principal>().unwrap(), alice);
    }
}
