//! A real system on loopback for the console's tests: a broker ([`StandaloneBroker`]), the
//! schema registry on an embedded metadata store, and the gateway (`fjord_gateway::run`),
//! which serves the console at `/ui/`; each on 127.0.0.1:0. kcat is the independent
//! client that makes topics, records and groups, and lists what the console created.
#![allow(dead_code, unreachable_pub)] // each test binary uses a different part

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fjord_gateway::GatewayConfig;
use fjord_testkit::StandaloneBroker;
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Broker + registry + gateway; everything stops when this is dropped.
pub struct System {
    pub broker: String,
    pub registry: String,
    pub http: String,
    shutdown: CancellationToken,
    _broker: StandaloneBroker,
    pub dir: TempDir,
}

impl Drop for System {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn bind() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
    let a = l.local_addr().expect("local addr").to_string();
    (l, a)
}

impl System {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(gateway: impl FnOnce(&mut GatewayConfig)) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let shutdown = CancellationToken::new();
        let standalone = StandaloneBroker::builder().configure(|config| config.num_partitions = 2).start().await.expect("broker");
        let broker = standalone.addr.clone();

        let store = fjord_coord::open(None, &dir.path().join("registry")).await.expect("embedded store");
        let (listener, registry) = bind().await;
        tokio::spawn(fjord_schema_registry::run(
            fjord_schema_registry::RegistryConfig::default(),
            store,
            listener,
            shutdown.clone(),
        ));

        let (http, http_addr) = bind().await;
        let (grpc, _) = bind().await;
        let mut config = GatewayConfig {
            registry_url: Some(format!("http://{registry}")),
            host_name: Some("console-it".into()),
            ..GatewayConfig::new(broker.clone())
        };
        gateway(&mut config);
        tokio::spawn(fjord_gateway::run(config, http, grpc, shutdown.clone()));
        Self {
            broker,
            registry: format!("http://{registry}"),
            http: format!("http://{http_addr}"),
            shutdown,
            _broker: standalone,
            dir,
        }
    }

    /// GET of a console page: (status, body).
    pub async fn get(&self, path: &str) -> (u16, String) {
        let r = reqwest::get(format!("{}{path}", self.http)).await.expect("GET");
        let status = r.status().as_u16();
        (status, r.text().await.expect("body"))
    }

    /// A form post as a browser sends it from the console's own page.
    pub async fn post_form(&self, path: &str, form: &[(&str, &str)]) -> reqwest::Response {
        let body: Vec<String> = form.iter().map(|(k, v)| format!("{}={}", enc(k), enc(v))).collect();
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
            .post(format!("{}{path}", self.http))
            .header("Content-Type", "application/x-www-form-urlencoded")
            .header("Origin", &self.http)
            .body(body.join("&"))
            .send()
            .await
            .expect("POST")
    }
}

/// Percent-encodes a form value.
pub fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-._~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

/// Runs kcat with `args` (and `input` on stdin): (success, stdout, stderr).
pub fn kcat(args: &[&str], input: Option<&[u8]>) -> (bool, String, String) {
    use std::io::Write;
    let mut child = Command::new("kcat")
        .args(args)
        .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kcat must be installed (cargo xtask test installs it)");
    if let Some(input) = input {
        child.stdin.take().unwrap().write_all(input).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Produces `key<TAB>value` lines with kcat to partition 0 of `topic` (auto-created), with
/// a header on each. One partition, so a group that read them all has committed offsets
/// everywhere they could be (kcat commits only partitions it received records from).
pub fn kcat_produce(broker: &str, topic: &str, lines: &str, header: Option<&str>) {
    let mut args = vec!["-b", broker, "-P", "-t", topic, "-p", "0", "-K", "\t"];
    if let Some(h) = header {
        args.extend(["-H", h]);
    }
    let (ok, _, err) = kcat(&args, Some(lines.as_bytes()));
    assert!(ok, "kcat produce failed: {err}");
}

/// Polls `f` until it is true, or fails after `secs` with `what`.
pub async fn until(secs: u64, what: &str, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
pub mod cdp;
