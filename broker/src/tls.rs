//! TLS for `SSL` and `SASL_SSL` listeners. The server side (PEM files as Kafka's KIP-651
//! reads them, reloading, client-certificate principals) is `fjord_auth::tls`, shared
//! with the gateway and the registry; what is the broker's own is the client side of its
//! connections to the other brokers.

pub use fjord_auth::tls::{certificate_subject, ClientAuth, MappingRule, SslConfig, TlsServer};
use fjord_auth::tls::{invalid_file, provider};
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::{Error, Result};

/// Loads the listeners' key and trust stores; an error names the file and what is wrong.
pub(crate) fn server(config: SslConfig) -> Result<TlsServer> {
    TlsServer::new(config).map_err(config_error)
}

/// The broker's error for fjord-auth's complaint about a TLS setting.
fn config_error(e: fjord_auth::Error) -> Error {
    match e {
        fjord_auth::Error::InvalidConfig { key, value, reason } => Error::InvalidConfig { key, value, reason },
        other => Error::InvalidConfig { key: "ssl".into(), value: String::new(), reason: other.to_string() },
    }
}

/// The client side of TLS for this broker's connections to the others: trusting
/// `ssl.truststore.location`, presenting `ssl.keystore.location` (when set) to a peer that
/// asks for a client certificate.
pub(crate) fn client_config(config: &SslConfig) -> Result<rustls::ClientConfig> {
    let invalid = |key: &str, path: &std::path::Path, reason: String| config_error(invalid_file(key, path, reason));
    let truststore = config.truststore_location.as_deref().ok_or_else(|| Error::InvalidConfig {
        key: "ssl.truststore.location".into(),
        value: String::new(),
        reason: "a TLS inter-broker listener needs the CA certificates its peers' certificates chain to".into(),
    })?;
    let mut roots = RootCertStore::empty();
    let cas = CertificateDer::pem_file_iter(truststore)
        .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| invalid("ssl.truststore.location", truststore, format!("reading certificates: {e}")))?;
    if roots.add_parsable_certificates(cas).0 == 0 {
        return Err(invalid("ssl.truststore.location", truststore, "no usable CA certificate in the file".into()));
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("ssl.truststore.location", truststore, e.to_string()))?
        .with_root_certificates(roots);
    match &config.keystore_location {
        None => Ok(builder.with_no_client_auth()),
        Some(keystore) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(keystore)
                .and_then(|certs| certs.collect::<std::result::Result<_, _>>())
                .map_err(|e| invalid("ssl.keystore.location", keystore, format!("reading certificates: {e}")))?;
            let key = PrivateKeyDer::from_pem_file(keystore)
                .map_err(|e| invalid("ssl.keystore.location", keystore, format!("no usable private key: {e}")))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| invalid("ssl.keystore.location", keystore, e.to_string()))
        }
    }
}
