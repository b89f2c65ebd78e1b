//! SASL listeners against real clients: kcat over SASL_SSL with SCRAM-SHA-256,
//! confluent-kafka with SCRAM-SHA-512 (a producer and a consumer group), a wrong
//! password refused as an authentication failure, and malformed or out-of-order SASL
//! messages closing only their own connection. Users are SCRAM credentials written to
//! the broker's metadata store before it starts.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::{kcat, Certs, RawClient};
use fjord_auth::ScramMechanism;
use fjord_testkit::StandaloneBroker;
use kafka_protocol::messages::{
    ApiKey, MetadataRequest, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;

const PASSWORD: &str = "alice-secret";
const BOB_PASSWORD: &str = "bob-secret";
const SASL_AUTHENTICATION_FAILED: i16 = 58;
const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
const ILLEGAL_SASL_STATE: i16 = 34;

struct SaslBroker {
    certs: Certs,
    broker: StandaloneBroker,
    _certs_dir: tempfile::TempDir,
}

impl SaslBroker {
    /// A broker with SASL_SSL, SASL_PLAINTEXT and PLAINTEXT listeners and user `alice`.
    async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// As [`SaslBroker::start`], with more broker settings and user `bob` too.
    async fn start_with(settings: &[(&str, &str)]) -> Self {
        common::init_tracing();
        let certs_dir = tempfile::tempdir().unwrap();
        let certs = Certs::create(certs_dir.path()).unwrap();
        let broker = StandaloneBroker::builder()
            .set("listeners", "SASL_SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,PLAINTEXT://127.0.0.1:0")
            .set("inter.broker.listener.name", "PLAINTEXT")
            .set("ssl.keystore.location", &certs.path("server-keystore.pem"))
            .set("sasl.enabled.mechanisms", "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN")
            .user("alice", PASSWORD)
            .user("bob", BOB_PASSWORD);
        let broker = settings.iter().fold(broker, |builder, (key, value)| builder.set(key, value)).start().await.unwrap();
        Self { certs, broker, _certs_dir: certs_dir }
    }

    fn addr(&self, listener: &str) -> SocketAddr {
        self.broker.listener(listener)
    }

    fn kcat_args(&self, mechanism: &str, password: &str) -> Vec<String> {
        [
            "-b".to_owned(),
            self.addr("SASL_SSL").to_string(),
            "-X".to_owned(),
            "security.protocol=sasl_ssl".to_owned(),
            "-X".to_owned(),
            format!("sasl.mechanisms={mechanism}"),
            "-X".to_owned(),
            "sasl.username=alice".to_owned(),
            "-X".to_owned(),
            format!("sasl.password={password}"),
            "-X".to_owned(),
            format!("ssl.ca.location={}", self.certs.path("ca.pem")),
        ]
        .into()
    }

    async fn stop(self) {
        self.broker.stop().await.unwrap();
    }
}

async fn kcat_with(args: &[String], extra: &[&str], stdin: Option<&[u8]>) -> anyhow::Result<Vec<u8>> {
    let all: Vec<&str> = args.iter().map(String::as_str).chain(extra.iter().copied()).collect();
    kcat(&all, stdin).await
}

/// True when the broker closes the connection within 5 s (after whatever it sends).
async fn closed_by_broker(client: &mut RawClient) -> bool {
    use tokio::io::AsyncReadExt;
    let mut sink = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match tokio::time::timeout_at(deadline, client.stream.read(&mut sink)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

async fn handshake(client: &mut RawClient, mechanism: &str) -> SaslHandshakeResponse {
    let request = SaslHandshakeRequest::default().with_mechanism(StrBytes::from_string(mechanism.to_owned()));
    client.call(ApiKey::SaslHandshake, 1, &request).await.unwrap()
}

async fn authenticate(client: &mut RawClient, token: &[u8]) -> anyhow::Result<SaslAuthenticateResponse> {
    let request = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::copy_from_slice(token));
    client.call(ApiKey::SaslAuthenticate, 2, &request).await
}

#[tokio::test]
async fn kcat_over_sasl_ssl_with_scram_sha_256() {
    let broker = SaslBroker::start().await;
    let args = broker.kcat_args("SCRAM-SHA-256", PASSWORD);
    let input = (0..100).map(|i| format!("k{i}:v{i}\n")).collect::<String>();
    kcat_with(&args, &["-P", "-t", "scram", "-K:"], Some(input.as_bytes())).await.unwrap();
    let output = kcat_with(&args, &["-C", "-t", "scram", "-o", "beginning", "-e", "-f", "%k:%s\n"], None).await.unwrap();
    assert_eq!(String::from_utf8(output).unwrap(), input);
    // A wrong password is an authentication failure: kcat gets no metadata.
    let wrong = kcat_with(&broker.kcat_args("SCRAM-SHA-256", "not-the-password"), &["-L", "-m", "5"], None).await;
    let error = wrong.expect_err("a wrong password must not authenticate").to_string();
    assert!(error.contains("Authentication failed") || error.contains("SASL"), "{error}");
    broker.stop().await;
}

#[tokio::test]
async fn confluent_kafka_with_scram_sha_512_produces_and_consumes_in_a_group() {
    let broker = SaslBroker::start().await;
    let script = r#"
import sys
from confluent_kafka import Producer, Consumer, KafkaException
bootstrap, password = sys.argv[1], sys.argv[2]
common = {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
          "sasl.username": "alice", "sasl.password": password}
p = Producer(dict(common))
for i in range(50):
    p.produce("scram512", key=b"k%d" % i, value=b"v%d" % i)
assert p.flush(30) == 0
c = Consumer(dict(common, **{"group.id": "g512", "auto.offset.reset": "earliest"}))
c.subscribe(["scram512"])
got = []
while len(got) < 50:
    m = c.poll(20)
    assert m is not None, "no message within 20 s, got %d" % len(got)
    assert m.error() is None, m.error()
    got.append(m.value())
c.commit(asynchronous=False)
c.close()
assert got == [b"v%d" % i for i in range(50)], got
errors = []
bad2 = Producer(dict(common, **{"sasl.password": "wrong", "error_cb": lambda e: errors.append(e)}))
bad2.poll(8)
assert any(e.code() == -169 or "Authentication" in e.str() for e in errors), errors
print("ok")
"#;
    common::run_python(script, &[&broker.addr("SASL_PLAINTEXT").to_string(), PASSWORD], Duration::from_secs(120)).await;
    broker.stop().await;
}

#[tokio::test]
async fn malformed_or_out_of_order_sasl_closes_only_that_connection() {
    let broker = SaslBroker::start().await;
    let addr = broker.addr("SASL_PLAINTEXT");
    // An authenticated connection that must be unaffected by the rest.
    let mut good = RawClient::connect(addr).await.unwrap();
    assert_eq!(handshake(&mut good, "PLAIN").await.error_code, 0);
    let answer = authenticate(&mut good, format!("\0alice\0{PASSWORD}").as_bytes()).await.unwrap();
    assert_eq!(answer.error_code, 0, "{:?}", answer.error_message);
    let metadata: kafka_protocol::messages::MetadataResponse =
        good.call(ApiKey::Metadata, 12, &MetadataRequest::default()).await.unwrap();
    assert!(!metadata.brokers.is_empty(), "authenticated: Metadata is answered");

    // Garbage as a SCRAM client-first.
    let mut client = RawClient::connect(addr).await.unwrap();
    assert_eq!(handshake(&mut client, "SCRAM-SHA-256").await.error_code, 0);
    let started = tokio::time::Instant::now();
    let answer = authenticate(&mut client, &[0xff, 0x00, 0x13, 0x37]).await.unwrap();
    assert_eq!(answer.error_code, SASL_AUTHENTICATION_FAILED);
    assert!(started.elapsed() >= Duration::from_millis(100), "failures are answered after the delay");
    assert!(closed_by_broker(&mut client).await);

    // A client-final with another exchange's nonce.
    let mut client = RawClient::connect(addr).await.unwrap();
    handshake(&mut client, "SCRAM-SHA-256").await;
    let first = authenticate(&mut client, b"n,,n=alice,r=clientnonce").await.unwrap();
    assert_eq!(first.error_code, 0);
    assert!(String::from_utf8_lossy(&first.auth_bytes).starts_with("r=clientnonce"));
    let replayed = authenticate(&mut client, b"c=biws,r=clientnonceOTHER,p=AAAA").await.unwrap();
    assert_eq!(replayed.error_code, SASL_AUTHENTICATION_FAILED);
    assert!(closed_by_broker(&mut client).await);

    // A mechanism that is not offered, and SaslAuthenticate before a handshake.
    let mut client = RawClient::connect(addr).await.unwrap();
    let answer = handshake(&mut client, "GSSAPI").await;
    assert_eq!(answer.error_code, UNSUPPORTED_SASL_MECHANISM);
    assert!(answer.mechanisms.iter().any(|m| m.as_str() == "SCRAM-SHA-512"));
    assert!(closed_by_broker(&mut client).await);
    let mut client = RawClient::connect(addr).await.unwrap();
    assert_eq!(authenticate(&mut client, b"n,,n=alice,r=x").await.unwrap().error_code, ILLEGAL_SASL_STATE);
    assert!(closed_by_broker(&mut client).await);

    // A wrong PLAIN password.
    let mut client = RawClient::connect(addr).await.unwrap();
    handshake(&mut client, "PLAIN").await;
    assert_eq!(authenticate(&mut client, b"\0alice\0wrong").await.unwrap().error_code, SASL_AUTHENTICATION_FAILED);
    assert!(closed_by_broker(&mut client).await);

    // The authenticated connection lives on.
    let metadata: kafka_protocol::messages::MetadataResponse =
        good.call(ApiKey::Metadata, 12, &MetadataRequest::default()).await.unwrap();
    assert!(!metadata.brokers.is_empty());
    broker.stop().await;
}

/// Two brokers on one metadata store whose inter-broker listener is SASL_SSL: a follower
/// joins the ISR only by fetching over TLS as the brokers' SASL principal, so an acks=all
/// produce with min.insync.replicas=2 succeeds only if that works.
#[tokio::test]
async fn replicas_fetch_over_a_sasl_ssl_inter_broker_listener() {
    use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
    use kafka_protocol::messages::{CreateTopicsRequest, CreateTopicsResponse};
    common::init_tracing();
    let certs_dir = tempfile::tempdir().unwrap();
    let certs = Certs::create(certs_dir.path()).unwrap();
    let mut brokers: Vec<StandaloneBroker> = Vec::new();
    for id in 0..2 {
        let builder = StandaloneBroker::builder()
            .set("broker.id", &id.to_string())
            .set("listeners", "INTERNAL://127.0.0.1:0,EXTERNAL://127.0.0.1:0")
            .set("listener.security.protocol.map", "INTERNAL:SASL_SSL,EXTERNAL:PLAINTEXT")
            .set("inter.broker.listener.name", "INTERNAL")
            .set("ssl.keystore.location", &certs.path("server-keystore.pem"))
            .set("ssl.truststore.location", &certs.path("ca.pem"))
            .set("sasl.mechanism.inter.broker.protocol", "SCRAM-SHA-512")
            .set("inter.broker.sasl.username", "broker")
            .set("inter.broker.sasl.password", "broker-secret");
        let builder = match brokers.first() {
            Some(first) => builder.shared_store(first.store().clone()),
            None => builder.user_with("broker", "broker-secret", &[ScramMechanism::Sha512]),
        };
        brokers.push(builder.start().await.unwrap());
    }
    let mut client = RawClient::connect(brokers[0].listener("EXTERNAL")).await.unwrap();
    let config = |k: &str, v: &str| {
        CreatableTopicConfig::default()
            .with_name(StrBytes::from_string(k.to_owned()))
            .with_value(Some(StrBytes::from_string(v.to_owned())))
    };
    let topic = CreatableTopic::default()
        .with_name(common::topic_name("replicated"))
        .with_num_partitions(1)
        .with_replication_factor(2)
        .with_configs(vec![config("min.insync.replicas", "2")]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let request = CreateTopicsRequest::default().with_timeout_ms(10_000).with_topics(vec![topic.clone()]);
        let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &request).await.unwrap();
        match response.topics[0].error_code {
            0 => break,
            // Both brokers must have registered before a factor of 2 is possible.
            38 if tokio::time::Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            code => panic!("CreateTopics: {code} {:?}", response.topics[0].error_message),
        }
    }
    // The leader may be either broker: produce through whichever answers.
    let mut acknowledged = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !acknowledged {
        for broker in &brokers {
            let mut client = RawClient::connect(broker.listener("EXTERNAL")).await.unwrap();
            let mut builder = fjord_record::BatchBuilder::new(1_700_000_000_000);
            builder.append(1_700_000_000_000, None, Some(b"replicated over SASL_SSL"), &[]);
            let (code, _) = client.produce(9, &common::produce_request("replicated", 0, -1, 5000, builder.build())).await;
            acknowledged |= code == 0;
        }
        assert!(tokio::time::Instant::now() < deadline, "acks=all with min.insync.replicas=2 never succeeded");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for broker in brokers {
        broker.stop().await.unwrap();
    }
}

/// A failed authentication is answered before the connection closes, even to a client
/// that reads late (kafka-python, under load, drops an answer that arrives in the same
/// read as the end of the stream, and sees only a disconnect): the broker keeps the
/// connection open after its answer, reading and dropping what the client still sends,
/// until the client closes it, and only after a bounded linger closes it itself. Bytes the
/// client sent after its token (a pipelined request) are read before the close, so the
/// close is a FIN, not a reset that can destroy the answer in flight.
#[tokio::test]
async fn a_failed_authentication_is_answered_before_a_clean_close_even_to_a_late_reader() {
    use tokio::io::AsyncReadExt;
    let broker = SaslBroker::start().await;
    let mut client = RawClient::connect(broker.addr("SASL_PLAINTEXT")).await.unwrap();
    assert_eq!(handshake(&mut client, "PLAIN").await.error_code, 0);
    let token = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from_static(b"\0alice\0wrong"));
    let frame = client.encode(ApiKey::SaslAuthenticate, 2, &token);
    let correlation_id = 2;
    client.send_frame(&frame).await.unwrap();
    // A request behind the token, sent while the broker holds its answer for the
    // failed-authentication delay: it is still unread in the socket when the answer goes.
    tokio::time::sleep(Duration::from_millis(30)).await;
    let metadata = client.encode(ApiKey::Metadata, 12, &MetadataRequest::default());
    client.send_frame(&metadata).await.unwrap();
    // Late: the answer (after the 100 ms failed-authentication delay) is long written.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let answer: SaslAuthenticateResponse =
        client.read_response(ApiKey::SaslAuthenticate, 2, correlation_id).await.expect("the answer, not a reset");
    assert_eq!(answer.error_code, SASL_AUTHENTICATION_FAILED);
    // Still open behind the answer: a client reads it before it sees any close.
    let mut byte = [0u8; 1];
    let next = tokio::time::timeout(Duration::from_millis(200), client.stream.read(&mut byte)).await;
    assert!(next.is_err(), "the broker closed right behind its answer: {next:?}");
    // Then it closes by itself (the client never does), with a FIN: the pipelined request
    // was read, so no reset.
    let started = tokio::time::Instant::now();
    let end = tokio::time::timeout(Duration::from_secs(10), client.stream.read(&mut byte)).await.expect("never closed");
    assert!(matches!(end, Ok(0)), "closed with {end:?}, not a clean end of stream");
    assert!(started.elapsed() < Duration::from_secs(5), "lingered {:?}", started.elapsed());
    broker.stop().await;
}

/// A PLAIN exchange on `client` (SaslHandshake v1, SaslAuthenticate v2).
async fn plain(client: &mut RawClient, user: &str, password: &str) -> SaslAuthenticateResponse {
    assert_eq!(handshake(client, "PLAIN").await.error_code, 0);
    authenticate(client, format!("\0{user}\0{password}").as_bytes()).await.unwrap()
}

async fn metadata(client: &mut RawClient) -> anyhow::Result<kafka_protocol::messages::MetadataResponse> {
    client.call(ApiKey::Metadata, 12, &MetadataRequest::default()).await
}

/// KIP-368 with `connections.max.reauth.ms`: the session's lifetime is announced, a
/// re-authentication as the same user resets it while the connection goes on serving,
/// another user or mechanism is refused and closes the connection, and an expired
/// session is closed at its next request.
#[tokio::test]
async fn sessions_expire_unless_reauthenticated_as_the_same_user() {
    const LIFETIME: Duration = Duration::from_millis(2000);
    let broker = SaslBroker::start_with(&[("connections.max.reauth.ms", "2000")]).await;
    let addr = broker.addr("SASL_PLAINTEXT");

    let mut client = RawClient::connect(addr).await.unwrap();
    let started = tokio::time::Instant::now();
    let answer = plain(&mut client, "alice", PASSWORD).await;
    assert_eq!(answer.error_code, 0, "{:?}", answer.error_message);
    assert_eq!(answer.session_lifetime_ms, 2000);
    tokio::time::sleep(LIFETIME * 6 / 10).await;
    // Re-authenticate, with a request served between the handshake and the token.
    assert_eq!(handshake(&mut client, "PLAIN").await.error_code, 0);
    assert!(!metadata(&mut client).await.unwrap().brokers.is_empty(), "served during re-authentication");
    let answer = authenticate(&mut client, format!("\0alice\0{PASSWORD}").as_bytes()).await.unwrap();
    assert_eq!(answer.error_code, 0, "{:?}", answer.error_message);
    assert_eq!(answer.session_lifetime_ms, 2000);
    let reauthenticated = tokio::time::Instant::now();
    // Past the first session's end: the second one is in force.
    tokio::time::sleep_until(started + LIFETIME * 13 / 10).await;
    assert!(!metadata(&mut client).await.unwrap().brokers.is_empty(), "the re-authentication renewed the session");
    // Past the second one's end: the next request closes the connection.
    tokio::time::sleep_until(reauthenticated + LIFETIME + Duration::from_millis(200)).await;
    assert!(metadata(&mut client).await.is_err(), "an expired session is not served");
    assert!(closed_by_broker(&mut client).await);

    // Another principal: refused after the failed-authentication delay, then closed.
    let mut client = RawClient::connect(addr).await.unwrap();
    assert_eq!(plain(&mut client, "alice", PASSWORD).await.error_code, 0);
    let started = tokio::time::Instant::now();
    let answer = plain(&mut client, "bob", BOB_PASSWORD).await;
    assert_eq!(answer.error_code, SASL_AUTHENTICATION_FAILED);
    assert!(started.elapsed() >= Duration::from_millis(100), "failures are answered after the delay");
    assert!(closed_by_broker(&mut client).await);

    // Bad credentials on re-authentication.
    let mut client = RawClient::connect(addr).await.unwrap();
    assert_eq!(plain(&mut client, "alice", PASSWORD).await.error_code, 0);
    assert_eq!(plain(&mut client, "alice", "wrong").await.error_code, SASL_AUTHENTICATION_FAILED);
    assert!(closed_by_broker(&mut client).await);

    // Another mechanism than the first authentication's.
    let mut client = RawClient::connect(addr).await.unwrap();
    assert_eq!(plain(&mut client, "alice", PASSWORD).await.error_code, 0);
    assert_eq!(handshake(&mut client, "SCRAM-SHA-256").await.error_code, UNSUPPORTED_SASL_MECHANISM);
    assert!(closed_by_broker(&mut client).await);
    broker.stop().await;
}

/// Without `connections.max.reauth.ms` sessions do not expire: the lifetime is 0.
#[tokio::test]
async fn sessions_do_not_expire_by_default() {
    let broker = SaslBroker::start().await;
    let mut client = RawClient::connect(broker.addr("SASL_PLAINTEXT")).await.unwrap();
    let answer = plain(&mut client, "alice", PASSWORD).await;
    assert_eq!((answer.error_code, answer.session_lifetime_ms), (0, 0));
    broker.stop().await;
}

/// confluent-kafka (librdkafka) re-authenticates by itself when the broker announces a
/// session lifetime: a producer through several 3 s sessions loses nothing, and its log
/// shows the re-authentications.
#[tokio::test]
async fn confluent_kafka_reauthenticates_while_producing() {
    let broker = SaslBroker::start_with(&[("connections.max.reauth.ms", "3000")]).await;
    let script = r#"
import sys, time, logging
from confluent_kafka import Producer
bootstrap, password = sys.argv[1], sys.argv[2]
lines = []
class Collect(logging.Handler):
    def emit(self, record):
        lines.append(record.getMessage())
log = logging.getLogger("rdkafka")
log.setLevel(logging.DEBUG)
log.addHandler(Collect())
errors = []
delivered = []
def on_delivery(err, msg):
    (errors if err else delivered).append(err or msg.value())
p = Producer({"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
              "sasl.username": "alice", "sasl.password": password, "acks": "all", "enable.idempotence": True,
              "debug": "security,broker", "error_cb": lambda e: errors.append(e)}, logger=log)
sent = 0
until = time.time() + 8
while time.time() < until:
    p.produce("reauth", value=b"v%d" % sent, on_delivery=on_delivery)
    sent += 1
    p.poll(0.01)
assert p.flush(30) == 0
assert not errors, errors
assert sorted(delivered) == sorted(b"v%d" % i for i in range(sent)), (len(delivered), sent)
reauths = [l for l in lines if "eauth" in l]
assert len(reauths) >= 2, "no re-authentication in the client's log: %r" % [l for l in lines if "SASL" in l][-20:]
print("sent", sent, "re-authentication lines", len(reauths))
print("ok")
"#;
    common::run_python(script, &[&broker.addr("SASL_PLAINTEXT").to_string(), PASSWORD], Duration::from_secs(120)).await;
    broker.stop().await;
}
