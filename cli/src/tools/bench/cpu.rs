//! CPU time of processes from `/proc/<pid>/stat` (Linux): what `fjord bench
//! --broker-pid` divides by the messages to report the brokers' CPU per message, the
//! figure that stays meaningful on a shared, noisy machine where throughput does not.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};

/// `/proc` reports CPU times in clock ticks of `USER_HZ`, which Linux fixes at 100 per
/// second on every architecture Fjord builds for (`getconf CLK_TCK`).
const TICKS_PER_SECOND: u64 = 100;

/// User plus system CPU time of process `pid` so far (all its threads, live and exited).
pub(crate) fn process_cpu(pid: u32) -> anyhow::Result<Duration> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(Path::new(&path)).with_context(|| format!("reading the CPU time of process {pid}"))?;
    parse_stat(&stat).with_context(|| format!("{path}: unexpected format"))
}

/// utime and stime, fields 14 and 15 of a `/proc/<pid>/stat` line. The command name
/// (field 2, in parentheses) may hold spaces and parentheses itself, so the fields are
/// counted from the last `)`.
fn parse_stat(stat: &str) -> anyhow::Result<Duration> {
    let Some(end) = stat.rfind(')') else { bail!("no command name") };
    // After the name: state (field 3) ... utime is the 12th field from there.
    let mut fields = stat[end + 1..].split_ascii_whitespace().skip(11);
    let mut tick = || -> anyhow::Result<u64> {
        let field = fields.next().context("too few fields")?;
        field.parse().with_context(|| format!("not a tick count: {field}"))
    };
    let ticks = tick()? + tick()?;
    Ok(Duration::from_millis(ticks * 1000 / TICKS_PER_SECOND))
}

/// The CPU time of several processes, read at the start of a measurement.
pub(crate) struct CpuMeter {
    pids: Vec<u32>,
    start: Vec<Duration>,
}

impl CpuMeter {
    /// Reads the CPU time of each of `pids` now; fails when one cannot be read.
    pub(crate) fn start(pids: &[u32]) -> anyhow::Result<Self> {
        let start = pids.iter().map(|&pid| process_cpu(pid)).collect::<anyhow::Result<_>>()?;
        Ok(Self { pids: pids.to_vec(), start })
    }

    /// The CPU time all of them used since [`CpuMeter::start`].
    pub(crate) fn used(&self) -> anyhow::Result<Duration> {
        let mut total = Duration::ZERO;
        for (&pid, &start) in self.pids.iter().zip(&self.start) {
            total += process_cpu(pid)?.saturating_sub(start);
        }
        Ok(total)
    }
}

/// Microseconds of CPU per message.
pub(crate) fn micros_per_message(cpu: Duration, messages: u64) -> f64 {
    cpu.as_secs_f64() * 1e6 / messages.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utime_and_stime_are_read_after_the_command_name() {
        // A name with a space and a parenthesis; utime 1234, stime 66 ticks.
        let line = "4242 (fjord (x) y) S 1 4242 4242 0 -1 4194560 1000 0 0 0 1234 66 0 0 20 0 9 0 100 1000000 500";
        assert_eq!(parse_stat(line).unwrap(), Duration::from_millis(13_000));
        assert!(parse_stat("4242 (fjord) S 1 2").is_err(), "too short");
        assert!(parse_stat("no name here").is_err());
        assert!(parse_stat("1 (a) S 1 1 1 0 -1 0 0 0 0 0 x 1").is_err(), "not a number");
    }

    #[test]
    fn this_process_uses_cpu_and_a_missing_one_is_an_error() {
        let meter = CpuMeter::start(&[std::process::id()]).unwrap();
        // Spin until the kernel has counted 30 ms of CPU (bounded: a busy machine may
        // give this thread little of each second).
        let spin = std::time::Instant::now();
        let mut x = 0u64;
        while meter.used().unwrap() < Duration::from_millis(30) {
            assert!(spin.elapsed() < Duration::from_secs(20), "no CPU time counted in 20 s");
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        assert!(process_cpu(u32::MAX).is_err());
        assert!((micros_per_message(Duration::from_secs(2), 1_000_000) - 2.0).abs() < 1e-9);
    }
}
