//! Per-client rate limits: requests/s and bytes/s per principal (or, for anonymous
//! callers, per IP address), refused with 429 + `Retry-After` / RESOURCE_EXHAUSTED.
//!
//! Each client has two token buckets, one per limit, each holding up to `rate x burst`
//! tokens and refilled at `rate` per second. A request is admitted while the client has a
//! request token and its byte bucket is not in debt; its bytes are charged as they arrive
//! (HTTP: the body as sent, compressed if it is, like Kafka's produce quotas; gRPC: the
//! events' size) and may drive the byte bucket below zero, which refuses the client's
//! next requests until the debt is paid back. So a request of unknown size (a chunked or
//! compressed body) is never buffered to be measured first, and one large body is
//! allowed once and then paid for.
//!
//! A small token bucket rather than a crate such as `governor`: the two limits must be
//! checked together (a request refused for its bytes must not spend a request token),
//! bytes are charged after admission and may exceed the burst, and the table of clients
//! must stay bounded under many distinct clients, with eviction we control.
//!
//! Memory: at most `max_clients` buckets. A bucket refilled to capacity holds nothing a
//! fresh one would not, so it is dropped first; when every tracked client is active, the
//! least recently seen tenth is dropped (those clients start again with a full burst).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::ClientLimits;
use crate::{Error, Result};

/// Longest `Retry-After` a refusal names: a client deep in byte debt is told to come back
/// within this, and is refused again then if still in debt.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Request tokens (may be fractional).
    requests: f64,
    /// Byte tokens; negative while in debt.
    bytes: f64,
    /// When the buckets were last refilled.
    at: Instant,
}

/// The limiter shared by both fronts.
pub(crate) struct Limiter {
    limits: ClientLimits,
    clients: Mutex<HashMap<String, Bucket>>,
}

impl Limiter {
    pub(crate) fn new(limits: ClientLimits) -> Self {
        Self { limits, clients: Mutex::new(HashMap::new()) }
    }

    /// Whether any limit is set.
    pub(crate) fn enabled(&self) -> bool {
        self.limits.requests_per_sec > 0 || self.limits.bytes_per_sec > 0
    }

    fn request_capacity(&self) -> f64 {
        (f64::from(self.limits.requests_per_sec) * self.limits.burst.as_secs_f64()).max(1.0)
    }

    fn byte_capacity(&self) -> f64 {
        (self.limits.bytes_per_sec as f64 * self.limits.burst.as_secs_f64()).max(1.0)
    }

    fn full(&self, now: Instant) -> Bucket {
        Bucket { requests: self.request_capacity(), bytes: self.byte_capacity(), at: now }
    }

    fn refill(&self, b: &mut Bucket, now: Instant) {
        let secs = now.saturating_duration_since(b.at).as_secs_f64();
        b.requests = (b.requests + secs * f64::from(self.limits.requests_per_sec)).min(self.request_capacity());
        b.bytes = (b.bytes + secs * self.limits.bytes_per_sec as f64).min(self.byte_capacity());
        b.at = now;
    }

    /// Admits one request of `client` or refuses it with [`Error::RateLimited`].
    pub(crate) fn admit(&self, client: &str) -> Result<()> {
        self.admit_at(client, Instant::now())
    }

    pub(crate) fn admit_at(&self, client: &str, now: Instant) -> Result<()> {
        if !self.enabled() {
            return Ok(());
        }
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        let b = self.bucket(&mut clients, client, now);
        let refuse = |limit: String, wait_secs: f64| Error::RateLimited {
            client: client.to_string(),
            limit,
            retry_after: Duration::from_secs_f64(wait_secs.max(0.001)).min(MAX_RETRY_AFTER),
        };
        let rps = self.limits.requests_per_sec;
        if rps > 0 && b.requests < 1.0 {
            return Err(refuse(format!("{rps} requests/s"), (1.0 - b.requests) / f64::from(rps)));
        }
        let bps = self.limits.bytes_per_sec;
        if bps > 0 && b.bytes < 0.0 {
            return Err(refuse(format!("{bps} bytes/s"), -b.bytes / bps as f64));
        }
        if rps > 0 {
            b.requests -= 1.0;
        }
        Ok(())
    }

    /// Charges `n` bytes to `client` (admitted before); may leave it in debt.
    pub(crate) fn charge(&self, client: &str, n: usize) {
        self.charge_at(client, n, Instant::now())
    }

    pub(crate) fn charge_at(&self, client: &str, n: usize, now: Instant) {
        if self.limits.bytes_per_sec == 0 || n == 0 {
            return;
        }
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        self.bucket(&mut clients, client, now).bytes -= n as f64;
    }

