//! One client connection: a reader that decodes and handles requests one at a time (so
//! produce requests on a connection are appended in the order they were sent, as Kafka
//! does), and a writer that sends the responses in the same order while the reader goes
//! on with the next request. An acks=all produce is handled up to its append; its answer
//! reaches the writer as a [`Reply::Later`] that completes once the ISR has the batches,
//! and the writer sends nothing queued after it before it (at most `RESPONSE_QUEUE`
//! answers wait so).
//!
//! Anything that is not a well-formed frame (negative or oversized length, truncation,
//! bytes that do not decode) closes this connection with a log line; nothing else is
//! affected. So does silence: no request for `connections.max.idle.ms`, or, before a
//! client has authenticated, `connection.authentication.timeout.ms` from the accept.
//! Until then only ApiVersions and the SASL requests are answered, and a frame may be at
//! most `sasl.server.max.receive.size`: an unauthenticated client cannot make the broker
//! read (or allocate) a 100 MiB request. Large frames also take their size from the
//! broker-wide `queued.max.request.bytes` before their body is read, and requests of many
//! elements their decoded size before they are decoded ([`crate::request_memory`]): when
//! it is spent, connections wait until requests end.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use fjord_auth::Principal;
use kafka_protocol::messages::ApiKey;
use nix::sys::socket::MsgFlags;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest, WriteHalf};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use crate::codec::{self, check_request};
use crate::handler::Broker;
use crate::listener::ListenerInfo;
use crate::metrics::ConnectionEvent;
use crate::quota::QuotaKind;
use crate::request_memory::RequestMemory;
use crate::response::{Chunk, Reply, Response};
use crate::sasl::{Mechanism, SaslState};
use crate::{Error, Result};

/// Responses queued for the writer; the reader waits when the client does not read.
const RESPONSE_QUEUE: usize = 16;
/// Small response pieces are gathered into one write up to this size.
const WRITE_BUFFER: usize = 64 * 1024;
/// File regions are copied through user space in pieces of this size where sendfile
/// cannot be used (inside TLS).
const COPY_CHUNK: usize = 64 * 1024;
/// How long a connection stays open after the answer that ends it (a failed
/// authentication) when the client does not close it first (see `linger`): long enough
/// for a client stalled under load to read the answer; never longer than an
/// unauthenticated client may hold a connection anyway (`connection.authentication.timeout.ms`).
const FAILED_AUTHENTICATION_LINGER: Duration = Duration::from_secs(2);

/// Who is on the other end of one connection: every handler gets it with the request.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) peer: SocketAddr,
    /// The listener the client came in on: its name picks the addresses Metadata and
    /// FindCoordinator answer with.
    pub(crate) listener: Arc<ListenerInfo>,
    /// `User:<name>` once authenticated (SASL, or a TLS client certificate), else
    /// `User:ANONYMOUS`.
    pub(crate) principal: Principal,
    /// False on a SASL listener until the exchange succeeded; only ApiVersions and the
    /// SASL requests are answered before.
    pub(crate) authenticated: bool,
    /// The broker id a replica Fetch on this connection was verified to come from.
    pub(crate) replica: Option<i32>,
    /// The SASL exchange, on SASL listeners.
    pub(crate) sasl: SaslState,
    /// The mechanism the SASL handshake chose.
    pub(crate) mechanism: Option<Mechanism>,
    /// Set by a handler whose answer ends the connection (a failed authentication).
    pub(crate) close: bool,
    /// When the SASL session ends (`connections.max.reauth.ms` after the last successful
    /// authentication): after it, only a re-authentication is answered.
    pub(crate) session_expiry: Option<Instant>,
    /// The client id of the last request (quotas are per user and client id).
    pub(crate) client_id: String,
    /// How long the next request is not read once the answer is on its way: a client
    /// over a quota is throttled by muting its connection (KIP-219).
    pub(crate) throttle: Duration,
    /// For an answer that comes later (acks=all): fires when it is done, so that the
    /// throttle starts after the answer, as in Kafka.
    pub(crate) answered: Option<tokio::sync::oneshot::Receiver<()>>,
    /// Time the last request spent waiting rather than being handled (a fetch's long
    /// poll): not counted against a request quota.
    pub(crate) waited: Duration,
}

