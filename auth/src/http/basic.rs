//! HTTP Basic (RFC 7617) checked against the user's SCRAM credential, as SASL PLAIN is:
//! the password is derived with the credential's salt and iterations and compared in
//! constant time; no password is stored anywhere.
//!
//! Deriving costs 4096+ PBKDF2 rounds (milliseconds of CPU): it runs on the blocking pool,
//! at most [`KDF_SLOTS`] at once, so a flood of wrong passwords cannot take the async
//! workers or more than those threads. A verified pair is then trusted for the cache TTL,
//! keyed by an HMAC of user and password under a key drawn at start, so the cache holds no
//! password and its keys are useless outside this process. Failures are not cached: a
//! guesser pays a derivation per guess.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use fjord_coord::Store;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::sync::Semaphore;

use super::Unauthenticated;
use crate::plain::PlainMessage;
use crate::{store, Error, Principal};

/// Longest `Authorization` value looked at; longer ones are refused unread.
const MAX_HEADER_LEN: usize = 8 * 1024;
/// Derivations running at once.
pub(crate) const KDF_SLOTS: usize = 2;
/// Verified pairs kept; past it the expired ones go, then all.
const CACHE_ENTRIES: usize = 10_000;

type CacheKey = [u8; 32];

pub(crate) struct BasicVerifier {
    store: Store,
    ttl: Duration,
    key: [u8; 32],
    cache: Mutex<HashMap<CacheKey, (Principal, Instant)>>,
    kdf: Arc<Semaphore>,
}

/// Parses `Basic <base64(user:password)>` (scheme case-insensitive); the password may
/// hold colons, the user may not (RFC 7617).
pub fn parse_basic(header: &[u8]) -> Result<(String, String), Unauthenticated> {
    if header.len() > MAX_HEADER_LEN {
        return Err(Unauthenticated::Malformed("longer than 8 KiB"));
    }
    let text = std::str::from_utf8(header).map_err(|_| Unauthenticated::Malformed("not ASCII"))?.trim();
    let (scheme, encoded) = text.split_once(' ').ok_or(Unauthenticated::Malformed("expected `Basic <credentials>`"))?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(Unauthenticated::Malformed("only the Basic scheme is supported"));
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| Unauthenticated::Malformed("credentials are not base64"))?;
    let decoded = String::from_utf8(decoded).map_err(|_| Unauthenticated::Malformed("credentials are not UTF-8"))?;
    let (user, password) = decoded.split_once(':').ok_or(Unauthenticated::Malformed("expected user:password"))?;
    if user.is_empty() || password.is_empty() {
        return Err(Unauthenticated::Malformed("empty user or password"));
    }
    Ok((user.to_owned(), password.to_owned()))
}

impl BasicVerifier {
    pub(crate) fn new(store: Store, ttl: Duration) -> Self {
        let mut key = [0u8; 32];
        rand::fill(&mut key[..]);
        Self { store, ttl, key, cache: Mutex::new(HashMap::new()), kdf: Arc::new(Semaphore::new(KDF_SLOTS)) }
    }

    fn cache_key(&self, user: &str, password: &str) -> CacheKey {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("invariant: HMAC takes any key length");
        mac.update(user.as_bytes());
        mac.update(&[0]);
        mac.update(password.as_bytes());
        mac.finalize().into_bytes().into()
    }

