//! gRPC → gateway → broker: a tonic client (unary, bidirectional stream, fetch,
//! subscribe, health, reflection) and an independent client, Python grpcio, built from
//! the .proto file.

mod support;

use std::process::Command;
use std::time::Duration;

use fjord_proto::v1::publisher_client::PublisherClient;
use fjord_proto::v1::subscriber_client::SubscriberClient;
use fjord_proto::v1::{Acks, Event, FetchRequest, Header, PublishRequest, SubscribeRequest};
use support::{kcat_consume, System};

fn event(value: &str) -> Event {
    Event { value: Some(value.to_string().into()), ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_unary_stream_fetch_and_subscribe() {
    let sys = System::start().await;
    sys.create_topic("rpc", 3).await;
    let mut publisher = PublisherClient::connect(sys.grpc.clone()).await.unwrap();

    // Unary: keys pick partitions, explicit partitions win, caller headers are kept.
    let mut keyed = event("k-event");
    keyed.key = Some("user-9".into());
    let mut placed = event("placed");
    placed.partition = Some(1);
    placed.headers =
        vec![Header { key: "fjord.host".into(), value: "upstream".into() }, Header { key: "trace".into(), value: "t1".into() }];
    let answer = publisher
        .publish(PublishRequest {
            topic: "rpc".into(),
            events: vec![keyed, placed],
            acks: Acks::All as i32,
            batch_id: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.offsets.len(), 2);
    assert_eq!(answer.offsets[0].partition, fjord_client::partitioner::partition_for_key(b"user-9", 3));
    assert_eq!(answer.offsets[1].partition, 1);

    // Streaming: 50 batches of 20, answers in order, one per batch.
    let batches: Vec<PublishRequest> = (0..50u64)
        .map(|b| PublishRequest {
            topic: "rpc".into(),
            events: (0..20).map(|i| event(&format!("s{b}-{i}"))).collect(),
            batch_id: b,
            ..Default::default()
        })
        .collect();
    let mut answers = publisher.publish_stream(futures::stream::iter(batches)).await.unwrap().into_inner();
    let mut ids = Vec::new();
    while let Some(a) = answers.message().await.unwrap() {
        assert!(a.error.is_none(), "{a:?}");
        assert_eq!(a.offsets.len(), 20);
        ids.push(a.batch_id);
    }
    assert_eq!(ids, (0..50).collect::<Vec<_>>());

    // What kcat sees.
    let messages = kcat_consume(&sys.broker, "rpc");
    assert_eq!(messages.len(), 2 + 50 * 20);
    let placed = messages.iter().find(|m| m.payload.as_deref() == Some("placed")).unwrap();
    assert_eq!((placed.partition, placed.header("fjord.host"), placed.header("trace")), (1, Some("upstream"), Some("t1")));
    assert!(placed.header("fjord.created_ms").is_some());
    let streamed = messages.iter().find(|m| m.payload.as_deref() == Some("s3-4")).unwrap();
    assert_eq!(streamed.header("fjord.host"), Some("gw-it"));

    // Fetch and Subscribe.
    let mut subscriber = SubscriberClient::connect(sys.grpc.clone()).await.unwrap();
    let fetched = subscriber
        .fetch(FetchRequest { topic: "rpc".into(), partition: 1, offset: -2, max_bytes: 0, max_wait_ms: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(fetched.records[0].value.as_deref(), Some(&b"placed"[..]));
    assert_eq!(fetched.next_offset, fetched.records.last().unwrap().offset + 1);
    let end = fetched.high_watermark;
    let mut stream = subscriber
        .subscribe(SubscribeRequest { topic: "rpc".into(), partition: 1, offset: end, max_bytes: 0 })
        .await
        .unwrap()
        .into_inner();
    let mut late = event("late");
    late.partition = Some(1);
    publisher.publish(PublishRequest { topic: "rpc".into(), events: vec![late], ..Default::default() }).await.unwrap();
    let pushed =
        tokio::time::timeout(Duration::from_secs(10), stream.message()).await.expect("subscribe delivers").unwrap().unwrap();
    assert_eq!((pushed.records[0].offset, pushed.records[0].value.as_deref()), (end, Some(&b"late"[..])));

    // Health and reflection, which grpcurl relies on.
    let channel = tonic::transport::Endpoint::from_shared(sys.grpc.clone()).unwrap().connect().await.unwrap();
    let health = tonic_health::pb::health_client::HealthClient::new(channel.clone())
        .check(tonic_health::pb::HealthCheckRequest { service: "fjord.v1.Publisher".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(health.status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::{
        server_reflection_client::ServerReflectionClient, server_reflection_request::MessageRequest, ServerReflectionRequest,
    };
    let ask = ServerReflectionRequest { host: String::new(), message_request: Some(MessageRequest::ListServices(String::new())) };
    let mut listed =
        ServerReflectionClient::new(channel).server_reflection_info(futures::stream::iter([ask])).await.unwrap().into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) = listed.message().await.unwrap().unwrap().message_response else {
        panic!("no service list")
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in ["fjord.v1.Publisher", "fjord.v1.Subscriber", "grpc.health.v1.Health"] {
        assert!(names.iter().any(|n| n == want), "reflection lists {names:?}");
    }

    // Errors as statuses.
    let e = publisher
        .publish(PublishRequest {
            topic: "rpc".into(),
            events: vec![Event { partition: Some(9), ..event("x") }],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    let e = subscriber
        .fetch(FetchRequest { topic: "rpc".into(), partition: 0, offset: 1 << 40, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::OutOfRange);
}

/// An independent client: Python grpcio with stubs generated from proto/fjord/v1 by
/// grpcio-tools.
/// A caller's timestamp beyond the topic's `message.timestamp.after.max.ms` (an hour by
/// default) is the caller's error, INVALID_ARGUMENT naming the limit, not INTERNAL; the
/// event is not written, and the next request goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stamped_beyond_the_topics_limit_is_an_invalid_argument() {
    let sys = System::start().await;
    sys.create_topic("stamped", 1).await;
    let mut publisher = PublisherClient::connect(sys.grpc.clone()).await.unwrap();
    let mut ahead = event("a day ahead");
    ahead.timestamp_ms = Some(fjord_record::now_ms() + 86_400_000);
    let request = |events| PublishRequest { topic: "stamped".into(), events, acks: Acks::All as i32, ..Default::default() };
    let status = publisher.publish(request(vec![ahead.clone()])).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("message.timestamp.after.max.ms"), "{status:?}");
    let answer = publisher.publish(request(vec![event("now")])).await.unwrap().into_inner();
    assert_eq!(answer.offsets.len(), 1);
    // Among others (one batch of one partition): only that event is refused, and the
    // answer says which were not stored, so the caller resends just those.
    let status = publisher.publish(request(vec![event("before"), ahead.clone(), event("after")])).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("2 of the 3 events were stored; not stored: events 1"), "{status:?}");
    let read: Vec<_> = kcat_consume(&sys.broker, "stamped").into_iter().map(|m| m.payload.unwrap()).collect();
    assert_eq!(read, ["now", "before", "after"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpcio_publishes_and_fetches() {
    let python = support::python();
    let sys = System::start().await;
    sys.create_topic("py", 1).await;
    let out_dir = tempfile::tempdir().unwrap();
    let proto_root = concat!(env!("CARGO_MANIFEST_DIR"), "/../proto");
    let generated = Command::new(&python)
        .args(["-m", "grpc_tools.protoc", "-I", proto_root])
        .arg(format!("--python_out={}", out_dir.path().display()))
        .arg(format!("--grpc_python_out={}", out_dir.path().display()))
        .arg(format!("{proto_root}/fjord/v1/events.proto"))
        .output()
        .expect("run grpc_tools.protoc");
    assert!(generated.status.success(), "protoc: {}", String::from_utf8_lossy(&generated.stderr));
    let script = r#"
import sys, grpc
from fjord.v1 import events_pb2 as pb, events_pb2_grpc as rpc
target = sys.argv[1]
with grpc.insecure_channel(target) as ch:
    pub = rpc.PublisherStub(ch)
    events = [pb.Event(key=b"k%d" % i, value=b"py-%d" % i, headers=[pb.Header(key="lang", value=b"python")]) for i in range(10)]
    r = pub.Publish(pb.PublishRequest(topic="py", events=events, acks=pb.ACKS_ALL, batch_id=5), timeout=30)
    assert r.batch_id == 5 and len(r.offsets) == 10, r
    answers = list(pub.PublishStream(iter([pb.PublishRequest(topic="py", events=[pb.Event(value=b"st-%d" % b)], batch_id=b) for b in range(5)]), timeout=30))
    assert [a.batch_id for a in answers] == list(range(5)), answers
    f = rpc.SubscriberStub(ch).Fetch(pb.FetchRequest(topic="py", partition=0, offset=-2), timeout=30)
    assert [x.value for x in f.records][:2] == [b"py-0", b"py-1"], f
    assert f.next_offset == 15, f.next_offset
    try:
        pub.Publish(pb.PublishRequest(topic="bad topic!", events=events), timeout=30)
        raise SystemExit("a bad topic name was accepted")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
print("python grpcio ok")
"#;
    let grpc_target = sys.grpc.trim_start_matches("http://").to_string();
    let out_path = out_dir.path().to_path_buf();
    let python_run = tokio::task::spawn_blocking(move || {
        Command::new(&python).arg("-c").arg(script).arg(grpc_target).env("PYTHONPATH", out_path).output().expect("run python")
    })
    .await
    .unwrap();
    assert!(
        python_run.status.success(),
        "python grpcio client failed:\n{}\n{}",
        String::from_utf8_lossy(&python_run.stdout),
        String::from_utf8_lossy(&python_run.stderr)
    );
    assert!(String::from_utf8_lossy(&python_run.stdout).contains("python grpcio ok"));
    let messages = kcat_consume(&sys.broker, "py");
    assert_eq!(messages.len(), 15);
    assert_eq!(messages[0].header("lang"), Some("python"));
    assert_eq!(messages[0].header("fjord.host"), Some("gw-it"));
}