impl Session {
    pub(crate) fn new(peer: SocketAddr, listener: Arc<ListenerInfo>) -> Self {
        let authenticated = !listener.protocol.sasl();
        Self {
            peer,
            listener,
            principal: Principal::anonymous(),
            authenticated,
            replica: None,
            sasl: SaslState::default(),
            mechanism: None,
            close: false,
            session_expiry: None,
            client_id: String::new(),
            throttle: Duration::ZERO,
            answered: None,
            waited: Duration::ZERO,
        }
    }

    /// Mutes the connection for `throttle` after this request's answer (or longer, if a
    /// longer throttle is already due).
    pub(crate) fn throttle(&mut self, throttle: Duration) {
        self.throttle = self.throttle.max(throttle);
    }

    /// Remembers the request's client id, allocating only when it changes.
    pub(crate) fn set_client_id(&mut self, client_id: Option<&str>) {
        let client_id = client_id.unwrap_or_default();
        if self.client_id != client_id {
            self.client_id = client_id.to_owned();
        }
    }
}

/// Where responses are written: a plaintext socket (file regions go out with
/// sendfile) or a stream that has to see every byte (TLS).
trait ResponseSink: AsyncWrite + Unpin + Send {
    /// The socket to sendfile(2) into, when bytes may bypass this writer.
    fn socket(&self) -> Option<&TcpStream>;
}

impl ResponseSink for OwnedWriteHalf {
    fn socket(&self) -> Option<&TcpStream> {
        Some(self.as_ref())
    }
}

impl ResponseSink for WriteHalf<TlsStream<TcpStream>> {
    fn socket(&self) -> Option<&TcpStream> {
        None
    }
}

/// Serves one connection until the client leaves, misbehaves, or `shutdown` fires.
pub(crate) async fn serve(
    broker: Arc<Broker>,
    stream: TcpStream,
    peer: SocketAddr,
    listener: Arc<ListenerInfo>,
    shutdown: CancellationToken,
) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "could not set TCP_NODELAY");
    }
    let accepted = Instant::now();
    let mut session = Session::new(peer, listener);
    if !session.listener.protocol.tls() {
        let (read, write) = stream.into_split();
        return run(&broker, read, write, session, accepted, &shutdown).await;
    }
    let Some(tls) = broker.tls.as_ref() else {
        // run_listeners loads the TLS files before any TLS listener accepts.
        tracing::error!(%peer, "TLS listener without TLS files; closing");
        return;
    };
    // The handshake counts against the authentication timeout: a client that opens a
    // connection and sends nothing (or half a ClientHello) holds no task for long.
    let handshake = tokio::time::timeout(broker.config.authentication_timeout, tls.acceptor().accept(stream));
    let stream = tokio::select! {
        result = handshake => match result {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                broker.metrics.connection_event(ConnectionEvent::TlsHandshakeFailed);
                tracing::warn!(%peer, listener = %session.listener.name, error = %e, "TLS handshake failed; connection closed");
                return;
            }
            Err(_) => {
                broker.metrics.connection_event(ConnectionEvent::TlsHandshakeFailed);
                let timeout = broker.config.authentication_timeout;
                tracing::warn!(%peer, listener = %session.listener.name, ?timeout, "TLS handshake did not finish in time; connection closed");
                return;
            }
        },
        () = shutdown.cancelled() => return,
    };
    // SSL: a trusted client certificate names the principal (its chain was verified in
    // the handshake). SASL_SSL authenticates with SASL inside TLS instead.
    if !session.listener.protocol.sasl() {
        let certificate = stream.get_ref().1.peer_certificates().and_then(|chain| chain.first());
        if let Some(certificate) = certificate {
            match crate::tls::certificate_subject(certificate) {
                Some(subject) => session.principal = tls.config().principal(&subject),
                None => {
                    broker.metrics.connection_event(ConnectionEvent::TlsHandshakeFailed);
                    tracing::warn!(%peer, "client certificate subject does not parse; connection closed");
                    return;
                }
            }
        }
    }
    tracing::debug!(%peer, principal = %session.principal, "TLS connection established");
    let (read, write) = tokio::io::split(stream);
    run(&broker, read, write, session, accepted, &shutdown).await;
}