    pub(crate) async fn verify(&self, header: &[u8]) -> Result<Principal, Unauthenticated> {
        let (user, password) = parse_basic(header)?;
        let key = self.cache_key(&user, &password);
        if let Some(principal) = self.cached(&key) {
            return Ok(principal);
        }
        let credentials = match store::user_credentials(&*self.store, &user).await {
            Ok(c) => c,
            // A name the store cannot hold names no user.
            Err(Error::InvalidUserName(_)) => Default::default(),
            Err(e) => return Err(Unauthenticated::Unavailable(e.to_string())),
        };
        // SASL PLAIN's check, so both front doors accept exactly the same passwords
        // (including the same constant-cost answer for an unknown user).
        let plain = [b"\0", user.as_bytes(), b"\0", password.as_bytes()].concat();
        let Ok(message) = PlainMessage::parse(&plain) else { return Err(Unauthenticated::Failed) };
        let permit = self.kdf.clone().acquire_owned().await.map_err(|_| Unauthenticated::Unavailable("shutting down".into()))?;
        let verified = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let credential = credentials.iter().next_back().map(|(m, c)| (*m, c));
            message.verify(credential)
        })
        .await
        .map_err(|e| Unauthenticated::Unavailable(format!("password check: {e}")))?;
        let principal = verified.map_err(|_| Unauthenticated::Failed)?;
        self.remember(key, principal.clone());
        Ok(principal)
    }

    fn cached(&self, key: &CacheKey) -> Option<Principal> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.get(key).filter(|(_, at)| at.elapsed() < self.ttl).map(|(p, _)| p.clone())
    }

    fn remember(&self, key: CacheKey, principal: Principal) {
        if self.ttl.is_zero() {
            return;
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_ENTRIES {
            cache.retain(|_, (_, at)| at.elapsed() < self.ttl);
            if cache.len() >= CACHE_ENTRIES {
                cache.clear();
            }
        }
        cache.insert(key, (principal, Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scram::{ScramCredential, ScramMechanism};

    fn basic(text: &str) -> Vec<u8> {
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(text)).into_bytes()
    }

    #[test]
    fn parses_basic_and_names_what_is_wrong() {
        assert_eq!(parse_basic(&basic("alice:pa:ss")).unwrap(), ("alice".into(), "pa:ss".into()));
        assert_eq!(parse_basic(b"bAsIc  YTpi ").unwrap(), ("a".into(), "b".into()));
        for (header, why) in [
            (&b"Bearer abc"[..], "only the Basic scheme is supported"),
            (b"Basic", "expected `Basic <credentials>`"),
            (b"Basic !!!notbase64", "credentials are not base64"),
            (b"Basic //79", "credentials are not UTF-8"),
            (b"Basic YWxpY2U=", "expected user:password"),
            (b"Basic OnB3", "empty user or password"),
            (b"Basic \xff", "not ASCII"),
        ] {
            assert_eq!(parse_basic(header), Err(Unauthenticated::Malformed(why)), "{header:?}");
        }
        let huge = [b"Basic ".as_slice(), &vec![b'A'; 100_000]].concat();
        assert_eq!(parse_basic(&huge), Err(Unauthenticated::Malformed("longer than 8 KiB")));
    }

    #[tokio::test]
    async fn verifies_against_the_stored_credential_and_caches_only_successes() {
        let dir = tempfile::tempdir().unwrap();
        let store = fjord_coord::open(None, dir.path()).await.unwrap();
        let credential = ScramCredential::generate(ScramMechanism::Sha256, "s3cret", 4096).unwrap();
        store::set_credential(&*store, "alice", ScramMechanism::Sha256, &credential).await.unwrap();
        let verifier = BasicVerifier::new(store.clone(), Duration::from_secs(60));
        assert_eq!(verifier.verify(&basic("alice:s3cret")).await.unwrap(), Principal::user("alice"));
        assert_eq!(verifier.verify(&basic("alice:wrong")).await, Err(Unauthenticated::Failed));
        assert_eq!(verifier.verify(&basic("nobody:s3cret")).await, Err(Unauthenticated::Failed));
        assert_eq!(verifier.verify(&basic("a/b:s3cret")).await, Err(Unauthenticated::Failed));
        assert_eq!(verifier.cache.lock().unwrap().len(), 1, "only the success is cached");
        // Within the TTL the pair is trusted without the store (the user is gone)...
        store::delete_user(&*store, "alice").await.unwrap();
        assert_eq!(verifier.verify(&basic("alice:s3cret")).await.unwrap(), Principal::user("alice"));
        // ...and with no cache every request reads the store and derives.
        let uncached = BasicVerifier::new(store, Duration::ZERO);
        assert_eq!(uncached.verify(&basic("alice:s3cret")).await, Err(Unauthenticated::Failed));
        assert!(uncached.cache.lock().unwrap().is_empty());
    }
}
