//! Random bytes at the broker: whatever arrives, the broker answers or closes that one
//! connection, and keeps serving everyone else. Never a panic, never a hang.

mod common;

use std::time::Duration;

use bytes::{BufMut, BytesMut};
use common::{RawClient, TestBroker};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ApiVersionsResponse};
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// API keys the broker implements, and a few it does not.
const KEYS: &[i16] = &[0, 1, 2, 3, 10, 18, 19, 20, 32, 33, 44, 11, 999, -1];

/// A frame: a plausible request header (known key, any version, a client id) in front of
/// random bytes, or random bytes from the first byte on.
fn frame() -> impl Strategy<Value = Vec<u8>> {
    let structured = (prop::sample::select(KEYS), -1i16..16, any::<i32>(), prop::collection::vec(any::<u8>(), 0..300)).prop_map(
        |(key, version, correlation_id, body)| {
            let mut frame = BytesMut::new();
            frame.put_i16(key);
            frame.put_i16(version);
            frame.put_i32(correlation_id);
            frame.put_i16(4);
            frame.put_slice(b"fuzz");
            frame.put_slice(&body);
            frame.to_vec()
        },
    );
    prop_oneof![structured, prop::collection::vec(any::<u8>(), 0..300)]
}

/// Sends the frame, then reads until the broker closes the connection.
async fn throw(addr: std::net::SocketAddr, frame: &[u8]) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut buf = BytesMut::new();
    buf.put_i32(frame.len() as i32);
    buf.put_slice(frame);
    stream.write_all(&buf).await.unwrap();
    // Half-close: the broker answers (or not), sees the end of the stream and hangs up.
    stream.shutdown().await.unwrap();
    let mut sink = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut sink)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return, // closed or reset: both fine
            Ok(Ok(_)) => {}
            Err(_) => panic!("the broker neither answered nor closed the connection"),
        }
    }
}

#[test]
fn random_request_bytes_never_take_the_broker_down() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let broker = runtime.block_on(TestBroker::start_in(dir.path().join("data"), |_| {})).unwrap();
    let addr = broker.addr;
    // PROPTEST_CASES (read by the default config) raises the count for a longer run.
    let config = ProptestConfig {
        cases: ProptestConfig::default().cases.max(1000),
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(frame in frame())| {
        runtime.block_on(throw(addr, &frame));
    });
    runtime.block_on(async {
        let mut client = RawClient::connect(addr).await.unwrap();
        let response: ApiVersionsResponse = client.call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default()).await.unwrap();
        assert_eq!(response.error_code, 0);
        broker.stop().await.unwrap();
    });
}
