//! Client quotas, Kafka's model (KIP-13 byte rates, KIP-55 user and client-id entities,
//! KIP-124 request percentage, KIP-219 throttling): the pure part. The metadata store side
//! (the `/config/users` and `/config/clients` nodes, the watch that keeps every broker
//! current) is [`store`]; the connection and the Produce/Fetch handlers only ask
//! [`ClientQuotas`] how long to throttle.
//!
//! # Entities and precedence
//! A quota is set on a user, a client id, or a (user, client id) pair, each named or the
//! default (`<default>`, a null name on the wire). A client's quota of one kind is the
//! first of these that sets it, Kafka's order:
//! ```text
//! 1. /config/users/<user>/clients/<client-id>
//! 2. /config/users/<user>/clients/<default>
//! 3. /config/users/<user>
//! 4. /config/users/<default>/clients/<client-id>
//! 5. /config/users/<default>/clients/<default>
//! 6. /config/users/<default>
//! 7. /config/clients/<client-id>
//! 8. /config/clients/<default>
//! ```
//! The level that matched also says who shares the measured rate (Kafka's metric tags):
//! a user quota (3, 6) is shared by all of that user's client ids, a client-id quota
//! (7, 8) by every user with that client id, and the others are per (user, client id).
//!
//! # Rates and throttling
//! A rate is Kafka's `Rate` over `quota.window.num` samples of `quota.window.size.seconds`
//! each (11 × 1 s): the sum of the samples divided by the time they cover, which counts as
//! at least `num - 1` whole windows (so a new client does not look infinitely fast). A
//! value is recorded first, then the rate checked; over the bound, the throttle time is
//! the delay that brings the rate back to the bound if nothing more came:
//! `X = (O - T) / T × W` for observed rate O, bound T and window W. Example: 5 MB/s
//! bound, 60 MB recorded in the first second: W = 10 s, O = 6 MB/s, X = 2 s.

pub(crate) mod store;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::time::Instant;

/// The quota keys Fjord enforces, with Kafka's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum QuotaKey {
    /// Bytes per second a client may produce (the size of its Produce requests).
    ProducerByteRate,
    /// Bytes per second a client may fetch (the records in its Fetch responses).
    ConsumerByteRate,
    /// Percentage of one request-handling second a client may use (KIP-124).
    RequestPercentage,
}

impl QuotaKey {
    pub(crate) const ALL: [QuotaKey; 3] = [QuotaKey::ProducerByteRate, QuotaKey::ConsumerByteRate, QuotaKey::RequestPercentage];

    /// Kafka's name of the key.
    pub(crate) fn name(self) -> &'static str {
        match self {
            QuotaKey::ProducerByteRate => "producer_byte_rate",
            QuotaKey::ConsumerByteRate => "consumer_byte_rate",
            QuotaKey::RequestPercentage => "request_percentage",
        }
    }

    pub(crate) fn parse(name: &str) -> Option<QuotaKey> {
        QuotaKey::ALL.into_iter().find(|key| key.name() == name)
    }

    /// Kafka types the byte rates as longs and the percentage as a double.
    pub(crate) fn is_long(self) -> bool {
        !matches!(self, QuotaKey::RequestPercentage)
    }
}

/// A user or client-id name in a quota entity: one name, or the default for all.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum EntityName {
    Default,
    Named(String),
}

impl EntityName {
    /// From the wire: a null name is the default.
    pub(crate) fn from_wire(name: Option<&str>) -> Self {
        name.map_or(EntityName::Default, |n| EntityName::Named(n.to_owned()))
    }

    pub(crate) fn to_wire(&self) -> Option<&str> {
        match self {
            EntityName::Default => None,
            EntityName::Named(name) => Some(name),
        }
    }
}

/// What a quota is set on: a user, a client id, or both (never neither).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct QuotaEntity {
    pub(crate) user: Option<EntityName>,
    pub(crate) client_id: Option<EntityName>,
}

impl QuotaEntity {
    fn new(user: Option<EntityName>, client_id: Option<EntityName>) -> Self {
        Self { user, client_id }
    }
}

