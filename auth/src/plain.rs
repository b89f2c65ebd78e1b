//! SASL PLAIN (RFC 4616): `[authzid] NUL authcid NUL passwd`, checked against the user's
//! stored SCRAM credential by deriving it from the password and comparing in constant
//! time, so one credential serves both mechanisms and no password is ever stored.
//!
//! PLAIN sends the password itself: offer it only on TLS listeners.

use std::fmt;

use crate::scram::{ScramCredential, ScramMechanism};
use crate::{Error, Principal, Result};

/// Longest PLAIN message accepted (RFC 4616 allows 255 octets per field).
const MAX_MESSAGE_LEN: usize = 8 * 1024;

/// A parsed PLAIN message.
pub struct PlainMessage {
    /// The user the client authenticates as.
    pub username: String,
    password: String,
}

impl fmt::Debug for PlainMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlainMessage").field("username", &self.username).finish_non_exhaustive()
    }
}

fn malformed(reason: &'static str) -> Error {
    Error::Malformed { message: "PLAIN", reason }
}

impl PlainMessage {
    /// Parses a PLAIN message. An authorization id other than empty or the user name is
    /// refused, as Kafka does.
    pub fn parse(message: &[u8]) -> Result<Self> {
        if message.len() > MAX_MESSAGE_LEN {
            return Err(malformed("longer than 8 KiB"));
        }
        let text = std::str::from_utf8(message).map_err(|_| malformed("not UTF-8"))?;
        let mut fields = text.split('\0');
        let (Some(authzid), Some(username), Some(password), None) = (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(malformed("expected authzid NUL user NUL password"));
        };
        if username.is_empty() {
            return Err(malformed("empty user name"));
        }
        if password.is_empty() {
            return Err(malformed("empty password"));
        }
        if !authzid.is_empty() && authzid != username {
            return Err(Error::AuthzidMismatch { authzid: authzid.to_string() });
        }
        Ok(Self { username: username.to_string(), password: password.to_string() })
    }

    /// Checks the password against the user's stored credential (`None` when the user has
    /// none); `User:<name>` when it matches, [`Error::AuthenticationFailed`] otherwise.
    /// An unknown user costs the same derivation as a known one.
    pub fn verify(&self, credential: Option<(ScramMechanism, &ScramCredential)>) -> Result<Principal> {
        let matches = match credential {
            Some((mechanism, credential)) => credential.verify_password(mechanism, &self.password),
            None => {
                let fake = ScramCredential::fake(ScramMechanism::Sha256, &self.username);
                let _ = fake.verify_password(ScramMechanism::Sha256, &self.password);
                false
            }
        };
        if matches {
            Ok(Principal::user(self.username.clone()))
        } else {
            Err(Error::AuthenticationFailed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_the_password_against_the_scram_credential() {
        for m in ScramMechanism::ALL {
            let credential = ScramCredential::generate(m, "s3cret", 4096).unwrap();
            let ok = PlainMessage::parse(b"\0alice\0s3cret").unwrap();
            assert_eq!(ok.verify(Some((m, &credential))).unwrap(), Principal::user("alice"));
            let with_authzid = PlainMessage::parse(b"alice\0alice\0s3cret").unwrap();
            assert!(with_authzid.verify(Some((m, &credential))).is_ok());
            let wrong = PlainMessage::parse(b"\0alice\0s3cret!").unwrap();
            assert!(matches!(wrong.verify(Some((m, &credential))), Err(Error::AuthenticationFailed)));
            assert!(matches!(ok.verify(None), Err(Error::AuthenticationFailed)));
        }
    }

    #[test]
    fn malformed_messages_get_a_precise_error() {
        for (message, reason) in [
            (&b"alice\0s3cret"[..], "expected authzid NUL user NUL password"),
            (b"\0alice\0pw\0", "expected authzid NUL user NUL password"),
            (b"\0\0pw", "empty user name"),
            (b"\0alice\0", "empty password"),
            (b"\0al\xffice\0pw", "not UTF-8"),
        ] {
            match PlainMessage::parse(message) {
                Err(Error::Malformed { reason: r, .. }) => assert_eq!(r, reason),
                other => panic!("{message:?}: {other:?}"),
            }
        }
        assert!(matches!(PlainMessage::parse(b"admin\0alice\0pw"), Err(Error::AuthzidMismatch { .. })));
        assert!(!format!("{:?}", PlainMessage::parse(b"\0alice\0hunter2").unwrap()).contains("hunter2"));
    }
}
