//! The independent clients that come as scripts, as the tests drive them: the Python ones
//! (confluent-kafka, kafka-python, fastavro, grpcio) with `python -c SCRIPT ARGS...`, and
//! KafkaJS (a pure JavaScript implementation of the protocol) with `node -e SCRIPT
//! ARGS...`. A script is given inline, its output read line by line while it runs (a test
//! acts on a line such as `restart`: kills a broker, answers on the script's stdin), its
//! stderr drained meanwhile (a chatty librdkafka must not block the script on a full
//! pipe), and what it said kept for the failure message.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::task::JoinHandle;

/// The Python interpreter of the tests that drive independent clients (confluent-kafka,
/// kafka-python, fastavro, grpcio): `$FJORD_TEST_PYTHON` (set by `cargo xtask test`),
/// else the workspace's `target/venv/bin/python` that `cargo xtask test` provisions.
/// Missing is an error, never a skip.
pub fn python() -> Result<PathBuf> {
    let path = match std::env::var_os("FJORD_TEST_PYTHON") {
        Some(path) => PathBuf::from(path),
        // Every crate of the workspace sits one level below its root.
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/venv/bin/python"),
    };
    if !path.exists() {
        bail!("no Python at {} (run `cargo xtask test`, which provisions target/venv, or set FJORD_TEST_PYTHON)", path.display());
    }
    Ok(path)
}

/// The `node_modules` directory holding KafkaJS: `$FJORD_TEST_NODE_MODULES` (set by `cargo
/// xtask test`), else the workspace's `target/node/node_modules` that `cargo xtask`
/// provisions. Missing is an error, never a skip.
pub fn node_modules() -> Result<PathBuf> {
    let path = match std::env::var_os("FJORD_TEST_NODE_MODULES") {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/node/node_modules"),
    };
    if !path.join("kafkajs/package.json").exists() {
        bail!(
            "no KafkaJS in {} (run `cargo xtask test`, which provisions target/node, or set FJORD_TEST_NODE_MODULES)",
            path.display()
        );
    }
    Ok(path)
}

/// A running client script, killed when dropped.
#[derive(Debug)]
pub struct ClientScript {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    stdout: Vec<String>,
    /// Filled as it arrives, so a test that gives up on a stuck script can still show it.
    stderr: Arc<Mutex<Vec<u8>>>,
    stderr_drain: Option<JoinHandle<()>>,
}

/// How a script ended: its exit status, every line it printed, and its stderr.
#[derive(Debug)]
pub struct ScriptOutput {
    /// The exit status.
    pub status: ExitStatus,
    /// Every line of its stdout, in order.
    pub lines: Vec<String>,
    /// All of its stderr.
    pub stderr: String,
}

impl ScriptOutput {
    /// Exited 0 with `ok` as its last line: how the tests' scripts say they passed.
    pub fn ok(&self) -> bool {
        self.status.success() && self.lines.last().is_some_and(|l| l == "ok")
    }

    /// Exited 0 and printed `ok` somewhere in its output.
    pub fn said_ok(&self) -> bool {
        self.status.success() && self.lines.iter().any(|l| l.contains("ok"))
    }

    /// Everything it said, for a failure message.
    pub fn transcript(&self) -> String {
        format!("({}):\n{}\n{}", self.status, self.lines.join("\n"), self.stderr)
    }
}

impl ClientScript {
    /// Starts `script` with the tests' Python ([`python`]) and `args` (`sys.argv[1:]`); its
    /// stdin stays open for [`ClientScript::answer`].
    pub fn python(script: &str, args: &[&str]) -> Result<Self> {
        let mut command = tokio::process::Command::new(python()?);
        command.arg("-c").arg(script).args(args);
        Self::spawn(command)
    }

