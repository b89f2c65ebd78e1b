//! TLS listeners against real clients: kcat (librdkafka on OpenSSL) produces and
//! consumes over SSL with a client certificate, a client without one is refused when
//! `ssl.client.auth=required`, garbage instead of a ClientHello and a stalled handshake
//! close only their own connection, and a rotated certificate is served without a
//! restart. Certificates come from `openssl` in a temp dir.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{kcat, Certs, RawClient};
use fjord_broker::BrokerConfig;
use fjord_testkit::StandaloneBroker;
use tokio::io::AsyncWriteExt;

struct TlsBroker {
    addr: SocketAddr,
    certs: Certs,
    broker: StandaloneBroker,
    _certs_dir: tempfile::TempDir,
}

impl TlsBroker {
    /// A broker with an SSL listener (`ssl.client.auth=<client_auth>`) and a plaintext one.
    async fn start(client_auth: &str, configure: impl FnOnce(&mut BrokerConfig)) -> Self {
        common::init_tracing();
        let certs_dir = tempfile::tempdir().unwrap();
        let certs = Certs::create(certs_dir.path()).unwrap();
        let broker = StandaloneBroker::builder()
            .set("listeners", "SSL://127.0.0.1:0,PLAINTEXT://127.0.0.1:0")
            .set("inter.broker.listener.name", "PLAINTEXT")
            .set("ssl.keystore.type", "PEM")
            .set("ssl.keystore.location", &certs.path("server-keystore.pem"))
            .set("ssl.truststore.location", &certs.path("ca.pem"))
            .set("ssl.client.auth", client_auth)
            .configure(configure)
            .start()
            .await
            .unwrap();
        Self { addr: broker.listener("SSL"), certs, broker, _certs_dir: certs_dir }
    }

    /// kcat's options for the SSL listener, with the client certificate when `with_cert`.
    fn kcat_args(&self, with_cert: bool) -> Vec<String> {
        let mut args = vec![
            "-b".to_owned(),
            self.addr.to_string(),
            "-X".to_owned(),
            "security.protocol=ssl".to_owned(),
            "-X".to_owned(),
            format!("ssl.ca.location={}", self.certs.path("ca.pem")),
            "-X".to_owned(),
            "socket.timeout.ms=5000".to_owned(),
        ];
        if with_cert {
            for (key, file) in [("ssl.certificate.location", "client.pem"), ("ssl.key.location", "client.key")] {
                args.extend(["-X".to_owned(), format!("{key}={}", self.certs.path(file))]);
            }
        }
        args
    }

    async fn stop(self) {
        self.broker.stop().await.unwrap();
    }
}

/// True when the broker closes the connection within 5 s (whatever it sends first, a TLS
/// alert for instance).
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

async fn kcat_with(args: &[String], extra: &[&str], stdin: Option<&[u8]>) -> anyhow::Result<Vec<u8>> {
    let all: Vec<&str> = args.iter().map(String::as_str).chain(extra.iter().copied()).collect();
    kcat(&all, stdin).await
}

#[tokio::test]
async fn kcat_produces_and_consumes_over_ssl_with_a_client_certificate() {
    let broker = TlsBroker::start("required", |_| {}).await;
    let args = broker.kcat_args(true);
    let input = (0..200).map(|i| format!("k{i}:value-{i}\n")).collect::<String>();
    kcat_with(&args, &["-P", "-t", "secured", "-K:"], Some(input.as_bytes())).await.unwrap();
    let output = kcat_with(&args, &["-C", "-t", "secured", "-o", "beginning", "-e", "-f", "%k:%s\n"], None).await.unwrap();
    assert_eq!(String::from_utf8(output).unwrap(), input, "every record back, in order, through TLS (copied, not sendfile)");
    // Without a client certificate the handshake is refused.
    let refused = kcat_with(&broker.kcat_args(false), &["-L", "-m", "3"], None).await;
    assert!(refused.is_err(), "a client without a certificate must not get metadata: {refused:?}");
    broker.stop().await;
}

#[tokio::test]
async fn a_client_certificate_names_the_principal_by_its_subject() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::create(dir.path()).unwrap();
    let status = std::process::Command::new("openssl")
        .args(["x509", "-in", &certs.path("client.pem"), "-outform", "DER", "-out", &certs.path("client.der")])
        .status()
        .unwrap();
    assert!(status.success());
    let der = std::fs::read(dir.path().join("client.der")).unwrap();
    let subject = fjord_broker::tls::certificate_subject(&der).unwrap();
    assert_eq!(subject, "CN=alice,OU=eng,O=Fjord Test", "RFC 2253, most specific first, as Kafka's X500Principal");
    let mut config = BrokerConfig::default();
    assert_eq!(config.ssl.principal(&subject).to_string(), "User:CN=alice,OU=eng,O=Fjord Test");
    config.set("ssl.principal.mapping.rules", "RULE:^CN=([^,]+),.*$/$1/,DEFAULT").unwrap();
    assert_eq!(config.ssl.principal(&subject).to_string(), "User:alice");
}

#[tokio::test]
async fn garbage_or_silence_instead_of_a_client_hello_closes_only_that_connection() {
    let broker = TlsBroker::start("none", |c| c.set("connection.authentication.timeout.ms", "1000").unwrap()).await;
    let mut garbage = RawClient::connect(broker.addr).await.unwrap();
    garbage.stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    assert!(closed_by_broker(&mut garbage).await, "not a ClientHello: closed");
    let mut kafka_frame = RawClient::connect(broker.addr).await.unwrap();
    let frame = kafka_frame.encode(
        kafka_protocol::messages::ApiKey::ApiVersions,
        3,
        &kafka_protocol::messages::ApiVersionsRequest::default(),
    );
    kafka_frame.send_frame(&frame).await.unwrap();
    assert!(closed_by_broker(&mut kafka_frame).await, "a plaintext Kafka request on the SSL listener: closed");
    let mut silent = RawClient::connect(broker.addr).await.unwrap();
    assert!(closed_by_broker(&mut silent).await, "a handshake that never starts is dropped after the timeout");
    // Everyone else is served.
    kcat_with(&broker.kcat_args(false), &["-L", "-m", "5"], None).await.expect("a real TLS client still connects");
    broker.stop().await;
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let broker = TlsBroker::start("none", |_| {}).await;
    let served_subject = |addr: SocketAddr, ca: String| async move {
        let output = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "openssl s_client -connect {addr} -CAfile {ca} -verify_return_error </dev/null 2>/dev/null | openssl x509 -noout -subject"
            ))
            .output()
            .await
            .unwrap();
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    };
    assert!(served_subject(broker.addr, broker.certs.path("ca.pem")).await.contains("CN = localhost"));
    // A new certificate for the same host, under another subject, written over the key store.
    broker.certs.issue("rotated", "/O=Rotated/CN=localhost", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth").unwrap();
    let keystore =
        [std::fs::read(broker.certs.path("rotated.key")).unwrap(), std::fs::read(broker.certs.path("rotated.pem")).unwrap()]
            .concat();
    let tmp = broker.certs.path("keystore.tmp");
    std::fs::write(&tmp, keystore).unwrap();
    std::fs::rename(&tmp, broker.certs.path("server-keystore.pem")).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let subject = served_subject(broker.addr, broker.certs.path("ca.pem")).await;
        if subject.contains("O = Rotated") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "still serving the old certificate: {subject}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A file that does not load leaves the current certificate in place.
    std::fs::write(broker.certs.path("server-keystore.pem"), "half a file").unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(served_subject(broker.addr, broker.certs.path("ca.pem")).await.contains("O = Rotated"));
    broker.stop().await;
}
