//! Shared by the tests that run `fjord broker` as a process of its own.
#![allow(dead_code)] // each test binary uses a different subset

use std::net::{SocketAddr, TcpStream};
use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Waits until `addr` accepts connections; fails if `child` exits first or 30 s pass.
pub(crate) fn wait_until_listening(addr: SocketAddr, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(addr).is_err() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("fjord exited early: {status}");
        }
        assert!(Instant::now() < deadline, "fjord did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `fjord` process that is killed when the test ends, failed or not: a leftover one
/// would keep the test harness's stderr pipe open and stall the whole run.
pub(crate) struct FjordProcess(pub(crate) Child);

impl Deref for FjordProcess {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for FjordProcess {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for FjordProcess {
    fn drop(&mut self) {
        // Killing a child that already exited (and was waited for) is harmless.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `fjord broker --id 0` on `127.0.0.1:port` with its data in `data_dir` and `env` set,
/// once it listens.
pub(crate) fn start_broker(port: u16, data_dir: &Path, env: &[(&str, &str)]) -> FjordProcess {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fjord"))
        .args(["broker", "--id", "0", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(data_dir)
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_until_listening(SocketAddr::from(([127, 0, 0, 1], port)), &mut child);
    FjordProcess(child)
}

/// A loopback port that was free a moment ago.
pub(crate) fn free_port() -> u16 {
    fjord_testkit::free_port().unwrap()
}

/// `fjord dev` (broker, schema registry, gateway) with its data in `data_dir`, the Kafka
/// listener on `port` and the registry on `registry`, its log (stdout, no colours)
/// appended to `log`; once the broker and the registry listen.
pub(crate) fn start_dev(port: u16, registry: u16, data_dir: &Path, log: &Path) -> FjordProcess {
    let out = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fjord"))
        .args(["dev", "--data-dir"])
        .arg(data_dir)
        .args(["--registry", &format!("127.0.0.1:{registry}"), "--http", &format!("127.0.0.1:{}", free_port())])
        .args(["--metrics", &format!("127.0.0.1:{}", free_port())])
        .env("FJORD_LISTENERS", format!("127.0.0.1:{port}"))
        .env("FJORD_DEV_GRPC", format!("127.0.0.1:{}", free_port()))
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1")
        .stdout(out)
        .spawn()
        .unwrap();
    wait_until_listening(SocketAddr::from(([127, 0, 0, 1], port)), &mut child);
    wait_until_listening(SocketAddr::from(([127, 0, 0, 1], registry)), &mut child);
    FjordProcess(child)
}

/// One HTTP/1.1 request to `127.0.0.1:port` (`Connection: close`): the status code and
/// the body.
pub(crate) fn http(port: u16, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.unwrap_or("");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/vnd.schemaregistry.v1+json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (status, body)
}

/// Runs the `fjord` binary with `args` off the runtime's threads, so a broker the test
/// serves in-process keeps serving meanwhile.
pub(crate) async fn fjord(args: &[&str]) -> std::process::Output {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || Command::new(env!("CARGO_BIN_EXE_fjord")).args(&args).output().unwrap()).await.unwrap()
}

/// What a `fjord` run printed; fails the test, with its stderr, if the run failed.
pub(crate) fn stdout(output: &std::process::Output) -> String {
    assert!(output.status.success(), "fjord failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The metrics page of a `fjord` process serving them on `127.0.0.1:port`.
pub(crate) fn metrics(port: u16) -> String {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}
