//! What one gRPC publish may cost the gateway (issue #26 case 4): a request of millions
//! of empty events is refused with RESOURCE_EXHAUSTED before it is decoded, and the
//! gateway's peak memory growth is measured while it is. Its own test binary: the
//! measurement reads this process's peak RSS, which other tests would disturb.

mod support;

use bytes::{Buf, BufMut};
use fjord_proto::codec::{MAX_PUBLISH_EVENTS, MAX_PUBLISH_HEADERS};
use fjord_proto::v1::publisher_client::PublisherClient;
use fjord_proto::v1::{Acks, Event, Header, PublishRequest};
use support::System;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

/// Sends already-encoded messages and hands back the answer's bytes: the test builds a
/// request of millions of events as bytes, without first building millions of structs.
#[derive(Clone, Default)]
struct RawCodec;

struct Raw;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(buf.copy_to_bytes(buf.remaining()).to_vec()))
    }
}

/// An encoded `PublishRequest` to `topic` of `events` empty events (two bytes each).
fn empty_events(topic: &str, events: usize) -> Vec<u8> {
    let mut message = Vec::with_capacity(events * 2 + topic.len() + 2);
    message.extend_from_slice(&[0x0a, topic.len() as u8]);
    message.extend_from_slice(topic.as_bytes());
    for _ in 0..events {
        message.extend_from_slice(&[0x12, 0x00]);
    }
    message
}

async fn publish_raw(grpc: &str, message: Vec<u8>) -> Result<Vec<u8>, Status> {
    let channel = tonic::transport::Endpoint::from_shared(grpc.to_string()).unwrap().connect().await.unwrap();
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/fjord.v1.Publisher/Publish");
    client.unary(tonic::Request::new(message), path, RawCodec).await.map(tonic::Response::into_inner)
}

fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// Peak RSS growth allowed while the gateway refuses a 10 MB request: the request as the
/// test holds it, tonic's copy of the message, HTTP/2 buffers, and slack; no decoded events.
const RSS_GROWTH_BOUND: u64 = 96 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_of_millions_of_empty_events_is_refused_before_it_is_decoded() {
    let sys = System::start().await;
    sys.create_topic("limits", 1).await;
    // Just under the gateway's 10 MiB message limit: five million empty events.
    let events = (10 << 20) / 2 - 64;
    let message = empty_events("limits", events);
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    let rss_before = status_bytes("VmRSS:");
    let err = publish_raw(&sys.grpc, message).await.unwrap_err();
    let growth = status_bytes("VmHWM:").saturating_sub(rss_before);
    eprintln!("{events} empty events refused; peak RSS growth {} MiB (bound {} MiB)", growth >> 20, RSS_GROWTH_BOUND >> 20);
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains(&format!("at most {MAX_PUBLISH_EVENTS} events")), "{}", err.message());
    assert!(growth <= RSS_GROWTH_BOUND, "peak RSS grew by {} MiB", growth >> 20);

    // Within the limits a request goes through, on the same server.
    let mut publisher = PublisherClient::connect(sys.grpc.clone()).await.unwrap();
    let fine = PublishRequest {
        topic: "limits".into(),
        events: vec![Event { value: Some(b"v".to_vec().into()), ..Event::default() }; 1000],
        acks: Acks::All as i32,
        batch_id: 1,
        ..Default::default()
    };
    assert_eq!(publisher.publish(fine).await.unwrap().into_inner().offsets.len(), 1000);

    // Headers count too, over all events of a request; a stream batch is held to the same.
    let header = Header { key: "h".into(), value: Default::default() };
    let heavy = PublishRequest {
        topic: "limits".into(),
        events: vec![Event { headers: vec![header; MAX_PUBLISH_HEADERS / 10 + 1], ..Event::default() }; 10],
        acks: Acks::All as i32,
        batch_id: 2,
        ..Default::default()
    };
    let err = publisher.publish(heavy.clone()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("headers"), "{}", err.message());
    let mut answers = publisher.publish_stream(futures::stream::iter([heavy])).await.unwrap().into_inner();
    let err = answers.message().await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
}