/// Every stored quota: entity → key → value.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct QuotaConfigs {
    pub(crate) entities: BTreeMap<QuotaEntity, BTreeMap<QuotaKey, f64>>,
}

/// Who shares one measured rate: Kafka's (user, client-id) metric tags, `""` where the
/// matching quota does not distinguish.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct RateKey {
    pub(crate) user: String,
    pub(crate) client_id: String,
}

/// The quota that applies to a client and whose rate it counts against.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Resolved {
    pub(crate) bound: f64,
    pub(crate) rate: RateKey,
}

impl QuotaConfigs {
    /// The `key` quota of `user` with `client_id`, by Kafka's precedence (module docs);
    /// `None` when no level sets it.
    pub(crate) fn resolve(&self, key: QuotaKey, user: &str, client_id: &str) -> Option<Resolved> {
        use EntityName::{Default, Named};
        if self.entities.is_empty() {
            // Every request asks; without quotas it allocates nothing.
            return None;
        }
        /// Who shares the rate of a level's quota.
        enum Share {
            UserAndClient,
            User,
            Client,
        }
        let (u, c) = (Named(user.to_owned()), Named(client_id.to_owned()));
        let levels = [
            (Some(u.clone()), Some(c.clone()), Share::UserAndClient),
            (Some(u.clone()), Some(Default), Share::UserAndClient),
            (Some(u), None, Share::User),
            (Some(Default), Some(c.clone()), Share::UserAndClient),
            (Some(Default), Some(Default), Share::UserAndClient),
            (Some(Default), None, Share::User),
            (None, Some(c), Share::Client),
            (None, Some(Default), Share::Client),
        ];
        levels.into_iter().find_map(|(user_name, client_name, share)| {
            let bound = *self.entities.get(&QuotaEntity::new(user_name, client_name))?.get(&key)?;
            let (user, client_id) = match share {
                Share::UserAndClient => (user, client_id),
                Share::User => (user, ""),
                Share::Client => ("", client_id),
            };
            Some(Resolved { bound, rate: RateKey { user: user.to_owned(), client_id: client_id.to_owned() } })
        })
    }

    /// Whether any entity sets `key`: without, nothing is measured for it (as Kafka).
    fn any(&self, key: QuotaKey) -> bool {
        self.entities.values().any(|values| values.contains_key(&key))
    }
}

/// `quota.window.num` samples of `quota.window.size.seconds`: what client quota rates
/// are measured over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaWindow {
    /// `quota.window.num`, at least 2.
    pub samples: u32,
    /// `quota.window.size.seconds`, whole seconds.
    pub size: Duration,
}

impl Default for QuotaWindow {
    /// Kafka's defaults: 11 samples of 1 s.
    fn default() -> Self {
        Self { samples: 11, size: Duration::from_secs(1) }
    }
}

impl QuotaWindow {
    fn size_ms(self) -> i64 {
        self.size.as_millis() as i64
    }

    /// The most a client can take in one go without being throttled for sure (Kafka's
    /// `getMaxValueInQuotaWindow`): what caps a fetch under a consumer quota.
    /// Example: 1 MB/s × (11 - 1) × 1 s = 10 MB.
    pub(crate) fn max_value(self, bound: f64) -> f64 {
        bound * f64::from(self.samples.saturating_sub(1)) * self.size.as_secs_f64()
    }
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    value: f64,
    /// Start of the sample's window.
    start_ms: i64,
}

/// Kafka's sampled `Rate`: a ring of samples, each covering one window.
#[derive(Debug, Clone, Default)]
pub(crate) struct Rate {
    samples: Vec<Sample>,
    current: usize,
    last_record_ms: i64,
}

impl Rate {
    /// Adds `value` at `now_ms` (negative to take back a recorded value).
    pub(crate) fn record(&mut self, window: QuotaWindow, value: f64, now_ms: i64) {
        if self.samples.is_empty() {
            self.samples.push(Sample { value: 0.0, start_ms: now_ms });
        }
        if now_ms - self.samples[self.current].start_ms >= window.size_ms() {
            // The current sample is complete: the next one starts now.
            self.current = (self.current + 1) % window.samples.max(1) as usize;
            if self.current >= self.samples.len() {
                self.samples.push(Sample { value: 0.0, start_ms: now_ms });
            } else {
                self.samples[self.current] = Sample { value: 0.0, start_ms: now_ms };
            }
        }
        self.samples[self.current].value += value;
        self.last_record_ms = now_ms;
    }

