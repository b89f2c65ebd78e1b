//! A connection from a follower to a leader: one request at a time, typed with the
//! `kafka-protocol` codecs, on the leader's inter-broker listener with its security:
//! TLS (trusting `ssl.truststore.location`, presenting `ssl.keystore.location` when the
//! leader asks for a client certificate) and SASL (`sasl.mechanism.inter.broker.protocol`
//! as `inter.broker.sasl.username`).
//!
//! Why not fjord-client's connection: the broker depends on no client or audit crate
//! (its own crates are record, log, coord and auth; what watches it, such as the audit,
//! plugs in through `crate::observer`), and a replica fetcher needs none of the client's machinery
//! (pipelining, metadata, retries): it sends one Fetch or OffsetForLeaderEpoch, waits for
//! the answer, and on any failure drops the connection and backs off.
//!
//! Every answer is walked ([`fjord_record::answers`], the schemas the client walks with)
//! before the codec crate decodes it: the codec allocates an array's claimed length
//! before reading its elements, so one broken or hostile peer answering "2^31 elements"
//! in a few bytes would otherwise abort this broker, and every partition it leads with it.

use std::time::Duration;

use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use fjord_auth::ScramClient;
use kafka_protocol::messages::{RequestHeader, ResponseHeader, SaslAuthenticateRequest, SaslHandshakeRequest};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::sasl::Mechanism;

/// Largest response frame accepted from a peer; beyond this the stream is corrupt.
const MAX_FRAME: usize = 1 << 30;

/// The SaslHandshake and SaslAuthenticate version of the inter-broker SASL exchange.
const SASL_VERSION: i16 = 1;

/// Why a request to a peer failed; the fetcher logs it and reconnects.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PeerError {
    #[error("{addr}: {source}")]
    Io { addr: String, source: std::io::Error },
    #[error("{addr}: no answer within {timeout:?}")]
    Timeout { addr: String, timeout: Duration },
    #[error("{addr}: {detail}")]
    Protocol { addr: String, detail: String },
}

/// How this broker connects to the others: the inter-broker listener's name (each peer's
/// endpoint of that name is dialled) and its security.
#[derive(Clone)]
pub(crate) struct PeerConfig {
    pub(crate) listener: String,
    pub(crate) tls: Option<Arc<rustls::ClientConfig>>,
    pub(crate) sasl: Option<PeerSasl>,
}

/// This broker's SASL identity on the inter-broker listener.
#[derive(Clone)]
pub(crate) struct PeerSasl {
    pub(crate) mechanism: Mechanism,
    pub(crate) username: String,
    pub(crate) password: String,
}

impl std::fmt::Debug for PeerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerConfig")
            .field("listener", &self.listener)
            .field("tls", &self.tls.is_some())
            .field("sasl_user", &self.sasl.as_ref().map(|s| &s.username))
            .finish()
    }
}

impl PeerConfig {
    /// A plaintext connection to each peer's listener `listener`.
    pub(crate) fn plaintext(listener: &str) -> Self {
        Self { listener: listener.to_owned(), tls: None, sasl: None }
    }
}

/// What a peer connection runs on: TCP, or TLS over it.
trait PeerStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> PeerStream for T {}

/// One connection to a peer broker.
pub(crate) struct Peer {
    addr: String,
    stream: Box<dyn PeerStream>,
    client_id: StrBytes,
    correlation_id: i32,
}

impl Peer {
    /// Connects to `host:port` and, as the listener requires, does the TLS handshake and
    /// the SASL exchange, all within `timeout`.
    pub(crate) async fn connect(
        host: &str,
        port: u16,
        client_id: String,
        config: &PeerConfig,
        timeout: Duration,
    ) -> Result<Self, PeerError> {
        let addr = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
        match tokio::time::timeout(timeout, Self::establish(host, &addr, client_id, config, timeout)).await {
            Err(_) => Err(PeerError::Timeout { addr, timeout }),
            Ok(result) => result,
        }
    }

    async fn establish(
        host: &str,
        addr: &str,
        client_id: String,
        config: &PeerConfig,
        timeout: Duration,
    ) -> Result<Self, PeerError> {
        let io = |source| PeerError::Io { addr: addr.to_owned(), source };
        let tcp = TcpStream::connect(addr).await.map_err(io)?;
        tcp.set_nodelay(true).map_err(io)?;
        let stream: Box<dyn PeerStream> = match &config.tls {
            None => Box::new(tcp),
            Some(tls) => {
                let name = ServerName::try_from(host.to_owned())
                    .map_err(|e| PeerError::Protocol { addr: addr.to_owned(), detail: format!("not a TLS server name: {e}") })?;
                let connector = tokio_rustls::TlsConnector::from(tls.clone());
                Box::new(connector.connect(name, tcp).await.map_err(io)?)
            }
        };
        let mut peer = Self { addr: addr.to_owned(), stream, client_id: StrBytes::from_string(client_id), correlation_id: 0 };
        if let Some(sasl) = &config.sasl {
            peer.authenticate(sasl, timeout).await?;
        }
        Ok(peer)
    }

