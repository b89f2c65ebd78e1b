//! HTTP → gateway → broker → kcat: every content type, key and partition choice, the
//! stateless pull, topic metadata, and every bad-input case with its status and proof
//! that nothing was produced.

mod support;

use std::time::{Duration, Instant};

use fjord_client::partitioner::partition_for_key;
use serde_json::{json, Value as Json};
use support::{kcat_consume, kcat_payloads, System};

const JSON_CT: &str = "application/vnd.kafka.json.v2+json";
const BINARY_CT: &str = "application/vnd.kafka.binary.v2+json";
const AVRO_CT: &str = "application/vnd.kafka.avro.v2+json";
const CLICK: &str = r#"{"type":"record","name":"Click","fields":[{"name":"url","type":"string"},{"name":"n","type":"long"}]}"#;

async fn post(url: &str, content_type: &str, body: impl Into<reqwest::Body>) -> (u16, Json) {
    let r = reqwest::Client::new().post(url).header("content-type", content_type).body(body).send().await.expect("request");
    let status = r.status().as_u16();
    (status, r.json().await.expect("JSON answer"))
}

/// Sends only the head of a request whose Content-Length is over the limit and reads the
/// answer: the gateway must refuse from the header, without reading or waiting for the
/// body. (Sending a whole oversize body races the server closing the connection after
/// its 413, and the client then sees a broken pipe instead of the answer.)
async fn post_declaring_length(url: &str, content_type: &str, length: usize) -> (u16, Json) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let url = reqwest::Url::parse(url).unwrap();
    let (host, port) = (url.host_str().unwrap().to_owned(), url.port().unwrap());
    let mut stream = tokio::net::TcpStream::connect((host.as_str(), port)).await.unwrap();
    let target = match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_owned(),
    };
    let head = format!(
        "POST {target} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {content_type}\r\n\
         Content-Length: {length}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("the gateway answers without waiting for the body")
        .unwrap();
    let answer = String::from_utf8(answer).unwrap();
    let status = answer.split(' ').nth(1).unwrap().parse().unwrap();
    let body = answer.split_once("\r\n\r\n").unwrap().1;
    (status, serde_json::from_str(body).unwrap_or_else(|e| panic!("JSON answer ({e}): {answer}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_v2_each_content_type_reaches_the_broker() {
    let sys = System::start().await;

    // json: keys and values are JSON text; the key picks the partition (murmur2, as Java).
    let (status, doc) = post(
        &format!("{}/topics/clicks", sys.http),
        JSON_CT,
        json!({"records":[{"key":"user-1","value":{"url":"/a"}},{"value":[1,2],"partition":2},{"value":null}]}).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{doc}");
    let offsets = doc["offsets"].as_array().unwrap();
    assert_eq!(offsets.len(), 3);
    assert_eq!(offsets[0]["partition"], partition_for_key(b"\"user-1\"", 3));
    assert_eq!(offsets[1]["partition"], 2);
    assert!(offsets.iter().all(|o| o["error"].is_null() && o["offset"].as_i64().unwrap() >= 0));
    let messages = kcat_consume(&sys.broker, "clicks");
    assert_eq!(messages.len(), 3);
    let keyed = messages.iter().find(|m| m.key.as_deref() == Some("\"user-1\"")).expect("keyed record");
    assert_eq!(
        (keyed.partition, keyed.offset),
        (offsets[0]["partition"].as_i64().unwrap() as i32, offsets[0]["offset"].as_i64().unwrap())
    );
    assert_eq!(keyed.payload.as_deref(), Some("{\"url\":\"/a\"}"));
    assert_eq!(keyed.header("fjord.host"), Some("gw-it"));
    let created: i64 = keyed.header("fjord.created_ms").expect("creation header").parse().expect("ms");
    assert!(created > 1_600_000_000_000);
    assert!(messages.iter().any(|m| m.payload.is_none()), "a null value stays null");

    // binary: base64 in, raw bytes out, into the partition of the path.
    let (status, doc) = post(
        &format!("{}/topics/blobs/partitions/1", sys.http),
        BINARY_CT,
        json!({"records":[{"key":"a2V5","value":"AAEC/w=="},{"value":"aGk="}]}).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{doc}");
    assert_eq!(doc["offsets"][0], json!({"partition":1,"offset":0,"error_code":null,"error":null}));
    assert_eq!(kcat_payloads(&sys.broker, "blobs", 1), vec![vec![0u8, 1, 2, 255], b"hi".to_vec()]);

    // avro: an inline schema is registered under {topic}-value; payloads are Confluent-framed.
    let (status, doc) = post(
        &format!("{}/topics/avro-clicks", sys.http),
        AVRO_CT,
        json!({"value_schema": CLICK, "records":[{"value":{"url":"/x","n":7}}]}).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{doc}");
    let id = doc["value_schema_id"].as_i64().expect("value_schema_id") as i32;
    let partition = doc["offsets"][0]["partition"].as_i64().unwrap() as i32;
    let payload = kcat_payloads(&sys.broker, "avro-clicks", partition).pop().expect("one payload");
    let registry = fjord_schema_registry::RegistryClient::new(&sys.registry).unwrap();
    let decoded = registry.deserialize(&payload).await.expect("a framed Avro datum");
    assert_eq!(decoded.schema_id, id);
    assert_eq!(
        decoded.value,
        apache_avro::types::Value::Record(vec![
            ("url".into(), apache_avro::types::Value::String("/x".into())),
            ("n".into(), apache_avro::types::Value::Long(7))
        ])
    );
    // ... and by id, with the key as Avro too.
    let (status, doc) = post(
        &format!("{}/topics/avro-clicks", sys.http),
        AVRO_CT,
        json!({"value_schema_id": id, "key_schema": "\"string\"", "records":[{"key":"k1","value":{"url":"/y","n":8}}]})
            .to_string(),
    )
    .await;
    assert_eq!((status, doc["value_schema_id"].as_i64()), (200, Some(id as i64)), "{doc}");
    assert!(doc["key_schema_id"].as_i64().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ndjson_bulk_with_key_field_partition_and_avro() {
    let sys = System::start().await;
    let body: String = (0..30).map(|i| format!("{{\"user\":{{\"id\":\"u{}\"}},\"seq\":{i}}}\n", i % 5)).collect();
    let (status, doc) = post(&format!("{}/v1/events/bulk?key=user.id", sys.http), "application/x-ndjson", body).await;
    assert_eq!(status, 200, "{doc}");
    assert_eq!(doc["count"], 30);
    let messages = kcat_consume(&sys.broker, "bulk");
    assert_eq!(messages.len(), 30);
    for m in &messages {
        let key = m.key.as_deref().expect("key from the field");
        assert_eq!(m.partition, partition_for_key(key.as_bytes(), 3), "same key, same partition");
        let doc: Json = serde_json::from_str(m.payload.as_deref().unwrap()).unwrap();
        assert_eq!(doc["user"]["id"], key);
    }
    // Per-partition first/last offsets add up to the count.
    let summed: i64 = doc["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["last_offset"].as_i64().unwrap() - p["first_offset"].as_i64().unwrap() + 1)
        .sum();
    assert_eq!(summed, 30);

    // Avro by schema id, into one partition.
    let registry = fjord_schema_registry::RegistryClient::new(&sys.registry).unwrap();
    let id = registry.register("bulk-avro-value", CLICK).await.unwrap();
    let body = "{\"url\":\"/1\",\"n\":1}\n{\"url\":\"/2\",\"n\":2}\n";
    let (status, doc) =
        post(&format!("{}/v1/events/bulk-avro?schema_id={id}&partition=2", sys.http), "application/x-ndjson", body).await;
    assert_eq!(status, 200, "{doc}");
    assert_eq!(doc["partitions"], json!([{"partition":2,"first_offset":0,"last_offset":1,"count":2}]));
    let payloads = kcat_payloads(&sys.broker, "bulk-avro", 2);
    assert_eq!(payloads.len(), 2);
    assert_eq!(registry.deserialize(&payloads[1]).await.unwrap().schema_id, id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_by_offset_long_poll_and_topic_metadata() {
    let sys = System::start().await;
    sys.create_topic("pull", 2).await;
    let body: String = (0..5).map(|i| format!("{{\"i\":{i}}}\n")).collect();
    let (status, _) = post(&format!("{}/v1/events/pull?partition=1", sys.http), "application/x-ndjson", body).await;
    assert_eq!(status, 200);
    let http = reqwest::Client::new();
    let get = |q: String| http.get(format!("{}/v1/topics/pull/partitions/1/records?{q}", sys.http)).send();
    let doc: Json = get("offset=0&format=json".into()).await.unwrap().json().await.unwrap();
    assert_eq!(doc["records"].as_array().unwrap().len(), 5);
    assert_eq!(doc["records"][3]["value"], json!({"i":3}));
    assert_eq!((doc["next_offset"].as_i64(), doc["high_watermark"].as_i64()), (Some(5), Some(5)));
    // max_bytes: fewer records, and next_offset says where to go on.
    let doc: Json = get("offset=1&max_bytes=10&format=text".into()).await.unwrap().json().await.unwrap();
    let n = doc["records"].as_array().unwrap().len() as i64;
    assert!((1..4).contains(&n), "{doc}");
    assert_eq!(doc["next_offset"].as_i64(), Some(1 + n));
    // Long poll: a record published while the fetch waits is returned at once.
    let started = Instant::now();
    let waiting = tokio::spawn(get("offset=5&max_wait_ms=5000&format=json".into()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    post(&format!("{}/v1/events/pull?partition=1", sys.http), "application/x-ndjson", "{\"late\":true}").await;
    let doc: Json = waiting.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(doc["records"][0]["value"], json!({"late":true}), "{doc}");
    assert!(started.elapsed() < Duration::from_secs(4));
    // Offsets beyond the log are 416.
    assert_eq!(get("offset=999".into()).await.unwrap().status(), 416);

    let topics: Json = http.get(format!("{}/topics", sys.http)).send().await.unwrap().json().await.unwrap();
    assert!(topics.as_array().unwrap().contains(&json!("pull")), "{topics}");
    let t: Json = http.get(format!("{}/topics/pull", sys.http)).send().await.unwrap().json().await.unwrap();
    assert_eq!(t["partitions"][1]["latest_offset"], 6, "{t}");
    assert_eq!(t["partitions"][1]["leader"], 0);
    let missing = http.get(format!("{}/topics/never-made", sys.http)).send().await.unwrap();
    assert_eq!(missing.status(), 404);
}

/// (url, content type, body, status, record index, what the message must say).
type BadCase<'a> = (String, &'a str, String, u16, Option<u64>, &'a str);

/// Every bad input: its status, the record it names, and nothing produced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_whole_with_nothing_produced() {
    let sys = System::start().await;
    sys.create_topic("bad", 3).await;
    let registry = fjord_schema_registry::RegistryClient::new(&sys.registry).unwrap();
    let id = registry.register("bad-value", CLICK).await.unwrap();
    let v2 = format!("{}/topics/bad", sys.http);
    let nd = format!("{}/v1/events/bad", sys.http);
    let good = json!({"value":{"url":"/ok","n":1}});
    let cases: Vec<BadCase<'_>> = vec![
        (v2.clone(), JSON_CT, "{\"records\":[{\"value\":1},".into(), 400, None, "malformed JSON"),
        (
            v2.clone(),
            BINARY_CT,
            json!({"records":[{"value":"aGk="},{"value":"not base64!"}]}).to_string(),
            422,
            Some(1),
            "base64",
        ),
        (
            v2.clone(),
            AVRO_CT,
            json!({"value_schema_id": id, "records":[good, {"value":{"url":"/x","n":"seven"}}]}).to_string(),
            422,
            Some(1),
            "$.n",
        ),
        (v2.clone(), AVRO_CT, json!({"value_schema_id": 99999, "records":[good]}).to_string(), 404, None, "99999"),
        (v2.clone(), AVRO_CT, json!({"value_schema": "{\"type\":\"nope\"}", "records":[good]}).to_string(), 422, None, "schema"),
        (v2.clone(), "application/json", json!({"records":[{"value":1}]}).to_string(), 415, None, "content type"),
        (
            format!("{}/topics/bad/partitions/7", sys.http),
            JSON_CT,
            json!({"records":[{"value":1}]}).to_string(),
            404,
            None,
            "partition 7",
        ),
        (v2.clone(), JSON_CT, json!({"records":[{"value":1},{"value":2,"partition":5}]}).to_string(), 404, None, "partition 5"),
        (nd.clone(), "application/x-ndjson", "{\"a\":1}\n{\"a\":2}\n{\"a\":\n".into(), 400, Some(2), "malformed JSON"),
        (format!("{nd}?key=user"), "application/x-ndjson", "{\"user\":1}\n{\"other\":2}\n".into(), 422, Some(1), "key field"),
        (
            format!("{nd}?schema_id={id}"),
            "application/x-ndjson",
            "{\"url\":\"/a\",\"n\":1}\n{\"url\":5,\"n\":1}\n".into(),
            422,
            Some(1),
            "$.url",
        ),
        (format!("{nd}?schema_id=99999"), "application/x-ndjson", "{}\n".into(), 404, None, "99999"),
        (nd.clone(), "application/x-ndjson", format!("{{\"big\":\"{}\"}}\n", "x".repeat(2 << 20)), 422, Some(0), "larger than"),
    ];
    for (url, content_type, body, status, index, says) in cases {
        let (got, doc) = post(&url, content_type, body.clone()).await;
        assert_eq!(got, status, "{url} {content_type}: {doc}");
        assert_eq!(doc["record_index"].as_u64(), index, "{url}: {doc}");
        assert_eq!(doc["error_code"].as_u64().unwrap() / 100, u64::from(status), "{doc}");
        assert!(doc["message"].as_str().unwrap().contains(says), "{url}: {doc} should say {says:?}");
    }
    // Over the body limit (default 10 MiB): 413, decided from Content-Length alone.
    let (got, doc) = post_declaring_length(&nd, "application/x-ndjson", 10 * 1024 * 1024 + 1).await;
    assert_eq!((got, doc["error_code"].as_u64()), (413, Some(41300)));
    assert_eq!(sys.end_offsets("bad", 3).await, vec![0, 0, 0], "nothing of a refused request was produced");
    assert!(kcat_consume(&sys.broker, "bad").is_empty());
}

/// A partition added with CreatePartitions is accepted by the very next request (the
/// gateway's producer still has the old count cached; metadata.max.age is minutes), and
/// a partition that does not exist is still refused at once, not after max.block.ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_just_added_is_accepted_at_once_and_a_missing_one_refused_quickly() {
    let sys = System::start().await;
    sys.create_topic("grow", 2).await;
    let url = |p: i32| format!("{}/topics/grow/partitions/{p}", sys.http);
    let one = || json!({"records":[{"value":"v"}]}).to_string();
    // The gateway's producer now caches 2 partitions.
    let (status, doc) = post(&url(1), JSON_CT, one()).await;
    assert_eq!(status, 200, "{doc}");

    let admin = fjord_client::Admin::connect(fjord_client::ClientConfig::new(&sys.broker)).await.unwrap();
    admin.create_partitions("grow", 4).await.unwrap();
    let (status, doc) = post(&url(3), JSON_CT, one()).await;
    assert_eq!(status, 200, "a partition just added is accepted: {doc}");
    assert_eq!(doc["offsets"][0]["partition"], 3, "{doc}");
    assert_eq!(sys.end_offsets("grow", 4).await, vec![0, 1, 0, 1], "the record landed in partition 3");

    // Well under the gateway's broker timeout (10 s), the producer's max.block.ms.
    let started = Instant::now();
    let (status, doc) = post(&url(9), JSON_CT, one()).await;
    assert_eq!((status, doc["error_code"].as_u64()), (404, Some(40402)), "{doc}");
    assert!(doc["message"].as_str().unwrap().contains("partition 9"), "{doc}");
    assert!(started.elapsed() < Duration::from_secs(3), "refused after {:?}", started.elapsed());
    assert_eq!(sys.end_offsets("grow", 4).await, vec![0, 1, 0, 1], "nothing of the refused request was produced");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_topic_is_404_when_the_broker_does_not_auto_create() {
    let sys = System::start_with(|b| b.auto_create_topics = false, |_| {}).await;
    let (status, doc) = post(&format!("{}/topics/nope", sys.http), JSON_CT, json!({"records":[{"value":1}]}).to_string()).await;
    assert_eq!((status, doc["error_code"].as_u64()), (404, Some(40401)), "{doc}");
    let (status, _) = post(&format!("{}/v1/events/nope", sys.http), "application/x-ndjson", "{}").await;
    assert_eq!(status, 404);
    let r = reqwest::get(format!("{}/v1/topics/nope/partitions/0/records", sys.http)).await.unwrap();
    assert_eq!(r.status(), 404);
}

/// A broker that accepts connections and never answers: requests get 503 after the
/// bounded wait, and while one holds the buffer, others get 429 with Retry-After (HTTP)
/// or RESOURCE_EXHAUSTED (gRPC).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_broker_gives_503_after_the_bound_and_a_full_buffer_429() {
    let (silent, addr) = support::bind().await;
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let (http, http_addr) = support::bind().await;
    let (grpc, grpc_addr) = support::bind().await;
    let config = fjord_gateway::GatewayConfig {
        broker_timeout: Duration::from_secs(2),
        max_body_bytes: 64 * 1024,
        buffer_bytes: 64 * 1024,
        ..fjord_gateway::GatewayConfig::new(addr.to_string())
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    let gateway = tokio::spawn(fjord_gateway::run(config, http, grpc, shutdown.clone()));
    let url = format!("http://{http_addr}/v1/events/t");
    let big: String = format!("{{\"pad\":\"{}\"}}\n", "x".repeat(40 * 1024));
    let started = Instant::now();
    let first = tokio::spawn({
        let (url, big) = (url.clone(), big.clone());
        async move { post(&url, "application/x-ndjson", big).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = reqwest::Client::new().post(&url).body(big).send().await.unwrap();
    let status = r.status();
    let retry_after = r.headers().get("retry-after").cloned();
    assert_eq!(status, 429, "{}", r.text().await.unwrap());
    assert_eq!(retry_after.unwrap(), "1");
    // The same bound over gRPC: RESOURCE_EXHAUSTED with the pushback in the trailers.
    let mut publisher = fjord_proto::v1::publisher_client::PublisherClient::connect(format!("http://{grpc_addr}")).await.unwrap();
    let event = fjord_proto::v1::Event { value: Some(vec![b'x'; 40 * 1024].into()), ..Default::default() };
    let status = publisher
        .publish(fjord_proto::v1::PublishRequest { topic: "t".into(), events: vec![event], ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert_eq!(status.metadata().get("grpc-retry-pushback-ms").unwrap(), "1000");
    let (status, doc) = first.await.unwrap();
    assert_eq!(status, 503, "{doc}");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(2) && waited < Duration::from_secs(6), "503 after {waited:?}");
    shutdown.cancel();
    gateway.await.unwrap().unwrap();
    hold.abort();
}
