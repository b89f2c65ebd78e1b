//! A connection from a follower to a leader: one request at a time, typed with the
//! `kafka-protocol` codecs.
//!
//! Why not fjord-client's connection: the broker may depend only on record, log and
//! coord (ARCHITECTURE.md), and a replica fetcher needs none of the client's machinery
//! (pipelining, metadata, retries): it sends one Fetch or OffsetForLeaderEpoch, waits for
//! the answer, and on any failure drops the connection and backs off.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest response frame accepted from a peer; beyond this the stream is corrupt.
const MAX_FRAME: usize = 1 << 30;

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
/// endpoint of that name is dialled).
#[derive(Debug, Clone)]
pub(crate) struct PeerConfig {
    pub(crate) listener: String,
}

impl PeerConfig {
    /// A plaintext connection to each peer's listener `listener`.
    pub(crate) fn plaintext(listener: &str) -> Self {
        Self { listener: listener.to_owned() }
    }
}

/// One connection to a peer broker.
pub(crate) struct Peer {
    addr: String,
    stream: TcpStream,
    client_id: StrBytes,
    correlation_id: i32,
}

impl Peer {
    pub(crate) async fn connect(
        addr: &str,
        client_id: String,
        _config: &PeerConfig,
        timeout: Duration,
    ) -> Result<Self, PeerError> {
        let stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Err(_) => return Err(PeerError::Timeout { addr: addr.to_owned(), timeout }),
            Ok(Err(source)) => return Err(PeerError::Io { addr: addr.to_owned(), source }),
            Ok(Ok(stream)) => stream,
        };
        stream.set_nodelay(true).map_err(|source| PeerError::Io { addr: addr.to_owned(), source })?;
        Ok(Self { addr: addr.to_owned(), stream, client_id: StrBytes::from_string(client_id), correlation_id: 0 })
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
        let mut frame = vec![0; len];
        self.stream.read_exact(&mut frame).await.map_err(io)?;
        let mut frame = Bytes::from(frame);
        let header = ResponseHeader::decode(&mut frame, R::Response::header_version(version))
            .map_err(|e| protocol(format!("bad response header: {e}")))?;
        if header.correlation_id != self.correlation_id {
            return Err(protocol(format!("correlation id {}, expected {}", header.correlation_id, self.correlation_id)));
        }
        let response = R::Response::decode(&mut frame, version)
            .map_err(|e| protocol(format!("cannot decode api {} v{version}: {e}", R::KEY)))?;
        if frame.has_remaining() {
            return Err(protocol(format!("{} bytes after the api {} response", frame.remaining(), R::KEY)));
        }
        Ok(response)
    }
}
