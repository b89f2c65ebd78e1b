//! One TCP connection to one broker, with pipelined requests.
//!
//! A writer task takes encoded requests from a bounded channel and writes them, coalescing
//! whatever is queued into one syscall; a reader task reads response frames and hands each
//! to the request it answers. Kafka answers requests on a connection strictly in the order
//! they were sent, so the in-flight list is a FIFO and the correlation id only confirms it.
//! Requests that expect no response (produce with acks=0) never enter that FIFO.
//!
//! A response goes either to a future ([`Connection::send`]) or to a callback run on the
//! reader task itself ([`Connection::send_parts_then`]): the producer completes its batches
//! there, without a task, a channel and a timer of its own per request.
//!
//! `request.timeout.ms` is one deadline sweep per connection, not a timer per request: the
//! oldest request in flight has the earliest deadline (one timeout for all, FIFO order),
//! so the reader's single timer only ever needs to fire at that request's deadline.
//!
//! When either side fails, every in-flight request fails with the same error and the
//! connection is marked closed; the [`crate::cluster::Cluster`] opens a new one on next use.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io::IoSlice;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, Result};
use crate::guard;
use crate::security::{self, Prepared};

/// Largest response frame accepted; a length beyond this means a corrupt stream.
const MAX_RESPONSE_FRAME: usize = 1 << 30;
/// Encoded requests waiting for the writer; bounds memory when the socket is slow.
const WRITE_QUEUE: usize = 256;
/// The reader's buffer: responses are read straight into it and handed on as slices of it.
const READ_BUFFER: usize = 256 * 1024;
/// Below this much free room the reader's buffer is renewed before the next read.
const MIN_READ_ROOM: usize = 16 * 1024;

/// A response handler run on the reader task: `Some` with the response body (or the
/// error that ended the connection), `None` when the request was dropped unanswered (the
/// connection went away with it still queued).
type Callback = Box<dyn FnOnce(Option<Result<Bytes>>) + Send>;

/// Where a request's response goes.
enum Reply {
    Channel(oneshot::Sender<Result<Bytes>>),
    Callback(Callback),
}

struct Pending {
    correlation_id: i32,
    response_header_version: i16,
    api_key: i16,
    /// When the request times out (`request.timeout.ms` after it was queued).
    deadline: Instant,
    /// Taken when answered; a callback still here on drop is told the request is lost.
    reply: Option<Reply>,
}