    /// Starts `script` with Node.js, KafkaJS on its module path ([`node_modules`]), and
    /// `args` (`process.argv.slice(1)`: `node -e` puts no script name before them); its
    /// stdin stays open for [`ClientScript::answer`].
    pub fn node(script: &str, args: &[&str]) -> Result<Self> {
        let mut command = tokio::process::Command::new("node");
        command
            .arg("-e")
            .arg(script)
            .args(args)
            .env("NODE_PATH", node_modules()?)
            // KafkaJS 2 warns on every producer that its default partitioner changed in 2.0.
            .env("KAFKAJS_NO_PARTITIONER_WARNING", "1");
        Self::spawn(command)
    }

    fn spawn(mut command: tokio::process::Command) -> Result<Self> {
        let program = command.as_std().get_program().to_string_lossy().into_owned();
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting a {program} script"))?;
        let stdin = child.stdin.take();
        let lines = BufReader::new(child.stdout.take().context("the script's stdout")?).lines();
        let mut pipe = child.stderr.take().context("the script's stderr")?;
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&stderr);
        let stderr_drain = tokio::spawn(async move {
            let mut chunk = [0u8; 8192];
            while let Ok(read @ 1..) = pipe.read(&mut chunk).await {
                sink.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(&chunk[..read]);
            }
        });
        Ok(Self { child, stdin, lines, stdout: Vec::new(), stderr, stderr_drain: Some(stderr_drain) })
    }

    /// The next line the script prints; `None` once it closed its output.
    pub async fn next_line(&mut self) -> Result<Option<String>> {
        let Some(line) = self.lines.next_line().await? else { return Ok(None) };
        self.stdout.push(line.clone());
        Ok(Some(line))
    }

    /// Closes the script's stdin: it reads end of file from then on.
    pub fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    /// Every line printed so far.
    pub fn stdout(&self) -> &[String] {
        &self.stdout
    }

    /// Its stderr so far.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }

    /// Everything it said so far on both outputs, for the message of a test that gives up
    /// on it while it runs.
    pub fn transcript(&self) -> String {
        format!("{}\n---- stderr ----\n{}", self.stdout.join("\n"), self.stderr())
    }

    /// Writes `line` and a newline to the script's stdin.
    pub async fn answer(&mut self, line: &str) -> Result<()> {
        let stdin = self.stdin.as_mut().context("the script's stdin is closed")?;
        stdin.write_all(format!("{line}\n").as_bytes()).await?;
        stdin.flush().await?;
        Ok(())
    }

    /// Kills the script (SIGKILL) and waits for it; [`ClientScript::finish`] then says
    /// what it printed.
    pub async fn kill(&mut self) -> Result<()> {
        self.child.kill().await?;
        Ok(())
    }

    /// Reads the rest of its output and waits for it to exit. Borrowed, not consumed, so
    /// that a test whose deadline cut this short can still say what the script printed
    /// ([`ClientScript::stdout`]).
    pub async fn finish(&mut self) -> Result<ScriptOutput> {
        while self.next_line().await?.is_some() {}
        drop(self.stdin.take());
        let status = self.child.wait().await?;
        if let Some(drain) = self.stderr_drain.take() {
            // Ends at the script's exit (its stderr closes); a panic lost nothing kept so far.
            let _ = drain.await;
        }
        Ok(ScriptOutput { status, lines: self.stdout.clone(), stderr: self.stderr() })
    }
}

/// Runs the Python `script` with `args` and nothing on its stdin to its end, within
/// `timeout`: how it ended, or an error if it could not start or outlived `timeout` (then
/// it is killed).
pub async fn run_python(script: &str, args: &[&str], timeout: Duration) -> Result<ScriptOutput> {
    run_to_end(ClientScript::python(script, args)?, timeout).await
}

/// Runs the KafkaJS `script` as [`run_python`] runs a Python one.
pub async fn run_node(script: &str, args: &[&str], timeout: Duration) -> Result<ScriptOutput> {
    run_to_end(ClientScript::node(script, args)?, timeout).await
}

async fn run_to_end(mut script: ClientScript, timeout: Duration) -> Result<ScriptOutput> {
    script.close_stdin();
    match tokio::time::timeout(timeout, script.finish()).await {
        Ok(output) => output,
        Err(_) => bail!("the script did not finish within {timeout:?}"),
    }
}