    /// The client's bucket, refilled to `now`; created (evicting if at the cap) if new.
    fn bucket<'a>(&self, clients: &'a mut HashMap<String, Bucket>, client: &str, now: Instant) -> &'a mut Bucket {
        if !clients.contains_key(client) && clients.len() >= self.limits.max_clients.max(1) {
            self.evict(clients, now);
        }
        let b = clients.entry(client.to_string()).or_insert_with(|| self.full(now));
        self.refill(b, now);
        b
    }

    /// Frees room: drops buckets that refilled to capacity (idle clients), and if that
    /// frees less than a tenth of the table, the least recently seen clients too, so
    /// eviction runs once per tenth of the cap, not per new client.
    fn evict(&self, clients: &mut HashMap<String, Bucket>, now: Instant) {
        let (requests, bytes) = (self.request_capacity(), self.byte_capacity());
        clients.retain(|_, b| {
            // Refilled on a copy: `at` stays the time the client was last seen.
            let mut refilled = *b;
            self.refill(&mut refilled, now);
            refilled.requests < requests || refilled.bytes < bytes
        });
        let target = self.limits.max_clients.max(1) - self.limits.max_clients.div_ceil(10).max(1);
        if clients.len() > target {
            let mut seen: Vec<Instant> = clients.values().map(|b| b.at).collect();
            let drop = clients.len() - target;
            let (_, cutoff, _) = seen.select_nth_unstable(drop - 1);
            let cutoff = *cutoff;
            let mut dropped = 0;
            clients.retain(|_, b| {
                let keep = b.at > cutoff || dropped >= drop;
                dropped += usize::from(!keep);
                keep
            });
        }
    }

    /// Clients tracked now.
    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.clients.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(requests_per_sec: u32, bytes_per_sec: u64, max_clients: usize) -> Limiter {
        Limiter::new(ClientLimits { requests_per_sec, bytes_per_sec, burst: Duration::from_secs(1), max_clients })
    }

    fn retry_after(r: Result<()>) -> Duration {
        match r {
            Err(Error::RateLimited { retry_after, .. }) => retry_after,
            other => panic!("expected RateLimited, got {other:?}"),
        }
    }

    #[test]
    fn requests_per_second_per_client_with_retry_after() {
        let l = limiter(2, 0, 100);
        let t0 = Instant::now();
        l.admit_at("a", t0).unwrap();
        l.admit_at("a", t0).unwrap();
        let wait = retry_after(l.admit_at("a", t0));
        assert!((wait.as_secs_f64() - 0.5).abs() < 0.01, "{wait:?}");
        l.admit_at("b", t0).unwrap();
        l.admit_at("a", t0 + Duration::from_millis(500)).unwrap();
        assert!(l.admit_at("a", t0 + Duration::from_millis(500)).is_err());
        // Idle time refills to the burst, not beyond it.
        let later = t0 + Duration::from_secs(60);
        l.admit_at("a", later).unwrap();
        l.admit_at("a", later).unwrap();
        assert!(l.admit_at("a", later).is_err());
    }

    #[test]
    fn bytes_go_into_debt_and_refuse_until_paid_back() {
        let l = limiter(0, 1000, 100);
        let t0 = Instant::now();
        l.admit_at("a", t0).unwrap();
        l.charge_at("a", 3000, t0);
        let wait = retry_after(l.admit_at("a", t0));
        assert!((wait.as_secs_f64() - 2.0).abs() < 0.01, "2000 bytes of debt at 1000 bytes/s: {wait:?}");
        l.admit_at("b", t0).unwrap();
        assert!(l.admit_at("a", t0 + Duration::from_millis(1900)).is_err());
        l.admit_at("a", t0 + Duration::from_millis(2000)).unwrap();
        // A refusal for bytes spends no request token.
        let both = limiter(1, 1000, 100);
        both.charge_at("c", 5000, t0);
        assert!(both.admit_at("c", t0).is_err());
        both.admit_at("c", t0 + Duration::from_secs(4)).unwrap();
        // Retry-After is capped.
        l.charge_at("d", usize::MAX / 2, t0);
        assert_eq!(retry_after(l.admit_at("d", t0)), MAX_RETRY_AFTER);
    }

    #[test]
    fn the_table_stays_bounded_under_many_clients() {
        let l = limiter(1, 0, 1000);
        let t0 = Instant::now();
        for i in 0..100_000 {
            l.admit_at(&format!("ip:{i}"), t0 + Duration::from_micros(i)).unwrap();
            assert!(l.tracked() <= 1000);
        }
        // Idle clients (refilled to capacity) go first: an active one keeps its state,
        // though it was seen before all of them.
        let l = limiter(1, 1000, 1000);
        let t1 = t0 + Duration::from_secs(100);
        l.admit_at("busy", t1).unwrap();
        l.charge_at("busy", 100_000, t1);
        for i in 0..999 {
            l.admit_at(&format!("old:{i}"), t1).unwrap();
        }
        let t2 = t1 + Duration::from_secs(10);
        for i in 0..900 {
            l.admit_at(&format!("new:{i}"), t2).unwrap();
        }
        assert_eq!(l.tracked(), 901, "the idle clients were dropped, busy and the new ones kept");
        assert!(l.admit_at("busy", t2).is_err(), "busy kept its debt");
        assert!(!limiter(0, 0, 10).enabled());
    }
}