impl Pending {
    fn resolve(mut self, result: Result<Bytes>) {
        match self.reply.take() {
            Some(Reply::Channel(tx)) => {
                let _ = tx.send(result);
            }
            Some(Reply::Callback(f)) => f(Some(result)),
            None => {}
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        // A dropped oneshot sender tells its future by itself; a callback must be called.
        if let Some(Reply::Callback(f)) = self.reply.take() {
            f(None);
        }
    }
}

/// A request as written: one buffer, or (a request whose body its caller encoded in
/// parts) the header then the body's slices, each written from where it is.
struct Frame {
    head: Bytes,
    parts: Vec<Bytes>,
}

struct Outgoing {
    frame: Frame,
    pending: Option<Pending>,
    /// Fired once the frame is handed to the socket (for requests without a response).
    written: Option<oneshot::Sender<Result<()>>>,
}

#[derive(Default)]
struct InFlight {
    /// Set when the connection broke; holds the error every later request gets.
    closed: Option<Error>,
    queue: VecDeque<Pending>,
}

impl InFlight {
    /// Marks the connection broken and hands back everything waiting on it, for the
    /// caller to fail once the lock is released (a callback must not run under it).
    fn close(&mut self, error: &Error) -> VecDeque<Pending> {
        self.closed.get_or_insert_with(|| error.clone());
        std::mem::take(&mut self.queue)
    }
}

/// Closes the connection's in-flight list and fails what it held.
fn fail_in_flight(in_flight: &Mutex<InFlight>, error: &Error) {
    let failed = in_flight.lock().unwrap_or_else(|e| e.into_inner()).close(error);
    for pending in failed {
        pending.resolve(Err(error.clone()));
    }
}

/// A request body encoded by its caller as slices, so that large fields (a produce
/// request's record batches) go to the socket from their own buffers instead of being
/// copied into the request frame.
pub(crate) struct BodyParts(pub(crate) Vec<Bytes>);

/// A pipelined connection to one broker; cheap to share behind an `Arc`.
pub(crate) struct Connection {
    addr: Arc<str>,
    client_id: StrBytes,
    request_timeout: Duration,
    tx: mpsc::Sender<Outgoing>,
    in_flight: Arc<Mutex<InFlight>>,
    /// api key → (min, max) version the broker supports.
    versions: HashMap<i16, (i16, i16)>,
    correlation: AtomicI32,
    tasks: [tokio::task::AbortHandle; 2],
}

impl Drop for Connection {
    fn drop(&mut self) {
        // The writer ends by itself once the channel closes and it has written what is
        // queued; the reader must be stopped or it would wait on the socket forever.
        self.tasks[1].abort();
    }
}

impl Connection {
    /// Connects, does the TLS handshake and SASL exchange `security` asks for, and learns
    /// the broker's API versions, all within `connect_timeout`: a listener that never
    /// answers (a plaintext client on a TLS port) fails here instead of hanging.
    pub(crate) async fn connect(
        addr: &str,
        client_id: &str,
        connect_timeout: Duration,
        request_timeout: Duration,
        security: &Prepared,
    ) -> Result<Self> {
        let establish = Self::establish(addr, client_id, request_timeout, security);
        match tokio::time::timeout(connect_timeout, establish).await {
            Err(_) => Err(Error::ConnectTimeout { broker: addr.to_string(), timeout: connect_timeout }),
            Ok(result) => result,
        }
    }

    async fn establish(addr: &str, client_id: &str, request_timeout: Duration, security: &Prepared) -> Result<Self> {
        let stream = TcpStream::connect(addr).await.map_err(|e| Error::io(addr, e))?;
        stream.set_nodelay(true).map_err(|e| Error::io(addr, e))?;
        let client_id = StrBytes::from_string(client_id.to_string());
        let addr: Arc<str> = addr.into();
        let in_flight = Arc::new(Mutex::new(InFlight::default()));
        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        // Plain TCP keeps its owned halves (no lock between reader and writer); TLS needs
        // one session for both directions, shared through `tokio::io::split`.
        let (writer, reader, correlation) = match &security.tls {
            None => {
                let mut stream = stream;
                let correlation = match &security.sasl {
                    Some(sasl) => security::authenticate(&mut stream, &addr, &client_id, sasl).await?,
                    None => 0,
                };
                let (read, write) = stream.into_split();
                let writer = tokio::spawn(write_loop(addr.clone(), write, rx, in_flight.clone()));
                let reader =
                    tokio::spawn(read_loop(addr.clone(), read, in_flight.clone(), request_timeout, writer.abort_handle()));
                (writer.abort_handle(), reader.abort_handle(), correlation)
            }
            Some(tls) => {
                let mut stream = security::tls_handshake(tls, &addr, stream).await?;
                let correlation = match &security.sasl {
                    Some(sasl) => security::authenticate(&mut stream, &addr, &client_id, sasl).await?,
                    None => 0,
                };
                let (read, write) = tokio::io::split(stream);
                let writer = tokio::spawn(write_loop(addr.clone(), write, rx, in_flight.clone()));
                let reader =
                    tokio::spawn(read_loop(addr.clone(), read, in_flight.clone(), request_timeout, writer.abort_handle()));
                (writer.abort_handle(), reader.abort_handle(), correlation)
            }
        };
        let mut conn = Self {
            addr: addr.clone(),
            client_id,
            request_timeout,
            tx,
            in_flight,
            versions: HashMap::new(),
            correlation: AtomicI32::new(correlation),
            tasks: [writer, reader],
        };
        // v0 is the one version every broker answers in a known layout.
        let response: ApiVersionsResponse = conn.request_at(&ApiVersionsRequest::default(), 0).await?;
        if let Some(e) = Error::kafka(response.error_code, format!("ApiVersions to {addr}"), None) {
            return Err(e);
        }
        conn.versions = response.api_keys.iter().map(|k| (k.api_key, (k.min_version, k.max_version))).collect();
        Ok(conn)
    }

