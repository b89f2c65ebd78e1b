//! `?on_invalid=dead_letter` end to end: a bulk NDJSON body with a few bad lines produces
//! the good ones and puts each bad one, byte for byte, in `<topic>.dlq` with its reason,
//! line number and request id as record headers; read back with kcat.

mod support;

use support::{kcat_consume, System};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_events_with_three_malformed_dead_letters_three() {
    let sys = System::start().await;
    let bad_lines = [17usize, 250, 500]; // 1-based, as the DLQ header counts
    let mut body = String::new();
    for line in 1..=500 {
        match line {
            17 => body.push_str("{\"user\":\"u17\",\"page\":\n"), // truncated
            250 => body.push_str("{\"page\":\"/no-user\"}\n"),    // no key field
            500 => body.push_str("not json at all\n"),
            _ => body.push_str(&format!("{{\"user\":\"u{}\",\"n\":{line}}}\n", line % 5)),
        }
    }
    let http = reqwest::Client::new();
    let url = format!("{}/v1/events/clicks?key=user&on_invalid=dead_letter", sys.http);
    let r = http.post(&url).header("x-request-id", "req-42").body(body.clone()).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let doc: serde_json::Value = r.json().await.unwrap();
    assert_eq!((doc["accepted"].as_u64(), doc["dead_lettered"].as_u64()), (Some(497), Some(3)), "{doc}");
    assert_eq!(doc["dead_letter_topic"], "clicks.dlq");
    assert_eq!(doc["request_id"], "req-42");

    assert_eq!(kcat_consume(&sys.broker, "clicks").len(), 497);
    let mut dead = kcat_consume(&sys.broker, "clicks.dlq");
    assert_eq!(dead.len(), 3);
    dead.sort_by_key(|m| m.header("fjord.dlq.line").unwrap().parse::<usize>().unwrap());
    let lines: Vec<usize> = dead.iter().map(|m| m.header("fjord.dlq.line").unwrap().parse().unwrap()).collect();
    assert_eq!(lines, bad_lines);
    assert_eq!(dead[0].payload.as_deref(), Some("{\"user\":\"u17\",\"page\":"), "the raw line");
    assert!(dead[0].header("fjord.dlq.reason").unwrap().contains("malformed JSON"), "{:?}", dead[0].headers);
    assert!(dead[1].header("fjord.dlq.reason").unwrap().contains("key field \"user\" is missing"), "{:?}", dead[1].headers);
    assert!(dead[2].header("fjord.dlq.reason").unwrap().contains("malformed JSON"));
    assert!(dead.iter().all(|m| m.header("fjord.dlq.request_id") == Some("req-42")));
    assert!(dead.iter().all(|m| m.header("fjord.dlq.topic") == Some("clicks")));

    // The default stays all-or-nothing: the same body is refused, nothing more produced.
    let r = http.post(format!("{}/v1/events/clicks?key=user", sys.http)).body(body).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let doc: serde_json::Value = r.json().await.unwrap();
    assert_eq!(doc["record_index"], 16, "0-based line of the first bad event");
    assert_eq!(sys.end_offsets("clicks", 3).await.iter().sum::<i64>(), 497);
    let r = http.post(format!("{}/v1/events/clicks?on_invalid=maybe", sys.http)).body("{}\n").send().await.unwrap();
    assert_eq!(r.status(), 400);
}
