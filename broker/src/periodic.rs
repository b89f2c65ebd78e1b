//! The timer of the broker's background loops (retention, flush, checkpoints, the log
//! cleaner, ISR expiry, group sessions).

use std::time::Duration;

use tokio::time::{interval_at, Instant, Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

/// The shortest period: a period of 0 from the config must not make a loop spin.
const MIN_PERIOD: Duration = Duration::from_millis(10);

/// Ticks every `period`, the first time one period after it is made. A round that
/// overruns the period delays the next tick rather than firing a burst of ticks to
/// catch up: a slow retention pass must not be followed by several more at once.
pub(crate) struct Periodic {
    interval: Interval,
}

impl Periodic {
    pub(crate) fn new(period: Duration) -> Self {
        let period = period.max(MIN_PERIOD);
        let mut interval = interval_at(Instant::now() + period, period);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Self { interval }
    }

    /// Waits for the next tick.
    pub(crate) async fn tick(&mut self) {
        self.interval.tick().await;
    }

    /// Waits for the next tick; false once `shutdown` is cancelled, so a loop is
    /// `while periodic.tick_until(&shutdown).await { ... }`.
    pub(crate) async fn tick_until(&mut self, shutdown: &CancellationToken) -> bool {
        tokio::select! {
            _ = self.interval.tick() => true,
            () = shutdown.cancelled() => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Paused time: the clock moves only when every task waits on a timer, so the
    // instants are exact.

    #[tokio::test(start_paused = true)]
    async fn the_first_tick_comes_one_period_after_the_start() {
        let start = Instant::now();
        let mut periodic = Periodic::new(Duration::from_millis(50));
        periodic.tick().await;
        assert_eq!(start.elapsed(), Duration::from_millis(50));
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_round_delays_the_next_tick_instead_of_a_burst() {
        let period = Duration::from_millis(50);
        let mut periodic = Periodic::new(period);
        periodic.tick().await;
        // A round that takes three periods: the missed tick fires at once, and the next
        // a whole period after it, not straight away to catch up.
        tokio::time::sleep(period * 3).await;
        let late = Instant::now();
        periodic.tick().await;
        assert_eq!(late.elapsed(), Duration::ZERO);
        periodic.tick().await;
        assert_eq!(late.elapsed(), period);
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_period_is_raised_to_the_minimum() {
        let start = Instant::now();
        let mut periodic = Periodic::new(Duration::ZERO);
        periodic.tick().await;
        periodic.tick().await;
        assert_eq!(start.elapsed(), MIN_PERIOD * 2);
    }

    #[tokio::test(start_paused = true)]
    async fn tick_until_stops_on_shutdown() {
        let shutdown = CancellationToken::new();
        let mut periodic = Periodic::new(Duration::from_millis(10));
        assert!(periodic.tick_until(&shutdown).await);
        shutdown.cancel();
        let mut periodic = Periodic::new(Duration::from_secs(3_600));
        assert!(!periodic.tick_until(&shutdown).await);
    }
}
