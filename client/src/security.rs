//! Kafka's client security settings (`security.protocol`, `sasl.*`, `ssl.*`) and the
//! handshake each connection does with them before its first request: TLS (rustls), then
//! SaslHandshake v1 and the mechanism's SaslAuthenticate exchange (PLAIN, or SCRAM through
//! `fjord-auth`'s client half, so the client and the broker share one SCRAM implementation).
//!
//! The SASL exchange runs on the bare stream, one request at a time, before the connection
//! starts pipelining: nothing else may be sent until the broker has authenticated us.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use fjord_auth::{ScramClient, ScramMechanism};
use kafka_protocol::messages::{
    RequestHeader, ResponseHeader, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::{Error, Result};
use crate::guard;

/// Largest SASL response accepted; real ones are a few hundred bytes.
const MAX_SASL_FRAME: usize = 64 * 1024;
/// Kafka's SASL_AUTHENTICATION_FAILED and UNSUPPORTED_SASL_MECHANISM codes.
const SASL_AUTHENTICATION_FAILED: i16 = 58;
const UNSUPPORTED_SASL_MECHANISM: i16 = 33;

/// `security.protocol`: how connections to the brokers are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SecurityProtocol {
    /// `PLAINTEXT`: TCP, no authentication.
    #[default]
    Plaintext,
    /// `SSL`: TLS (with a client certificate when `ssl.certificate.location` is set).
    Ssl,
    /// `SASL_PLAINTEXT`: SASL authentication over TCP.
    SaslPlaintext,
    /// `SASL_SSL`: SASL authentication over TLS.
    SaslSsl,
}

impl SecurityProtocol {
    /// Whether connections are TLS.
    pub fn uses_tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }

    /// Whether connections authenticate with SASL.
    pub fn uses_sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }
}

impl FromStr for SecurityProtocol {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_uppercase().as_str() {
            "PLAINTEXT" => Self::Plaintext,
            "SSL" => Self::Ssl,
            "SASL_PLAINTEXT" => Self::SaslPlaintext,
            "SASL_SSL" => Self::SaslSsl,
            _ => {
                return Err(Error::InvalidConfig(format!(
                    "security.protocol {s:?} is not one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"
                )))
            }
        })
    }
}

/// `sasl.mechanism`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SaslMechanism {
    /// `PLAIN` (RFC 4616): the password travels as is, so use it over TLS only.
    Plain,
    /// `SCRAM-SHA-256` (RFC 7677).
    #[default]
    ScramSha256,
    /// `SCRAM-SHA-512`.
    ScramSha512,
}

impl SaslMechanism {
    /// The SASL name, as sent in SaslHandshake.
    pub fn name(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::ScramSha256 => "SCRAM-SHA-256",
            Self::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

impl FromStr for SaslMechanism {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_uppercase().as_str() {
            "PLAIN" => Self::Plain,
            "SCRAM-SHA-256" => Self::ScramSha256,
            "SCRAM-SHA-512" => Self::ScramSha512,
            _ => {
                return Err(Error::InvalidConfig(format!(
                    "sasl.mechanism {s:?} is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"
                )))
            }
        })
    }
}

/// The security settings of a client (Kafka's names on each field).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecurityConfig {
    /// `security.protocol`.
    pub protocol: SecurityProtocol,
    /// `sasl.mechanism` (SCRAM-SHA-256 unless set).
    pub sasl_mechanism: SaslMechanism,
    /// `sasl.username`.
    pub sasl_username: Option<String>,
    /// `sasl.password`; never printed by `Debug`.
    pub sasl_password: Option<String>,
    /// `ssl.ca.location`: PEM file of the CA certificates the brokers' certificates chain to.
    pub ssl_ca_location: Option<PathBuf>,
    /// `ssl.certificate.location`: PEM file of this client's certificate chain.
    pub ssl_certificate_location: Option<PathBuf>,
    /// `ssl.key.location`: PEM file of this client's private key.
    pub ssl_key_location: Option<PathBuf>,
}

