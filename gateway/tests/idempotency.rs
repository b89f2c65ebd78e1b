//! `Idempotency-Key` (HTTP) and `idempotency_key` (gRPC) end to end on a real broker: a
//! repeated request gets the first answer and writes nothing, across a gateway restart
//! and with two gateways answering alternately or at once. What the topic holds is read
//! back from the broker, not from the gateway.

mod support;

use fjord_proto::v1::publisher_client::PublisherClient;
use fjord_proto::v1::{Event, PublishRequest};
use serde_json::Value as Json;
use support::{LoneGateway, System};

const TOPIC: &str = "orders";

fn ndjson(n: usize, tag: &str) -> String {
    (0..n).map(|i| format!("{{\"order\":\"{tag}-{i}\",\"user\":\"u{}\"}}\n", i % 7)).collect()
}

/// Posts `body` to `/v1/events/orders?key=user` with the key (if any); status and JSON.
async fn post(base: &str, key: Option<&str>, body: &str) -> (u16, Json) {
    let http = reqwest::Client::new();
    let mut r = http.post(format!("{base}/v1/events/{TOPIC}?key=user")).body(body.to_string());
    if let Some(k) = key {
        r = r.header("Idempotency-Key", k);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

async fn events_in_topic(sys: &System) -> i64 {
    sys.end_offsets(TOPIC, 3).await.iter().sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_gets_the_first_answer_and_writes_nothing() {
    let sys = System::start().await;
    sys.create_topic(TOPIC, 3).await;
    let body = ndjson(20, "a");
    let (s1, first) = post(&sys.http, Some("key-1"), &body).await;
    assert_eq!(s1, 200, "{first}");
    assert_eq!(first["count"], 20);
    let (s2, second) = post(&sys.http, Some("key-1"), &body).await;
    assert_eq!((s2, &second), (200, &first), "the repeat gets the first answer");
    assert_eq!(events_in_topic(&sys).await, 20, "each event once");

    // The same key for a different request is refused, and writes nothing.
    let (s3, refused) = post(&sys.http, Some("key-1"), &ndjson(20, "b")).await;
    assert_eq!(s3, 422, "{refused}");
    assert!(refused["message"].as_str().unwrap().contains("Idempotency-Key"), "{refused}");
    assert_eq!(events_in_topic(&sys).await, 20);

    // A bad key is a clear 400; without a key nothing changed: every post is written.
    assert_eq!(post(&sys.http, Some("has space"), &body).await.0, 400);
    assert_eq!(post(&sys.http, None, &body).await.0, 200);
    assert_eq!(post(&sys.http, None, &body).await.0, 200);
    assert_eq!(events_in_topic(&sys).await, 60);

    // gRPC: the same with the idempotency_key field.
    let mut publisher = PublisherClient::connect(sys.grpc.clone()).await.unwrap();
    let request = |key: &str, v: &str| PublishRequest {
        topic: TOPIC.into(),
        events: (0..5).map(|i| Event { value: Some(format!("{v}{i}").into()), ..Default::default() }).collect(),
        idempotency_key: key.into(),
        ..Default::default()
    };
    let a = publisher.publish(request("grpc-1", "x")).await.unwrap().into_inner();
    let b = publisher.publish(request("grpc-1", "x")).await.unwrap().into_inner();
    assert_eq!(a.offsets.len(), 5);
    assert_eq!(a.offsets, b.offsets);
    assert_eq!(events_in_topic(&sys).await, 65);
    let status = publisher.publish(request("grpc-1", "y")).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert_eq!(events_in_topic(&sys).await, 65);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_after_a_gateway_restart_gets_the_first_answer() {
    let sys = System::start().await;
    sys.create_topic(TOPIC, 3).await;
    let body = ndjson(30, "r");
    let gw = LoneGateway::start(&sys.broker, "gw-a").await;
    let (s1, first) = post(&gw.http, Some("restart-1"), &body).await;
    assert_eq!(s1, 200, "{first}");
    gw.stop().await;

    let gw = LoneGateway::start(&sys.broker, "gw-a").await;
    let (s2, second) = post(&gw.http, Some("restart-1"), &body).await;
    assert_eq!((s2, &second), (200, &first));
    assert_eq!(events_in_topic(&sys).await, 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_alternating_or_racing_write_once() {
    let sys = System::start().await;
    sys.create_topic(TOPIC, 3).await;
    let (a, b) = (LoneGateway::start(&sys.broker, "gw-a").await, LoneGateway::start(&sys.broker, "gw-b").await);

    let body = ndjson(10, "alt");
    let (s, first) = post(&a.http, Some("alt-1"), &body).await;
    assert_eq!(s, 200, "{first}");
    for gw in [&b, &a, &b] {
        assert_eq!(post(&gw.http, Some("alt-1"), &body).await, (200, first.clone()));
    }
    assert_eq!(events_in_topic(&sys).await, 10);

    // Both at once: one writes, the other waits for it and gets the same answer.
    for round in 0..5 {
        let key = format!("race-{round}");
        let body = ndjson(10, &key);
        let (ra, rb) = tokio::join!(post(&a.http, Some(&key), &body), post(&b.http, Some(&key), &body));
        assert_eq!(ra.0, 200, "{}", ra.1);
        assert_eq!(ra, rb);
    }
    assert_eq!(events_in_topic(&sys).await, 60);
}

/// Many repeats at once on one gateway: one run writes, the others wait for its answer,
/// and each claims the key at most once (a loser looks again once the follower has read
/// its claim, instead of claiming again while the follower catches up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_repeats_on_one_gateway_write_once_and_claim_at_most_once_each() {
    const REPEATS: usize = 8;
    let sys = System::start().await;
    sys.create_topic(TOPIC, 3).await;
    let body = ndjson(10, "burst");
    // The key topic exists once the first keyed request has opened the key store.
    let (s, _) = post(&sys.http, Some("warm-up"), &ndjson(1, "warm")).await;
    assert_eq!(s, 200);
    let key_records_before = sys.end_offsets("_gateway_idempotency", 1).await[0];

    let answers = futures::future::join_all((0..REPEATS).map(|_| post(&sys.http, Some("burst-1"), &body))).await;
    for answer in &answers {
        assert_eq!(answer, &answers[0], "every repeat gets the first run's answer");
    }
    assert_eq!(answers[0].0, 200, "{}", answers[0].1);
    assert_eq!(events_in_topic(&sys).await, 1 + 10, "the burst's events are written once");
    let key_records = sys.end_offsets("_gateway_idempotency", 1).await[0] - key_records_before;
    assert!(
        key_records <= REPEATS as i64 + 1,
        "{key_records} key records for {REPEATS} requests: a claim each and one answer at most"
    );
}