/// The request loop on an established (and, for TLS, handshaken) stream.
async fn run<R, W>(broker: &Arc<Broker>, read: R, write: W, mut session: Session, accepted: Instant, shutdown: &CancellationToken)
where
    R: AsyncRead + Unpin + Send,
    W: ResponseSink + 'static,
{
    let peer = session.peer;
    let listener = session.listener.name.clone();
    let (responses, queue) = mpsc::channel(RESPONSE_QUEUE);
    let writer = tokio::spawn(write_responses(write, queue));
    let read_result = tokio::select! {
        result = read_requests(broker, read, responses, &mut session, accepted) => result,
        () = shutdown.cancelled() => Ok(()),
    };
    // The reader has dropped its sender: the writer drains what is queued and stops,
    // unless a client that stopped reading holds it up at shutdown.
    let mut writer = writer;
    let write_result = tokio::select! {
        joined = &mut writer => joined.unwrap_or_else(|e| Err(Error::Task(e))),
        () = shutdown.cancelled() => {
            writer.abort();
            Ok(())
        }
    };
    match read_result.and(write_result) {
        Ok(()) => tracing::debug!(%peer, %listener, "connection closed"),
        Err(e @ (Error::Protocol(_) | Error::FrameTooLarge { .. })) => {
            broker.metrics.malformed();
            tracing::warn!(%peer, %listener, error = %e, "closing connection after bad request")
        }
        Err(e @ Error::SessionExpired { .. }) => tracing::debug!(%peer, %listener, error = %e, "connection closed"),
        Err(e @ Error::ConnectionIdle { .. }) => {
            broker.metrics.connection_event(ConnectionEvent::Idle);
            tracing::debug!(%peer, %listener, error = %e, "connection closed")
        }
        Err(e @ Error::Unauthenticated { .. }) => {
            broker.metrics.connection_event(ConnectionEvent::AuthenticationFailed);
            tracing::warn!(%peer, %listener, error = %e, "closing connection")
        }
        Err(e) => tracing::info!(%peer, %listener, error = %e, "connection closed"),
    }
}

/// The APIs a client may use before it has authenticated.
fn allowed_before_authentication(api_key: i16) -> bool {
    [ApiKey::ApiVersions, ApiKey::SaslHandshake, ApiKey::SaslAuthenticate].iter().any(|&k| k as i16 == api_key)
}

/// Whether a request may be answered once the SASL session has expired: only the
/// re-authentication, as in Kafka (anything else closes the connection).
fn allowed_after_expiry(api_key: i16) -> bool {
    [ApiKey::SaslHandshake, ApiKey::SaslAuthenticate].iter().any(|&k| k as i16 == api_key)
}

/// Whether the session ending at `expiry` is over at `now`.
fn session_expired(expiry: Option<Instant>, now: Instant) -> bool {
    expiry.is_some_and(|expiry| now >= expiry)
}

