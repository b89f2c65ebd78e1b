//! Headless Chromium driven over the DevTools protocol: Debian's `chromium` with
//! `--remote-debugging-port=0` (it picks a free port and writes it to
//! `DevToolsActivePort` in its profile), one page target over a WebSocket. Enough for
//! the console's tests: navigate and wait for the load, evaluate JavaScript, take
//! screenshots, and collect every JavaScript error and console error of the page.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

const CHROMIUM: &str = "/usr/bin/chromium";

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A browser with one page; the process is killed when dropped.
pub struct Browser {
    child: Child,
    socket: Socket,
    next_id: u64,
    /// JavaScript exceptions, console errors and error log entries, as text.
    pub errors: Vec<String>,
    loaded: bool,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    /// Starts Chromium with its profile in `profile`, a 1280×800 window.
    pub async fn start(profile: &Path) -> Result<Self> {
        if !Path::new(CHROMIUM).exists() {
            bail!("{CHROMIUM} is missing: `cargo xtask test` installs Debian's chromium");
        }
        let child = Command::new(CHROMIUM)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--window-size=1280,800",
                "--remote-debugging-port=0",
                "--remote-allow-origins=*",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start chromium")?;
        let port_file = profile.join("DevToolsActivePort");
        let deadline = Instant::now() + Duration::from_secs(60);
        let port = loop {
            if let Some(port) =
                std::fs::read_to_string(&port_file).ok().and_then(|s| s.lines().next()?.trim().parse::<u16>().ok())
            {
                break port;
            }
            if Instant::now() > deadline {
                bail!("chromium wrote no DevToolsActivePort within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let targets: Value = reqwest::get(format!("http://127.0.0.1:{port}/json/list")).await?.json().await?;
        let ws = targets
            .as_array()
            .and_then(|t| t.iter().find(|t| t["type"] == "page"))
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .ok_or_else(|| anyhow!("no page target in {targets}"))?
            .to_string();
        let (socket, _) = tokio_tungstenite::connect_async(ws.as_str()).await.context("DevTools WebSocket")?;
        let mut b = Self { child, socket, next_id: 0, errors: Vec::new(), loaded: false };
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            b.call(domain, json!({})).await?;
        }
        b.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": false}),
        )
        .await?;
        Ok(b)
    }

    /// Sends one command and waits for its answer, keeping the events that arrive meanwhile.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value> {
        self.next_id += 1;
        let id = self.next_id;
        self.socket.send(Message::text(json!({"id": id, "method": method, "params": params}).to_string())).await?;
        loop {
            let msg = self.read(Duration::from_secs(60)).await?.ok_or_else(|| anyhow!("no answer to {method} within 60 s"))?;
            if msg["id"] == id {
                if let Some(e) = msg.get("error") {
                    bail!("{method}: {e}");
                }
                return Ok(msg["result"].clone());
            }
        }
    }

    /// The next message (an answer or an event), within `wait`; events are recorded.
    async fn read(&mut self, wait: Duration) -> Result<Option<Value>> {
        let next = match tokio::time::timeout(wait, self.socket.next()).await {
            Err(_) => return Ok(None),
            Ok(None) => bail!("the DevTools connection closed"),
            Ok(Some(m)) => m?,
        };
        let Message::Text(text) = next else { return Ok(Some(Value::Null)) };
        let msg: Value = serde_json::from_str(&text)?;
        match msg["method"].as_str() {
            Some("Runtime.exceptionThrown") => {
                let d = &msg["params"]["exceptionDetails"];
                self.errors.push(format!("exception: {} {}", d["text"], d["exception"]["description"]));
            }
            Some("Runtime.consoleAPICalled") if msg["params"]["type"] == "error" => {
                self.errors.push(format!("console.error: {}", msg["params"]["args"]));
            }
            Some("Log.entryAdded") if msg["params"]["entry"]["level"] == "error" => {
                let e = &msg["params"]["entry"];
                self.errors.push(format!("log: {} {}", e["text"], e["url"]));
            }
            Some("Page.loadEventFired") => self.loaded = true,
            _ => {}
        }
        Ok(Some(msg))
    }

    /// Waits for the page's load event (after a navigation or a form submission).
    pub async fn wait_loaded(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.loaded {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("the page did not load within 60 s");
            }
            self.read(left).await?;
        }
        Ok(())
    }

    /// Opens `url` and waits until it has loaded.
    pub async fn goto(&mut self, url: &str) -> Result<()> {
        self.loaded = false;
        let r = self.call("Page.navigate", json!({"url": url})).await?;
        if let Some(e) = r.get("errorText") {
            bail!("navigating to {url}: {e}");
        }
        self.wait_loaded().await
    }

    /// Runs `expression` in the page (awaiting a promise) and returns its value.
    pub async fn eval(&mut self, expression: &str) -> Result<Value> {
        let r =
            self.call("Runtime.evaluate", json!({"expression": expression, "returnByValue": true, "awaitPromise": true})).await?;
        if let Some(e) = r.get("exceptionDetails") {
            bail!("{expression}: {e}");
        }
        Ok(r["result"]["value"].clone())
    }

    /// Runs `expression` that navigates (a click on a submit button) and waits for the new page.
    pub async fn eval_and_wait(&mut self, expression: &str) -> Result<()> {
        self.loaded = false;
        self.eval(expression).await?;
        self.wait_loaded().await
    }

    /// Polls `expression` until it is `true`, reading events meanwhile.
    pub async fn wait_for(&mut self, expression: &str, secs: u64) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if self.eval(expression).await? == Value::Bool(true) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{expression} was not true within {secs} s");
            }
            self.read(Duration::from_millis(250)).await?;
        }
    }

    /// A PNG of the whole page, written to `path`.
    pub async fn screenshot(&mut self, path: &Path) -> Result<()> {
        let r = self.call("Page.captureScreenshot", json!({"format": "png", "captureBeyondViewport": true})).await?;
        let data = r["data"].as_str().ok_or_else(|| anyhow!("no screenshot data"))?;
        let png = base64::engine::general_purpose::STANDARD.decode(data)?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, png)?;
        Ok(())
    }
}

/// Where screenshots go: `target/console-screenshots/` of the workspace (never committed).
pub fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("console-screenshots")
}
