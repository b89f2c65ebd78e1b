//! The gRPC front (tonic): `fjord.v1.Publisher` and `fjord.v1.Subscriber`, plus the
//! standard health and reflection services so grpcurl works without the .proto.
//!
//! `PublishStream` keeps up to [`STREAM_PIPELINE`] batches of one stream publishing at
//! once and answers in the order the batches came; it reads the next batch only while it
//! has room, so a client that stops reading answers is slowed down by HTTP/2 flow
//! control instead of growing the gateway's memory.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use fjord_auth::http::{Conn, Incoming, Peer};
use fjord_auth::Operation;

use fjord_client::Acks;
use fjord_proto::v1::publisher_server::{Publisher, PublisherServer};
use fjord_proto::v1::subscriber_server::{Subscriber, SubscriberServer};
use fjord_proto::v1::{
    self, EventOffset, FetchRequest, FetchResponse, PublishError, PublishRequest, PublishResponse, SubscribeRequest,
};
use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::codec::CompressionEncoding;
use tonic::transport::server::Connected;
use tonic::{Request, Response, Status, Streaming};

use crate::backend::{Delivered, Event, FetchQuery, Fetched};
use crate::http::auth::{forbidden, unauthenticated, unknown_peer, Caller};
use crate::http::produce::all_delivered;
use crate::http::read::DEFAULT_FETCH_BYTES;
use crate::idempotency::{self, Outcome, RequestHash};
use crate::service::{check_topic_name, Gateway};
use crate::{Error, Result};

/// Batches of one `PublishStream` in flight at once.
pub(crate) const STREAM_PIPELINE: usize = 32;
/// Long-poll wait of each fetch behind `Subscribe`.
const SUBSCRIBE_WAIT: Duration = Duration::from_millis(500);

struct PublisherService(Arc<Gateway>);
struct SubscriberService {
    gateway: Arc<Gateway>,
    shutdown: CancellationToken,
}

fn acks(value: i32) -> Result<Acks> {
    match v1::Acks::try_from(value) {
        Ok(v1::Acks::Unspecified | v1::Acks::All) => Ok(Acks::All),
        Ok(v1::Acks::Leader) => Ok(Acks::Leader),
        Ok(v1::Acks::None) => Ok(Acks::None),
        Err(_) => Err(Error::BadRequest { index: None, reason: format!("unknown acks value {value}") }),
    }
}

fn events(request: &mut PublishRequest) -> Vec<Event> {
    std::mem::take(&mut request.events)
        .into_iter()
        .map(|e| Event {
            key: e.key,
            value: e.value,
            headers: e.headers.into_iter().map(|h| (h.key, Some(h.value))).collect(),
            timestamp_ms: e.timestamp_ms,
            partition: e.partition,
        })
        .collect()
}

/// Who made a call: its `authorization` metadata (HTTP Basic, as the HTTP front) or its
/// client certificate; UNAUTHENTICATED when credentials are required and missing or wrong.
async fn caller<T>(g: &Gateway, request: &Request<T>) -> Result<Caller> {
    let peer = request.extensions().get::<Peer>().cloned().unwrap_or_else(unknown_peer);
    let authorization = request.metadata().get("authorization").map(|v| v.as_bytes());
    let principal = g.security.authenticate(authorization, &peer).await.map_err(|why| unauthenticated(g, why))?;
    Ok(Caller { principal, host: peer.host() })
}

/// PERMISSION_DENIED unless the caller may `operation` the topic.
fn authorize(g: &Gateway, caller: &Caller, operation: Operation, topic: &str) -> Result<()> {
    if caller.may(g, operation, topic) {
        Ok(())
    } else {
        Err(forbidden(caller, operation, topic))
    }
}