async fn read_requests<R: AsyncRead + Unpin>(
    broker: &Arc<Broker>,
    mut read: R,
    responses: mpsc::Sender<Reply>,
    session: &mut Session,
    accepted: Instant,
) -> Result<()> {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let config = &broker.config;
    let idle = config.connections_max_idle;
    let authentication_deadline = accepted + config.authentication_timeout;
    let memory = &broker.request_memory;
    loop {
        let authenticated = session.authenticated;
        let (max, wait) = if authenticated {
            (config.socket_request_max_bytes, idle)
        } else {
            (config.sasl_server_max_receive_size, idle.min(authentication_deadline.saturating_duration_since(Instant::now())))
        };
        let frame = match tokio::time::timeout(wait, read_frame(&mut read, &mut buf, max, memory)).await {
            Ok(frame) => frame?,
            Err(_) if authenticated => return Err(Error::ConnectionIdle { idle }),
            Err(_) => return Err(Error::Unauthenticated { reason: format!("not authenticated within {wait:?}") }),
        };
        // `held` is the frame's share of `queued.max.request.bytes`, given back once the
        // request is handled.
        let Some((frame, held)) = frame else { break };
        if matches!(session.sasl, SaslState::Authenticating { raw: true, .. }) {
            // After a v0 SaslHandshake the tokens come bare, each answered bare.
            let Some(token) = broker.sasl_raw_token(&frame, session).await else {
                return Err(Error::Unauthenticated { reason: "SASL authentication failed".into() });
            };
            let mut framed = BytesMut::with_capacity(4 + token.len());
            framed.extend_from_slice(&(token.len() as u32).to_be_bytes());
            framed.extend_from_slice(&token);
            if responses.send(Response::from(framed.freeze()).into()).await.is_err() {
                break;
            }
            continue;
        }
        if !authenticated && frame.len() >= 2 {
            let api_key = i16::from_be_bytes([frame[0], frame[1]]);
            if !allowed_before_authentication(api_key) {
                let api = codec::api_name(api_key);
                return Err(Error::Unauthenticated { reason: format!("{api} request before authentication") });
            }
        }
        if frame.len() >= 2 && session_expired(session.session_expiry, Instant::now()) {
            let api_key = i16::from_be_bytes([frame[0], frame[1]]);
            if !allowed_after_expiry(api_key) {
                let api = codec::api_name(api_key);
                return Err(Error::SessionExpired { api });
            }
        }
        let checked = check_request(frame).map_err(Error::Protocol)?;
        let held_decoded = memory.reserve_decoded(checked.elements()).await;
        let decoded = checked.decode().map_err(Error::Protocol)?;
        let started = Instant::now();
        session.waited = Duration::ZERO;
        let metered = broker.request_quota_applies(&decoded, session);
        let response = broker.handle(decoded, session).await;
        drop((held, held_decoded));
        if let Some(response) = response {
            if responses.send(response).await.is_err() {
                break; // the writer failed: the client is gone
            }
        }
        if metered {
            // KIP-124: the time spent handling the request, as a percentage of a second.
            let handled = started.elapsed().saturating_sub(session.waited);
            let percent = handled.as_secs_f64() * 100.0;
            let throttle = broker.quotas.record(QuotaKind::Request, session.principal.name(), &session.client_id, percent);
            broker.metrics.throttled(QuotaKind::Request, throttle);
            session.throttle(throttle);
        }
        if !session.throttle.is_zero() {
            // KIP-219: once the answer is on its way, the next request waits out the throttle.
            if let Some(answered) = session.answered.take() {
                let _ = answered.await; // an error: the answer was dropped with the connection
            }
            tokio::time::sleep(std::mem::take(&mut session.throttle)).await;
        }
        session.answered = None;
        if session.close {
            // The answer (a SASL failure) is with the writer; the connection closes only
            // after the client has had it (see `linger`).
            linger(&mut read, &mut buf, FAILED_AUTHENTICATION_LINGER.min(config.authentication_timeout)).await;
            return Err(Error::Unauthenticated { reason: "SASL authentication failed or out of order".into() });
        }
    }
    Ok(())
}

/// After an answer that ends the connection (a failed authentication): keeps the
/// connection open, reading and dropping whatever the client still sends, until the
/// client closes it or `limit` passes; then the writer sends the
/// end of stream (and TLS close_notify) behind the answer.
///
/// Closing right behind the answer loses it in two ways, both seen with kafka-python
/// under load: a client that reads late gets the answer and the end of stream in one
/// read, and kafka-python then drops the answer and reports only a disconnect; and
/// closing a socket with unread input makes the kernel send a reset, which discards the
/// answer if it is still in flight. A client that read its answer closes at once, so
/// this costs a well-behaved client nothing.
async fn linger<R: AsyncRead + Unpin>(read: &mut R, buf: &mut BytesMut, limit: Duration) {
    let until = Instant::now() + limit;
    loop {
        buf.clear();
        match tokio::time::timeout_at(until, read.read_buf(buf)).await {
            Ok(Ok(n)) if n > 0 => continue,
            // The client closed (or reset) the connection, or the linger is over.
            _ => return,
        }
    }
}

