//! Three brokers on ZooKeeper with nothing plaintext (#19): a SASL_SSL listener for
//! clients and a SASL_SSL inter-broker listener on which every broker authenticates as
//! its own SCRAM user (the testkit's `ClusterBuilder::sasl_ssl`). Replication runs over
//! the secure inter-broker listener (an acks=all produce through confluent-kafka with
//! min.insync.replicas=3 needs every follower), and an ACL created through one broker is
//! enforced by all three within 2 s (the ACL watch through ZooKeeper), measured here.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use fjord_auth::{Operation, PatternType, Permission, ResourceType, ScramClient, ScramMechanism};
use fjord_coord::paths;
use fjord_coord::registry::{read_json, BrokerRegistration};
use fjord_testkit::{Cluster, SECURE_ADMIN};
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, CreateAclsRequest, CreateAclsResponse, MetadataRequest, MetadataResponse, RequestHeader, SaslAuthenticateRequest,
    SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

const BOB_PASSWORD: &str = "bob-secret";
const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
/// The issue's bound on ACL propagation across the cluster.
const ACL_PROPAGATION_BOUND: Duration = Duration::from_secs(2);

/// A raw Kafka-protocol connection over TLS, authenticated with SCRAM-SHA-256: one
/// request at a time, to one chosen broker (a client library would route requests to
/// whichever broker it likes, and this test must ask each broker itself).
struct SecureClient {
    stream: TlsStream<TcpStream>,
    correlation_id: i32,
}

impl SecureClient {
    async fn connect(addr: &str, ca: &Path, user: &str, password: &str) -> anyhow::Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca)? {
            roots.add(cert?)?;
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
            .connect(ServerName::try_from("localhost")?, tcp)
            .await
            .with_context(|| format!("TLS handshake with {addr}"))?;
        let mut client = Self { stream, correlation_id: 0 };
        let mechanism = StrBytes::from_static_str("SCRAM-SHA-256");
        let handshake: SaslHandshakeResponse =
            client.call(ApiKey::SaslHandshake, 1, &SaslHandshakeRequest::default().with_mechanism(mechanism)).await?;
        if handshake.error_code != 0 {
            bail!("SaslHandshake: error {}", handshake.error_code);
        }
        let (mut scram, first) = ScramClient::new(ScramMechanism::Sha256, user, password);
        let server_first = client.authenticate(first).await?;
        let last = scram.client_final(&server_first)?;
        let server_final = client.authenticate(last).await?;
        scram.verify_server_final(&server_final)?;
        Ok(client)
    }

    async fn authenticate(&mut self, bytes: Vec<u8>) -> anyhow::Result<Bytes> {
        let request = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(bytes));
        let response: SaslAuthenticateResponse = self.call(ApiKey::SaslAuthenticate, 2, &request).await?;
        if response.error_code != 0 {
            bail!("SaslAuthenticate: error {} {:?}", response.error_code, response.error_message);
        }
        Ok(response.auth_bytes)
    }

    async fn call<Req: Encodable, Resp: Decodable>(&mut self, key: ApiKey, version: i16, body: &Req) -> anyhow::Result<Resp> {
        self.correlation_id += 1;
        let mut buf = BytesMut::new();
        buf.put_i32(0);
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("fjord-test")))
            .encode(&mut buf, key.request_header_version(version))?;
        body.encode(&mut buf, version)?;
        let len = (buf.len() - 4) as i32;
        buf[..4].copy_from_slice(&len.to_be_bytes());
        self.stream.write_all(&buf).await?;
        let len = self.stream.read_i32().await? as usize;
        let mut frame = vec![0; len];
        self.stream.read_exact(&mut frame).await?;
        let mut frame = Bytes::from(frame);
        let correlation_id = frame.get_i32();
        if correlation_id != self.correlation_id {
            bail!("correlation id {correlation_id}, expected {}", self.correlation_id);
        }
        if key.response_header_version(version) >= 1 {
            frame.get_u8(); // no tagged fields in a response header
        }
        Resp::decode(&mut frame, version)
    }

    /// Metadata of `topic` as this connection's principal sees it: its error code.
    async fn topic_error(&mut self, topic: &str) -> anyhow::Result<i16> {
        let request = MetadataRequest::default()
            .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(common::topic_name(topic)))]))
            .with_allow_auto_topic_creation(false);
        let response: MetadataResponse = self.call(ApiKey::Metadata, 12, &request).await?;
        Ok(response.topics[0].error_code)
    }
}