    /// Samples that started `samples × size` ago or earlier count nothing any more.
    fn purge(&mut self, window: QuotaWindow, now_ms: i64) {
        let expiry = i64::from(window.samples) * window.size_ms();
        for sample in &mut self.samples {
            if now_ms - sample.start_ms >= expiry {
                *sample = Sample { value: 0.0, start_ms: now_ms };
            }
        }
    }

    /// The time the rate is measured over, in ms: since the oldest sample started, but
    /// at least `samples - 1` whole windows.
    pub(crate) fn window_ms(&mut self, window: QuotaWindow, now_ms: i64) -> i64 {
        self.purge(window, now_ms);
        let oldest = self.samples.iter().map(|s| s.start_ms).min().unwrap_or(now_ms);
        let mut elapsed = now_ms - oldest;
        let full_windows = elapsed / window.size_ms();
        let min_full_windows = i64::from(window.samples.saturating_sub(1));
        if full_windows < min_full_windows {
            elapsed += (min_full_windows - full_windows) * window.size_ms();
        }
        elapsed
    }

    /// Units per second.
    pub(crate) fn measure(&mut self, window: QuotaWindow, now_ms: i64) -> f64 {
        let window_ms = self.window_ms(window, now_ms);
        let total: f64 = self.samples.iter().map(|s| s.value).sum();
        total / (window_ms.max(1) as f64 / 1000.0)
    }

    /// Records `value` and answers the throttle time in ms it causes under `bound` (0
    /// while the rate stays within it).
    pub(crate) fn record_and_throttle(&mut self, window: QuotaWindow, bound: f64, value: f64, now_ms: i64) -> u64 {
        self.record(window, value, now_ms);
        self.throttle(window, bound, now_ms)
    }

    /// The throttle time in ms the rate so far calls for under `bound`.
    pub(crate) fn throttle(&mut self, window: QuotaWindow, bound: f64, now_ms: i64) -> u64 {
        let observed = self.measure(window, now_ms);
        if observed <= bound {
            return 0;
        }
        throttle_time_ms(observed, bound, self.window_ms(window, now_ms))
    }
}

/// Kafka's throttle time: the delay `X` that brings an observed rate `O` measured over a
/// window `W` back to the bound `T`, from `O × W / (W + X) = T`: `X = (O - T) / T × W`.
pub(crate) fn throttle_time_ms(observed: f64, bound: f64, window_ms: i64) -> u64 {
    if bound <= 0.0 || observed <= bound {
        return 0;
    }
    ((observed - bound) / bound * window_ms as f64).round() as u64
}

/// Which rate a measurement goes to: the quota's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum QuotaKind {
    Produce,
    Fetch,
    Request,
}

impl QuotaKind {
    fn key(self) -> QuotaKey {
        match self {
            QuotaKind::Produce => QuotaKey::ProducerByteRate,
            QuotaKind::Fetch => QuotaKey::ConsumerByteRate,
            QuotaKind::Request => QuotaKey::RequestPercentage,
        }
    }
}

/// A rate nobody recorded into for this long is forgotten (Kafka's inactive sensor
/// expiry: one hour).
const INACTIVE_RATE_EXPIRY: Duration = Duration::from_secs(3600);

/// The broker's quotas and the clients' rates: what the connection and the handlers ask.
#[derive(Debug)]
pub(crate) struct ClientQuotas {
    window: QuotaWindow,
    configs: RwLock<Arc<QuotaConfigs>>,
    rates: Mutex<Rates>,
    /// The zero of the ms clock the rates run on.
    origin: Instant,
}

#[derive(Debug, Default)]
struct Rates {
    by_key: HashMap<(QuotaKind, RateKey), Rate>,
    last_expiry_ms: i64,
}