/// Reads one `i32 length | body` frame with the memory it holds (see [`RequestMemory`]),
/// taken before the buffer grows to the frame's size; `None` at a clean end of stream.
async fn read_frame<R: AsyncRead + Unpin>(
    read: &mut R,
    buf: &mut BytesMut,
    max: usize,
    memory: &RequestMemory,
) -> Result<Option<(Bytes, Option<OwnedSemaphorePermit>)>> {
    let mut held: Option<Option<OwnedSemaphorePermit>> = None;
    loop {
        if buf.len() >= 4 {
            let size = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
            let size = match usize::try_from(size) {
                Ok(size) if size <= max => size,
                _ => return Err(Error::FrameTooLarge { size: i64::from(size), max }),
            };
            if held.is_none() {
                held = Some(memory.reserve(size).await);
            }
            if buf.len() >= 4 + size {
                buf.advance(4);
                return Ok(Some((buf.split_to(size).freeze(), held.flatten())));
            }
            buf.reserve(4 + size - buf.len());
        }
        if read.read_buf(buf).await.map_err(Error::Network)? == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(Error::Protocol(format!("connection closed inside a frame ({} bytes pending)", buf.len())))
            };
        }
    }
}

async fn write_responses<W: ResponseSink>(mut write: W, mut queue: mpsc::Receiver<Reply>) -> Result<()> {
    let mut out: Vec<u8> = Vec::with_capacity(WRITE_BUFFER);
    while let Some(reply) = queue.recv().await {
        let mut next = Some(reply);
        while let Some(reply) = next {
            let response = match reply {
                Reply::Now(response) => Some(response),
                Reply::Later(pending) => {
                    // What is gathered goes out before the wait, not after it.
                    flush(&mut write, &mut out).await?;
                    pending.await
                }
            };
            for chunk in response.map(|r| r.chunks).unwrap_or_default() {
                match chunk {
                    Chunk::Bytes(bytes) if bytes.len() <= WRITE_BUFFER => out.extend_from_slice(&bytes),
                    Chunk::Bytes(bytes) => {
                        flush(&mut write, &mut out).await?;
                        write.write_all(&bytes).await.map_err(Error::Network)?;
                    }
                    // Nothing to send, and a MSG_MORE with no region after it would
                    // hold the bytes before it until the next answer.
                    Chunk::File { len: 0, .. } => {}
                    Chunk::File { file, position, len } => {
                        match write.socket() {
                            Some(socket) => {
                                send_more(socket, &mut out).await.map_err(Error::Network)?;
                                send_file(socket, &file, position, len).await
                            }
                            None => {
                                flush(&mut write, &mut out).await?;
                                copy_file(&mut write, &file, position, len).await
                            }
                        }
                        .map_err(Error::Network)?;
                    }
                }
            }
            if out.len() >= WRITE_BUFFER {
                flush(&mut write, &mut out).await?;
            }
            // Gather responses that are already waiting into the same write.
            next = queue.try_recv().ok();
        }
        flush(&mut write, &mut out).await?;
        // TLS: a write can leave records inside the session when the socket is full;
        // they must reach the socket now, not with the next answer (which may never come).
        write.flush().await.map_err(Error::Network)?;
    }
    write.shutdown().await.ok();
    Ok(())
}

async fn flush<W: AsyncWrite + Unpin>(write: &mut W, out: &mut Vec<u8>) -> Result<()> {
    if !out.is_empty() {
        write.write_all(out).await.map_err(Error::Network)?;
        out.clear();
    }
    Ok(())
}