    /// `host:port` of the broker.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// `host:port` of the broker, to keep beyond the connection's life without a copy.
    pub(crate) fn shared_addr(&self) -> Arc<str> {
        self.addr.clone()
    }

    /// Whether the connection broke; a closed connection fails every request at once.
    pub(crate) fn is_closed(&self) -> bool {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner()).closed.is_some() || self.tx.is_closed()
    }

    /// The highest version of `R` both sides speak, at most `preferred`.
    pub(crate) fn version<R: Request>(&self, preferred: i16) -> Result<i16> {
        let ours = R::VERSIONS;
        // Never above the versions whose answers the guard walks.
        let walked = guard::highest_walked(R::KEY).unwrap_or(-1);
        let max = preferred.min(ours.max).min(walked);
        let unsupported =
            || Error::UnsupportedVersion { broker: self.addr.to_string(), api: api_name(R::KEY), min: ours.min, max };
        let &(broker_min, broker_max) = self.versions.get(&R::KEY).ok_or_else(unsupported)?;
        let version = broker_max.min(max);
        if version < broker_min.max(ours.min) {
            return Err(unsupported());
        }
        Ok(version)
    }

    /// Sends `request` at the best common version and waits for its response.
    pub(crate) async fn request<R: Request>(&self, request: &R, preferred: i16) -> Result<R::Response> {
        let version = self.version::<R>(preferred)?;
        self.request_at(request, version).await
    }

    /// Sends `request` at `version` and waits for its response.
    pub(crate) async fn request_at<R: Request>(&self, request: &R, version: i16) -> Result<R::Response> {
        self.send(request, version).await?.await
    }