impl ClientQuotas {
    pub(crate) fn new(window: QuotaWindow) -> Self {
        Self { window, configs: Default::default(), rates: Default::default(), origin: Instant::now() }
    }

    /// The stored quotas as last read.
    pub(crate) fn configs(&self) -> Arc<QuotaConfigs> {
        self.configs.read().expect("invariant: the quota lock is never poisoned").clone()
    }

    /// Takes a new reading of the stored quotas; rates go on, under the new bounds.
    pub(crate) fn set_configs(&self, configs: QuotaConfigs) {
        let mut current = self.configs.write().expect("invariant: the quota lock is never poisoned");
        if **current != configs {
            tracing::info!(quotas = ?configs.entities, "client quotas changed");
            *current = Arc::new(configs);
        }
    }

    fn now_ms(&self) -> i64 {
        self.origin.elapsed().as_millis() as i64
    }

    /// Records `value` for `user` with `client_id` and answers the throttle time it calls
    /// for; 0 (and nothing recorded) when no quota of this kind applies.
    pub(crate) fn record(&self, kind: QuotaKind, user: &str, client_id: &str, value: f64) -> Duration {
        let Some(resolved) = self.configs().resolve(kind.key(), user, client_id) else { return Duration::ZERO };
        let now_ms = self.now_ms();
        let mut rates = self.rates.lock().expect("invariant: the quota lock is never poisoned");
        let rate = rates.rate(kind, resolved.rate, now_ms);
        let mut throttle = rate.record_and_throttle(self.window, resolved.bound, value, now_ms);
        if kind == QuotaKind::Request {
            // Kafka caps a request-time throttle at one window.
            throttle = throttle.min(self.window.size_ms() as u64);
        }
        Duration::from_millis(throttle)
    }

    /// Takes back a recorded `value` (a throttled fetch answers with no records, so its
    /// bytes do not count, as in Kafka).
    pub(crate) fn unrecord(&self, kind: QuotaKind, user: &str, client_id: &str, value: f64) {
        let Some(resolved) = self.configs().resolve(kind.key(), user, client_id) else { return };
        let now_ms = self.now_ms();
        let mut rates = self.rates.lock().expect("invariant: the quota lock is never poisoned");
        rates.rate(kind, resolved.rate, now_ms).record(self.window, -value, now_ms);
    }

    /// The throttle time the rate so far calls for, without recording (the request
    /// quota: a request's handling time is only known after its answer is built).
    pub(crate) fn throttle(&self, kind: QuotaKind, user: &str, client_id: &str) -> Duration {
        let configs = self.configs();
        if !configs.any(kind.key()) {
            return Duration::ZERO;
        }
        let Some(resolved) = configs.resolve(kind.key(), user, client_id) else { return Duration::ZERO };
        let now_ms = self.now_ms();
        let mut rates = self.rates.lock().expect("invariant: the quota lock is never poisoned");
        let Some(rate) = rates.by_key.get_mut(&(kind, resolved.rate)) else { return Duration::ZERO };
        let mut throttle = rate.throttle(self.window, resolved.bound, now_ms);
        if kind == QuotaKind::Request {
            throttle = throttle.min(self.window.size_ms() as u64);
        }
        Duration::from_millis(throttle)
    }

    /// The most a fetch may return to `user` with `client_id` (`None`: no consumer quota).
    pub(crate) fn max_fetch_bytes(&self, user: &str, client_id: &str) -> Option<usize> {
        let resolved = self.configs().resolve(QuotaKey::ConsumerByteRate, user, client_id)?;
        Some(self.window.max_value(resolved.bound).clamp(1.0, usize::MAX as f64) as usize)
    }
}