/// Publishes one batch; shared by the unary and the streaming call.
async fn publish(g: &Gateway, api: &'static str, caller: &Caller, mut request: PublishRequest) -> Result<Vec<Delivered>> {
    let start = Instant::now();
    let result = async {
        check_topic_name(&request.topic)?;
        // Each batch (unary, or one of a stream) is a request against the caller's limits.
        let client = caller.limit_key();
        g.limiter.admit(&client)?;
        authorize(g, caller, Operation::Write, &request.topic)?;
        let acks = acks(request.acks)?;
        let atomic = request.atomic;
        if atomic && acks != Acks::All {
            return Err(Error::BadRequest { index: None, reason: "atomic needs ACKS_ALL (or unspecified)".into() });
        }
        if request.events.is_empty() {
            return Err(Error::BadRequest { index: None, reason: "the batch holds no events".into() });
        }
        let events = events(&mut request);
        let bytes = events.iter().map(Event::encoded_size).sum::<usize>();
        g.limiter.charge(&client, bytes);
        let topic = &request.topic;
        let publish = |events| async move {
            match atomic {
                true => g.publish_atomic(topic, events).await,
                false => all_delivered(g.publish(topic, events, acks).await?),
            }
        };
        if request.idempotency_key.is_empty() {
            return Ok((publish(events).await?, bytes));
        }
        idempotency::check_key(&request.idempotency_key)?;
        let hash = request_hash(&request.topic, request.acks, atomic, &events);
        let keys = g.key_store().await?;
        let scope = caller.key_scope();
        let run = keys.run(&scope, &request.idempotency_key, &hash, || async {
            let delivered = publish(events).await?;
            let pairs: Vec<(i32, i64)> = delivered.iter().map(|d| (d.partition, d.offset)).collect();
            let answer = serde_json::value::to_raw_value(&pairs).expect("invariant: pairs of numbers are JSON");
            Ok((answer, delivered))
        });
        match run.await? {
            Outcome::Fresh(delivered) => Ok((delivered, bytes)),
            Outcome::Stored(answer) => Ok((stored_offsets(&answer)?, 0)),
        }
    }
    .await;
    let (status, events, bytes) = match &result {
        Ok((d, bytes)) => (200, d.len(), *bytes),
        Err(e) => (e.http_status(), 0, 0),
    };
    g.metrics.record(api, status, events, bytes, start.elapsed());
    result.map(|(d, _)| d)
}

/// What makes two keyed batches the same request: topic, acks, atomic and the events as
/// sent.
fn request_hash(topic: &str, acks: i32, atomic: bool, events: &[Event]) -> String {
    let mut h = RequestHash::new();
    h.part(b"grpc").part(topic.as_bytes()).part(&acks.to_be_bytes());
    if atomic {
        // Only when set, so keys stored before the flag existed keep their hash.
        h.part(b"atomic");
    }
    let opt = |b: &Option<bytes::Bytes>| b.as_ref().map_or(vec![0], |b| [&[1u8][..], b].concat());
    for e in events {
        h.part(&opt(&e.key)).part(&opt(&e.value));
        h.part(&e.timestamp_ms.map_or(vec![0], |t| t.to_be_bytes().to_vec()));
        h.part(&e.partition.map_or(vec![0], |p| p.to_be_bytes().to_vec()));
        for (k, v) in &e.headers {
            h.part(k.as_bytes()).part(&opt(v));
        }
        h.part(b"end of event");
    }
    h.finish()
}

/// The offsets of a stored answer (`[[partition, offset], ...]`).
fn stored_offsets(answer: &serde_json::value::RawValue) -> Result<Vec<Delivered>> {
    let pairs: Vec<(i32, i64)> = serde_json::from_str(answer.get())
        .map_err(|_| Error::Unavailable("the stored answer of this Idempotency-Key is unreadable".into()))?;
    Ok(pairs.into_iter().map(|(partition, offset)| Delivered { partition, offset }).collect())
}

