//! Per-client limits over real HTTP and gRPC against a real broker: a client over its
//! requests/s or bytes/s gets 429 with `Retry-After` (gRPC: RESOURCE_EXHAUSTED with
//! `grpc-retry-pushback-ms`) while another client goes on unaffected. Anonymous clients
//! are told apart by IP address; the clients here connect from different loopback
//! addresses (127.0.0.2, 127.0.0.3, ...), which Linux routes to the same interface.

mod support;

use std::net::IpAddr;
use std::time::Duration;

use fjord_proto::v1::publisher_client::PublisherClient;
use fjord_proto::v1::{Event, PublishRequest};
use serde_json::Value as Json;
use support::System;

fn client_from(ip: &str) -> reqwest::Client {
    reqwest::Client::builder().local_address(ip.parse::<IpAddr>().unwrap()).build().unwrap()
}

/// Posts `body` as NDJSON; the status, the `Retry-After` header and the JSON answer.
async fn post(http: &reqwest::Client, base: &str, body: &str) -> (u16, Option<u64>, Json) {
    let r = http.post(format!("{base}/v1/events/limited")).body(body.to_string()).send().await.unwrap();
    let status = r.status().as_u16();
    let retry_after = r.headers().get("retry-after").map(|v| v.to_str().unwrap().parse().unwrap());
    (status, retry_after, r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_limit_gets_429_and_others_are_unaffected() {
    let sys = System::start_with(
        |_| {},
        |g| {
            g.client_limits.requests_per_sec = 3;
            g.client_limits.bytes_per_sec = 10_000;
        },
    )
    .await;
    sys.create_topic("limited", 1).await;
    let event = "{\"page\":\"/a\"}\n";

    // Requests/s: of 4 at once, the burst of 3 passes and one is refused (at once, so the
    // allowance cannot refill in between however slow the machine); a second client is not.
    let (a, b) = (client_from("127.0.0.2"), client_from("127.0.0.3"));
    let (r1, r2, r3, r4) = tokio::join!(
        post(&a, &sys.http, event),
        post(&a, &sys.http, event),
        post(&a, &sys.http, event),
        post(&a, &sys.http, event)
    );
    let mut answers = vec![r1, r2, r3, r4];
    answers.sort_by_key(|r| r.0);
    assert_eq!(answers.iter().map(|r| r.0).collect::<Vec<_>>(), [200, 200, 200, 429], "{answers:?}");
    let (_, retry_after, doc) = answers.pop().unwrap();
    assert_eq!(retry_after, Some(1), "{doc}");
    assert_eq!(doc["error_code"], 42901);
    assert!(doc["message"].as_str().unwrap().contains("ip:127.0.0.2 is over its limit of 3 requests/s"), "{doc}");
    for _ in 0..3 {
        assert_eq!(post(&b, &sys.http, event).await.0, 200, "another client has its own allowance");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(post(&a, &sys.http, event).await.0, 200, "after Retry-After the client is served again");

    // Bytes/s: a 60 kB body is taken (the allowance goes 50 kB into debt), then the client
    // is refused for 5 s; a client from another address still posts.
    let (c, d) = (client_from("127.0.0.4"), client_from("127.0.0.5"));
    let big: String = (0..3000).map(|i| format!("{{\"s\":\"{i:011}\"}}\n")).collect();
    assert_eq!(big.len(), 60_000);
    assert_eq!(post(&c, &sys.http, &big).await.0, 200);
    let (status, retry_after, doc) = post(&c, &sys.http, event).await;
    assert_eq!(status, 429, "{doc}");
    assert!((3..=5).contains(&retry_after.unwrap()), "{retry_after:?}");
    assert!(doc["message"].as_str().unwrap().contains("10000 bytes/s"), "{doc}");
    assert_eq!(post(&d, &sys.http, event).await.0, 200);
    // The refused requests wrote nothing.
    assert_eq!(sys.end_offsets("limited", 1).await, [3 + 3 + 1 + 3000 + 1]);

    // gRPC: each batch is a request; over the limit is RESOURCE_EXHAUSTED with a pushback.
    let mut publisher = PublisherClient::connect(sys.grpc.clone()).await.unwrap();
    let request = || PublishRequest {
        topic: "limited".into(),
        events: vec![Event { value: Some(b"{}".to_vec().into()), ..Default::default() }],
        ..Default::default()
    };
    let (mut p1, mut p2, mut p3) = (publisher.clone(), publisher.clone(), publisher.clone());
    let (r1, r2, r3, r4) =
        tokio::join!(p1.publish(request()), p2.publish(request()), p3.publish(request()), publisher.publish(request()));
    let refused: Vec<tonic::Status> = [r1, r2, r3, r4].into_iter().filter_map(Result::err).collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    let status = &refused[0];
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("ip:127.0.0.1"), "{status:?}");
    let pushback: u64 = status.metadata().get("grpc-retry-pushback-ms").unwrap().to_str().unwrap().parse().unwrap();
    assert!((1..=1000).contains(&pushback), "{pushback}");
    assert_eq!(post(&client_from("127.0.0.6"), &sys.http, event).await.0, 200);
    assert_eq!(sys.end_offsets("limited", 1).await, [3 + 3 + 1 + 3000 + 1 + 3 + 1]);
}