impl Rates {
    fn rate(&mut self, kind: QuotaKind, key: RateKey, now_ms: i64) -> &mut Rate {
        let expiry_ms = INACTIVE_RATE_EXPIRY.as_millis() as i64;
        if now_ms - self.last_expiry_ms >= expiry_ms / 60 {
            self.by_key.retain(|_, rate| now_ms - rate.last_record_ms < expiry_ms);
            self.last_expiry_ms = now_ms;
        }
        self.by_key.entry((kind, key)).or_insert_with(|| Rate { last_record_ms: now_ms, ..Rate::default() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: QuotaWindow = QuotaWindow { samples: 11, size: Duration::from_secs(1) };

    fn named(name: &str) -> Option<EntityName> {
        Some(EntityName::Named(name.to_owned()))
    }

    fn configs(entries: &[(Option<EntityName>, Option<EntityName>, f64)]) -> QuotaConfigs {
        let mut configs = QuotaConfigs::default();
        for (user, client_id, value) in entries {
            configs
                .entities
                .entry(QuotaEntity::new(user.clone(), client_id.clone()))
                .or_default()
                .insert(QuotaKey::ProducerByteRate, *value);
        }
        configs
    }

    fn resolve(configs: &QuotaConfigs) -> Option<(f64, String, String)> {
        configs.resolve(QuotaKey::ProducerByteRate, "alice", "app").map(|r| (r.bound, r.rate.user, r.rate.client_id))
    }

    #[test]
    fn the_most_specific_quota_wins_in_kafkas_order() {
        use EntityName::Default as D;
        // Every level present; take them away from the most specific one.
        let mut levels = vec![
            (named("alice"), named("app"), 1.0),
            (named("alice"), Some(D), 2.0),
            (named("alice"), None, 3.0),
            (Some(D), named("app"), 4.0),
            (Some(D), Some(D), 5.0),
            (Some(D), None, 6.0),
            (None, named("app"), 7.0),
            (None, Some(D), 8.0),
        ];
        let shares = ["both", "both", "user", "both", "both", "user", "client", "client"];
        for (i, share) in shares.iter().enumerate() {
            let (bound, user, client_id) = resolve(&configs(&levels)).unwrap();
            assert_eq!(bound, (i + 1) as f64);
            let expected = match *share {
                "both" => ("alice", "app"),
                "user" => ("alice", ""),
                _ => ("", "app"),
            };
            assert_eq!((user.as_str(), client_id.as_str()), expected, "level {}", i + 1);
            levels.remove(0);
        }
        assert_eq!(resolve(&configs(&levels)), None);
        // Other names never match.
        assert_eq!(resolve(&configs(&[(named("bob"), None, 1.0), (None, named("other"), 2.0)])), None);
        // Another key does not match a producer quota.
        let c = configs(&[(named("alice"), None, 1.0)]);
        assert_eq!(c.resolve(QuotaKey::ConsumerByteRate, "alice", "app"), None);
    }

    #[test]
    fn throttle_time_is_kafkas_formula() {
        // 6 MB/s observed over 10 s against 5 MB/s: (6 - 5) / 5 × 10 s = 2 s.
        assert_eq!(throttle_time_ms(6e6, 5e6, 10_000), 2000);
        assert_eq!(throttle_time_ms(5e6, 5e6, 10_000), 0);
        assert_eq!(throttle_time_ms(4e6, 5e6, 10_000), 0);
        assert_eq!(throttle_time_ms(7.5, 5.0, 11_000), 5500);
    }

    #[test]
    fn a_new_rate_counts_at_least_ten_windows() {
        let mut rate = Rate::default();
        rate.record(W, 50.0, 0);
        assert_eq!(rate.window_ms(W, 0), 10_000);
        assert_eq!(rate.measure(W, 0), 5.0);
        assert_eq!(rate.window_ms(W, 500), 10_500);
        // 50 units in the first second under a 5/s bound is exactly at the bound; one more
        // unit is over: (5.1 - 5) / 5 × 10 s = 200 ms.
        assert_eq!(rate.record_and_throttle(W, 5.0, 1.0, 0), 200);
    }

    #[test]
    fn old_samples_stop_counting() {
        let mut rate = Rate::default();
        for second in 0..11 {
            rate.record(W, 10.0, second * 1000);
        }
        // 11 samples of 10 over 10 s (the oldest started at 0).
        assert_eq!(rate.measure(W, 10_000), 11.0);
        // At 11 s the first sample is 11 s old: expired, and its slot is the new one.
        rate.record(W, 0.0, 11_000);
        assert_eq!(rate.measure(W, 11_000), 10.0);
        // Nothing for a long time: everything expired, the rate is zero.
        assert_eq!(rate.measure(W, 60_000), 0.0);
    }

    #[test]
    fn a_greedy_producer_that_waits_out_its_throttles_keeps_to_the_bound() {
        // A client that sends 1 MB whenever it is let in, honoring every throttle, against
        // a 5 MB/s bound. Kafka's rate lets it take about a window's worth (11 × 5 MB) at
        // the start; after that it moves at the bound.
        let bound = 5e6;
        let mut rate = Rate::default();
        let (mut now, mut sent, mut sent_by_11s) = (0i64, 0.0, None);
        while now < 66_000 {
            if now >= 11_000 && sent_by_11s.is_none() {
                sent_by_11s = Some(sent);
            }
            let throttle = rate.record_and_throttle(W, bound, 1e6, now);
            sent += 1e6;
            now += 10 + throttle as i64;
        }
        let first_window = sent_by_11s.unwrap();
        assert!(first_window <= bound * 11.0 + 10e6, "{first_window}");
        let steady = (sent - first_window) / 55.0;
        assert!((bound * 0.9..=bound * 1.1).contains(&steady), "{steady}");
    }

    #[test]
    fn unrecording_takes_the_value_back() {
        let mut rate = Rate::default();
        rate.record(W, 100.0, 0);
        rate.record(W, -100.0, 10);
        assert_eq!(rate.measure(W, 10), 0.0);
    }

    #[test]
    fn the_fetch_cap_is_the_quota_over_all_but_one_window() {
        assert_eq!(W.max_value(1e6), 10e6);
        let quotas = ClientQuotas::new(W);
        assert_eq!(quotas.max_fetch_bytes("alice", "app"), None);
        let mut c = QuotaConfigs::default();
        c.entities.entry(QuotaEntity::new(None, named("app"))).or_default().insert(QuotaKey::ConsumerByteRate, 1000.0);
        quotas.set_configs(c);
        assert_eq!(quotas.max_fetch_bytes("alice", "app"), Some(10_000));
        assert_eq!(quotas.max_fetch_bytes("alice", "other"), None);
    }

    #[test]
    fn clients_without_a_quota_are_not_throttled_and_others_are() {
        let quotas = ClientQuotas::new(W);
        quotas.set_configs(configs(&[(None, named("slow"), 1000.0)]));
        assert_eq!(quotas.record(QuotaKind::Produce, "ANONYMOUS", "fast", 1e9), Duration::ZERO);
        assert_eq!(quotas.record(QuotaKind::Produce, "ANONYMOUS", "slow", 10_000.0), Duration::ZERO);
        // 20 000 over 10 s = 2000/s against 1000/s: 10 s.
        let throttle = quotas.record(QuotaKind::Produce, "ANONYMOUS", "slow", 10_000.0);
        assert!((Duration::from_millis(9_900)..=Duration::from_millis(10_100)).contains(&throttle), "{throttle:?}");
        // A fetch quota is another rate.
        assert_eq!(quotas.record(QuotaKind::Fetch, "ANONYMOUS", "slow", 1e9), Duration::ZERO);
    }

    #[test]
    fn a_request_throttle_is_capped_at_one_window() {
        let quotas = ClientQuotas::new(W);
        let mut c = QuotaConfigs::default();
        c.entities.entry(QuotaEntity::new(named("alice"), None)).or_default().insert(QuotaKey::RequestPercentage, 1.0);
        quotas.set_configs(c);
        assert_eq!(quotas.throttle(QuotaKind::Request, "alice", "x"), Duration::ZERO);
        quotas.record(QuotaKind::Request, "alice", "x", 500.0);
        assert_eq!(quotas.throttle(QuotaKind::Request, "alice", "x"), Duration::from_secs(1));
        assert_eq!(quotas.throttle(QuotaKind::Request, "bob", "x"), Duration::ZERO);
    }
}
