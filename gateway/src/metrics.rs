//! Prometheus text exposition of the gateway's counters (`GET /metrics`): requests and
//! errors by API and status, events and bytes published, request latency histograms, and
//! the producer buffer in use.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use fjord_metrics::{family, sample, Kind};

/// Latency bucket bounds, seconds.
const BUCKETS: [f64; 12] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

#[derive(Default)]
struct Histogram {
    /// Cumulative counts are computed at render time; these are per bucket (+Inf last).
    buckets: [u64; BUCKETS.len() + 1],
    sum: f64,
    count: u64,
}

#[derive(Default)]
struct State {
    requests: BTreeMap<(&'static str, u16), u64>,
    events: BTreeMap<&'static str, u64>,
    bytes: BTreeMap<&'static str, u64>,
    latency: BTreeMap<&'static str, Histogram>,
}

/// The gateway's counters. One mutex: updates are a few additions per request.
#[derive(Default)]
pub(crate) struct Metrics {
    state: Mutex<State>,
}

impl Metrics {
    /// Counts one finished request of `api` (e.g. `http_ndjson`) with its status, the
    /// events and bytes it published, and how long it took.
    pub(crate) fn record(&self, api: &'static str, status: u16, events: usize, bytes: usize, elapsed: Duration) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        *s.requests.entry((api, status)).or_default() += 1;
        if events > 0 {
            *s.events.entry(api).or_default() += events as u64;
            *s.bytes.entry(api).or_default() += bytes as u64;
        }
        let h = s.latency.entry(api).or_default();
        let secs = elapsed.as_secs_f64();
        let i = BUCKETS.iter().position(|b| secs <= *b).unwrap_or(BUCKETS.len());
        h.buckets[i] += 1;
        h.sum += secs;
        h.count += 1;
    }

    /// The exposition text.
    pub(crate) fn render(&self, buffer_used: usize, buffer_capacity: usize) -> String {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        family(&mut out, "fjord_gateway_requests_total", Kind::Counter, "Requests answered, by API and status.");
        for ((api, status), n) in &s.requests {
            sample(&mut out, "fjord_gateway_requests_total", &format!("api=\"{api}\",status=\"{status}\""), n);
        }
        family(
            &mut out,
            "fjord_gateway_errors_total",
            Kind::Counter,
            "Requests answered with an error status (4xx/5xx), by API and status.",
        );
        for ((api, status), n) in s.requests.iter().filter(|((_, st), _)| *st >= 400) {
            sample(&mut out, "fjord_gateway_errors_total", &format!("api=\"{api}\",status=\"{status}\""), n);
        }
        family(&mut out, "fjord_gateway_events_total", Kind::Counter, "Events published, by API.");
        for (api, n) in &s.events {
            sample(&mut out, "fjord_gateway_events_total", &format!("api=\"{api}\""), n);
        }
        family(&mut out, "fjord_gateway_bytes_total", Kind::Counter, "Event bytes (key, value, headers) published, by API.");
        for (api, n) in &s.bytes {
            sample(&mut out, "fjord_gateway_bytes_total", &format!("api=\"{api}\""), n);
        }
        family(&mut out, "fjord_gateway_request_duration_seconds", Kind::Histogram, "Request latency, by API.");
        for (api, h) in &s.latency {
            let mut cumulative = 0;
            for (i, bound) in BUCKETS.iter().enumerate() {
                cumulative += h.buckets[i];
                sample(
                    &mut out,
                    "fjord_gateway_request_duration_seconds_bucket",
                    &format!("api=\"{api}\",le=\"{bound}\""),
                    cumulative,
                );
            }
            sample(&mut out, "fjord_gateway_request_duration_seconds_bucket", &format!("api=\"{api}\",le=\"+Inf\""), h.count);
            sample(&mut out, "fjord_gateway_request_duration_seconds_sum", &format!("api=\"{api}\""), h.sum);
            sample(&mut out, "fjord_gateway_request_duration_seconds_count", &format!("api=\"{api}\""), h.count);
        }
        family(&mut out, "fjord_gateway_buffer_used_bytes", Kind::Gauge, "Bytes of events accepted and not yet acknowledged.");
        sample(&mut out, "fjord_gateway_buffer_used_bytes", "", buffer_used);
        family(&mut out, "fjord_gateway_buffer_capacity_bytes", Kind::Gauge, "Bound on fjord_gateway_buffer_used_bytes.");
        sample(&mut out, "fjord_gateway_buffer_capacity_bytes", "", buffer_capacity);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_cumulative_histograms() {
        let m = Metrics::default();
        m.record("http_ndjson", 200, 10, 2000, Duration::from_millis(3));
        m.record("http_ndjson", 200, 5, 1000, Duration::from_millis(30));
        m.record("http_ndjson", 400, 0, 0, Duration::from_secs(20));
        let text = m.render(7, 100);
        assert!(text.contains("fjord_gateway_requests_total{api=\"http_ndjson\",status=\"200\"} 2\n"), "{text}");
        assert!(text.contains("fjord_gateway_errors_total{api=\"http_ndjson\",status=\"400\"} 1\n"));
        assert!(text.contains("fjord_gateway_events_total{api=\"http_ndjson\"} 15\n"));
        assert!(text.contains("fjord_gateway_bytes_total{api=\"http_ndjson\"} 3000\n"));
        assert!(text.contains("le=\"0.005\"} 1\n"));
        assert!(text.contains("le=\"0.05\"} 2\n"));
        assert!(text.contains("le=\"10\"} 2\n"));
        assert!(text.contains("le=\"+Inf\"} 3\n"));
        assert!(text.contains("fjord_gateway_buffer_used_bytes 7\n"));
    }
}
