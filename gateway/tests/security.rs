//! The gateway behind TLS, HTTP Basic and ACLs (#19), against a broker with SASL and its
//! authorizer on: curl over HTTPS (401 / 403 / 200, a client certificate, beacons and CORS
//! preflights), Python grpcio over TLS with `authorization` metadata, and hostile input
//! (garbage instead of a ClientHello, a huge or malformed Authorization header) that
//! fails alone while other clients go on.

mod support;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use fjord_auth::scram::ScramMechanism;
use fjord_auth::{AccessControlEntry, AclBinding, Operation, PatternType, Permission, Principal, ResourcePattern, ResourceType};
use fjord_gateway::GatewayConfig;
use fjord_testkit::{Certs, StandaloneBroker};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

const USERS: [(&str, &str); 4] =
    [("admin", "admin-pw"), ("gateway", "gateway-pw"), ("writer", "writer-pw"), ("reader", "reader-pw")];

/// A broker (SASL_PLAINTEXT, authorizer on, `admin` and `gateway` super users) and a
/// gateway in front of it on HTTPS / gRPC over TLS with Basic and the ACLs: `writer` may
/// Write `orders`, `reader` may Read it, `alice` (the test client certificate, by CN)
/// may Write it, and `User:ANONYMOUS` may Write topics starting with `web-`.
struct Secure {
    http: String,
    grpc: SocketAddr,
    certs: Certs,
    shutdown: CancellationToken,
    _broker: StandaloneBroker,
    _dir: tempfile::TempDir,
}

impl Drop for Secure {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn allow(principal: &str, operation: Operation, topic: &str, pattern: PatternType) -> AclBinding {
    AclBinding {
        pattern: ResourcePattern::new(ResourceType::Topic, topic, pattern).unwrap(),
        entry: AccessControlEntry::new(Principal::user(principal), "*", operation, Permission::Allow).unwrap(),
    }
}

impl Secure {
    async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// [`Secure::start`] with the gateway's config adjusted by the caller.
    async fn start_with(configure: impl FnOnce(&mut GatewayConfig)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("certs")).unwrap();
        let certs = Certs::create(&dir.path().join("certs")).unwrap();
        let mut broker = StandaloneBroker::builder()
            .set("listeners", "SASL_PLAINTEXT://127.0.0.1:0,PLAINTEXT://127.0.0.1:0")
            .set("inter.broker.listener.name", "PLAINTEXT")
            .set("sasl.enabled.mechanisms", "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN")
            .set("authorizer.enable", "true")
            .set("super.users", "User:admin;User:gateway")
            .configure(|config| config.num_partitions = 1);
        for (i, (user, password)) in USERS.into_iter().enumerate() {
            // One user on SCRAM-SHA-512 only: Basic takes either mechanism's credential.
            let mechanism = if i == 3 { ScramMechanism::Sha512 } else { ScramMechanism::Sha256 };
            broker = broker.user_with(user, password, &[mechanism]);
        }
        let broker = broker
            .acls([
                allow("writer", Operation::Write, "orders", PatternType::Literal),
                allow("reader", Operation::Read, "orders", PatternType::Literal),
                allow("alice", Operation::Write, "orders", PatternType::Literal),
                allow("ANONYMOUS", Operation::Write, "web-", PatternType::Prefixed),
            ])
            .start()
            .await
            .expect("broker");
        let sasl = broker.listener("SASL_PLAINTEXT");
        let store = broker.store().clone();
        let shutdown = CancellationToken::new();

        let mut gateway = GatewayConfig {
            host_name: Some("gw-secure".into()),
            broker_timeout: Duration::from_secs(5),
            cors: fjord_gateway::CorsConfig::loopback(),
            ..GatewayConfig::new(sasl.to_string())
        };
        for (key, value) in [
            ("ssl.keystore.location", certs.path("server-keystore.pem")),
            ("ssl.truststore.location", certs.path("ca.pem")),
            ("ssl.client.authentication", "REQUESTED".into()),
            ("ssl.principal.mapping.rules", "RULE:^CN=([^,]+),.*$/$1/".into()),
            ("authentication.method", "BASIC".into()),
            ("authentication.realm", "fjord-test".into()),
            ("authorizer.enable", "true".into()),
            ("client.security.protocol", "SASL_PLAINTEXT".into()),
            ("client.sasl.mechanism", "SCRAM-SHA-256".into()),
            ("client.sasl.username", "gateway".into()),
            ("client.sasl.password", "gateway-pw".into()),
        ] {
            gateway.set(key, &value).unwrap();
        }
        configure(&mut gateway);
        let (http, http_addr) = support::bind().await;
        let (grpc, grpc_addr) = support::bind().await;
        tokio::spawn(fjord_gateway::run_with_store(gateway, Some(store), http, grpc, shutdown.clone()));