    /// Queues `request` now (so requests keep their order on the wire) and returns a
    /// future of its response, bounded by `request.timeout.ms`.
    pub(crate) async fn send<R: Request>(
        &self,
        request: &R,
        version: i16,
    ) -> Result<impl Future<Output = Result<R::Response>> + Send + 'static> {
        let (reply, response) = oneshot::channel();
        self.enqueue::<R>(self.encode(request, version)?, version, Reply::Channel(reply)).await?;
        let addr = self.addr.clone();
        Ok(async move {
            let mut body = response.await.map_err(|_| aborted(&addr))??;
            decode::<R>(&addr, &mut body, version)
        })
    }

    /// Queues a request of type `R`, its body encoded by the caller (see [`BodyParts`]),
    /// and calls `then` with its response (or the reason there is none: a broken
    /// connection, `request.timeout.ms`) on the reader task, exactly once. `then` runs on
    /// the connection's reader, so it must be quick and must not block.
    pub(crate) async fn send_parts_then<R: Request>(
        &self,
        body: BodyParts,
        version: i16,
        then: impl FnOnce(Result<R::Response>) + Send + 'static,
    ) {
        let frame = match self.encode_parts::<R>(body, version) {
            Ok(frame) => frame,
            Err(e) => return then(Err(e)),
        };
        let addr = self.addr.clone();
        let callback: Callback = Box::new(move |result: Option<Result<Bytes>>| {
            then(match result {
                Some(Ok(mut body)) => decode::<R>(&addr, &mut body, version),
                Some(Err(e)) => Err(e),
                None => Err(aborted(&addr)),
            })
        });
        // On failure the request is dropped with its callback, which tells `then`.
        let _ = self.enqueue::<R>(frame, version, Reply::Callback(callback)).await;
    }

    /// Queues a request of type `R` that gets no response (produce with acks=0), its body
    /// encoded by the caller; the future resolves once it has been written to the socket.
    pub(crate) async fn send_parts_oneway<R: Request>(
        &self,
        body: BodyParts,
        version: i16,
    ) -> Result<impl Future<Output = Result<()>> + Send + 'static> {
        let (frame, _) = self.encode_parts::<R>(body, version)?;
        let (written, done) = oneshot::channel();
        self.push(Outgoing { frame, pending: None, written: Some(written) }).await?;
        let addr = self.addr.clone();
        Ok(async move { done.await.unwrap_or_else(|_| Err(aborted(&addr))) })
    }

    /// Queues an encoded request whose response goes to `reply`.
    async fn enqueue<R: Request>(&self, (frame, correlation_id): (Frame, i32), version: i16, reply: Reply) -> Result<()> {
        let pending = Pending {
            correlation_id,
            response_header_version: R::Response::header_version(version),
            api_key: R::KEY,
            deadline: Instant::now() + self.request_timeout,
            reply: Some(reply),
        };
        self.push(Outgoing { frame, pending: Some(pending), written: None }).await
    }

    async fn push(&self, outgoing: Outgoing) -> Result<()> {
        if let Some(e) = &self.in_flight.lock().unwrap_or_else(|e| e.into_inner()).closed {
            return Err(e.clone());
        }
        self.tx.send(outgoing).await.map_err(|_| aborted(&self.addr))
    }

    /// The request as one buffer: length, header, body.
    fn encode<R: Request>(&self, request: &R, version: i16) -> Result<(Frame, i32)> {
        let body_size = request.compute_size(version).map_err(|e| self.codec_error::<R>(version, e))?;
        let (mut buf, correlation_id) = self.encode_header::<R>(version, body_size, body_size)?;
        request.encode(&mut buf, version).map_err(|e| self.codec_error::<R>(version, e))?;
        Ok((Frame { head: buf.freeze(), parts: Vec::new() }, correlation_id))
    }

    /// The request as its length and header, then the caller's slices of its body.
    fn encode_parts<R: Request>(&self, body: BodyParts, version: i16) -> Result<(Frame, i32)> {
        let (head, correlation_id) = self.encode_header::<R>(version, body.0.iter().map(Bytes::len).sum(), 0)?;
        Ok((Frame { head: head.freeze(), parts: body.0 }, correlation_id))
    }

    /// A buffer with the frame length (for a body of `body_size` bytes) and the request
    /// header written, with `room` bytes more for the body; and the header's correlation id.
    fn encode_header<R: Request>(&self, version: i16, body_size: usize, room: usize) -> Result<(BytesMut, i32)> {
        let correlation_id = self.correlation.fetch_add(1, Ordering::Relaxed);
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(self.client_id.clone()));
        let header_version = R::header_version(version);
        let header_size = header.compute_size(header_version).map_err(|e| self.codec_error::<R>(version, e))?;
        let len = i32::try_from(header_size + body_size).map_err(|_| Error::Protocol {
            broker: self.addr.to_string(),
            detail: format!("{} v{version} request of {body_size} bytes is too large", api_name(R::KEY)),
        })?;
        let mut buf = BytesMut::with_capacity(4 + header_size + room);
        buf.put_i32(len);
        header.encode(&mut buf, header_version).map_err(|e| self.codec_error::<R>(version, e))?;
        Ok((buf, correlation_id))
    }

    /// kafka-protocol reports codec failures as `anyhow::Error`; we only format them.
    fn codec_error<R: Request>(&self, version: i16, e: anyhow::Error) -> Error {
        Error::Protocol { broker: self.addr.to_string(), detail: format!("cannot encode {} v{version}: {e}", api_name(R::KEY)) }
    }
}

/// The error of a request whose connection went away before it was answered.
fn aborted(addr: &str) -> Error {
    Error::io(addr, std::io::ErrorKind::ConnectionAborted.into())
}

/// Decodes an answer, once the guard has checked that decoding it cannot abort the process.
fn decode<R: Request>(addr: &str, body: &mut Bytes, version: i16) -> Result<R::Response> {
    guard::check_response(R::KEY, version, body).map_err(|reason| guard::refused(addr, R::KEY, version, reason))?;
    R::Response::decode(body, version).map_err(|e| Error::Protocol {
        broker: addr.to_string(),
        detail: format!("cannot decode {} v{version}: {e}", api_name(R::KEY)),
    })
}

