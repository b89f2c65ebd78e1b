//! The open-loop pieces of `fjord bench --rate`, as pure logic: when each message is
//! due, and the latency histogram.
//!
//! An open-loop load generator sends message `i` at `start + i / rate` whatever happened
//! to the messages before it, and measures each latency from that scheduled time, not
//! from when the send actually happened. A closed loop (send, wait, send) measures only
//! the requests it managed to send: when the system stalls, it stops sending, so the
//! stall shows up in one sample instead of in every message that should have gone out
//! meanwhile ("coordinated omission"). Here a sender that falls behind sends the overdue
//! messages at once, and their latencies start at their scheduled times, so a stall is
//! counted in full.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// Message `i` is due at `start + i * interval`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    start: Instant,
    /// Nanoseconds between two messages (fractional, so any rate keeps its average).
    interval_ns: f64,
}

impl Schedule {
    /// `rate` messages per second from `start`; `rate` must be positive.
    pub(crate) fn new(start: Instant, rate: u64) -> Self {
        debug_assert!(rate > 0);
        Self { start, interval_ns: 1e9 / rate.max(1) as f64 }
    }

    /// When message `i` is due.
    pub(crate) fn due_at(&self, i: u64) -> Instant {
        self.start + Duration::from_nanos((i as f64 * self.interval_ns) as u64)
    }

    /// How many messages are due by `now` (messages `0..n`).
    pub(crate) fn due_by(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.start).as_nanos() as f64;
        (elapsed / self.interval_ns).floor() as u64 + 1
    }
}

/// Largest latency recorded, in microseconds: an hour. Longer ones count as an hour.
const MAX_MICROS: u64 = 3_600_000_000;

/// Latencies in microseconds, in an HDR histogram (3 significant digits: a value is off
/// by at most 0.1%, with fixed memory whatever the count).
pub(crate) struct Latencies {
    histogram: Histogram<u64>,
}

impl Latencies {
    pub(crate) fn new() -> Self {
        let histogram = Histogram::new_with_bounds(1, MAX_MICROS, 3).expect("invariant: valid fixed histogram bounds");
        Self { histogram }
    }

    /// Records one latency (sub-microsecond ones as 1 µs, over an hour as an hour).
    pub(crate) fn record(&mut self, latency: Duration) {
        self.record_micros(latency.as_micros().min(u128::from(MAX_MICROS)) as u64);
    }

    pub(crate) fn record_micros(&mut self, micros: u64) {
        self.histogram.saturating_record(micros.clamp(1, MAX_MICROS));
    }

    /// Records the latency of a message due at `due` that completed at `done`.
    pub(crate) fn record_since(&mut self, due: Instant, done: Instant) {
        self.record(done.saturating_duration_since(due));
    }

    /// Adds every latency of `other` (another producer's, in the same run).
    pub(crate) fn merge(&mut self, other: &Latencies) {
        // Same bounds on both sides, so nothing can be out of range.
        self.histogram.add(&other.histogram).expect("invariant: histograms with the same bounds");
    }

    pub(crate) fn count(&self) -> u64 {
        self.histogram.len()
    }

    /// The latency at quantile `q` (0..=1) in milliseconds; 0 when nothing was recorded.
    pub(crate) fn quantile_ms(&self, q: f64) -> f64 {
        if self.histogram.is_empty() {
            return 0.0;
        }
        self.histogram.value_at_quantile(q) as f64 / 1000.0
    }

    /// The largest latency in milliseconds; 0 when nothing was recorded.
    pub(crate) fn max_ms(&self) -> f64 {
        if self.histogram.is_empty() {
            return 0.0;
        }
        self.histogram.max() as f64 / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn messages_are_due_at_fixed_intervals_from_the_start() {
        let start = Instant::now();
        let s = Schedule::new(start, 1_000);
        assert_eq!(s.due_at(0), start);
        assert_eq!(s.due_at(250), start + ms(250));
        assert_eq!(s.due_by(start), 1, "message 0 is due at once");
        assert_eq!(s.due_by(start + Duration::from_micros(999)), 1);
        assert_eq!(s.due_by(start + ms(1)), 2);
        assert_eq!(s.due_by(start + ms(10)), 11);
        // A rate that does not divide a second keeps its average.
        let s = Schedule::new(start, 3);
        assert_eq!(s.due_by(start + ms(1_000)), 4);
        assert_eq!(s.due_at(3_000), start + Duration::from_secs(1_000));
    }

    /// The sender stalls 200 ms while sending message 10 (rate 1000/s): the messages that
    /// fell due meanwhile are all due at once when it comes back, each keeps its own
    /// scheduled time, and so each latency includes the part of the stall it waited.
    #[test]
    fn a_stalled_send_keeps_the_schedule_and_the_latencies_include_the_stall() {
        let start = Instant::now();
        let s = Schedule::new(start, 1_000);
        let mut latencies = Latencies::new();
        // Messages 0..10 go out on time and are acknowledged 1 ms later.
        for i in 0..10 {
            latencies.record_since(s.due_at(i), s.due_at(i) + ms(1));
        }
        // Message 10 is sent on time but its send blocks until 210 ms.
        let back = start + ms(210);
        assert_eq!(s.due_by(back), 211, "messages 11..=210 fell due during the stall");
        // Everything up to 210 is then sent at once and acknowledged 1 ms later.
        for i in 10..s.due_by(back) {
            latencies.record_since(s.due_at(i), back + ms(1));
        }
        assert_eq!(latencies.count(), 211);
        // Message 10 waited the whole stall: 201 ms, counted from its scheduled time.
        assert!((latencies.max_ms() - 201.0).abs() < 0.5, "max {}", latencies.max_ms());
        // Half the messages waited over 100 ms: a closed loop (latency from the actual
        // send) would have seen one slow message and 210 fast ones.
        let median = latencies.quantile_ms(0.5);
        assert!((95.0..=106.0).contains(&median), "median {median}");
        assert!(latencies.quantile_ms(0.99) > 190.0);
    }

    #[test]
    fn the_histogram_reports_quantiles_and_the_maximum_within_its_precision() {
        let mut latencies = Latencies::new();
        assert_eq!((latencies.quantile_ms(0.99), latencies.max_ms()), (0.0, 0.0), "empty");
        for micros in 1..=10_000u64 {
            latencies.record_micros(micros);
        }
        let close = |got: f64, want: f64| (got - want).abs() <= want * 0.001 + 0.001;
        assert!(close(latencies.quantile_ms(0.5), 5.0), "{}", latencies.quantile_ms(0.5));
        assert!(close(latencies.quantile_ms(0.99), 9.9), "{}", latencies.quantile_ms(0.99));
        assert!(close(latencies.quantile_ms(0.999), 9.99), "{}", latencies.quantile_ms(0.999));
        assert!(close(latencies.max_ms(), 10.0), "{}", latencies.max_ms());
        // Out of range values are clamped, never refused.
        latencies.record(Duration::ZERO);
        latencies.record(Duration::from_secs(10 * 3600));
        assert!(close(latencies.max_ms(), 3_600_000.0), "{}", latencies.max_ms());
        assert_eq!(latencies.count(), 10_002);
    }
}
