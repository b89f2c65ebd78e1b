//! One TCP connection to one broker, with pipelined requests.
//!
//! A writer task takes encoded requests from a bounded channel and writes them, coalescing
//! whatever is queued into one syscall; a reader task reads response frames and hands each
//! to the request it answers. Kafka answers requests on a connection strictly in the order
//! they were sent, so the in-flight list is a FIFO and the correlation id only confirms it.
//! Requests that expect no response (produce with acks=0) never enter that FIFO.
//!
//! When either side fails, every in-flight request fails with the same error and the
//! connection is marked closed; the [`crate::cluster::Cluster`] opens a new one on next use.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io::IoSlice;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, Result};

/// Largest response frame accepted; a length beyond this means a corrupt stream.
const MAX_RESPONSE_FRAME: usize = 1 << 30;
/// Encoded requests waiting for the writer; bounds memory when the socket is slow.
const WRITE_QUEUE: usize = 256;

struct Pending {
    correlation_id: i32,
    response_header_version: i16,
    reply: oneshot::Sender<Result<Bytes>>,
}

struct Outgoing {
    frame: Bytes,
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
    /// Marks the connection broken and fails everything waiting on it.
    fn fail(&mut self, error: Error) {
        for pending in self.queue.drain(..) {
            let _ = pending.reply.send(Err(error.clone()));
        }
        self.closed.get_or_insert(error);
    }
}

/// A pipelined connection to one broker; cheap to share behind an `Arc`.
pub(crate) struct Connection {
    addr: String,
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
    /// Connects within `connect_timeout` and learns the broker's API versions.
    pub(crate) async fn connect(
        addr: &str,
        client_id: &str,
        connect_timeout: Duration,
        request_timeout: Duration,
    ) -> Result<Self> {
        let stream = match tokio::time::timeout(connect_timeout, TcpStream::connect(addr)).await {
            Err(_) => return Err(Error::ConnectTimeout { broker: addr.to_string(), timeout: connect_timeout }),
            Ok(Err(e)) => return Err(Error::io(addr, e)),
            Ok(Ok(stream)) => stream,
        };
        stream.set_nodelay(true).map_err(|e| Error::io(addr, e))?;
        let (read, write) = stream.into_split();
        let in_flight = Arc::new(Mutex::new(InFlight::default()));
        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        let writer = tokio::spawn(write_loop(addr.to_string(), write, rx, in_flight.clone()));
        let reader = tokio::spawn(read_loop(addr.to_string(), BufReader::with_capacity(256 * 1024, read), in_flight.clone()));
        let mut conn = Self {
            addr: addr.to_string(),
            client_id: StrBytes::from_string(client_id.to_string()),
            request_timeout,
            tx,
            in_flight,
            versions: HashMap::new(),
            correlation: AtomicI32::new(0),
            tasks: [writer.abort_handle(), reader.abort_handle()],
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

    /// Whether the connection broke; a closed connection fails every request at once.
    pub(crate) fn is_closed(&self) -> bool {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner()).closed.is_some() || self.tx.is_closed()
    }

    /// The highest version of `R` both sides speak, at most `preferred`.
    pub(crate) fn version<R: Request>(&self, preferred: i16) -> Result<i16> {
        let ours = R::VERSIONS;
        let max = preferred.min(ours.max);
        let unsupported = || Error::UnsupportedVersion { broker: self.addr.clone(), api: api_name(R::KEY), min: ours.min, max };
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
        let (frame, correlation_id) = self.encode(request, version)?;
        let (reply, response) = oneshot::channel();
        let pending = Pending { correlation_id, response_header_version: R::Response::header_version(version), reply };
        self.enqueue(Outgoing { frame, pending: Some(pending), written: None }).await?;
        let addr = self.addr.clone();
        let timeout = self.request_timeout;
        let in_flight = self.in_flight.clone();
        Ok(async move {
            let mut body = match tokio::time::timeout(timeout, response).await {
                Ok(Ok(result)) => result?,
                Ok(Err(_)) => return Err(Error::io(&addr, std::io::ErrorKind::ConnectionAborted.into())),
                Err(_) => {
                    // The stream's state is unknown now (a late response would be taken for
                    // the next request's), so the connection is given up, as Kafka's clients do.
                    let error = Error::RequestTimeout { broker: addr.clone(), api: api_name(R::KEY), timeout };
                    in_flight.lock().unwrap_or_else(|e| e.into_inner()).fail(error.clone());
                    return Err(error);
                }
            };
            R::Response::decode(&mut body, version).map_err(|e| Error::Protocol {
                broker: addr,
                detail: format!("cannot decode {} v{version}: {e}", api_name(R::KEY)),
            })
        })
    }

    /// Queues a request that gets no response (produce with acks=0); the future resolves
    /// once the request has been written to the socket.
    pub(crate) async fn send_oneway<R: Request>(
        &self,
        request: &R,
        version: i16,
    ) -> Result<impl Future<Output = Result<()>> + Send + 'static> {
        let (frame, _) = self.encode(request, version)?;
        let (written, done) = oneshot::channel();
        self.enqueue(Outgoing { frame, pending: None, written: Some(written) }).await?;
        let addr = self.addr.clone();
        Ok(async move { done.await.unwrap_or_else(|_| Err(Error::io(&addr, std::io::ErrorKind::ConnectionAborted.into()))) })
    }

