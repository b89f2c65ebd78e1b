//! Network namespaces for a chaos run: one per node (ZooKeeper, each broker, the
//! clients), each with a veth pair to a bridge in a namespace of its own, and nftables
//! rules inside a node's namespace for the network faults.
//!
//! Names are `fjchaos-<pid>x<n>-<label>`: the pid of the process that made them, so a
//! later run can tell stale ones (their process is gone) from a parallel run's, and
//! [`sweep_stale`] removes what a killed run left behind. A [`Network`] deletes its
//! namespaces when dropped, on failure too.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{anyhow, bail, Context, Result};

/// Prefix of every namespace a chaos run creates.
pub const PREFIX: &str = "fjchaos-";
/// The /24 the nodes live in (only inside the run's namespaces, never on the host).
const SUBNET: &str = "10.99.0";

/// One node's namespace.
#[derive(Debug, Clone)]
pub struct Node {
    /// Short name: `zk`, `b0`, `clients`...
    pub label: String,
    /// Namespace name (for `ip netns exec`).
    pub netns: String,
    /// Its address on the bridge.
    pub ip: String,
}

/// The faults active on a node's inbound traffic, rendered as its nftables table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    /// Packets from these addresses are dropped.
    pub blocked: Vec<String>,
    /// Percentage (1-99) of packets from other nodes dropped at random.
    pub loss_percent: u8,
}

impl Rules {
    fn render(&self) -> String {
        let mut rules = String::new();
        if !self.blocked.is_empty() {
            rules.push_str(&format!("    ip saddr {{ {} }} drop\n", self.blocked.join(", ")));
        }
        if self.loss_percent > 0 {
            rules.push_str(&format!("    iifname \"eth0\" numgen random mod 100 < {} drop\n", self.loss_percent.min(99)));
        }
        // Re-created in one transaction: `add` makes the delete succeed on a fresh node.
        format!(
            "add table inet chaos\ndelete table inet chaos\ntable inet chaos {{\n  chain input {{\n    type filter hook input priority -10; policy accept;\n{rules}  }}\n}}\n"
        )
    }
}

/// The namespaces of one run, deleted on drop.
#[derive(Debug)]
pub struct Network {
    bridge: String,
    nodes: BTreeMap<String, Node>,
    rules: BTreeMap<String, Rules>,
}

