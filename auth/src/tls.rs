//! The server side of TLS, shared by the broker's `SSL` / `SASL_SSL` listeners and the
//! gateway's and registry's HTTPS and gRPC listeners, with PEM files as Kafka's KIP-651
//! reads them:
//! `ssl.keystore.location` holds the private key and the certificate chain,
//! `ssl.truststore.location` the CA certificates client certificates are checked
//! against, `ssl.client.auth` says whether a client certificate is asked for.
//!
//! A client certificate names the connection's principal: `User:` + its subject in RFC
//! 2253 form (`CN=alice,O=Example`), or what the first matching rule of
//! `ssl.principal.mapping.rules` makes of it (`RULE:^CN=([^,]+).*$/$1/,DEFAULT` takes the
//! CN).
//!
//! The files are re-read when they change (checked at most once a second, on the next
//! handshake), so certificates are rotated without a restart; a rotation that does not
//! load (a half-written file, a key that does not match) is logged and the previous
//! certificates stay in use.

mod subject;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use regex::Regex;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::{Error, Result};

/// How often the key and trust files are checked for changes, at most.
const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// `ssl.client.auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientAuth {
    /// No client certificate is asked for.
    #[default]
    None,
    /// One is asked for; a client without one connects as `User:ANONYMOUS`.
    Requested,
    /// A client without a trusted certificate cannot connect.
    Required,
}

/// The `ssl.*` keys of the broker.
#[derive(Debug, Clone, Default)]
pub struct SslConfig {
    /// `ssl.keystore.location`: PEM with the private key and the certificate chain.
    pub keystore_location: Option<PathBuf>,
    /// `ssl.truststore.location`: PEM with the CA certificates client certificates must
    /// chain to.
    pub truststore_location: Option<PathBuf>,
    /// `ssl.client.auth`: none (default), requested or required.
    pub client_auth: ClientAuth,
    /// `ssl.principal.mapping.rules`, parsed; empty is `DEFAULT` (the whole subject).
    pub principal_mapping_rules: Vec<MappingRule>,
}

impl SslConfig {
    /// The `ssl.*` keys this config reads.
    pub const KEYS: &'static [&'static str] = &[
        "ssl.keystore.type",
        "ssl.truststore.type",
        "ssl.keystore.location",
        "ssl.truststore.location",
        "ssl.client.auth",
        "ssl.principal.mapping.rules",
        "ssl.key.password",
    ];

    /// Sets one `ssl.*` key; the error is the reason.
    pub fn set(&mut self, key: &str, value: &str) -> std::result::Result<(), String> {
        let value = value.trim();
        let path = || Some(PathBuf::from(value)).filter(|p| !p.as_os_str().is_empty());
        match key {
            "ssl.keystore.type" | "ssl.truststore.type" if value.eq_ignore_ascii_case("PEM") => {}
            "ssl.keystore.type" | "ssl.truststore.type" => return Err("only PEM files are supported (KIP-651)".into()),
            "ssl.keystore.location" => self.keystore_location = path(),
            "ssl.truststore.location" => self.truststore_location = path(),
            "ssl.client.auth" => {
                self.client_auth = match value.to_ascii_lowercase().as_str() {
                    "none" => ClientAuth::None,
                    "requested" => ClientAuth::Requested,
                    "required" => ClientAuth::Required,
                    _ => return Err("expected none, requested or required".into()),
                }
            }
            "ssl.principal.mapping.rules" => self.principal_mapping_rules = parse_rules(value)?,
            "ssl.key.password" if value.is_empty() => {}
            "ssl.key.password" => return Err("encrypted private keys are not supported: give an unencrypted PKCS#8 key".into()),
            _ => return Err("not an ssl key".into()),
        }
        Ok(())
    }

    /// The principal of a client certificate's subject (RFC 2253): `User:` + what the
    /// first matching mapping rule makes of it, or the subject itself.
    pub fn principal(&self, subject: &str) -> crate::Principal {
        crate::Principal::user(self.principal_name(subject))
    }

    fn principal_name(&self, subject: &str) -> String {
        self.principal_mapping_rules.iter().find_map(|rule| rule.apply(subject)).unwrap_or_else(|| subject.to_owned())
    }
}

/// One rule of `ssl.principal.mapping.rules`: `RULE:pattern/replacement/[LU]`, or
/// `DEFAULT` (the subject as it is). The pattern must match the whole subject.
#[derive(Debug, Clone)]
pub struct MappingRule {
    pattern: Option<Regex>,
    replacement: String,
    case: Option<char>,
}