/// The admin's client properties as a Python dict literal, for confluent-kafka.
fn python_config(cluster: &Cluster) -> String {
    let mut config = format!("{{'bootstrap.servers': '{}'", cluster.bootstrap());
    for (key, value) in cluster.secure().unwrap().client_properties() {
        config.push_str(&format!(", '{key}': '{value}'"));
    }
    config.push('}');
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_and_acls_work_over_sasl_ssl_between_brokers() {
    common::init_tracing();
    let cluster = Cluster::builder().sasl_ssl().scram_user("bob", BOB_PASSWORD).start().await.unwrap();
    let secure = cluster.secure().unwrap().clone();

    // Each broker registered its INTERNAL (SASL_SSL) listener as the inter-broker one:
    // the address every follower fetches from.
    for id in cluster.ids() {
        let (registration, _) = read_json::<BrokerRegistration>(&**cluster.store(), &paths::broker(id)).await.unwrap().unwrap();
        let internal = cluster.listener_addr(id, "INTERNAL").unwrap();
        assert_eq!(format!("{}:{}", registration.host, registration.port), internal, "broker {id}'s inter-broker address");
        assert_eq!(registration.listener_security_protocol_map["INTERNAL"], "SASL_SSL");
        assert_eq!(registration.listener_security_protocol_map["CLIENT"], "SASL_SSL");
    }

    // min.insync.replicas=3: an acks=all produce is acknowledged only once both followers,
    // fetching over SASL_SSL as `broker`, hold the records.
    cluster.create_topic("replicated", 1, &[("min.insync.replicas", "3")], Duration::from_secs(30)).await.unwrap();
    let script = r#"
import sys
from confluent_kafka import Producer, Consumer
config = eval(sys.argv[1])
producer = Producer(dict(config, **{'acks': 'all', 'enable.idempotence': True}))
errors = []
def delivered(err, msg):
    if err is not None:
        errors.append(err)
for i in range(200):
    producer.produce('replicated', value=b'record-%d' % i, callback=delivered)
assert producer.flush(60) == 0, 'not all delivered'
assert not errors, errors
consumer = Consumer(dict(config, **{'group.id': 'readers', 'auto.offset.reset': 'earliest', 'enable.auto.commit': False}))
consumer.subscribe(['replicated'])
values = []
while len(values) < 200:
    message = consumer.poll(30)
    assert message is not None, 'timed out after %d records' % len(values)
    assert message.error() is None, message.error()
    values.append(message.value())
consumer.close()
assert values == [b'record-%d' % i for i in range(200)], values[:5]
print('ok')
"#;
    common::run_python(script, &[&python_config(&cluster)], Duration::from_secs(180)).await;
    // Each replica holds the same bytes (identical batches at identical offsets).
    let state = cluster.wait_for_isr("replicated", 0, &[0, 1, 2], Duration::from_secs(10)).await.unwrap();
    let leader = cluster.log_bytes(state.leader, "replicated", 0).unwrap();
    assert!(!leader.is_empty());
    for id in cluster.ids() {
        assert_eq!(cluster.log_bytes(id, "replicated", 0).unwrap(), leader, "broker {id}'s replica differs from the leader's");
    }

    // bob may not see the topic on any broker, until an ACL created through broker 0 lets him.
    let mut bobs = Vec::new();
    for id in cluster.ids() {
        let addr = cluster.addr(id);
        let mut bob = SecureClient::connect(&addr, &secure.ca, "bob", BOB_PASSWORD).await.unwrap();
        assert_eq!(bob.topic_error("replicated").await.unwrap(), TOPIC_AUTHORIZATION_FAILED, "broker {id} before the ACL");
        bobs.push((id, bob));
    }
    let mut admin = SecureClient::connect(&cluster.addr(0), &secure.ca, SECURE_ADMIN, &secure.admin_password).await.unwrap();
    let creation = AclCreation::default()
        .with_resource_type(ResourceType::Topic.code())
        .with_resource_name(StrBytes::from_static_str("replicated"))
        .with_resource_pattern_type(PatternType::Literal.code())
        .with_principal(StrBytes::from_static_str("User:bob"))
        .with_host(StrBytes::from_static_str("*"))
        .with_operation(Operation::Read.code())
        .with_permission_type(Permission::Allow.code());
    let response: CreateAclsResponse =
        admin.call(ApiKey::CreateAcls, 2, &CreateAclsRequest::default().with_creations(vec![creation])).await.unwrap();
    assert_eq!(response.results[0].error_code, 0, "{:?}", response.results[0].error_message);
    let created = Instant::now();
    // Every broker polled in turn, each at most every 20 ms, until all three allow.
    let mut enforced_after = Vec::new();
    while !bobs.is_empty() {
        let mut waiting = Vec::new();
        for (id, mut bob) in bobs {
            match bob.topic_error("replicated").await.unwrap() {
                0 => enforced_after.push((id, created.elapsed())),
                code => {
                    assert_eq!(code, TOPIC_AUTHORIZATION_FAILED);
                    waiting.push((id, bob));
                }
            }
        }
        bobs = waiting;
        assert!(
            created.elapsed() < ACL_PROPAGATION_BOUND || bobs.is_empty(),
            "brokers {:?} did not enforce the ACL within {ACL_PROPAGATION_BOUND:?} (others after {enforced_after:?})",
            bobs.iter().map(|(id, _)| id).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (id, after) in &enforced_after {
        assert!(*after < ACL_PROPAGATION_BOUND, "broker {id} enforced the ACL after {after:?}");
        eprintln!("broker {id} enforced the ACL {after:?} after CreateAcls on broker 0 answered");
    }
}