impl fmt::Debug for SecurityConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecurityConfig")
            .field("protocol", &self.protocol)
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("sasl_username", &self.sasl_username)
            .field("sasl_password", &self.sasl_password.as_ref().map(|_| "<hidden>"))
            .field("ssl_ca_location", &self.ssl_ca_location)
            .field("ssl_certificate_location", &self.ssl_certificate_location)
            .field("ssl_key_location", &self.ssl_key_location)
            .finish()
    }
}

impl SecurityConfig {
    /// Sets one security property by its Kafka name; `Ok(false)` when `key` is not one.
    pub fn set(&mut self, key: &str, value: &str) -> Result<bool> {
        let path = || Some(PathBuf::from(value));
        match key {
            "security.protocol" => self.protocol = value.parse()?,
            "sasl.mechanism" => self.sasl_mechanism = value.parse()?,
            "sasl.username" => self.sasl_username = Some(value.to_owned()),
            "sasl.password" => self.sasl_password = Some(value.to_owned()),
            "ssl.ca.location" => self.ssl_ca_location = path(),
            "ssl.certificate.location" => self.ssl_certificate_location = path(),
            "ssl.key.location" => self.ssl_key_location = path(),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Checks the settings fit together and loads the TLS files, once per client.
    pub(crate) fn prepare(&self) -> Result<Arc<Prepared>> {
        let tls = if self.protocol.uses_tls() { Some(Arc::new(self.tls_config()?)) } else { None };
        let sasl = if self.protocol.uses_sasl() {
            let missing = |key: &str| Error::InvalidConfig(format!("security.protocol {:?} needs {key}", self.protocol));
            let username = self.sasl_username.clone().filter(|u| !u.is_empty()).ok_or_else(|| missing("sasl.username"))?;
            let password = self.sasl_password.clone().ok_or_else(|| missing("sasl.password"))?;
            Some(Sasl { mechanism: self.sasl_mechanism, username, password })
        } else {
            None
        };
        Ok(Arc::new(Prepared { tls, sasl }))
    }

    fn tls_config(&self) -> Result<rustls::ClientConfig> {
        let invalid =
            |key: &str, path: &Path, reason: String| Error::InvalidConfig(format!("{key} {}: {reason}", path.display()));
        let ca = self.ssl_ca_location.as_deref().ok_or_else(|| {
            Error::InvalidConfig(format!(
                "security.protocol {:?} needs ssl.ca.location (the CA certificates the brokers' certificates chain to)",
                self.protocol
            ))
        })?;
        let cas = CertificateDer::pem_file_iter(ca)
            .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
            .map_err(|e| invalid("ssl.ca.location", ca, format!("reading certificates: {e}")))?;
        let mut roots = RootCertStore::empty();
        if roots.add_parsable_certificates(cas).0 == 0 {
            return Err(invalid("ssl.ca.location", ca, "no usable CA certificate in the file".into()));
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("ssl.ca.location", ca, e.to_string()))?
            .with_root_certificates(roots);
        match (&self.ssl_certificate_location, &self.ssl_key_location) {
            (None, None) => Ok(builder.with_no_client_auth()),
            (Some(cert), Some(key)) => {
                let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                    .and_then(|certs| certs.collect::<std::result::Result<_, _>>())
                    .map_err(|e| invalid("ssl.certificate.location", cert, format!("reading certificates: {e}")))?;
                if chain.is_empty() {
                    return Err(invalid("ssl.certificate.location", cert, "no certificate in the file".into()));
                }
                let private = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| invalid("ssl.key.location", key, format!("no usable private key: {e}")))?;
                builder.with_client_auth_cert(chain, private).map_err(|e| invalid("ssl.key.location", key, e.to_string()))
            }
            _ => Err(Error::InvalidConfig("ssl.certificate.location and ssl.key.location must be set together".into())),
        }
    }
}

/// `key=value` lines of a Java properties file (as Kafka's `--command-config` reads):
/// blank lines and lines starting with `#` or `!` are skipped, `:` also separates, and
/// spaces around keys and values are trimmed. A line without a separator is an error
/// naming its number (it would otherwise be silently ignored).
pub fn parse_properties(text: &str) -> Result<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
            continue;
        }
        match line.split_once(['=', ':']) {
            Some((key, value)) if !key.trim().is_empty() => pairs.push((key.trim().to_owned(), value.trim().to_owned())),
            _ => return Err(Error::InvalidConfig(format!("line {} is not key=value", number + 1))),
        }
    }
    Ok(pairs)
}

