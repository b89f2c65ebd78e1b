//! `?on_invalid=dead_letter` end to end: a bulk NDJSON body with a few bad lines produces
//! the good ones and puts each bad one, byte for byte, in `<topic>.dlq` with its reason,
//! line number and request id as record headers; read back with kcat. The audit report
//! (gateway, dead-letter and broker tiers) balances: 500 came in, 497 reached the topic,
//! 3 its dead-letter topic.

mod support;

use std::time::Duration;

use fjord_audit::{Report, ReportConfig, Verdict, DEAD_LETTER_TIER};
use support::{kcat_consume, System};

/// The sum of `tier` over the windows of `topic`.
fn total(r: &Report, topic: &str, tier: &str) -> u64 {
    r.windows.iter().filter(|w| w.topic == topic).map(|w| w.counts.get(tier).copied().unwrap_or(0)).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_events_with_three_malformed_dead_letters_three() {
    // The broker and gateway tiers of the audit publish every 200 ms.
    let sys = System::start_with(
        |b| {
            b.audit.enable = true;
            b.audit.interval = Duration::from_millis(200);
            fjord_audit::BrokerTier::install(b).expect("broker audit tier");
        },
        |g| g.audit_interval = Some(Duration::from_millis(200)),
    )
    .await;
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
    let status = r.status();
    let doc: serde_json::Value = r.json().await.unwrap();
    assert_eq!(status, 200, "{doc}");
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

    // The audit: under "clicks" the gateway tier counts the 497 it produced there and the
    // dead-letter tier the 3 set aside, and the broker agrees with the 497; under
    // "clicks.dlq" the gateway and the broker count the 3. Every window is complete.
    let client = fjord_client::ClientConfig::new(&sys.broker);
    let config = ReportConfig { grace: Duration::ZERO, ..ReportConfig::new(client) }.with_topics("^clicks").unwrap();
    let expected = [
        ("clicks", "gateway", 497),
        ("clicks", DEAD_LETTER_TIER, 3),
        ("clicks", "broker", 497),
        ("clicks.dlq", "gateway", 3),
        ("clicks.dlq", "broker", 3),
    ];
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let report = loop {
        let report = fjord_audit::collect(&config).await.unwrap();
        if expected.iter().all(|(topic, tier, n)| total(&report, topic, tier) == *n) {
            break report;
        }
        assert!(std::time::Instant::now() < deadline, "{}", fjord_audit::render::text(&report));
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(report.windows.iter().all(|w| w.verdict == Verdict::Complete), "{}", fjord_audit::render::text(&report));
    let dead: u64 = report.windows.iter().filter(|w| w.topic == "clicks").map(|w| w.dead_lettered).sum();
    let produced: u64 = report.windows.iter().filter(|w| w.topic == "clicks").map(|w| w.produced).sum();
    assert_eq!((produced, dead), (497, 3), "what came in: 497 produced + 3 dead-lettered");
}