        // Topics made by the admin over SASL (an anonymous client may not).
        let mut admin = fjord_client::ClientConfig::new(&sasl.to_string());
        for (key, value) in [
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanism", "SCRAM-SHA-256"),
            ("sasl.username", "admin"),
            ("sasl.password", "admin-pw"),
        ] {
            admin.set(key, value).unwrap();
        }
        let admin = fjord_client::Admin::connect(admin).await.expect("admin over SASL");
        let topics = ["orders", "web-clicks", "secret"].map(|t| fjord_client::NewTopic::new(t, 1));
        admin.create_topics(&topics).await.expect("create topics");
        Self {
            http: format!("https://localhost:{}", http_addr.port()),
            grpc: grpc_addr,
            certs,
            shutdown,
            _broker: broker,
            _dir: dir,
        }
    }

    /// Runs curl with `args` against `path`: (status, response headers, body).
    ///
    /// HTTP/1.1: a refusal answered before the request body is read ends an HTTP/2
    /// stream with RST_STREAM(NO_ERROR) after the full answer (RFC 9113 §8.1), which
    /// curl 7.88 sometimes reports as error 92 instead of the answer. HTTP/2 over TLS is
    /// exercised by the grpcio test.
    fn curl(&self, path: &str, args: &[&str]) -> (u16, String, String) {
        let dir = tempfile::tempdir().unwrap();
        let headers = dir.path().join("headers");
        let out = Command::new("curl")
            .args(["-sS", "--http1.1", "--max-time", "20", "--cacert", &self.certs.path("ca.pem")])
            .args(["-D", headers.to_str().unwrap(), "-w", "\n%{http_code}"])
            .args(args)
            .arg(format!("{}{path}", self.http))
            .output()
            .expect("curl must be installed");
        assert!(out.status.success(), "curl {args:?} {path}: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap();
        (code.trim().parse().unwrap(), std::fs::read_to_string(headers).unwrap_or_default(), body.to_owned())
    }
}

const EVENT: &str = r#"{"value":{"order":1}}"#;

fn post(body: &str) -> Vec<&str> {
    vec!["-X", "POST", "-H", "content-type: application/x-ndjson", "--data-binary", body]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_basic_answers_401_403_and_200_by_the_acls() {
    let s = Secure::start().await;
    // No credentials: 401 with the Basic challenge; health stays open.
    let (status, headers, body) = s.curl("/v1/events/orders", &post(EVENT));
    assert_eq!(status, 401, "{body}");
    assert!(headers.to_ascii_lowercase().contains("www-authenticate: basic realm=\"fjord-test\""), "{headers}");
    assert!(body.contains("40100"), "{body}");
    assert_eq!(s.curl("/healthz", &[]).0, 200);
    // Wrong password and unknown user: 401, the same answer.
    let wrong = s.curl("/v1/events/orders", &[post(EVENT), vec!["-u", "writer:nope"]].concat());
    let unknown = s.curl("/v1/events/orders", &[post(EVENT), vec!["-u", "nobody:writer-pw"]].concat());
    assert_eq!((wrong.0, unknown.0), (401, 401));
    assert_eq!(wrong.2, unknown.2, "a guesser cannot tell a wrong password from an unknown user");
    // A reader may not publish; a writer may, through the gateway's own SASL identity.
    let (status, _, body) = s.curl("/v1/events/orders", &[post(EVENT), vec!["-u", "reader:reader-pw"]].concat());
    assert_eq!(status, 403, "{body}");
    assert!(body.contains(r#"User:reader may not Write topic \"orders\""#), "{body}");
    for _ in 0..3 {
        let (status, _, body) = s.curl("/v1/events/orders", &[post(EVENT), vec!["-u", "writer:writer-pw"]].concat());
        assert_eq!(status, 200, "{body}");
    }
    // Pulling needs Read: the reader (a SCRAM-SHA-512 credential) may, the writer may not.
    let pull = "/v1/topics/orders/partitions/0/records?offset=0";
    let (status, _, body) = s.curl(pull, &["-u", "reader:reader-pw"]);
    assert_eq!(status, 200, "{body}");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&body).unwrap()["records"].as_array().unwrap().len(), 3);
    assert_eq!(s.curl(pull, &["-u", "writer:writer-pw"]).0, 403);
    // Topic listing shows only what the caller may Describe; describing another is 403.
    let (status, _, body) = s.curl("/topics", &["-u", "reader:reader-pw"]);
    assert_eq!((status, body.as_str()), (200, r#"["orders"]"#));
    assert_eq!(s.curl("/topics/secret", &["-u", "reader:reader-pw"]).0, 403);
    // Metrics need credentials too.
    assert_eq!(s.curl("/metrics", &[]).0, 401);
    assert_eq!(s.curl("/metrics", &["-u", "reader:reader-pw"]).0, 200);
    // Dead-lettering writes a second topic: Write on it is needed too.
    let (status, _, body) =
        s.curl("/v1/events/orders?on_invalid=dead_letter", &[post("{bad\n"), vec!["-u", "writer:writer-pw"]].concat());
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("orders.dlq"), "{body}");
    // Plain HTTP to the TLS port is not served.
    let plain = Command::new("curl")
        .args(["-sS", "--max-time", "5", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(s.http.replace("https://", "http://") + "/healthz")
        .output()
        .unwrap();
    assert_ne!(String::from_utf8_lossy(&plain.stdout), "200", "plain HTTP answered on the TLS port");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_the_principal_and_beacons_are_anonymous() {
    let s = Secure::start().await;
    let cert = ["--cert", &s.certs.path("client.pem"), "--key", &s.certs.path("client.key")].map(str::to_owned);
    let cert: Vec<&str> = cert.iter().map(String::as_str).collect();
    // alice (CN of the certificate, by the mapping rule) may Write orders, without Basic.
    let (status, _, body) = s.curl("/v1/events/orders", &[post(EVENT), cert.clone()].concat());
    assert_eq!(status, 200, "{body}");
    assert_eq!(s.curl("/v1/topics/orders/partitions/0/records", &cert).0, 403, "alice may not Read");
    // A beacon carries no credentials: User:ANONYMOUS, allowed on web-* only.
    let beacon = ["-X", "POST", "-H", "content-type: text/plain", "--data-binary", EVENT];
    let (status, _, body) = s.curl("/v1/beacon/web-clicks", &beacon);
    assert_eq!(status, 204, "{body}");
    let (status, headers, _) = s.curl("/v1/beacon/orders", &beacon);
    assert_eq!(status, 401);
    assert!(headers.to_ascii_lowercase().contains("www-authenticate"), "{headers}");
    // Other endpoints do not fall back to anonymous.
    assert_eq!(s.curl("/v1/events/web-clicks", &post(EVENT)).0, 401);
    // A browser's CORS preflight never carries credentials and is still answered.
    let preflight = [
        "-X",
        "OPTIONS",
        "-H",
        "Origin: http://localhost:3000",
        "-H",
        "Access-Control-Request-Method: POST",
        "-H",
        "Access-Control-Request-Headers: authorization, content-type",
    ];
    let (status, headers, _) = s.curl("/v1/events/orders", &preflight);
    assert!((200..300).contains(&status), "preflight: {status} {headers}");
    assert!(headers.to_ascii_lowercase().contains("access-control-allow-origin: http://localhost:3000"), "{headers}");
    // ...and a refused cross-origin request carries the CORS header, so the page can read the 401.
    let (status, headers, _) = s.curl("/v1/events/orders", &[post(EVENT), vec!["-H", "Origin: http://localhost:3000"]].concat());
    assert_eq!(status, 401);
    assert!(headers.to_ascii_lowercase().contains("access-control-allow-origin"), "{headers}");
}

/// Idempotency keys and the per-client limits belong to the authenticated principal:
/// the writer (Basic) and alice (a client certificate) use one key for the same body and
/// each is written once with its own answer; the writer over its bytes/s is refused while
/// alice, from the same address, is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_keys_and_limits_are_per_principal() {
    let s = Secure::start_with(|g| g.client_limits.bytes_per_sec = 1000).await;
    let cert = ["--cert", &s.certs.path("client.pem"), "--key", &s.certs.path("client.key")].map(str::to_owned);
    let alice: Vec<&str> = cert.iter().map(String::as_str).collect();
    let writer = vec!["-u", "writer:writer-pw"];
    let keyed = |who: &Vec<&str>, body: &str| {
        let args = [post(body), vec!["-H", "Idempotency-Key: order-7"], who.clone()].concat();
        let (status, _, body) = s.curl("/v1/events/orders", &args);
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    };
    let by_writer = keyed(&writer, EVENT);
    let by_alice = keyed(&alice, EVENT);
    assert_ne!(by_writer, by_alice, "alice's request under the writer's key is her own: {by_writer} {by_alice}");
    assert_eq!(keyed(&writer, EVENT), by_writer, "the writer's repeat gets the writer's answer");
    assert_eq!(keyed(&alice, EVENT), by_alice);
    let pull = "/v1/topics/orders/partitions/0/records?offset=0";
    let (status, _, records) = s.curl(pull, &["-u", "reader:reader-pw"]);
    assert_eq!(status, 200, "{records}");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&records).unwrap()["records"].as_array().unwrap().len(), 2);

    // 10 kB at 1000 bytes/s: the writer is refused for about 9 s, alice is not.
    let big: String = (0..500).map(|i| format!("{{\"n\":\"{i:012}\"}}\n")).collect();
    assert_eq!(s.curl("/v1/events/orders", &[post(&big), writer.clone()].concat()).0, 200);
    let (status, headers, body) = s.curl("/v1/events/orders", &[post(EVENT), writer.clone()].concat());
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("User:writer is over its limit of 1000 bytes/s"), "{body}");
    let retry_after = headers.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("retry-after: ").map(str::to_owned));
    let retry_after: u64 = retry_after.expect("Retry-After header").trim().parse().unwrap();
    assert!((1..=10).contains(&retry_after), "{retry_after}");
    assert_eq!(s.curl("/v1/events/orders", &[post(EVENT), alice.clone()].concat()).0, 200, "alice has her own allowance");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_fails_alone_and_cleanly() {
    let s = Secure::start().await;
    let port: u16 = s.http.rsplit(':').next().unwrap().parse().unwrap();
    for target in [SocketAddr::from(([127, 0, 0, 1], port)), s.grpc] {
        // Garbage instead of a ClientHello: the connection is closed, nothing else happens.
        let mut garbage = tokio::net::TcpStream::connect(target).await.unwrap();
        garbage.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\xff\xfe garbage").await.unwrap();
        let mut buf = vec![0u8; 1024];
        let read = tokio::time::timeout(Duration::from_secs(10), garbage.read(&mut buf)).await.expect("closed promptly");
        // Closed (0 or a reset), or a TLS alert and then closed: never an HTTP answer.
        if let Ok(n) = read {
            assert!(!buf[..n].starts_with(b"HTTP/"), "answered in clear: {:?}", String::from_utf8_lossy(&buf[..n]));
        }
        // A client that connects and says nothing holds only its own connection.
        let _silent = tokio::net::TcpStream::connect(target).await.unwrap();
    }
    // Malformed credentials: 401 each, never a 5xx.
    let huge = format!("Authorization: Basic {}", "A".repeat(30 * 1024));
    for header in ["Authorization: Basic !!!not-base64!!!", "Authorization: Basic YWxpY2U=", "Authorization: Bearer x", &huge] {
        let (status, _, body) = s.curl("/v1/events/orders", &[post(EVENT), vec!["-H", header]].concat());
        assert!(status == 401 || status == 400 || status == 431, "{header:.40}: {status} {body}");
    }
    // A header past hyper's limit is refused by the HTTP layer, cleanly.
    // (From a file: an argument that long is past the kernel's limit.)
    let enormous = s.certs.dir.join("enormous-header");
    std::fs::write(&enormous, format!("Authorization: Basic {}\n", "A".repeat(1024 * 1024))).unwrap();
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "20", "--cacert", &s.certs.path("ca.pem"), "-o", "/dev/null", "-w", "%{http_code}"])
        .arg("-H")
        .arg(format!("@{}", enormous.display()))
        .arg(format!("{}/v1/events/orders", s.http))
        .output()
        .unwrap();
    let code = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!code.starts_with('5'), "a 1 MiB header got {code}");
    // Everyone else is served as before.
    let (status, _, body) = s.curl("/v1/events/orders", &[post(EVENT), vec!["-u", "writer:writer-pw"]].concat());
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_tls_takes_basic_credentials_in_the_authorization_metadata() {
    let s = Secure::start().await;
    let python = support::python();
    let out_dir = tempfile::tempdir().unwrap();
    let proto_root = concat!(env!("CARGO_MANIFEST_DIR"), "/../proto");
    let generated = Command::new(&python)
        .args(["-m", "grpc_tools.protoc", "-I", proto_root])
        .arg(format!("--python_out={}", out_dir.path().display()))
        .arg(format!("--grpc_python_out={}", out_dir.path().display()))
        .arg(format!("{proto_root}/fjord/v1/events.proto"))
        .output()
        .expect("run grpc_tools.protoc");
    assert!(generated.status.success(), "protoc: {}", String::from_utf8_lossy(&generated.stderr));
    let script = r#"
import base64, sys, grpc
from fjord.v1 import events_pb2 as pb, events_pb2_grpc as rpc
target, ca = sys.argv[1], open(sys.argv[2], "rb").read()
def basic(user, pw):
    return (("authorization", "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()),)
creds = grpc.ssl_channel_credentials(root_certificates=ca)
with grpc.secure_channel(target, creds, options=(("grpc.ssl_target_name_override", "localhost"),)) as ch:
    pub, sub = rpc.PublisherStub(ch), rpc.SubscriberStub(ch)
    req = pb.PublishRequest(topic="orders", events=[pb.Event(value=b"g-%d" % i) for i in range(4)], batch_id=1)
    def code(f):
        try:
            f()
            return grpc.StatusCode.OK
        except grpc.RpcError as e:
            return e.code()
    assert code(lambda: pub.Publish(req, timeout=30)) == grpc.StatusCode.UNAUTHENTICATED
    assert code(lambda: pub.Publish(req, timeout=30, metadata=basic("writer", "bad"))) == grpc.StatusCode.UNAUTHENTICATED
    assert code(lambda: pub.Publish(req, timeout=30, metadata=(("authorization", "Basic %%%"),))) == grpc.StatusCode.UNAUTHENTICATED
    assert code(lambda: pub.Publish(req, timeout=30, metadata=basic("reader", "reader-pw"))) == grpc.StatusCode.PERMISSION_DENIED
    r = pub.Publish(req, timeout=30, metadata=basic("writer", "writer-pw"))
    assert len(r.offsets) == 4, r
    answers = list(pub.PublishStream(iter([req, pb.PublishRequest(topic="secret", events=[pb.Event(value=b"x")], batch_id=2)]), timeout=30, metadata=basic("writer", "writer-pw")))
    assert answers[0].error.code == 0 and len(answers[0].offsets) == 4, answers
    assert answers[1].error.code == grpc.StatusCode.PERMISSION_DENIED.value[0], answers
    fetch = pb.FetchRequest(topic="orders", partition=0, offset=-2)
    assert code(lambda: sub.Fetch(fetch, timeout=30, metadata=basic("writer", "writer-pw"))) == grpc.StatusCode.PERMISSION_DENIED
    f = sub.Fetch(fetch, timeout=30, metadata=basic("reader", "reader-pw"))
    assert len(f.records) == 8, f
    assert code(lambda: next(sub.Subscribe(pb.SubscribeRequest(topic="orders", partition=0), timeout=30))) == grpc.StatusCode.UNAUTHENTICATED
print("grpc tls ok")
"#;
    let target = format!("127.0.0.1:{}", s.grpc.port());
    let (out_path, ca) = (out_dir.path().to_path_buf(), s.certs.path("ca.pem"));
    let run = tokio::task::spawn_blocking(move || {
        Command::new(&python).arg("-c").arg(script).arg(target).arg(ca).env("PYTHONPATH", out_path).output().expect("python")
    })
    .await
    .unwrap();
    assert!(
        run.status.success() && String::from_utf8_lossy(&run.stdout).contains("grpc tls ok"),
        "python grpcio over TLS failed:\n{}\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
}