/// Slices written with one `writev` at most.
const MAX_GATHER: usize = 64;

/// Writes queued frames in order. Frames queued together go out in one vectored write,
/// straight from their own buffers: a produce request is tens of KiB of records, and
/// copying each one into a write buffer first showed in profiles of the producer.
async fn write_loop(
    addr: Arc<str>,
    mut socket: impl AsyncWrite + Unpin,
    mut rx: mpsc::Receiver<Outgoing>,
    in_flight: Arc<Mutex<InFlight>>,
) {
    let mut written = Vec::new();
    let mut frames: VecDeque<Bytes> = VecDeque::new();
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(mut outgoing) = next.take() {
            let mut refused = None;
            if let Some(pending) = outgoing.pending.take() {
                // Registered before the frame is written, so the reader finds it.
                let mut state = in_flight.lock().unwrap_or_else(|e| e.into_inner());
                match &state.closed {
                    Some(e) => refused = Some((pending, e.clone())),
                    None => state.queue.push_back(pending),
                }
            }
            match refused {
                Some((pending, e)) => pending.resolve(Err(e)),
                None => {
                    frames.push_back(outgoing.frame.head);
                    frames.extend(outgoing.frame.parts);
                    written.extend(outgoing.written.take());
                }
            }
            if frames.len() < MAX_GATHER {
                next = rx.try_recv().ok();
            }
        }
        match write_frames(&mut socket, &mut frames).await {
            Ok(()) => {
                for w in written.drain(..) {
                    let _ = w.send(Ok(()));
                }
            }
            Err(e) => {
                let error = Error::io(&addr, e);
                for w in written.drain(..) {
                    let _ = w.send(Err(error.clone()));
                }
                fail_in_flight(&in_flight, &error);
                return;
            }
        }
    }
}

/// Writes every frame of `frames`, in order, with vectored writes; empties it.
async fn write_frames(socket: &mut (impl AsyncWrite + Unpin), frames: &mut VecDeque<Bytes>) -> std::io::Result<()> {
    while !frames.is_empty() {
        let mut slices = [IoSlice::new(&[]); MAX_GATHER];
        let count = frames.len().min(MAX_GATHER);
        for (slice, frame) in slices.iter_mut().zip(frames.iter()) {
            *slice = IoSlice::new(frame);
        }
        let mut n = socket.write_vectored(&slices[..count]).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while let Some(front) = frames.front_mut() {
            if n < front.len() {
                front.advance(n);
                break;
            }
            n -= front.len();
            frames.pop_front();
        }
    }
    Ok(())
}

/// Reads response frames and resolves the requests they answer, in order; fails the
/// oldest request (and with it the connection) once it is `request_timeout` old.
///
/// Responses are read into one buffer and each frame is handed on as a slice of it (no
/// copy). The read is cancel-safe, so the deadline timer can interrupt it at any point.
async fn read_loop(
    addr: Arc<str>,
    mut socket: impl AsyncRead + Unpin,
    in_flight: Arc<Mutex<InFlight>>,
    request_timeout: Duration,
    writer: tokio::task::AbortHandle,
) {
    let mut buf = BytesMut::with_capacity(READ_BUFFER);
    // Invariant: the sweep fires no later than the deadline of any request in flight.
    // Requests registered after a reset to `now + request_timeout` have later deadlines.
    let sweep = tokio::time::sleep(request_timeout);
    tokio::pin!(sweep);
    let error = 'read: loop {
        while let Some(frame) = match next_frame(&addr, &mut buf) {
            Ok(frame) => frame,
            Err(e) => break 'read e,
        } {
            if let Err(e) = answer(&addr, &in_flight, frame) {
                break 'read e;
            }
        }
        if buf.capacity() - buf.len() < MIN_READ_ROOM {
            buf.reserve(READ_BUFFER);
        }
        tokio::select! {
            biased;
            read = socket.read_buf(&mut buf) => match read {
                Ok(0) => break Error::io(&addr, std::io::ErrorKind::UnexpectedEof.into()),
                Ok(_) => {}
                Err(e) => break Error::io(&addr, e),
            },
            () = &mut sweep => {
                let now = Instant::now();
                let oldest = in_flight.lock().unwrap_or_else(|e| e.into_inner()).queue.front().map(|p| (p.deadline, p.api_key));
                match oldest {
                    // The stream's state is unknown now (a late response would be taken for
                    // the next request's), so the connection is given up, as Kafka's clients do.
                    Some((deadline, api)) if deadline <= now => {
                        break Error::RequestTimeout { broker: addr.to_string(), api: api_name(api), timeout: request_timeout };
                    }
                    Some((deadline, _)) => sweep.as_mut().reset(deadline.into()),
                    None => sweep.as_mut().reset((now + request_timeout).into()),
                }
            }
        }
    };
    fail_in_flight(&in_flight, &error);
    // A writer blocked on a broker that stopped reading would hold the requests queued
    // behind it forever: stopping it drops them, which fails them too.
    writer.abort();
}

