//! A real browser against the gateway: headless Chromium loads a page served from another
//! origin (a small server on another port), which posts with `fetch` (a CORS preflight,
//! since `application/x-ndjson` is not a "simple" type) and with `navigator.sendBeacon`
//! (`text/plain`, no preflight). From the allowed origin both arrive in the topic; from an
//! origin that is not allowed the preflight is refused, and so is the beacon, on the
//! server, so nothing of that page is produced.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::response::Html;
use axum::routing::get;
use axum::Router;
use fjord_gateway::CorsConfig;
use support::{bind, kcat_consume, System};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

const CHROMIUM: &str = "/usr/bin/chromium";

/// The page: posts two events with fetch and one with sendBeacon, each naming the page's
/// port, then reports what it saw to its own server at `/done`.
fn page(gateway: &str) -> String {
    format!(
        r#"<!doctype html><html><body><script>
const gw = "{gateway}";
const me = location.port;
async function run() {{
  const out = [];
  try {{
    const r = await fetch(gw + "/v1/events/web", {{
      method: "POST",
      headers: {{ "Content-Type": "application/x-ndjson" }},
      body: '{{"via":"fetch","page":"' + me + '","n":1}}\n{{"via":"fetch","page":"' + me + '","n":2}}\n',
    }});
    const doc = await r.json();
    out.push("fetch=" + r.status + ":" + doc.count);
  }} catch (e) {{
    out.push("fetch=blocked");
  }}
  out.push("beacon=" + navigator.sendBeacon(gw + "/v1/beacon/web", '{{"via":"beacon","page":"' + me + '"}}\n'));
  await fetch("/done?r=" + encodeURIComponent(out.join(",")));
}}
run();
</script></body></html>"#
    )
}

#[derive(serde::Deserialize)]
struct Done {
    r: String,
}

/// Serves the page on `listener`; each `/done` report goes to `tx`.
fn serve_page(listener: TcpListener, html: String, tx: mpsc::UnboundedSender<String>) {
    let app = Router::new()
        .route(
            "/page.html",
            get(|State((html, _)): State<(Arc<String>, mpsc::UnboundedSender<String>)>| async move { Html((*html).clone()) }),
        )
        .route(
            "/done",
            get(|State((_, tx)): State<(Arc<String>, mpsc::UnboundedSender<String>)>, Query(d): Query<Done>| async move {
                let _ = tx.send(d.r);
                "ok"
            }),
        )
        .with_state((Arc::new(html), tx));
    tokio::spawn(async move { axum::serve(listener, app).await });
}

/// A browser process, killed when dropped.
struct Browser(Child);

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Chromium on `url` until dropped (the page reports back; no fixed sleep). It must live
/// until the beacon arrived: the browser sends a beacon in the background, possibly after
/// the page's report.
fn chromium(profile: &Path, url: &str) -> Browser {
    assert!(Path::new(CHROMIUM).exists(), "{CHROMIUM} is missing: `cargo xtask test` installs Debian's chromium");
    Command::new(CHROMIUM)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Browser)
        .expect("start chromium")
}

async fn report(rx: &mut mpsc::UnboundedReceiver<String>) -> String {
    let r = tokio::time::timeout(Duration::from_secs(60), rx.recv()).await;
    r.expect("the page reports within 60 s").expect("page server running")
}

async fn metric(http: &str, line: &str) -> u64 {
    let text = reqwest::get(format!("{http}/metrics")).await.unwrap().text().await.unwrap();
    text.lines().find_map(|l| l.strip_prefix(line)).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_posts_with_fetch_and_beacon_from_an_allowed_origin_only() {
    let (allowed_listener, allowed_addr) = bind().await;
    let (refused_listener, refused_addr) = bind().await;
    let allowed_origin = format!("http://127.0.0.1:{}", allowed_addr.port());
    let sys = System::start_with(
        |_| {},
        |g| g.cors = CorsConfig { allowed_origins: vec![allowed_origin.clone()], ..CorsConfig::default() },
    )
    .await;
    sys.create_topic("web", 3).await;
    let dir = tempfile::tempdir().unwrap();

    let (tx, mut rx) = mpsc::unbounded_channel();
    serve_page(allowed_listener, page(&sys.http), tx.clone());
    serve_page(refused_listener, page(&sys.http), tx);

    let profile = dir.path().join("allowed");
    let browser = chromium(&profile, &format!("http://{allowed_addr}/page.html"));
    let seen = report(&mut rx).await;
    assert_eq!(seen, "fetch=200:2,beacon=true");
    let deadline = Instant::now() + Duration::from_secs(30);
    while sys.end_offsets("web", 3).await.iter().sum::<i64>() < 3 {
        assert!(Instant::now() < deadline, "the beacon did not arrive");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(browser);
    assert_eq!(metric(&sys.http, "fjord_gateway_requests_total{api=\"http_cors\",status=\"204\"}").await, 1, "one preflight");
    assert_eq!(metric(&sys.http, "fjord_gateway_requests_total{api=\"http_beacon\",status=\"200\"}").await, 1);

    let profile = dir.path().join("refused");
    let browser = chromium(&profile, &format!("http://{refused_addr}/page.html"));
    let seen = report(&mut rx).await;
    assert_eq!(seen, "fetch=blocked,beacon=true", "the browser queued the beacon; the gateway must refuse it");
    // The refused preflight and the refused beacon.
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(&sys.http, "fjord_gateway_requests_total{api=\"http_cors\",status=\"403\"}").await < 2 {
        assert!(Instant::now() < deadline, "the refused page's requests did not reach the gateway");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(browser);
    let messages = kcat_consume(&sys.broker, "web");
    let mut pages: Vec<(String, String)> = messages
        .iter()
        .map(|m| {
            let doc: serde_json::Value = serde_json::from_str(m.payload.as_deref().unwrap()).unwrap();
            (doc["via"].as_str().unwrap().to_string(), doc["page"].as_str().unwrap().to_string())
        })
        .collect();
    pages.sort();
    let port = allowed_addr.port().to_string();
    assert_eq!(
        pages,
        vec![("beacon".into(), port.clone()), ("fetch".into(), port.clone()), ("fetch".into(), port)],
        "only the allowed page's events"
    );
}