/// The settings as each connection uses them: TLS files loaded, SASL checked complete.
pub(crate) struct Prepared {
    pub(crate) tls: Option<Arc<rustls::ClientConfig>>,
    pub(crate) sasl: Option<Sasl>,
}

pub(crate) struct Sasl {
    mechanism: SaslMechanism,
    username: String,
    password: String,
}

/// A connection's stream: TCP, or TLS over it.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Stream for T {}

/// Does the TLS handshake with the broker at `addr` over `tcp`.
pub(crate) async fn tls_handshake(
    tls: &Arc<rustls::ClientConfig>,
    addr: &str,
    tcp: tokio::net::TcpStream,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(host.to_owned()).map_err(|e| Error::TlsHandshake {
        broker: addr.to_owned(),
        reason: format!("{host:?} is not a TLS server name: {e}"),
    })?;
    tokio_rustls::TlsConnector::from(tls.clone())
        .connect(name, tcp)
        .await
        .map_err(|e| Error::TlsHandshake { broker: addr.to_owned(), reason: e.to_string() })
}

/// SaslHandshake v1, then the mechanism's tokens in SaslAuthenticate v1 requests, on a
/// stream nothing else uses yet. Returns the next free correlation id.
pub(crate) async fn authenticate(
    stream: &mut (impl Stream + ?Sized),
    addr: &str,
    client_id: &StrBytes,
    sasl: &Sasl,
) -> Result<i32> {
    let mut exchange = Exchange { stream, addr, client_id, correlation_id: 0 };
    let mechanism = sasl.mechanism.name();
    let handshake = SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism));
    let answer = exchange.call(&handshake, 1).await?;
    match answer.error_code {
        0 => {}
        UNSUPPORTED_SASL_MECHANISM => {
            return Err(Error::UnsupportedSaslMechanism {
                broker: addr.to_owned(),
                mechanism,
                enabled: answer.mechanisms.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(", "),
            })
        }
        code => {
            return Err(Error::kafka(code, format!("SaslHandshake {mechanism} with {addr}"), None)
                .unwrap_or_else(|| protocol(addr, format!("SaslHandshake answered unknown error {code}"))))
        }
    }
    let failed = |response: &SaslAuthenticateResponse| -> Result<()> {
        match response.error_code {
            0 => Ok(()),
            code => Err(Error::AuthenticationFailed {
                broker: addr.to_owned(),
                mechanism,
                username: sasl.username.clone(),
                message: response.error_message.as_ref().map_or_else(
                    || if code == SASL_AUTHENTICATION_FAILED { "invalid credentials".into() } else { format!("error {code}") },
                    |m| m.to_string(),
                ),
            }),
        }
    };
    let step = |token: Vec<u8>| SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token));
    match sasl.mechanism {
        SaslMechanism::Plain => {
            let token = format!("\0{}\0{}", sasl.username, sasl.password).into_bytes();
            failed(&exchange.call(&step(token), 1).await?)?;
        }
        SaslMechanism::ScramSha256 | SaslMechanism::ScramSha512 => {
            let m = if sasl.mechanism == SaslMechanism::ScramSha256 { ScramMechanism::Sha256 } else { ScramMechanism::Sha512 };
            let (mut client, first) = ScramClient::new(m, &sasl.username, &sasl.password);
            let response = exchange.call(&step(first), 1).await?;
            failed(&response)?;
            let last =
                client.client_final(&response.auth_bytes).map_err(|e| protocol(addr, format!("SCRAM server-first: {e}")))?;
            let response = exchange.call(&step(last), 1).await?;
            failed(&response)?;
            // A broker that cannot prove it knows the credential is not the one we trust.
            client
                .verify_server_final(&response.auth_bytes)
                .map_err(|e| protocol(addr, format!("SCRAM server-final does not prove the server knows the credential: {e}")))?;
        }
    }
    Ok(exchange.correlation_id)
}

