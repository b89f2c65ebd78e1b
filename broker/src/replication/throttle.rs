//! Replication throttles (Kafka's `ReplicationQuotaManager`), as pure logic: a windowed
//! byte-rate limiter and the throttled-replica lists of a topic.
//!
//! Kafka throttles the catch-up traffic of a reassignment with two broker rates,
//! `leader.replication.throttled.rate` (bytes/s a leader sends to throttled followers)
//! and `follower.replication.throttled.rate` (bytes/s a follower fetches for its
//! throttled replicas), and two topic lists naming the replicas they apply to:
//! `leader.replication.throttled.replicas` and `follower.replication.throttled.replicas`,
//! each `*` or `partition:broker,...`. An entry `p:b` of the leader list throttles
//! partition `p` when broker `b` leads it; of the follower list, when `b` follows it.
//!
//! The rule, on both sides, is Kafka's: a throttled replica that is not in the ISR gets
//! no bytes while the measured rate is above the limit; the bytes of every throttled
//! replica (in the ISR or not) are counted. The rate is measured as Kafka's `SimpleRate`:
//! the bytes of the last 11 one-second windows over the time since the oldest began
//! (at least one window). A fetch is never cut short: the rate goes above the limit by
//! at most one fetch, then that many bytes wait out their time.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

/// The broker key of the leader's rate.
pub(crate) const LEADER_RATE: &str = "leader.replication.throttled.rate";
/// The broker key of the follower's rate.
pub(crate) const FOLLOWER_RATE: &str = "follower.replication.throttled.rate";
/// The topic key of the replicas a leader throttles.
pub(crate) const LEADER_REPLICAS: &str = "leader.replication.throttled.replicas";
/// The topic key of the replicas a follower throttles.
pub(crate) const FOLLOWER_REPLICAS: &str = "follower.replication.throttled.replicas";
/// No throttle (Kafka's default, Long.MAX_VALUE).
pub(crate) const UNLIMITED: u64 = i64::MAX as u64;

/// Kafka's replication quota windows: 10 whole windows and the current one, of 1 s.
const WINDOW: Duration = Duration::from_secs(1);
const SAMPLES: usize = 11;

/// A byte rate measured over the last [`SAMPLES`] windows of [`WINDOW`], against a limit.
#[derive(Debug, Clone)]
pub(crate) struct RateLimiter {
    /// Bytes per second; [`UNLIMITED`] never throttles.
    limit: u64,
    /// (window start, bytes recorded in it), oldest first.
    samples: VecDeque<(Instant, u64)>,
}

impl RateLimiter {
    pub(crate) fn new(limit: u64) -> Self {
        Self { limit, samples: VecDeque::new() }
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    pub(crate) fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
    }

    /// Drops the windows that ended more than [`SAMPLES`] windows ago.
    fn expire(&mut self, now: Instant) {
        let span = WINDOW * SAMPLES as u32;
        while self.samples.front().is_some_and(|(start, _)| now.saturating_duration_since(*start) >= span) {
            self.samples.pop_front();
        }
    }

    /// Counts `bytes` sent or fetched now.
    pub(crate) fn record(&mut self, bytes: u64, now: Instant) {
        self.expire(now);
        match self.samples.back_mut() {
            Some((start, total)) if now.saturating_duration_since(*start) < WINDOW => *total += bytes,
            _ => self.samples.push_back((now, bytes)),
        }
    }

    /// Bytes recorded in the live windows, and the time since the oldest began.
    fn measured(&mut self, now: Instant) -> (u64, Duration) {
        self.expire(now);
        let total = self.samples.iter().map(|(_, bytes)| bytes).sum();
        let elapsed = self.samples.front().map_or(Duration::ZERO, |(start, _)| now.saturating_duration_since(*start));
        (total, elapsed)
    }

    /// The measured rate, bytes per second (over at least one window).
    pub(crate) fn rate(&mut self, now: Instant) -> f64 {
        let (total, elapsed) = self.measured(now);
        total as f64 / elapsed.max(WINDOW).as_secs_f64()
    }