fn offsets(delivered: Vec<Delivered>) -> Vec<EventOffset> {
    delivered.into_iter().map(|d| EventOffset { partition: d.partition, offset: d.offset }).collect()
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Publisher for PublisherService {
    async fn publish(&self, request: Request<PublishRequest>) -> Result<Response<PublishResponse>, Status> {
        let caller = caller(&self.0, &request).await?;
        let request = request.into_inner();
        let batch_id = request.batch_id;
        let delivered = publish(&self.0, "grpc_publish", &caller, request).await?;
        Ok(Response::new(PublishResponse { batch_id, offsets: offsets(delivered), error: None }))
    }

    type PublishStreamStream = BoxStream<PublishResponse>;

    async fn publish_stream(
        &self,
        request: Request<Streaming<PublishRequest>>,
    ) -> Result<Response<Self::PublishStreamStream>, Status> {
        let g = self.0.clone();
        // Authenticated once for the stream; each batch's topic is authorized on its own.
        let caller = Arc::new(caller(&g, &request).await?);
        let answers = request
            .into_inner()
            .map(move |batch| {
                let (g, caller) = (g.clone(), caller.clone());
                async move {
                    let batch = batch?;
                    let batch_id = batch.batch_id;
                    Ok(match publish(&g, "grpc_publish_stream", &caller, batch).await {
                        Ok(delivered) => PublishResponse { batch_id, offsets: offsets(delivered), error: None },
                        Err(e) => PublishResponse {
                            batch_id,
                            offsets: Vec::new(),
                            error: Some(PublishError {
                                code: e.grpc_code() as i32,
                                message: e.to_string(),
                                event_index: e.record_index().map(|i| i as u32),
                            }),
                        },
                    })
                }
            })
            .buffered(STREAM_PIPELINE);
        Ok(Response::new(Box::pin(answers)))
    }
}

fn fetch_query(
    g: &Gateway,
    topic: String,
    partition: i32,
    offset: i64,
    max_bytes: i32,
    max_wait: Duration,
) -> Result<FetchQuery> {
    check_topic_name(&topic)?;
    if partition < 0 {
        return Err(Error::UnknownPartition { topic, partition });
    }
    if offset < -2 {
        return Err(Error::BadRequest {
            index: None,
            reason: format!("offset {offset} is neither an offset nor -2 (earliest) / -1 (latest)"),
        });
    }
    let max_bytes = match max_bytes {
        0 => DEFAULT_FETCH_BYTES.min(g.config.max_fetch_bytes),
        n if n > 0 && n as usize <= g.config.max_fetch_bytes => n as usize,
        n => {
            return Err(Error::BadRequest {
                index: None,
                reason: format!("max_bytes {n} is not in 0..={}", g.config.max_fetch_bytes),
            })
        }
    };
    if max_wait > g.config.max_fetch_wait {
        return Err(Error::BadRequest {
            index: None,
            reason: format!("max_wait_ms is over the limit of {:?}", g.config.max_fetch_wait),
        });
    }
    Ok(FetchQuery { topic, partition, offset, max_bytes, max_wait })
}

fn fetch_response(topic: &str, partition: i32, f: Fetched) -> FetchResponse {
    FetchResponse {
        topic: topic.to_string(),
        partition,
        next_offset: f.next_offset,
        high_watermark: f.high_watermark,
        records: f
            .records
            .into_iter()
            .map(|r| v1::Record {
                offset: r.offset,
                timestamp_ms: r.timestamp_ms,
                key: r.key,
                value: r.value,
                headers: r.headers.into_iter().map(|(key, value)| v1::Header { key, value: value.unwrap_or_default() }).collect(),
            })
            .collect(),
    }
}

#[tonic::async_trait]
impl Subscriber for SubscriberService {
    async fn fetch(&self, request: Request<FetchRequest>) -> Result<Response<FetchResponse>, Status> {
        let start = Instant::now();
        let g = &self.gateway;
        let caller = caller(g, &request).await;
        let r = request.into_inner();
        let result = async {
            let caller = caller?;
            g.limiter.admit(&caller.limit_key())?;
            authorize(g, &caller, Operation::Read, &r.topic)?;
            let q = fetch_query(
                g,
                r.topic.clone(),
                r.partition,
                r.offset,
                r.max_bytes,
                Duration::from_millis(u64::from(r.max_wait_ms)),
            )?;
            g.backend.fetch(q).await
        }
        .await;
        g.metrics.record("grpc_fetch", result.as_ref().map_or_else(Error::http_status, |_| 200), 0, 0, start.elapsed());
        Ok(Response::new(fetch_response(&r.topic, r.partition, result?)))
    }

    type SubscribeStream = BoxStream<FetchResponse>;

    async fn subscribe(&self, request: Request<SubscribeRequest>) -> Result<Response<Self::SubscribeStream>, Status> {
        let caller = caller(&self.gateway, &request).await?;
        let r = request.into_inner();
        let g = self.gateway.clone();
        authorize(&g, &caller, Operation::Read, &r.topic)?;
        let mut query = fetch_query(&g, r.topic.clone(), r.partition, r.offset, r.max_bytes, SUBSCRIBE_WAIT)?;
        let shutdown = self.shutdown.clone();
        // A small channel: the subscriber's reading speed paces the fetches.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<FetchResponse, Status>>(2);
        tokio::spawn(async move {
            loop {
                let fetched = tokio::select! {
                    _ = tx.closed() => return,
                    _ = shutdown.cancelled() => {
                        let _ = tx.send(Err(Status::unavailable("gateway is shutting down"))).await;
                        return;
                    }
                    f = g.backend.fetch(query.clone()) => f,
                };
                match fetched {
                    Ok(f) => {
                        query.offset = f.next_offset;
                        if !f.records.is_empty() && tx.send(Ok(fetch_response(&r.topic, r.partition, f))).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e.into())).await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }
}

/// Serves Publisher, Subscriber, health and reflection on `listener` until `shutdown`.
pub(crate) async fn serve(gateway: Arc<Gateway>, listener: TcpListener, shutdown: CancellationToken) -> Result<()> {
    let limit = gateway.config.max_body_bytes;
    let incoming =
        Incoming::start(listener, gateway.security.clone(), shutdown.clone()).map_err(|e| Error::Serve(format!("gRPC: {e}")))?;
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<PublisherServer<PublisherService>>().await;
    health.set_serving::<SubscriberServer<SubscriberService>>().await;
    let reflection = |b: tonic_reflection::server::Builder<'static>| {
        b.register_encoded_file_descriptor_set(fjord_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection(tonic_reflection::server::Builder::configure())
        .build_v1()
        .map_err(|e| Error::Serve(format!("reflection service: {e}")))?;
    let reflection_v1alpha = reflection(tonic_reflection::server::Builder::configure())
        .build_v1alpha()
        .map_err(|e| Error::Serve(format!("reflection service: {e}")))?;
    // Compressed messages are inflated by tonic into a buffer limited to
    // max_decoding_message_size, so the body limit holds for the decoded size too.
    // Answers are compressed only for a client that lists the coding in
    // grpc-accept-encoding.
    let publisher = PublisherServer::new(PublisherService(gateway.clone()))
        .max_decoding_message_size(limit)
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Zstd)
        .send_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Zstd);
    let subscriber = SubscriberServer::new(SubscriberService { gateway, shutdown: shutdown.clone() })
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Zstd)
        .send_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Zstd);
    tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(publisher)
        .add_service(subscriber)
        .serve_with_incoming_shutdown(
            // TLS handshakes (when on) run in `Incoming`, each on its own task; it also
            // sets TCP_NODELAY, without which Nagle held each small answer of a stream
            // until the client's delayed ACK (~40 ms per answer).
            futures::stream::unfold(incoming, |mut incoming| async move {
                let (conn, peer) = incoming.next().await?;
                Some((Ok::<_, std::io::Error>(GrpcConn { conn, peer }), incoming))
            }),
            shutdown.cancelled_owned(),
        )
        .await
        .map_err(|e| Error::Serve(format!("gRPC: {e}")))
}

/// A connection as tonic takes it: calls see the [`Peer`] in their extensions.
struct GrpcConn {
    conn: Conn,
    peer: Peer,
}

impl Connected for GrpcConn {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        self.peer.clone()
    }
}