impl Network {
    /// Creates the bridge namespace and one namespace per label, with addresses
    /// `10.99.0.<2+i>` in label order.
    pub fn create(labels: &[&str]) -> Result<Self> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let run = format!("{PREFIX}{}x{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let bridge = format!("{run}-br");
        let mut network = Self { bridge: bridge.clone(), nodes: BTreeMap::new(), rules: BTreeMap::new() };
        // Every namespace is recorded before it is configured, so a failure part-way
        // still deletes it (drop).
        ip(&["netns", "add", &bridge]).context(
            "could not create a network namespace (a chaos run needs root and iproute2: `cargo xtask test` installs it)",
        )?;
        ip(&["-n", &bridge, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &bridge, "link", "set", "br0", "up"])?;
        ip(&["-n", &bridge, "link", "set", "lo", "up"])?;
        for (i, label) in labels.iter().enumerate() {
            let netns = format!("{run}-{label}");
            let node = Node { label: label.to_string(), netns: netns.clone(), ip: format!("{SUBNET}.{}", 2 + i) };
            ip(&["netns", "add", &netns])?;
            network.nodes.insert(label.to_string(), node.clone());
            let veth = format!("v{i}");
            ip(&["-n", &bridge, "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &netns])?;
            ip(&["-n", &bridge, "link", "set", &veth, "master", "br0", "up"])?;
            ip(&["-n", &netns, "addr", "add", &format!("{}/24", node.ip), "dev", "eth0"])?;
            ip(&["-n", &netns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &netns, "link", "set", "lo", "up"])?;
            network
                .set_rules(label, Rules::default())
                .context("nftables in a namespace (`cargo xtask test` installs nftables)")?;
        }
        Ok(network)
    }

    /// A node by label.
    pub fn node(&self, label: &str) -> Result<&Node> {
        self.nodes.get(label).ok_or_else(|| anyhow!("no node {label} in the chaos network"))
    }

    /// The current rules of a node.
    pub fn rules(&self, label: &str) -> Rules {
        self.rules.get(label).cloned().unwrap_or_default()
    }

    /// Replaces a node's inbound rules.
    pub fn set_rules(&mut self, label: &str, rules: Rules) -> Result<()> {
        let netns = self.node(label)?.netns.clone();
        nft(&netns, &rules.render())?;
        self.rules.insert(label.to_owned(), rules);
        Ok(())
    }

    /// Redirects every connection node `label` opens to a broker port (`port`, on the
    /// bridge's subnet) to `proxy` in the same namespace, except the proxy's own
    /// (marked [`super::proxy::MARK`]).
    pub fn intercept(&self, label: &str, port: u16, proxy: &str) -> Result<()> {
        let netns = &self.node(label)?.netns;
        let rules = format!(
            "table ip chaosnat {{\n  chain output {{\n    type nat hook output priority -100; policy accept;\n    meta mark != {:#x} ip daddr {SUBNET}.0/24 tcp dport {port} dnat to {proxy}\n  }}\n}}\n",
            super::proxy::MARK
        );
        nft(netns, &rules)
    }

    /// Drops traffic from every node of `from` to every node of `to` (one way).
    pub fn block(&mut self, from: &[&str], to: &[&str]) -> Result<()> {
        for &target in to {
            let mut rules = self.rules(target);
            for &source in from {
                let ip = self.node(source)?.ip.clone();
                if !rules.blocked.contains(&ip) && source != target {
                    rules.blocked.push(ip);
                }
            }
            self.set_rules(target, rules)?;
        }
        Ok(())
    }

    /// Removes every network fault.
    pub fn heal(&mut self) -> Result<()> {
        let labels: Vec<String> = self.nodes.keys().cloned().collect();
        for label in labels {
            if self.rules(&label) != Rules::default() {
                self.set_rules(&label, Rules::default())?;
            }
        }
        Ok(())
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for node in self.nodes.values() {
            if let Err(e) = delete_netns(&node.netns) {
                eprintln!("chaos: {e:#}");
            }
        }
        if let Err(e) = delete_netns(&self.bridge) {
            eprintln!("chaos: {e:#}");
        }
    }
}

/// Removes the namespaces (and kills the processes in them) of runs whose process is
/// gone: what a run killed before its clean-up left behind. Returns how many.
pub fn sweep_stale() -> Result<usize> {
    let output = Command::new("ip").args(["netns", "list"]).output().context("could not run `ip netns list` (iproute2)")?;
    let mut removed = 0;
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else { continue };
        let Some(rest) = name.strip_prefix(PREFIX) else { continue };
        let Some(pid) = rest.split('x').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        delete_netns(name)?;
        removed += 1;
    }
    Ok(removed)
}

/// Kills what still runs in a namespace, then deletes it.
fn delete_netns(name: &str) -> Result<()> {
    if let Ok(output) = Command::new("ip").args(["netns", "pids", name]).output() {
        for pid in String::from_utf8_lossy(&output.stdout).split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            if pid as u32 != std::process::id() {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
        }
    }
    ip(&["netns", "delete", name]).with_context(|| format!("deleting network namespace {name}"))
}

/// Loads an nftables script into namespace `netns`.
fn nft(netns: &str, script: &str) -> Result<()> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", netns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("could not run nft (a chaos run needs nftables: `cargo xtask test` installs it)")?;
    child.stdin.take().ok_or_else(|| anyhow!("nft stdin"))?.write_all(script.as_bytes())?;
    let output = child.wait_with_output()?;
    if !output.status.success() {
        bail!("nft in {netns} failed: {}\n{script}", String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}

/// Runs `ip ARGS`, failing with its stderr.
fn ip(args: &[&str]) -> Result<()> {
    let output = Command::new("ip").args(args).output().context("could not run `ip` (iproute2)")?;
    if !output.status.success() {
        bail!("ip {} failed: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}

/// Moves the calling thread into namespace `netns`: every socket it (and every thread
/// it starts afterwards) opens is then in that namespace.
pub fn enter(netns: &str) -> Result<()> {
    let path = format!("/var/run/netns/{netns}");
    let file = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).with_context(|| format!("entering network namespace {netns}"))
}