    /// Whether the measured rate is above the limit: throttled replicas wait.
    pub(crate) fn is_exceeded(&mut self, now: Instant) -> bool {
        self.limit != UNLIMITED && self.rate(now) > self.limit as f64
    }

    /// How long until the rate is back at the limit if nothing more is recorded (zero
    /// when it is already): the bytes counted need `total / limit` seconds in all.
    pub(crate) fn delay(&mut self, now: Instant) -> Duration {
        if !self.is_exceeded(now) {
            return Duration::ZERO;
        }
        let (total, elapsed) = self.measured(now);
        let needed = Duration::from_secs_f64(total as f64 / self.limit.max(1) as f64);
        needed.saturating_sub(elapsed).max(Duration::from_millis(1))
    }
}

/// A topic's list of throttled replicas (one of the two keys).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum ThrottledReplicas {
    /// Empty or unset: nothing throttled.
    #[default]
    None,
    /// `*`: every replica of every partition.
    All,
    /// `partition:broker` pairs.
    Listed(BTreeSet<(i32, i32)>),
}

impl ThrottledReplicas {
    /// Parses a value as Kafka validates it: `*`, or a comma-separated list whose entries
    /// (trimmed) are empty or `partition:broker`, both non-negative integers.
    pub(crate) fn parse(value: &str) -> Result<Self, String> {
        let value = value.trim();
        if value == "*" {
            return Ok(Self::All);
        }
        let mut listed = BTreeSet::new();
        for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let pair = entry.split_once(':').and_then(|(p, b)| {
                let number = |s: &str| (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit())).then(|| s.parse::<i32>().ok());
                Some((number(p)??, number(b)??))
            });
            match pair {
                Some(pair) => listed.insert(pair),
                None => {
                    return Err(format!(
                        "{entry:?} is not partition:broker: the value must be * or a list of [partitionId]:[brokerId],[partitionId]:[brokerId],..."
                    ))
                }
            };
        }
        Ok(if listed.is_empty() { Self::None } else { Self::Listed(listed) })
    }

    /// Whether `partition` is throttled on broker `broker`.
    pub(crate) fn covers(&self, partition: i32, broker: i32) -> bool {
        match self {
            Self::None => false,
            Self::All => true,
            Self::Listed(pairs) => pairs.contains(&(partition, broker)),
        }
    }
}

/// Both lists of a topic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TopicThrottles {
    pub(crate) leader: ThrottledReplicas,
    pub(crate) follower: ThrottledReplicas,
}

impl TopicThrottles {
    /// The lists in a topic's overrides (unset keys throttle nothing).
    pub(crate) fn from_overrides(overrides: &std::collections::BTreeMap<String, String>) -> Result<Self, String> {
        let list = |key: &str| match overrides.get(key) {
            Some(value) => ThrottledReplicas::parse(value).map_err(|reason| format!("{key}={value}: {reason}")),
            None => Ok(ThrottledReplicas::None),
        };
        Ok(Self { leader: list(LEADER_REPLICAS)?, follower: list(FOLLOWER_REPLICAS)? })
    }
}

/// One broker's throttles: its two rates and the lists of the topics it knows. The fetch
/// paths ask it; the topic view and the dynamic broker configs keep it current.
#[derive(Debug)]
pub(crate) struct ReplicationThrottles {
    broker_id: i32,
    leader: Mutex<RateLimiter>,
    follower: Mutex<RateLimiter>,
    topics: RwLock<HashMap<String, TopicThrottles>>,
}

/// Which side of replication a question is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Leader,
    Follower,
}

impl ReplicationThrottles {
    pub(crate) fn new(broker_id: i32) -> Self {
        Self {
            broker_id,
            leader: Mutex::new(RateLimiter::new(UNLIMITED)),
            follower: Mutex::new(RateLimiter::new(UNLIMITED)),
            topics: RwLock::new(HashMap::new()),
        }
    }

