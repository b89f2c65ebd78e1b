use bytes::BytesMut;
use fjord_record::answers::{highest_walked, WALKED};
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, FetchRequest, FetchResponse, OffsetForLeaderEpochRequest, SaslAuthenticateRequest,
    SaslHandshakeRequest, TopicName, WriteTxnMarkersRequest,
};
use kafka_protocol::protocol::Encodable;
use tokio::net::TcpListener;

use super::*;
use crate::codec::api_name;

const TIMEOUT: Duration = Duration::from_secs(10);

/// A "peer" on 127.0.0.1 that answers each request of its one connection with the
/// response header (of `header_version`, echoing the correlation id) and `body`.
async fn serve(header_version: i16, body: Vec<u8>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        loop {
            let Ok(len) = socket.read_u32().await else { return };
            let mut request = vec![0; len as usize];
            if socket.read_exact(&mut request).await.is_err() {
                return;
            }
            let correlation_id = i32::from_be_bytes(request[4..8].try_into().unwrap());
            let mut frame = BytesMut::new();
            frame.put_i32(0);
            ResponseHeader::default().with_correlation_id(correlation_id).encode(&mut frame, header_version).unwrap();
            frame.extend_from_slice(&body);
            crate::codec::patch_length(&mut frame);
            if socket.write_all(&frame).await.is_err() {
                return;
            }
        }
    });
    port
}

fn fetch() -> FetchRequest {
    FetchRequest::default().with_replica_id(kafka_protocol::messages::BrokerId(2)).with_max_wait_ms(10)
}

/// A Fetch v12 answer (flexible) whose topics claim 0x7fff_ffff entries in a few bytes:
/// the codec would ask for a vector of two billion topics and the allocation would abort
/// the process.
fn hostile_fetch_answer() -> Vec<u8> {
    let mut body = Vec::new();
    body.extend(0i32.to_be_bytes()); // throttle time
    body.extend(0i16.to_be_bytes()); // error code
    body.extend(0i32.to_be_bytes()); // session id
    body.extend([0x80, 0x80, 0x80, 0x80, 0x08]); // compact count 0x8000_0000: 0x7fff_ffff topics
    body.push(0); // tagged fields
    body
}

#[tokio::test]
async fn a_hostile_peer_answer_is_refused_not_decoded() {
    let port = serve(1, hostile_fetch_answer()).await;
    let mut peer =
        Peer::connect("127.0.0.1", port, "broker-2".into(), &PeerConfig::plaintext("INTERNAL"), TIMEOUT).await.unwrap();
    let error = peer.call(&fetch(), 12, TIMEOUT).await.map(|_| ()).unwrap_err();
    match error {
        PeerError::Protocol { addr, detail } => {
            assert_eq!(addr, format!("127.0.0.1:{port}"));
            assert_eq!(detail, "refused the Fetch v12 answer: array claims more elements than the message has bytes");
        }
        other => panic!("expected a protocol error, got {other}"),
    }
}

#[tokio::test]
async fn a_hostile_sasl_handshake_answer_is_refused() {
    // SaslHandshake v1 (header v0): an error code, then mechanisms claiming 0x7fff_ffff.
    let mut body = 0i16.to_be_bytes().to_vec();
    body.extend(i32::MAX.to_be_bytes());
    let port = serve(0, body).await;
    let config = PeerConfig {
        listener: "INTERNAL".into(),
        tls: None,
        sasl: Some(PeerSasl { mechanism: Mechanism::Plain, username: "broker".into(), password: "secret".into() }),
    };
    match Peer::connect("127.0.0.1", port, "broker-2".into(), &config, TIMEOUT).await.map(|_| ()) {
        Err(PeerError::Protocol { detail, .. }) => {
            assert_eq!(detail, "refused the SaslHandshake v1 answer: array claims more elements than the message has bytes")
        }
        Err(other) => panic!("expected a protocol error, got {other}"),
        Ok(()) => panic!("expected a protocol error"),
    }
}

#[tokio::test]
async fn a_well_formed_answer_still_decodes() {
    let mut body = BytesMut::new();
    FetchResponse::default()
        .with_responses(vec![kafka_protocol::messages::fetch_response::FetchableTopicResponse::default()
            .with_topic(TopicName(StrBytes::from_static_str("t")))
            .with_partitions(vec![kafka_protocol::messages::fetch_response::PartitionData::default()
                .with_partition_index(3)
                .with_high_watermark(42)])])
        .encode(&mut body, 12)
        .unwrap();
    let port = serve(1, body.to_vec()).await;
    let mut peer =
        Peer::connect("127.0.0.1", port, "broker-2".into(), &PeerConfig::plaintext("INTERNAL"), TIMEOUT).await.unwrap();
    let response = peer.call(&fetch(), 12, TIMEOUT).await.unwrap();
    assert_eq!(response.responses[0].partitions[0].high_watermark, 42);
}

#[tokio::test]
async fn a_version_without_a_walk_is_refused() {
    // Fetch v13 names topics by id; there is no walk for it, so its answer is not decoded.
    let port = serve(1, vec![0; 16]).await;
    let mut peer =
        Peer::connect("127.0.0.1", port, "broker-2".into(), &PeerConfig::plaintext("INTERNAL"), TIMEOUT).await.unwrap();
    match peer.call(&fetch(), 13, TIMEOUT).await.map(|_| ()) {
        Err(PeerError::Protocol { detail, .. }) => {
            assert_eq!(detail, "refused the Fetch v13 answer: no walk for this API version")
        }
        other => panic!("expected a protocol error, got {other:?}"),
    }
}

#[test]
fn every_peer_call_has_a_walk() {
    use crate::replication::fetcher::{FETCH_VERSION, OFFSET_FOR_LEADER_EPOCH_VERSION};
    use crate::txn::verify::VERIFY_VERSION;
    use crate::txn::MARKER_VERSION;
    let calls = [
        (<FetchRequest as Request>::KEY, FETCH_VERSION),
        (<OffsetForLeaderEpochRequest as Request>::KEY, OFFSET_FOR_LEADER_EPOCH_VERSION),
        (<WriteTxnMarkersRequest as Request>::KEY, MARKER_VERSION),
        (<AddPartitionsToTxnRequest as Request>::KEY, VERIFY_VERSION),
        (<SaslHandshakeRequest as Request>::KEY, SASL_VERSION),
        (<SaslAuthenticateRequest as Request>::KEY, SASL_VERSION),
    ];
    for (key, version) in calls {
        let walked = WALKED.iter().any(|&(api, min, max)| api == key && (min..=max).contains(&version));
        assert!(walked, "{} v{version}: a peer call without a walk would always be refused", api_name(key));
        assert!(highest_walked(key) >= Some(version));
    }
}