impl AsyncRead for GrpcConn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().conn).poll_read(cx, buf)
    }
}

impl AsyncWrite for GrpcConn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().conn).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().conn).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.conn.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().conn).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().conn).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use fjord_proto::v1::publisher_client::PublisherClient;
    use fjord_proto::v1::subscriber_client::SubscriberClient;

    use super::*;
    use crate::service::tests::{gateway, MemoryBackend};
    use crate::GatewayConfig;

    fn event(v: &str) -> v1::Event {
        v1::Event { value: Some(v.to_string().into()), ..Default::default() }
    }

    #[tokio::test]
    async fn unary_stream_fetch_and_subscribe() {
        let g = gateway(MemoryBackend { partitions: 2, ..Default::default() }, GatewayConfig::default());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(g, listener, shutdown.clone()));
        let mut publisher = PublisherClient::connect(url.clone()).await.unwrap();

        let r = publisher
            .publish(PublishRequest {
                topic: "g".into(),
                events: vec![event("a"), event("b")],
                acks: v1::Acks::Leader as i32,
                batch_id: 9,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!((r.batch_id, r.offsets.len(), r.error), (9, 2, None));
        let status = publisher
            .publish(PublishRequest { topic: "missing-t".into(), events: vec![event("a")], ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::NotFound);
        let status =
            publisher.publish(PublishRequest { topic: "g".into(), events: vec![], ..Default::default() }).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);

        // Stream: answers in batch order; a bad batch gets an error answer, the stream goes on.
        let batches: Vec<PublishRequest> = (0..20u64)
            .map(|i| {
                let mut events = vec![event(&format!("s{i}"))];
                if i == 7 {
                    events[0].partition = Some(5);
                }
                PublishRequest { topic: "g".into(), events, batch_id: i, ..Default::default() }
            })
            .collect();
        let mut answers = publisher.publish_stream(futures::stream::iter(batches)).await.unwrap().into_inner();
        let mut ids = Vec::new();
        while let Some(a) = answers.message().await.unwrap() {
            if a.batch_id == 7 {
                assert_eq!(a.error.as_ref().unwrap().code, tonic::Code::NotFound as i32);
            } else {
                assert_eq!(a.offsets.len(), 1);
            }
            ids.push(a.batch_id);
        }
        assert_eq!(ids, (0..20).collect::<Vec<_>>());

        let mut subscriber = SubscriberClient::connect(url).await.unwrap();
        let f = subscriber
            .fetch(FetchRequest { topic: "g".into(), partition: 0, offset: -2, max_bytes: 0, max_wait_ms: 0 })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(f.records.len(), 21);
        assert_eq!(f.records[0].value.as_deref(), Some(&b"a"[..]));
        assert!(f.records[0].headers.iter().any(|h| h.key == "fjord.host" && h.value == "gw-test"));
        let e = subscriber
            .fetch(FetchRequest { topic: "g".into(), partition: 0, offset: -3, ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        let mut sub = subscriber
            .subscribe(SubscribeRequest { topic: "g".into(), partition: 0, offset: 20, max_bytes: 0 })
            .await
            .unwrap()
            .into_inner();
        let first = sub.message().await.unwrap().unwrap();
        assert_eq!(first.records[0].offset, 20);
        shutdown.cancel();
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn gzip_and_zstd_requests_are_accepted_and_the_limit_holds_for_the_inflated_size() {
        let config = GatewayConfig { max_body_bytes: 64 * 1024, ..GatewayConfig::default() };
        let g = gateway(MemoryBackend { partitions: 1, ..Default::default() }, config);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(g.clone(), listener, shutdown.clone()));
        for encoding in [CompressionEncoding::Gzip, CompressionEncoding::Zstd] {
            let mut publisher =
                PublisherClient::connect(url.clone()).await.unwrap().send_compressed(encoding).accept_compressed(encoding);
            let r = publisher
                .publish(PublishRequest { topic: "z".into(), events: vec![event("a"), event("b")], ..Default::default() })
                .await
                .unwrap_or_else(|e| panic!("{encoding:?}: {e}"))
                .into_inner();
            assert_eq!(r.offsets.len(), 2, "{encoding:?}");
            // 1 MiB of one byte compresses to a few KB but inflates past the 64 KiB limit.
            let big = PublishRequest { topic: "z".into(), events: vec![event(&"x".repeat(1 << 20))], ..Default::default() };
            let status = publisher.publish(big).await.unwrap_err();
            assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{encoding:?}: {status}");
        }
        let log = g.backend.topics().await.unwrap();
        assert_eq!(log, vec!["z".to_string()]);
        shutdown.cancel();
        server.await.unwrap().unwrap();
    }
}