    async fn enqueue(&self, outgoing: Outgoing) -> Result<()> {
        if let Some(e) = &self.in_flight.lock().unwrap_or_else(|e| e.into_inner()).closed {
            return Err(e.clone());
        }
        self.tx.send(outgoing).await.map_err(|_| Error::io(&self.addr, std::io::ErrorKind::ConnectionAborted.into()))
    }

    fn encode<R: Request>(&self, request: &R, version: i16) -> Result<(Bytes, i32)> {
        let correlation_id = self.correlation.fetch_add(1, Ordering::Relaxed);
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(self.client_id.clone()));
        let header_version = R::header_version(version);
        // kafka-protocol reports codec failures as `anyhow::Error`; we only format them.
        let codec_error = |e: anyhow::Error| Error::Protocol {
            broker: self.addr.clone(),
            detail: format!("cannot encode {} v{version}: {e}", api_name(R::KEY)),
        };
        let size =
            4 + header.compute_size(header_version).map_err(codec_error)? + request.compute_size(version).map_err(codec_error)?;
        let mut buf = BytesMut::with_capacity(size);
        buf.put_i32(0);
        header.encode(&mut buf, header_version).map_err(codec_error)?;
        request.encode(&mut buf, version).map_err(codec_error)?;
        let len = (buf.len() - 4) as i32;
        buf[..4].copy_from_slice(&len.to_be_bytes());
        Ok((buf.freeze(), correlation_id))
    }
}

/// Frames written with one `writev` at most.
const MAX_GATHER: usize = 64;

/// Writes queued frames in order. Frames queued together go out in one vectored write,
/// straight from their own buffers: a produce request is tens of KiB of records, and
/// copying each one into a write buffer first showed in profiles of the producer.
async fn write_loop(
    addr: String,
    mut socket: tokio::net::tcp::OwnedWriteHalf,
    mut rx: mpsc::Receiver<Outgoing>,
    in_flight: Arc<Mutex<InFlight>>,
) {
    let mut written = Vec::new();
    let mut frames: VecDeque<Bytes> = VecDeque::new();
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(mut outgoing) = next.take() {
            let mut skip = false;
            if let Some(pending) = outgoing.pending.take() {
                // Registered before the frame is written, so the reader finds it.
                let mut state = in_flight.lock().unwrap_or_else(|e| e.into_inner());
                match &state.closed {
                    Some(e) => {
                        let _ = pending.reply.send(Err(e.clone()));
                        skip = true;
                    }
                    None => state.queue.push_back(pending),
                }
            }
            if !skip {
                frames.push_back(outgoing.frame);
                written.extend(outgoing.written.take());
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
                in_flight.lock().unwrap_or_else(|e| e.into_inner()).fail(error);
                return;
            }
        }
    }
}

/// Writes every frame of `frames`, in order, with vectored writes; empties it.
async fn write_frames(socket: &mut tokio::net::tcp::OwnedWriteHalf, frames: &mut VecDeque<Bytes>) -> std::io::Result<()> {
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

async fn read_loop(addr: String, mut socket: BufReader<tokio::net::tcp::OwnedReadHalf>, in_flight: Arc<Mutex<InFlight>>) {
    let error = loop {
        let len = match socket.read_i32().await {
            Ok(len) => len,
            Err(e) => break Error::io(&addr, e),
        };
        let Some(len) = usize::try_from(len).ok().filter(|&l| (4..=MAX_RESPONSE_FRAME).contains(&l)) else {
            break Error::Protocol { broker: addr.clone(), detail: format!("invalid response frame length {len}") };
        };
        let mut frame = BytesMut::zeroed(len);
        if let Err(e) = socket.read_exact(&mut frame).await {
            break Error::io(&addr, e);
        }
        let mut frame = frame.freeze();
        let Some(pending) = in_flight.lock().unwrap_or_else(|e| e.into_inner()).queue.pop_front() else {
            break Error::Protocol { broker: addr.clone(), detail: "response to no request".into() };
        };
        let header = match ResponseHeader::decode(&mut frame, pending.response_header_version) {
            Ok(h) => h,
            Err(e) => break Error::Protocol { broker: addr.clone(), detail: format!("bad response header: {e}") },
        };
        if header.correlation_id != pending.correlation_id {
            let detail = format!("response correlation id {} for request {}", header.correlation_id, pending.correlation_id);
            let error = Error::Protocol { broker: addr.clone(), detail };
            let _ = pending.reply.send(Err(error.clone()));
            break error;
        }
        let _ = pending.reply.send(Ok(frame.copy_to_bytes(frame.remaining())));
    };
    in_flight.lock().unwrap_or_else(|e| e.into_inner()).fail(error);
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
