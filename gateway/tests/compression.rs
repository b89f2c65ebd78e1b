//! Compressed request bodies, end to end: curl posts gzip and zstd NDJSON files to a real
//! gateway and broker; a small body that inflates past the limit is refused with 413
//! while the process's peak memory (VmHWM, the gateway runs in this process) stays
//! within a stated bound.

mod support;

use std::io::Write;
use std::path::Path;
use std::process::Command;

use support::System;

/// `curl --data-binary @file` with extra headers; returns (status, body).
fn curl(url: &str, file: &Path, headers: &[&str]) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-o", "-", "-w", "\n%{http_code}", "-X", "POST", "--data-binary"]).arg(format!("@{}", file.display()));
    for h in headers {
        cmd.args(["-H", h]);
    }
    let out = cmd.arg(url).output().expect("curl must be installed");
    assert!(out.status.success(), "curl failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("UTF-8 answer");
    let (body, code) = text.rsplit_once('\n').expect("status line");
    (code.trim().parse().expect("status"), body.to_string())
}

fn ndjson(n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| format!("{{\"user\":\"u{}\",\"page\":\"/p/{i}\",\"n\":{i}}}\n", i % 7).into_bytes()).collect()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// (VmHWM, VmRSS) of this process in KiB.
fn memory_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let field = |name: &str| -> u64 {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name} in /proc/self/status"));
        line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("a number of kB")
    };
    (field("VmHWM:"), field("VmRSS:"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_posts_gzip_and_zstd_ndjson_and_every_event_is_produced() {
    let sys = System::start().await;
    let dir = tempfile::tempdir().unwrap();
    let plain = ndjson(1000);
    let gz = dir.path().join("events.ndjson.gz");
    std::fs::write(&gz, gzip(&plain)).unwrap();
    let zst = dir.path().join("events.ndjson.zst");
    std::fs::write(&zst, zstd::encode_all(&plain[..], 3).unwrap()).unwrap();
    let deflate = dir.path().join("events.ndjson.zz");
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(&plain).unwrap();
    std::fs::write(&deflate, z.finish().unwrap()).unwrap();

    for (topic, file, encoding) in [("gz", &gz, "gzip"), ("zst", &zst, "zstd"), ("zz", &deflate, "deflate")] {
        let url = format!("{}/v1/events/{topic}?key=user", sys.http);
        let encoding = format!("Content-Encoding: {encoding}");
        let (status, body) = curl(&url, file, &["Content-Type: application/x-ndjson", &encoding]);
        assert_eq!(status, 200, "{encoding}: {body}");
        let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(doc["count"], 1000, "{body}");
        assert_eq!(sys.end_offsets(topic, 3).await.iter().sum::<i64>(), 1000, "{encoding}: all events in the broker");
    }
    // The v2 endpoint decodes too.
    let v2 = dir.path().join("v2.json.gz");
    std::fs::write(&v2, gzip(br#"{"records":[{"value":{"a":1}},{"value":{"a":2}}]}"#)).unwrap();
    let (status, body) = curl(
        &format!("{}/topics/v2gz", sys.http),
        &v2,
        &["Content-Type: application/vnd.kafka.json.v2+json", "Content-Encoding: gzip"],
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(sys.end_offsets("v2gz", 3).await.iter().sum::<i64>(), 2);

    // An encoding the gateway does not know: 415, nothing produced.
    let (status, body) = curl(&format!("{}/v1/events/br", sys.http), &gz, &["Content-Encoding: br"]);
    assert_eq!(status, 415, "{body}");
    assert!(body.contains("41501") && body.contains("br"), "{body}");
    // A body that is not what its header says: 400 naming the coding.
    let (status, body) = curl(&format!("{}/v1/events/bad", sys.http), &zst, &["Content-Encoding: gzip"]);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("gzip"), "{body}");
    let messages = support::kcat_consume(&sys.broker, "gz");
    assert_eq!(messages.len(), 1000);
    assert!(messages.iter().any(|m| m.payload.as_deref() == Some(r#"{"user":"u0","page":"/p/0","n":0}"#)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_body_inflating_past_the_limit_is_413_and_memory_stays_bounded() {
    const LIMIT: usize = 1 << 20;
    let sys = System::start_with(|_| {}, |g| g.max_body_bytes = LIMIT).await;
    sys.create_topic("bomb", 3).await;
    let dir = tempfile::tempdir().unwrap();

    // ~10 KB of gzip that inflates to 10 MiB (ten times the limit).
    let bomb = gzip(&vec![b' '; 10 << 20]);
    assert!(bomb.len() < 12_000, "{} bytes", bomb.len());
    let gz = dir.path().join("bomb.gz");
    std::fs::write(&gz, &bomb).unwrap();
    // A zstd body of ~30 KB that inflates to 1 GiB: without a bound on the decoded size
    // the gateway would hold all of it.
    let mut e = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
    let chunk = vec![b' '; 1 << 20];
    for _ in 0..1024 {
        e.write_all(&chunk).unwrap();
    }
    let zbomb = e.finish().unwrap();
    let zst = dir.path().join("bomb.zst");
    std::fs::write(&zst, &zbomb).unwrap();

    let (hwm_before, rss_before) = memory_kib();
    let url = format!("{}/v1/events/bomb", sys.http);
    let (status, body) = curl(&url, &gz, &["Content-Encoding: gzip"]);
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("41300"), "{body}");
    let (status, body) = curl(&url, &zst, &["Content-Encoding: zstd"]);
    assert_eq!(status, 413, "{body}");
    let (hwm_after, rss_after) = memory_kib();
    eprintln!(
        "gzip bomb {} B -> 10 MiB, zstd bomb {} B -> 1 GiB, limit {LIMIT} B: VmHWM {hwm_before} -> {hwm_after} KiB \
         (+{} KiB), VmRSS {rss_before} -> {rss_after} KiB",
        bomb.len(),
        zbomb.len(),
        hwm_after - hwm_before
    );
    // Decoding holds at most limit + 1 bytes of output per body (and the vector's
    // doubling can reserve twice that); 16 MiB leaves room for the allocator and the
    // rest of the test process, and is 64x less than the 1 GiB the zstd body inflates to.
    assert!(hwm_after - hwm_before < 16 * 1024, "peak memory grew by {} KiB", hwm_after - hwm_before);
    assert_eq!(sys.end_offsets("bomb", 3).await.iter().sum::<i64>(), 0, "nothing produced");
}
