//! Many concurrent small requests through one gateway: every one acknowledged, every event
//! stored exactly once (checked with kcat, outside our client), offsets never handed out
//! twice. Scaled (50 clients x 40 requests x 10 events over HTTP, plus 10 gRPC streams x
//! 40 batches x 10 events) so a debug build runs it in seconds.

mod support;

use std::collections::HashSet;

use fjord_proto::v1::publisher_client::PublisherClient;
use fjord_proto::v1::{Event, PublishRequest};
use support::{kcat_consume, System};

const HTTP_CLIENTS: usize = 50;
const GRPC_STREAMS: usize = 10;
const REQUESTS: usize = 40;
const EVENTS: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_small_requests_are_all_acknowledged_exactly_once() {
    let sys = System::start().await;
    sys.create_topic("load", 3).await;
    let mut tasks = Vec::new();
    // Even clients post bulk NDJSON (answer: count and per-partition offset ranges), odd
    // ones REST Proxy v2 JSON (answer: one offset per event).
    for c in 0..HTTP_CLIENTS {
        let http_base = sys.http.clone();
        tasks.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut acknowledged = Vec::new();
            for r in 0..REQUESTS {
                let ids: Vec<String> = (0..EVENTS).map(|e| format!("h{c}-{r}-{e}")).collect();
                if c % 2 == 0 {
                    let body: String = ids.iter().map(|id| format!("{{\"id\":\"{id}\"}}\n")).collect();
                    let resp = http.post(format!("{http_base}/v1/events/load")).body(body).send().await.expect("request");
                    assert_eq!(resp.status(), 200);
                    let doc: serde_json::Value = resp.json().await.unwrap();
                    assert_eq!(doc["count"], EVENTS);
                    let counted: u64 = doc["partitions"].as_array().unwrap().iter().map(|p| p["count"].as_u64().unwrap()).sum();
                    assert_eq!(counted, EVENTS as u64);
                } else {
                    let records: Vec<serde_json::Value> = ids.iter().map(|id| serde_json::json!({"value": {"id": id}})).collect();
                    let resp = http
                        .post(format!("{http_base}/topics/load"))
                        .header("content-type", "application/vnd.kafka.json.v2+json")
                        .body(serde_json::json!({ "records": records }).to_string())
                        .send()
                        .await
                        .expect("request");
                    assert_eq!(resp.status(), 200);
                    let doc: serde_json::Value = resp.json().await.unwrap();
                    for o in doc["offsets"].as_array().unwrap() {
                        acknowledged.push((o["partition"].as_i64().unwrap(), o["offset"].as_i64().unwrap()));
                    }
                }
            }
            acknowledged
        }));
    }
    for s in 0..GRPC_STREAMS {
        let grpc = sys.grpc.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = PublisherClient::connect(grpc).await.unwrap();
            let batches: Vec<PublishRequest> = (0..REQUESTS)
                .map(|r| PublishRequest {
                    topic: "load".into(),
                    events: (0..EVENTS)
                        .map(|e| Event { value: Some(format!("{{\"id\":\"g{s}-{r}-{e}\"}}").into()), ..Default::default() })
                        .collect(),
                    batch_id: r as u64,
                    ..Default::default()
                })
                .collect();
            let mut answers = client.publish_stream(futures::stream::iter(batches)).await.unwrap().into_inner();
            let mut acknowledged = Vec::new();
            while let Some(a) = answers.message().await.unwrap() {
                assert!(a.error.is_none(), "{a:?}");
                acknowledged.extend(a.offsets.iter().map(|o| (o.partition as i64, o.offset)));
            }
            assert_eq!(acknowledged.len(), REQUESTS * EVENTS);
            acknowledged
        }));
    }
    let mut offsets = HashSet::new();
    for t in tasks {
        for o in t.await.unwrap() {
            assert!(offsets.insert(o), "offset {o:?} acknowledged twice");
        }
    }
    let total = (HTTP_CLIENTS + GRPC_STREAMS) * REQUESTS * EVENTS;
    assert_eq!(offsets.len(), (HTTP_CLIENTS / 2 + GRPC_STREAMS) * REQUESTS * EVENTS);

    let messages = kcat_consume(&sys.broker, "load");
    assert_eq!(messages.len(), total);
    let mut ids = HashSet::new();
    for m in &messages {
        let doc: serde_json::Value = serde_json::from_str(m.payload.as_deref().unwrap()).unwrap();
        assert!(ids.insert(doc["id"].as_str().unwrap().to_string()), "event {} stored twice", doc["id"]);
        let id = doc["id"].as_str().unwrap();
        let client: usize = id[1..].split('-').next().unwrap().parse().unwrap();
        let reported_per_event = id.starts_with('g') || client % 2 == 1;
        if reported_per_event {
            assert!(offsets.contains(&(m.partition as i64, m.offset)), "event {id} stored at an offset nobody was told");
        }
    }
    assert_eq!(ids.len(), total);
}