/// Sends what `out` gathered (the response's bytes up to a file region) with MSG_MORE,
/// so the kernel holds them for the region's first bytes instead of sending them in a
/// segment of their own: each region of a fetch response then costs one segment
/// fewer, on the sender and on the receiver (the region's sendfile ends by pushing).
async fn send_more(stream: &TcpStream, out: &mut Vec<u8>) -> io::Result<()> {
    // nix has no name for MSG_MORE (Linux's "more data follows").
    let more = MsgFlags::from_bits_retain(nix::libc::MSG_MORE);
    let mut sent = 0;
    while sent < out.len() {
        stream.writable().await?;
        let result = stream.try_io(Interest::WRITABLE, || {
            nix::sys::socket::send(stream.as_fd().as_raw_fd(), &out[sent..], more).map_err(io::Error::from)
        });
        match result {
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    out.clear();
    Ok(())
}

/// Sends `len` bytes of `file` from `position` to the socket with sendfile(2): the
/// kernel moves page-cache pages to the socket, nothing passes through user space.
async fn send_file(stream: &TcpStream, file: &std::fs::File, position: u64, len: usize) -> io::Result<()> {
    let mut offset = i64::try_from(position).map_err(|_| io::Error::other("file position beyond i64"))?;
    let mut remaining = len;
    while remaining > 0 {
        stream.writable().await?;
        let sent = stream.try_io(Interest::WRITABLE, || {
            nix::sys::sendfile::sendfile(stream.as_fd(), file.as_fd(), Some(&mut offset), remaining).map_err(io::Error::from)
        });
        match sent {
            // The file ended early (truncated under us): the frame length is already on
            // the wire, so the only honest way out is to drop the connection.
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "segment file shorter than the fetched region")),
            Ok(n) => remaining -= n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes `len` bytes of `file` from `position` through `write`, a piece at a time:
/// sendfile cannot cross user-space TLS. Fetches on TLS listeners read their records
/// into memory already (see `handler::fetch`); this keeps any file region that still
/// reaches a TLS writer correct. The reads hit the page cache, as sendfile's would.
async fn copy_file<W: AsyncWrite + Unpin>(write: &mut W, file: &std::fs::File, position: u64, len: usize) -> io::Result<()> {
    let mut piece = vec![0u8; COPY_CHUNK.min(len)];
    let (mut at, end) = (position, position + len as u64);
    while at < end {
        let n = piece.len().min((end - at) as usize);
        let read = file.read_at(&mut piece[..n], at)?;
        if read == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "segment file shorter than the fetched region"));
        }
        write.write_all(&piece[..read]).await?;
        at += read as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use tokio::net::TcpListener;

    use super::*;
    use crate::response::{Chunk, Response};

    /// A connected pair on loopback: the writer's half and the reading client.
    async fn pair() -> (OwnedWriteHalf, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        server.set_nodelay(true).unwrap();
        let (_, write) = server.into_split();
        (write, client)
    }

    fn segment(bytes: &[u8]) -> Arc<std::fs::File> {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(bytes).unwrap();
        Arc::new(file)
    }

    async fn read_exactly(client: &mut TcpStream, n: usize) -> Vec<u8> {
        let mut got = vec![0; n];
        tokio::time::timeout(Duration::from_secs(5), client.read_exact(&mut got))
            .await
            .expect("the response arrives without waiting for another")
            .unwrap();
        got
    }

    #[tokio::test]
    async fn bytes_and_file_regions_arrive_whole_and_in_order() {
        let (write, mut client) = pair().await;
        let (queue, replies) = mpsc::channel(4);
        let writer = tokio::spawn(write_responses(write, replies));
        let file = segment(b"0123456789");
        let chunks = vec![
            Chunk::Bytes(Bytes::from_static(b"head:")),
            Chunk::File { file: file.clone(), position: 2, len: 5 },
            Chunk::Bytes(Bytes::from_static(b":mid:")),
            Chunk::File { file, position: 0, len: 3 },
            Chunk::Bytes(Bytes::from_static(b":tail")),
        ];
        queue.send(Reply::Now(Response { chunks })).await.unwrap();
        assert_eq!(read_exactly(&mut client, 23).await, b"head:23456:mid:012:tail");
        drop(queue);
        writer.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn bytes_before_an_empty_region_are_not_held_back() {
        // The bytes before a region go out with MSG_MORE; an empty region has no
        // sendfile to push them, and Linux would hold them for its 200 ms cork timeout.
        let (write, mut client) = pair().await;
        let (queue, replies) = mpsc::channel(4);
        let _writer = tokio::spawn(write_responses(write, replies));
        let chunks = vec![Chunk::Bytes(Bytes::from_static(b"head")), Chunk::File { file: segment(b"x"), position: 0, len: 0 }];
        let sent = std::time::Instant::now();
        queue.send(Reply::Now(Response { chunks })).await.unwrap();
        assert_eq!(read_exactly(&mut client, 4).await, b"head");
        let waited = sent.elapsed();
        assert!(waited < Duration::from_millis(150), "the answer was held back for {waited:?}");
    }
}