impl MappingRule {
    fn apply(&self, subject: &str) -> Option<String> {
        let Some(pattern) = &self.pattern else { return Some(subject.to_owned()) };
        pattern.is_match(subject).then_some(())?;
        let mapped = pattern.replace(subject, self.replacement.as_str()).into_owned();
        Some(match self.case {
            Some('L') => mapped.to_lowercase(),
            Some('U') => mapped.to_uppercase(),
            _ => mapped,
        })
    }
}

/// Parses Kafka's rule list: `RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L,DEFAULT`.
fn parse_rules(value: &str) -> std::result::Result<Vec<MappingRule>, String> {
    let mut rules = Vec::new();
    let mut rest = value.trim();
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("DEFAULT") {
            rules.push(MappingRule { pattern: None, replacement: String::new(), case: None });
            rest = after.trim_start().trim_start_matches(',').trim_start();
            continue;
        }
        let body =
            rest.strip_prefix("RULE:").ok_or_else(|| format!("`{rest}`: expected RULE:pattern/replacement/ or DEFAULT"))?;
        // pattern/replacement/ then an optional L or U; `/` inside them is not supported.
        let mut pieces = body.splitn(3, '/');
        let (pattern, replacement, tail) = match (pieces.next(), pieces.next(), pieces.next()) {
            (Some(p), Some(r), Some(t)) => (p, r, t),
            _ => return Err(format!("`{rest}`: expected RULE:pattern/replacement/")),
        };
        let (case, tail) = match tail.chars().next() {
            Some(c @ ('L' | 'U')) => (Some(c), &tail[1..]),
            _ => (None, tail),
        };
        let anchored = format!("^(?:{pattern})$");
        let pattern = Regex::new(&anchored).map_err(|e| format!("`{pattern}`: {e}"))?;
        rules.push(MappingRule { pattern: Some(pattern), replacement: replacement.to_owned(), case });
        rest = tail.trim_start();
        if !rest.is_empty() {
            rest = rest.strip_prefix(',').ok_or_else(|| format!("`{rest}`: rules are separated by commas"))?.trim_start();
        }
    }
    Ok(rules)
}

/// The server side of TLS: the current acceptor, rebuilt when the files change.
pub struct TlsServer {
    config: SslConfig,
    /// ALPN protocols offered, most preferred first (none for Kafka listeners).
    alpn: Vec<Vec<u8>>,
    state: Mutex<Loaded>,
}

struct Loaded {
    acceptor: TlsAcceptor,
    /// Modification times of the key and trust files when they were loaded.
    stamps: Vec<Option<SystemTime>>,
    checked: Instant,
}

impl TlsServer {
    /// Loads the files; an error names the file and what is wrong with it.
    pub fn new(config: SslConfig) -> Result<Self> {
        Self::with_alpn(config, Vec::new())
    }

    /// [`TlsServer::new`] offering the ALPN protocols `alpn` (`h2`, `http/1.1`): HTTP/2
    /// clients, gRPC's above all, refuse a TLS server that negotiates none.
    pub fn with_alpn(config: SslConfig, alpn: Vec<Vec<u8>>) -> Result<Self> {
        let stamps = stamps(&config);
        let acceptor = TlsAcceptor::from(Arc::new(server_config(&config, &alpn)?));
        Ok(Self { config, alpn, state: Mutex::new(Loaded { acceptor, stamps, checked: Instant::now() }) })
    }

    /// The acceptor for the next handshake: the files as they are now, re-read if they
    /// changed since they were loaded.
    pub fn acceptor(&self) -> TlsAcceptor {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.checked.elapsed() >= RELOAD_CHECK {
            state.checked = Instant::now();
            let now = stamps(&self.config);
            if now != state.stamps {
                state.stamps = now;
                match server_config(&self.config, &self.alpn) {
                    Ok(config) => {
                        state.acceptor = TlsAcceptor::from(Arc::new(config));
                        tracing::info!("TLS key store or trust store changed: reloaded");
                    }
                    Err(e) => tracing::error!(error = %e, "TLS files changed but do not load; the previous ones stay in use"),
                }
            }
        }
        state.acceptor.clone()
    }

    /// The settings the files were loaded from.
    pub fn config(&self) -> &SslConfig {
        &self.config
    }
}

fn stamps(config: &SslConfig) -> Vec<Option<SystemTime>> {
    [&config.keystore_location, &config.truststore_location]
        .into_iter()
        .map(|path| path.as_ref().and_then(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok()))
        .collect()
}

/// The subject of a DER certificate in RFC 2253 form (`CN=alice,O=Example`), as Kafka
/// names a TLS client before `ssl.principal.mapping.rules`; `None` if it does not parse.
pub fn certificate_subject(der: &[u8]) -> Option<String> {
    subject::subject_rfc2253(der)
}