    fn limiter(&self, side: Side) -> std::sync::MutexGuard<'_, RateLimiter> {
        let limiter = match side {
            Side::Leader => &self.leader,
            Side::Follower => &self.follower,
        };
        limiter.lock().expect("invariant: throttle lock is never poisoned")
    }

    /// Sets the rate of `side` (bytes/s, [`UNLIMITED`] for none).
    pub(crate) fn set_rate(&self, side: Side, limit: u64) {
        let mut limiter = self.limiter(side);
        if limiter.limit() != limit {
            tracing::info!(broker = self.broker_id, ?side, limit, "replication throttle rate");
            limiter.set_limit(limit);
        }
    }

    /// Sets (or with `None`, forgets) the lists of `topic`.
    pub(crate) fn set_topic(&self, topic: &str, throttles: Option<&TopicThrottles>) {
        let mut topics = self.topics.write().expect("invariant: throttle lock is never poisoned");
        match throttles {
            Some(t) if *t != TopicThrottles::default() => {
                topics.insert(topic.to_owned(), t.clone());
            }
            _ => {
                topics.remove(topic);
            }
        }
    }

    /// Whether this broker throttles `partition` of `topic` as `side`.
    pub(crate) fn is_throttled(&self, side: Side, topic: &str, partition: i32) -> bool {
        let topics = self.topics.read().expect("invariant: throttle lock is never poisoned");
        topics.get(topic).is_some_and(|t| match side {
            Side::Leader => t.leader.covers(partition, self.broker_id),
            Side::Follower => t.follower.covers(partition, self.broker_id),
        })
    }

    /// Whether a throttled replica outside the ISR must wait now (Kafka's
    /// `shouldLeaderThrottle` / `shouldFollowerThrottle`).
    pub(crate) fn must_wait(&self, side: Side, topic: &str, partition: i32, in_sync: bool) -> bool {
        !in_sync && self.is_throttled(side, topic, partition) && self.limiter(side).is_exceeded(Instant::now())
    }

    /// Counts `bytes` of a throttled replica.
    pub(crate) fn record(&self, side: Side, bytes: u64) {
        if bytes > 0 {
            self.limiter(side).record(bytes, Instant::now());
        }
    }

    /// How long until `side` is under its rate again.
    pub(crate) fn delay(&self, side: Side) -> Duration {
        self.limiter(side).delay(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn the_rate_is_the_bytes_of_the_live_windows_over_their_span() {
        let t = Instant::now();
        let mut limiter = RateLimiter::new(1_000);
        assert!(!limiter.is_exceeded(t), "nothing recorded");
        // Within the first second the span counts as a whole second.
        limiter.record(900, t);
        assert_eq!(limiter.rate(at(t, 100)), 900.0);
        assert!(!limiter.is_exceeded(at(t, 100)));
        limiter.record(900, at(t, 200));
        assert!(limiter.is_exceeded(at(t, 200)), "1800 bytes in a second");
        // 1800 bytes need 1.8 s at 1000/s.
        assert_eq!(limiter.delay(at(t, 200)), Duration::from_millis(1_600));
        assert!(limiter.is_exceeded(at(t, 1_790)));
        assert!(!limiter.is_exceeded(at(t, 1_800)));
        assert_eq!(limiter.delay(at(t, 1_800)), Duration::ZERO);
        // After 11 windows the bytes are forgotten.
        assert_eq!(limiter.rate(at(t, 11_000)), 0.0);
    }

    #[test]
    fn a_steady_sender_that_waits_while_exceeded_stays_within_one_fetch_of_the_limit() {
        // A follower fetching 100 KiB at a time whenever the limiter lets it, every 10 ms,
        // against 200 KB/s for 5 s: the bytes sent never exceed limit * elapsed + one fetch.
        let (t, limit, fetch) = (Instant::now(), 200_000u64, 100 * 1024u64);
        let mut limiter = RateLimiter::new(limit);
        let mut sent = 0;
        for ms in (0..5_000).step_by(10) {
            let now = at(t, ms);
            if !limiter.is_exceeded(now) {
                limiter.record(fetch, now);
                sent += fetch;
            }
            let allowed = limit as f64 * (ms as f64 / 1000.0).max(1.0) + fetch as f64;
            assert!(sent as f64 <= allowed, "{sent} bytes after {ms} ms");
        }
        assert!(sent >= limit * 4, "the limiter let too little through: {sent}");
    }

    #[test]
    fn unlimited_never_throttles() {
        let t = Instant::now();
        let mut limiter = RateLimiter::new(UNLIMITED);
        limiter.record(u64::MAX / 4, t);
        assert!(!limiter.is_exceeded(t));
        assert_eq!(limiter.delay(t), Duration::ZERO);
    }

    #[test]
    fn replica_lists_are_validated_as_kafka_does() {
        assert_eq!(ThrottledReplicas::parse("*"), Ok(ThrottledReplicas::All));
        assert_eq!(ThrottledReplicas::parse(" * "), Ok(ThrottledReplicas::All));
        assert_eq!(ThrottledReplicas::parse(""), Ok(ThrottledReplicas::None));
        assert_eq!(ThrottledReplicas::parse("0:1, 2:3,"), Ok(ThrottledReplicas::Listed([(0, 1), (2, 3)].into())));
        for bad in ["0", "0:", ":1", "a:1", "0:1:2", "-1:2", "*,0:1", "0:1 2:3", "0 : 1"] {
            let e = ThrottledReplicas::parse(bad).unwrap_err();
            assert!(e.contains("partition:broker"), "{bad}: {e}");
        }
        let listed = ThrottledReplicas::parse("0:1,1:2").unwrap();
        assert!(listed.covers(0, 1) && listed.covers(1, 2));
        assert!(!listed.covers(0, 2) && !listed.covers(1, 1));
        assert!(ThrottledReplicas::All.covers(7, 9) && !ThrottledReplicas::None.covers(0, 0));
    }

    #[test]
    fn a_broker_throttles_the_listed_replicas_that_are_not_in_sync_while_over_its_rate() {
        let throttles = ReplicationThrottles::new(2);
        let overrides = [(LEADER_REPLICAS.to_owned(), "0:1".to_owned()), (FOLLOWER_REPLICAS.to_owned(), "0:2".to_owned())];
        let lists = TopicThrottles::from_overrides(&overrides.into_iter().collect()).unwrap();
        throttles.set_topic("t", Some(&lists));
        assert!(throttles.is_throttled(Side::Follower, "t", 0));
        assert!(!throttles.is_throttled(Side::Leader, "t", 0), "0:1 names broker 1 as the throttled leader");
        assert!(!throttles.is_throttled(Side::Follower, "t", 1));
        // Unlimited: nothing waits, whatever was recorded.
        throttles.record(Side::Follower, 10_000_000);
        assert!(!throttles.must_wait(Side::Follower, "t", 0, false));
        throttles.set_rate(Side::Follower, 1_000);
        assert!(throttles.must_wait(Side::Follower, "t", 0, false));
        assert!(throttles.delay(Side::Follower) > Duration::from_secs(9_000));
        assert!(!throttles.must_wait(Side::Follower, "t", 0, true), "in the ISR: never throttled");
        assert!(!throttles.must_wait(Side::Follower, "t", 1, false), "not listed");
        assert!(!throttles.must_wait(Side::Leader, "t", 0, false), "the leader's rate is its own");
        throttles.set_topic("t", None);
        assert!(!throttles.must_wait(Side::Follower, "t", 0, false), "the lists were removed");
        let bad = [(LEADER_REPLICAS.to_owned(), "x".to_owned())].into_iter().collect();
        assert!(TopicThrottles::from_overrides(&bad).unwrap_err().contains(LEADER_REPLICAS));
    }
}