    /// SaslHandshake v1, then the mechanism's tokens in SaslAuthenticate v1 requests.
    async fn authenticate(&mut self, sasl: &PeerSasl, timeout: Duration) -> Result<(), PeerError> {
        let addr = self.addr.clone();
        let failed = |detail: String| PeerError::Protocol { addr: addr.clone(), detail };
        let handshake = SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(sasl.mechanism.name()));
        let answer = self.call(&handshake, SASL_VERSION, timeout).await?;
        if answer.error_code != 0 {
            return Err(failed(format!("SaslHandshake {} answered error {}", sasl.mechanism.name(), answer.error_code)));
        }
        let step = |token: Vec<u8>| SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token));
        let check = |response: &kafka_protocol::messages::SaslAuthenticateResponse| {
            if response.error_code != 0 {
                let message = response.error_message.as_ref().map(|m| m.to_string()).unwrap_or_default();
                return Err(failed(format!(
                    "SASL authentication as {} failed ({}): {message}",
                    sasl.username, response.error_code
                )));
            }
            Ok(())
        };
        match sasl.mechanism {
            Mechanism::Plain => {
                let token = format!("\0{}\0{}", sasl.username, sasl.password).into_bytes();
                let response = self.call(&step(token), SASL_VERSION, timeout).await?;
                check(&response)?;
            }
            Mechanism::Scram(m) => {
                let (mut client, first) = ScramClient::new(m, &sasl.username, &sasl.password);
                let response = self.call(&step(first), SASL_VERSION, timeout).await?;
                check(&response)?;
                let last = client.client_final(&response.auth_bytes).map_err(|e| failed(e.to_string()))?;
                let response = self.call(&step(last), SASL_VERSION, timeout).await?;
                check(&response)?;
                client.verify_server_final(&response.auth_bytes).map_err(|e| failed(format!("server-final: {e}")))?;
            }
        }
        Ok(())
    }

    /// Sends `request` at `version` and waits at most `timeout` for its response. After
    /// an error the connection must be dropped (the stream position is unknown).
    pub(crate) async fn call<R: Request>(
        &mut self,
        request: &R,
        version: i16,
        timeout: Duration,
    ) -> Result<R::Response, PeerError> {
        match tokio::time::timeout(timeout, self.exchange(request, version)).await {
            Ok(result) => result,
            Err(_) => Err(PeerError::Timeout { addr: self.addr.clone(), timeout }),
        }
    }

    async fn exchange<R: Request>(&mut self, request: &R, version: i16) -> Result<R::Response, PeerError> {
        let protocol = |detail: String| PeerError::Protocol { addr: self.addr.clone(), detail };
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(self.client_id.clone()));
        let mut buf = BytesMut::with_capacity(256);
        buf.put_i32(0);
        header
            .encode(&mut buf, R::header_version(version))
            .and_then(|()| request.encode(&mut buf, version))
            .map_err(|e| protocol(format!("cannot encode api {} v{version}: {e}", R::KEY)))?;
        crate::codec::patch_length(&mut buf);
        let io = |source| PeerError::Io { addr: self.addr.clone(), source };
        self.stream.write_all(&buf).await.map_err(io)?;
        let len = self.stream.read_u32().await.map_err(io)? as usize;
        if len > MAX_FRAME {
            return Err(protocol(format!("response frame of {len} bytes")));
        }
        // Read into spare capacity: zeroing a buffer the read overwrites cost the
        // followers 2% of their CPU (a fetch response is megabytes).
        let mut frame = BytesMut::with_capacity(len);
        while frame.len() < len {
            let want = (len - frame.len()) as u64;
            if (&mut self.stream).take(want).read_buf(&mut frame).await.map_err(io)? == 0 {
                return Err(io(std::io::ErrorKind::UnexpectedEof.into()));
            }
        }
        let mut frame = frame.freeze();
        let header = ResponseHeader::decode(&mut frame, R::Response::header_version(version))
            .map_err(|e| protocol(format!("bad response header: {e}")))?;
        if header.correlation_id != self.correlation_id {
            return Err(protocol(format!("correlation id {}, expected {}", header.correlation_id, self.correlation_id)));
        }
        // Walk the body before decoding it (see the module's comment); a version without
        // a walk is refused too, never decoded unchecked.
        fjord_record::answers::walk_answer(R::KEY, version, &frame, fjord_record::answers::MAX_RESPONSE_ELEMENTS)
            .map_err(|reason| protocol(format!("refused the {} v{version} answer: {reason}", crate::codec::api_name(R::KEY))))?;
        let response = R::Response::decode(&mut frame, version)
            .map_err(|e| protocol(format!("cannot decode api {} v{version}: {e}", R::KEY)))?;
        if frame.has_remaining() {
            return Err(protocol(format!("{} bytes after the api {} response", frame.remaining(), R::KEY)));
        }
        Ok(response)
    }
}

#[cfg(test)]
mod tests;