/// The error for a TLS file `path` set by `key` that cannot be used.
pub fn invalid_file(key: &str, path: &Path, reason: String) -> Error {
    Error::InvalidConfig { key: key.into(), value: path.display().to_string(), reason }
}

/// The crypto provider every Fjord TLS config uses (ring).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A rustls server config from the PEM files.
fn server_config(config: &SslConfig, alpn: &[Vec<u8>]) -> Result<ServerConfig> {
    let keystore = config.keystore_location.as_deref().ok_or_else(|| Error::InvalidConfig {
        key: "ssl.keystore.location".into(),
        value: String::new(),
        reason: "an SSL or SASL_SSL listener needs a PEM key store (private key and certificate chain)".into(),
    })?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(keystore)
        .and_then(|certs| certs.collect::<std::result::Result<_, _>>())
        .map_err(|e| invalid_file("ssl.keystore.location", keystore, format!("reading certificates: {e}")))?;
    if chain.is_empty() {
        return Err(invalid_file("ssl.keystore.location", keystore, "no CERTIFICATE in the file".into()));
    }
    let key = PrivateKeyDer::from_pem_file(keystore)
        .map_err(|e| invalid_file("ssl.keystore.location", keystore, format!("no usable private key: {e}")))?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid_file("ssl.keystore.location", keystore, e.to_string()))?;
    let builder = match (config.client_auth, &config.truststore_location) {
        (ClientAuth::None, _) => builder.with_no_client_auth(),
        (_, None) => {
            return Err(Error::InvalidConfig {
                key: "ssl.truststore.location".into(),
                value: String::new(),
                reason: "ssl.client.auth asks for client certificates: a PEM trust store must say which CAs to accept".into(),
            })
        }
        (auth, Some(truststore)) => {
            let mut roots = RootCertStore::empty();
            let cas = CertificateDer::pem_file_iter(truststore)
                .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
                .map_err(|e| invalid_file("ssl.truststore.location", truststore, format!("reading certificates: {e}")))?;
            let (added, _) = roots.add_parsable_certificates(cas);
            if added == 0 {
                return Err(invalid_file("ssl.truststore.location", truststore, "no usable CA certificate in the file".into()));
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
            let verifier = match auth {
                ClientAuth::Requested => verifier.allow_unauthenticated(),
                _ => verifier,
            }
            .build()
            .map_err(|e| invalid_file("ssl.truststore.location", truststore, e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut server = builder
        .with_single_cert(chain, key)
        .map_err(|e| invalid_file("ssl.keystore.location", keystore, format!("key and certificate do not go together: {e}")))?;
    server.alpn_protocols = alpn.to_vec();
    Ok(server)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_rules_take_the_cn_or_keep_the_subject() {
        let mut config = SslConfig::default();
        let subject = "CN=alice,OU=ServiceUsers,O=Example,C=NO";
        assert_eq!(config.principal_name(subject), subject, "no rules: DEFAULT");
        config.set("ssl.principal.mapping.rules", "RULE:^CN=([^,]+),OU=ServiceUsers.*$/$1/U, DEFAULT").unwrap();
        assert_eq!(config.principal_name(subject), "ALICE");
        assert_eq!(config.principal_name("CN=bob,O=Other"), "CN=bob,O=Other", "no rule matches: DEFAULT");
        config.set("ssl.principal.mapping.rules", "RULE:CN=([^,]+).*/$1/").unwrap();
        assert_eq!(config.principal_name("CN=bob,O=Other"), "bob");
        assert_eq!(config.principal_name("O=Other,CN=bob"), "O=Other,CN=bob", "the pattern must match the whole subject");
        for bad in ["RULE:(/x/", "RULE:abc", "DEFAULTS", "RULE:a/b/ RULE:c/d/"] {
            assert!(SslConfig::default().set("ssl.principal.mapping.rules", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_pem_and_unencrypted_keys() {
        let mut config = SslConfig::default();
        config.set("ssl.keystore.type", "PEM").unwrap();
        assert!(config.set("ssl.keystore.type", "JKS").is_err());
        assert!(config.set("ssl.key.password", "secret").is_err());
        assert!(config.set("ssl.client.auth", "maybe").is_err());
        config.set("ssl.client.auth", "REQUIRED").unwrap();
        assert_eq!(config.client_auth, ClientAuth::Required);
    }

    #[test]
    fn missing_or_unusable_files_are_config_errors() {
        assert!(
            matches!(TlsServer::new(SslConfig::default()), Err(Error::InvalidConfig { key, .. }) if key == "ssl.keystore.location")
        );
        let dir = tempfile::tempdir().unwrap();
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a pem file").unwrap();
        let config = SslConfig { keystore_location: Some(garbage), ..SslConfig::default() };
        assert!(matches!(TlsServer::new(config), Err(Error::InvalidConfig { .. })));
    }
}