fn protocol(addr: &str, detail: String) -> Error {
    Error::Protocol { broker: addr.to_owned(), detail }
}

/// One request, one response, on a stream not yet pipelined.
struct Exchange<'a, S: ?Sized> {
    stream: &'a mut S,
    addr: &'a str,
    client_id: &'a StrBytes,
    correlation_id: i32,
}

impl<S: Stream + ?Sized> Exchange<'_, S> {
    async fn call<R: Request>(&mut self, request: &R, version: i16) -> Result<R::Response> {
        let addr = self.addr;
        let correlation_id = self.correlation_id;
        self.correlation_id += 1;
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(self.client_id.clone()));
        let mut buf = BytesMut::with_capacity(256);
        buf.put_i32(0);
        header
            .encode(&mut buf, R::header_version(version))
            .and_then(|()| request.encode(&mut buf, version))
            .map_err(|e| protocol(addr, format!("cannot encode api {} v{version}: {e}", R::KEY)))?;
        let len = (buf.len() - 4) as i32;
        buf[..4].copy_from_slice(&len.to_be_bytes());
        let io = |e| Error::io(addr, e);
        self.stream.write_all(&buf).await.map_err(io)?;
        self.stream.flush().await.map_err(io)?;
        let len = self.stream.read_u32().await.map_err(io)? as usize;
        if len > MAX_SASL_FRAME {
            return Err(protocol(addr, format!("SASL response frame of {len} bytes")));
        }
        let mut frame = vec![0; len];
        self.stream.read_exact(&mut frame).await.map_err(io)?;
        let mut frame = Bytes::from(frame);
        let header = ResponseHeader::decode(&mut frame, R::Response::header_version(version))
            .map_err(|e| protocol(addr, format!("bad response header: {e}")))?;
        if header.correlation_id != correlation_id {
            return Err(protocol(addr, format!("correlation id {}, expected {correlation_id}", header.correlation_id)));
        }
        guard::check_response(R::KEY, version, &frame).map_err(|reason| guard::refused(addr, R::KEY, version, reason))?;
        let response = R::Response::decode(&mut frame, version)
            .map_err(|e| protocol(addr, format!("cannot decode api {} v{version}: {e}", R::KEY)))?;
        if frame.has_remaining() {
            return Err(protocol(addr, format!("{} bytes after the api {} response", frame.remaining(), R::KEY)));
        }
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_and_settings_parse_and_the_password_stays_hidden() {
        let text = "# comment\n! also\n\nsecurity.protocol = SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username: alice\nsasl.password=p=w\n";
        let mut config = SecurityConfig::default();
        for (k, v) in parse_properties(text).unwrap() {
            assert!(config.set(&k, &v).unwrap(), "{k}");
        }
        assert_eq!(config.protocol, SecurityProtocol::SaslSsl);
        assert_eq!(config.sasl_mechanism, SaslMechanism::ScramSha512);
        assert_eq!(config.sasl_password.as_deref(), Some("p=w"));
        assert!(!format!("{config:?}").contains("p=w"));
        assert!(matches!(parse_properties("a=1\nnot a pair\n"), Err(Error::InvalidConfig(m)) if m.contains("line 2")));
        assert!(config.set("security.protocol", "TLS").is_err());
        assert!(config.set("sasl.mechanism", "GSSAPI").is_err());
        assert!(!config.set("linger.ms", "5").unwrap());
        // SASL_SSL without a CA file, and SASL without a user, are refused up front.
        assert!(matches!(config.prepare(), Err(Error::InvalidConfig(m)) if m.contains("ssl.ca.location")));
        let sasl_only = SecurityConfig { protocol: SecurityProtocol::SaslPlaintext, ..SecurityConfig::default() };
        assert!(matches!(sasl_only.prepare(), Err(Error::InvalidConfig(m)) if m.contains("sasl.username")));
    }
}