/// The next complete response frame in `buf` (without its length prefix), if there is one;
/// makes room for the rest of a partial one.
fn next_frame(addr: &str, buf: &mut BytesMut) -> Result<Option<Bytes>> {
    let Some(prefix) = buf.get(..4) else {
        return Ok(None);
    };
    let len = i32::from_be_bytes(prefix.try_into().expect("4 bytes"));
    let Some(len) = usize::try_from(len).ok().filter(|&l| (4..=MAX_RESPONSE_FRAME).contains(&l)) else {
        return Err(Error::Protocol { broker: addr.to_string(), detail: format!("invalid response frame length {len}") });
    };
    if buf.len() < 4 + len {
        buf.reserve(4 + len - buf.len());
        return Ok(None);
    }
    let mut frame = buf.split_to(4 + len).freeze();
    frame.advance(4);
    Ok(Some(frame))
}

/// Hands a response frame to the oldest request in flight, which it must answer.
fn answer(addr: &str, in_flight: &Mutex<InFlight>, mut frame: Bytes) -> Result<()> {
    let Some(pending) = in_flight.lock().unwrap_or_else(|e| e.into_inner()).queue.pop_front() else {
        return Err(Error::Protocol { broker: addr.to_string(), detail: "response to no request".into() });
    };
    let header = match ResponseHeader::decode(&mut frame, pending.response_header_version) {
        Ok(h) => h,
        Err(e) => {
            let error = Error::Protocol { broker: addr.to_string(), detail: format!("bad response header: {e}") };
            pending.resolve(Err(error.clone()));
            return Err(error);
        }
    };
    if header.correlation_id != pending.correlation_id {
        let detail = format!("response correlation id {} for request {}", header.correlation_id, pending.correlation_id);
        let error = Error::Protocol { broker: addr.to_string(), detail };
        pending.resolve(Err(error.clone()));
        return Err(error);
    }
    pending.resolve(Ok(frame));
    Ok(())
}

/// Kafka's name of an API, for messages.
pub(crate) fn api_name(key: i16) -> &'static str {
    kafka_protocol::messages::ApiKey::try_from(key).map(api_key_name).unwrap_or("unknown API")
}

fn api_key_name(key: kafka_protocol::messages::ApiKey) -> &'static str {
    use kafka_protocol::messages::ApiKey as K;
    match key {
        K::Produce => "Produce",
        K::Fetch => "Fetch",
        K::ListOffsets => "ListOffsets",
        K::Metadata => "Metadata",
        K::ApiVersions => "ApiVersions",
        K::CreateTopics => "CreateTopics",
        K::DeleteTopics => "DeleteTopics",
        K::DescribeConfigs => "DescribeConfigs",
        K::IncrementalAlterConfigs => "IncrementalAlterConfigs",
        _ => "request",
    }
}
