//! `fjord bench connect`: new connections per second, as a client makes them (TCP, the
//! TLS handshake, the SASL exchange, ApiVersions) and closes them again; what a broker
//! pays when clients reconnect often (serverless functions, short-lived jobs).
//!
//! Two phases in one run against the same listener, so the figures compare: first
//! without SASL (TLS only on a TLS listener: ApiVersions is answered before
//! authentication), then with the configured security (TLS + the SASL mechanism). The
//! difference is what authentication costs. Each phase opens `--messages` connections,
//! `--concurrency` at a time. The client's own work counts too (SCRAM makes the client
//! derive the salted password, 4096 PBKDF2 rounds and more, for every connection, as
//! librdkafka and the Java client do); with `--broker-pid` the report gives the broker's
//! CPU per connection, which is the server's cost alone.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use fjord_client::{ClientConfig, ConnectionProbe, SecurityProtocol};

use super::cpu::{self, CpuMeter};

/// One phase's result.
struct Phase {
    name: String,
    connections: u64,
    seconds: f64,
    broker_cpu: Option<std::time::Duration>,
    client_cpu: std::time::Duration,
}

/// Runs both phases and prints them.
pub(crate) async fn run(
    client: ClientConfig,
    connections: u64,
    concurrency: usize,
    broker_pids: &[u32],
    json: bool,
) -> anyhow::Result<()> {
    if concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    let broker = client.bootstrap_servers.first().cloned().context("no bootstrap server")?;
    let mut phases = Vec::new();
    let security = client.security.clone();
    let without_sasl = match security.protocol {
        SecurityProtocol::SaslSsl => Some(SecurityProtocol::Ssl),
        SecurityProtocol::SaslPlaintext => Some(SecurityProtocol::Plaintext),
        _ => None,
    };
    if let Some(protocol) = without_sasl {
        let mut plain = client.clone();
        plain.security.protocol = protocol;
        phases.push((format!("{protocol:?} (no SASL)"), plain));
    }
    let name = match security.protocol {
        p if p.uses_sasl() => format!("{p:?} {}", security.sasl_mechanism.name()),
        p => format!("{p:?}"),
    };
    phases.push((name, client));
    let mut results = Vec::new();
    for (name, config) in phases {
        results.push(phase(name, ConnectionProbe::new(config)?, &broker, connections, concurrency, broker_pids).await?);
    }
    for p in &results {
        let per_s = p.connections as f64 / p.seconds;
        let broker_us = p.broker_cpu.map(|c| cpu::micros_per_message(c, p.connections));
        let client_us = cpu::micros_per_message(p.client_cpu, p.connections);
        if json {
            let mut report = serde_json::json!({
                "mode": "connect",
                "security": p.name,
                "connections": p.connections,
                "concurrency": concurrency,
                "seconds": p.seconds,
                "connections_per_s": per_s,
                "client_cpu_us_per_connection": client_us,
            });
            if let Some(us) = broker_us {
                report["broker_cpu_us_per_connection"] = us.into();
            }
            println!("{report}");
        } else {
            let brokers = broker_us.map(|us| format!("; broker CPU {us:.0} µs/connection")).unwrap_or_default();
            println!(
                "connect {}: {} connections ({concurrency} at a time) in {:.2} s: {per_s:.0} connections/s{brokers}; client CPU {client_us:.0} µs/connection",
                p.name, p.connections, p.seconds
            );
        }
    }
    Ok(())
}

/// `connections` probes, `concurrency` at a time; any failure ends the run with it.
async fn phase(
    name: String,
    probe: ConnectionProbe,
    broker: &str,
    connections: u64,
    concurrency: usize,
    broker_pids: &[u32],
) -> anyhow::Result<Phase> {
    let brokers = (!broker_pids.is_empty()).then(|| CpuMeter::start(broker_pids)).transpose()?;
    let client = CpuMeter::start(&[std::process::id()])?;
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (probe, next, broker) = (probe.clone(), next.clone(), broker.to_owned());
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < connections {
                    probe.connect_once(&broker).await?;
                }
                Ok::<_, fjord_client::Error>(())
            })
        })
        .collect();
    for worker in workers {
        worker.await?.with_context(|| format!("a {name} connection failed"))?;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(Phase { name, connections, seconds, broker_cpu: brokers.map(|m| m.used()).transpose()?, client_cpu: client.used()? })
}
