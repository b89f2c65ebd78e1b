//! Idempotency keys: a publish carrying a key is written at most once within the window,
//! across retries, gateway restarts and several gateways on one cluster.
//!
//! The key store lives in the brokers, in the compacted topic [`TOPIC`] (one partition,
//! so its log is one total order every gateway reads the same way). Each gateway follows
//! it from the start and holds what it read in memory. To run a keyed request, a gateway
//! appends a `pending` claim and waits until its own follower has read it: the first
//! live claim for a key in the log wins, whoever wrote it, so two gateways racing on one
//! key agree without talking to each other. The winner publishes and appends `done` with
//! the answer; everyone else waits for that `done` and returns the stored answer, writing
//! nothing. A claim whose gateway died is taken over after [`KeyStore::lease`].
//!
//! Every rule is decided from the records alone (their `at_ms`, not the reader's clock),
//! so all followers build the same map.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use fjord_client::{
    Acks, Admin, ClientConfig, Consumer, ConsumerConfig, NewTopic, OffsetReset, OffsetSpec, Producer, ProducerConfig,
    ProducerRecord, SeekTo, TopicPartition,
};
use fjord_record::now_ms;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::{Error, GatewayConfig, Result};

/// The internal topic holding the keys.
pub const TOPIC: &str = "_gateway_idempotency";
/// The HTTP header carrying a key.
pub(crate) const HEADER: &str = "idempotency-key";
/// Longest key accepted (Stripe's and the IETF draft's keys are UUIDs; 255 leaves room).
const MAX_KEY_LEN: usize = 255;
/// How often a repeat waiting on an in-flight run looks again without news from the log.
const IN_FLIGHT_RECHECK: Duration = Duration::from_millis(500);
/// Pause after a failed poll of the key topic before trying again.
const FOLLOW_BACKOFF: Duration = Duration::from_millis(200);
/// Most records of our own kept for the follower to pass (see `Keys::own`): past it, a
/// claim waits for the follower as if the records were another gateway's.
const MAX_OWN: usize = 65_536;

/// Checks a caller's key: 1..=255 visible ASCII characters.
pub(crate) fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY_LEN || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::BadRequest {
            index: None,
            reason: format!("Idempotency-Key must be 1-{MAX_KEY_LEN} visible ASCII characters"),
        });
    }
    Ok(())
}

/// A fingerprint of a request, so a key reused for a different request is refused.
/// Each part is length-prefixed: ("ab","c") and ("a","bc") differ.
pub(crate) struct RequestHash(Sha256);

impl RequestHash {
    pub(crate) fn new() -> Self {
        Self(Sha256::new())
    }

    pub(crate) fn part(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.update((bytes.len() as u64).to_be_bytes());
        self.0.update(bytes);
        self
    }

    pub(crate) fn finish(self) -> String {
        self.0.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// What a keyed request gets: its own fresh result, or the answer stored by an earlier
/// run of the same request (JSON text, parsed only by a repeat).
pub(crate) enum Outcome<R> {
    Fresh(R),
    Stored(Box<RawValue>),
}

/// One record of the key topic.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct KeyRecord {
    state: State,
    /// Unique per attempt: `done` and `released` apply only to their own claim.
    claim: String,
    hash: String,
    gateway: String,
    /// Writer's clock when written, ms since the epoch.
    at_ms: i64,
    /// After this the key is free again.
    expires_ms: i64,
    /// The answer of a `done` record, kept as the JSON text it was written as: an answer
    /// lists an offset per event, and as a parsed tree it cost thousands of allocations
    /// per keyed request (cloned, written, parsed back by every follower) and several
    /// times the memory for the window's keys held; only a repeat reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    answer: Option<Box<RawValue>>,
}

/// The answer of a `done` record written without one.
fn null() -> Box<RawValue> {
    RawValue::from_string("null".into()).expect("invariant: null is JSON")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum State {
    Pending,
    Done,
    /// The winner failed before publishing anything it could vouch for: the key is free.
    Released,
}

/// What the log says about one key.
#[derive(Debug, Clone)]
struct Entry {
    claim: String,
    hash: String,
    since_ms: i64,
    expires_ms: i64,
    answer: Option<Box<RawValue>>,
}

struct Keys {
    map: HashMap<Bytes, Entry>,
    /// Next offset of the key topic to apply: `map` is the log's state below it. Kept
    /// under the same lock as the map, so a claim can be judged against exactly the
    /// records before it.
    next: i64,
    /// Records this store appended at `next` or beyond, by offset: what the follower will
    /// read there, known from the append's acknowledgement. A claim whose gap to the
    /// follower holds only these is decided without waiting for the follower to fetch
    /// them (a fetch round trip or two on every keyed request when one gateway serves
    /// several at once).
    own: BTreeMap<i64, (Bytes, KeyRecord)>,
}

impl Default for Keys {
    fn default() -> Self {
        Self { map: HashMap::new(), next: -1, own: BTreeMap::new() }
    }
}

impl Keys {
    /// Whether a claim of `key` written at `at_ms` wins against the state the map holds
    /// (the records before it): the key is unknown, expired, or a pending claim whose
    /// lease ran out.
    fn claim_wins(&self, key: &Bytes, at_ms: i64, lease_ms: i64) -> bool {
        match self.map.get(key) {
            None => true,
            Some(e) => at_ms >= e.expires_ms || (e.answer.is_none() && at_ms >= e.since_ms.saturating_add(lease_ms)),
        }
    }

    /// Moves the applied position to `next` (never back), forgetting our own records
    /// below it: the map holds their effect now.
    fn advance(&mut self, next: i64) {
        self.next = self.next.max(next);
        if self.own.first_key_value().is_some_and(|(o, _)| *o < self.next) {
            self.own = self.own.split_off(&self.next);
        }
    }

    /// Whether claim `claim` of `key`, at `offset` and written at `at_ms`, is the first
    /// live claim in the log, when that can be told now (`None`: not yet). It can once the
    /// follower has applied every record before `offset` (the map is then the state the
    /// claim meets), or when every record from the follower's position up to `offset` is
    /// one of our own: a record changes only its own key's entry, so the key's state at
    /// `offset` is its entry in the map with our records of that key applied in order,
    /// exactly what every follower will compute.
    fn decide(&self, key: &Bytes, claim: &str, offset: i64, at_ms: i64, lease_ms: i64) -> Option<bool> {
        if self.next > offset {
            return Some(self.map.get(key).is_some_and(|e| e.claim == claim));
        }
        if self.next < 0 || self.own.range(self.next..offset).count() as i64 != offset - self.next {
            return None;
        }
        let mut one = Keys::default();
        if let Some(e) = self.map.get(key) {
            one.map.insert(key.clone(), e.clone());
        }
        for (k, r) in self.own.range(self.next..offset).map(|(_, kr)| kr).filter(|(k, _)| k == key) {
            one.apply(k.clone(), r.clone(), lease_ms);
        }
        Some(one.claim_wins(key, at_ms, lease_ms))
    }

    /// Applies one record; the same rules on every gateway.
    fn apply(&mut self, key: Bytes, r: KeyRecord, lease_ms: i64) {
        match r.state {
            State::Pending => {
                if self.claim_wins(&key, r.at_ms, lease_ms) {
                    let entry = Entry { claim: r.claim, hash: r.hash, since_ms: r.at_ms, expires_ms: r.expires_ms, answer: None };
                    self.map.insert(key, entry);
                }
            }
            State::Done => {
                if let Some(e) = self.map.get_mut(&key).filter(|e| e.claim == r.claim) {
                    e.answer = Some(r.answer.unwrap_or_else(null));
                    e.expires_ms = r.expires_ms;
                }
            }
            State::Released => {
                if self.map.get(&key).is_some_and(|e| e.claim == r.claim && e.answer.is_none()) {
                    self.map.remove(&key);
                }
            }
        }
    }
}

struct Shared {
    keys: Mutex<Keys>,
    /// Next offset of the key topic the follower will apply.
    applied: watch::Sender<i64>,
}

/// The key store of one gateway: a producer into [`TOPIC`] and a follower of it.
pub(crate) struct KeyStore {
    shared: Arc<Shared>,
    producer: Producer,
    gateway: String,
    window: Duration,
    lease: Duration,
    /// Bound on waiting for the key topic (append, follow).
    timeout: Duration,
    claims: AtomicU64,
    follower: tokio::task::JoinHandle<()>,
}

impl Drop for KeyStore {
    fn drop(&mut self) {
        self.follower.abort();
    }
}

enum Lookup {
    Free,
    InFlight,
    Done(Box<RawValue>),
}

impl KeyStore {
    /// Creates the key topic if missing, reads it to its end, and keeps following it.
    pub(crate) async fn open(config: &GatewayConfig, client: ClientConfig) -> Result<Self> {
        let window_ms = config.idempotency_window.as_millis().to_string();
        let admin = Admin::connect(client.clone()).await?;
        let mut topic = NewTopic::new(TOPIC, 1);
        // Compaction keeps the last record per key; deletion past the window drops
        // expired keys, so the topic stays the size of one window's keys.
        topic.configs.insert("cleanup.policy".into(), "compact,delete".into());
        topic.configs.insert("retention.ms".into(), window_ms);
        match admin.create_topics(&[topic]).await {
            Ok(()) => {}
            Err(e) if e.code() == Some(fjord_client::ResponseError::TopicAlreadyExists) => {}
            Err(e) => return Err(e.into()),
        }
        let end = admin.list_offsets(&[(TOPIC.to_string(), 0, OffsetSpec::Latest)]).await?[0];
        let producer = Producer::connect(ProducerConfig {
            client: client.clone(),
            acks: Acks::All,
            linger: Duration::ZERO,
            delivery_timeout: config.broker_timeout,
            max_block: config.broker_timeout,
            ..ProducerConfig::default()
        })
        .await?;
        let mut consumer = Consumer::connect(ConsumerConfig {
            client: ClientConfig { allow_auto_create_topics: false, ..client },
            fetch_max_wait: Duration::from_millis(100),
            auto_offset_reset: OffsetReset::Earliest,
            ..ConsumerConfig::default()
        })
        .await?;
        let tp = TopicPartition::new(TOPIC, 0);
        consumer.assign([tp.clone()]).await?;
        consumer.seek(&tp, SeekTo::Beginning)?;
        let (applied, _) = watch::channel(-1);
        let shared = Arc::new(Shared { keys: Mutex::new(Keys::default()), applied });
        // The lease covers the longest a winner may legitimately take: a dead-letter
        // request publishes twice, each bounded by broker_timeout, plus the appends.
        let lease = config.broker_timeout * 4;
        let follower = tokio::spawn(follow(consumer, shared.clone(), lease.as_millis() as i64, config.idempotency_window));
        let store = Self {
            shared,
            producer,
            gateway: config.resolved_host_name(),
            window: config.idempotency_window,
            lease,
            timeout: config.broker_timeout,
            claims: AtomicU64::new(0),
            follower,
        };
        store.caught_up(end).await?;
        Ok(store)
    }

    /// Waits until the follower has applied every offset below `end`.
    async fn caught_up(&self, end: i64) -> Result<()> {
        let mut rx = self.shared.applied.subscribe();
        let caught_up = tokio::time::timeout(self.timeout, rx.wait_for(|next| *next >= end)).await.is_ok_and(|r| r.is_ok());
        if caught_up {
            Ok(())
        } else {
            Err(Error::Unavailable(format!("the idempotency key topic was not read within {:?}", self.timeout)))
        }
    }

    fn lookup(&self, key: &Bytes, hash: &str) -> Result<Lookup> {
        let now = now_ms();
        let keys = self.shared.keys.lock().unwrap_or_else(|e| e.into_inner());
        let Some(e) = keys.map.get(key).filter(|e| now < e.expires_ms) else {
            return Ok(Lookup::Free);
        };
        if e.hash != hash {
            return Err(Error::Unprocessable {
                index: None,
                reason: "this Idempotency-Key was already used for a different request (topic or body differ)".into(),
            });
        }
        Ok(match &e.answer {
            Some(a) => Lookup::Done(a.clone()),
            None if now >= e.since_ms.saturating_add(self.lease.as_millis() as i64) => Lookup::Free,
            None => Lookup::InFlight,
        })
    }

    /// Whether our claim `claim` of `key`, appended at `offset` and written at `at_ms`,
    /// is the first live claim in the log: decided as soon as every record before it is
    /// known (see [`Keys::decide`]), without waiting for the follower to read the claim
    /// back (a fetch round trip on every keyed request).
    async fn claim_won(&self, key: &Bytes, claim: &str, offset: i64, at_ms: i64) -> Result<bool> {
        let deadline = Instant::now() + self.timeout;
        let mut rx = self.shared.applied.subscribe();
        loop {
            {
                let keys = self.shared.keys.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(won) = keys.decide(key, claim, offset, at_ms, self.lease.as_millis() as i64) {
                    return Ok(won);
                }
            }
            if tokio::time::timeout_at(deadline, rx.changed()).await.is_err() {
                return Err(Error::Unavailable(format!("the idempotency key topic was not read within {:?}", self.timeout)));
            }
        }
    }

    async fn append(&self, key: &Bytes, record: &KeyRecord) -> Result<i64> {
        let value = serde_json::to_vec(record).map_err(|e| Error::Unavailable(format!("encoding a key record: {e}")))?;
        let send = async {
            let r = ProducerRecord::new(TOPIC, value).key(key.clone()).partition(0);
            self.producer.send(r).await?.await
        };
        match tokio::time::timeout(self.timeout, send).await {
            Ok(Ok(m)) => {
                let mut keys = self.shared.keys.lock().unwrap_or_else(|e| e.into_inner());
                if m.offset >= keys.next && keys.next >= 0 && keys.own.len() < MAX_OWN {
                    keys.own.insert(m.offset, (key.clone(), record.clone()));
                    drop(keys);
                    // Wakes claims waiting on a gap this record fills.
                    self.shared.applied.send_modify(|_| {});
                }
                Ok(m.offset)
            }
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(Error::Unavailable(format!("the idempotency key topic did not acknowledge within {:?}", self.timeout))),
        }
    }

    fn record(&self, state: State, claim: &str, hash: &str, answer: Option<Box<RawValue>>) -> KeyRecord {
        let at_ms = now_ms();
        KeyRecord {
            state,
            claim: claim.into(),
            hash: hash.into(),
            gateway: self.gateway.clone(),
            at_ms,
            expires_ms: at_ms.saturating_add(self.window.as_millis() as i64),
            answer,
        }
    }

    /// Runs `f` at most once for (`principal`, `key`) within the window. `f` returns the
    /// answer to store (JSON text) and its own result. A repeat gets the stored answer; a
    /// repeat of a different request (`hash`) is refused with 422.
    ///
    /// `f` runs once the key is claimed for this run, so a repeat, a refused key or a
    /// failed claim runs nothing of it. Preparing the request (parsing, converting the
    /// events) while the claim was on its way was tried and undone: preparing is CPU work
    /// without an await, so it held the runtime worker the claim's round trip needed, and
    /// the claim took 1.2 ms instead of 0.5 ms (compression_bench, 500 events a request),
    /// longer than the preparation it overlapped.
    pub(crate) async fn run<R, F, Fut>(&self, principal: &str, key: &str, hash: &str, f: F) -> Result<Outcome<R>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(Box<RawValue>, R)>>,
    {
        let mut stored = Vec::with_capacity(principal.len() + 1 + key.len());
        stored.extend_from_slice(principal.as_bytes());
        stored.push(0);
        stored.extend_from_slice(key.as_bytes());
        let store_key = Bytes::from(stored);
        let claim = match self.claim(&store_key, key, hash).await? {
            Claimed::Stored(answer) => return Ok(Outcome::Stored(answer)),
            Claimed::Won(claim) => claim,
        };
        match f().await {
            Ok((answer, r)) => {
                if let Err(e) = self.append(&store_key, &self.record(State::Done, &claim, hash, Some(answer))).await {
                    // The events are written: answering an error would invite a retry that
                    // duplicates them once the lease passes. Answer, and say so in the log.
                    tracing::warn!(error = %e, key, "published, but could not record the idempotency answer");
                }
                Ok(Outcome::Fresh(r))
            }
            Err(e) => {
                // Refused requests produced nothing (see the crate invariants): free the key
                // so a corrected retry runs.
                if let Err(release) = self.append(&store_key, &self.record(State::Released, &claim, hash, None)).await {
                    tracing::warn!(error = %release, key, "could not release an idempotency claim; it frees at its lease");
                }
                Err(e)
            }
        }
    }

    /// Claims `store_key` for this run, or finds the stored answer of an earlier one.
    async fn claim(&self, store_key: &Bytes, key: &str, hash: &str) -> Result<Claimed> {
        // A repeat waits for the first run, up to its lease; then it takes over.
        let deadline = Instant::now() + self.lease + self.timeout * 2;
        loop {
            let mut rx = self.shared.applied.subscribe();
            match self.lookup(store_key, hash)? {
                Lookup::Done(answer) => return Ok(Claimed::Stored(answer)),
                Lookup::InFlight => {
                    if Instant::now() >= deadline {
                        return Err(Error::Unavailable("a request with this Idempotency-Key is still in flight".into()));
                    }
                    // Woken by the next record read; also look again now and then, since
                    // a claim's lease runs out without anything being written.
                    let _ = tokio::time::timeout(IN_FLIGHT_RECHECK, rx.changed()).await;
                }
                Lookup::Free => {
                    let n = self.claims.fetch_add(1, Ordering::Relaxed);
                    let claim = format!("{}/{}/{}/{n}", self.gateway, std::process::id(), now_ms());
                    let record = self.record(State::Pending, &claim, hash, None);
                    let offset = self.append(store_key, &record).await?;
                    if self.claim_won(store_key, &claim, offset, record.at_ms).await? {
                        return Ok(Claimed::Won(claim));
                    }
                    // Lost to an earlier claim, perhaps known only from our own records:
                    // look again once the follower has applied ours, so the map shows the
                    // winner (rather than claiming again and again while it catches up).
                    let _ = tokio::time::timeout_at(deadline, rx.wait_for(|next| *next > offset)).await;
                    if Instant::now() >= deadline {
                        tracing::debug!(key, "lost the claim of an Idempotency-Key and its first run is still in flight");
                        return Err(Error::Unavailable("a request with this Idempotency-Key is still in flight".into()));
                    }
                }
            }
        }
    }
}

/// How a claim ended: this run owns the key, or an earlier run's answer is stored.
enum Claimed {
    Won(String),
    Stored(Box<RawValue>),
}

/// Reads the key topic forever, applying records in offset order.
async fn follow(mut consumer: Consumer, shared: Arc<Shared>, lease_ms: i64, window: Duration) {
    let tp = TopicPartition::new(TOPIC, 0);
    let mut last_prune = Instant::now();
    loop {
        match consumer.poll(Duration::from_millis(200)).await {
            Ok(records) => {
                let mut next = None;
                {
                    let mut keys = shared.keys.lock().unwrap_or_else(|e| e.into_inner());
                    for r in records {
                        next = Some(r.offset + 1);
                        keys.advance(r.offset + 1);
                        let (Some(key), Some(value)) = (r.key, r.value) else { continue };
                        match serde_json::from_slice::<KeyRecord>(&value) {
                            Ok(record) => keys.apply(key, record, lease_ms),
                            Err(e) => tracing::warn!(offset = r.offset, error = %e, "skipping a malformed idempotency record"),
                        }
                    }
                    // Expired keys are dropped from memory, so it holds one window's keys.
                    if last_prune.elapsed() >= window.min(Duration::from_secs(60)) {
                        let now = now_ms();
                        keys.map.retain(|_, e| e.expires_ms > now);
                        last_prune = Instant::now();
                    }
                }
                // An empty poll at the end still tells waiters where the log ends.
                let position = match next {
                    Some(n) => Some(n),
                    None => consumer.position(&tp).await.ok(),
                };
                if let Some(p) = position {
                    {
                        let mut keys = shared.keys.lock().unwrap_or_else(|e| e.into_inner());
                        keys.advance(p);
                    }
                    shared.applied.send_if_modified(|cur| {
                        let changed = p > *cur;
                        *cur = (*cur).max(p);
                        changed
                    });
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the idempotency key topic failed; retrying");
                tokio::time::sleep(FOLLOW_BACKOFF).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(state: State, claim: &str, at_ms: i64) -> KeyRecord {
        KeyRecord {
            state,
            claim: claim.into(),
            hash: "h".into(),
            gateway: "g".into(),
            at_ms,
            expires_ms: at_ms + 1000,
            answer: (state == State::Done).then(|| serde_json::value::to_raw_value(claim).unwrap()),
        }
    }

    #[test]
    fn the_first_live_claim_wins_and_only_its_owner_completes_or_releases_it() {
        let mut keys = Keys::default();
        let k = Bytes::from_static(b"\0k");
        keys.apply(k.clone(), rec(State::Pending, "a", 0), 100);
        keys.apply(k.clone(), rec(State::Pending, "b", 10), 100);
        assert_eq!(keys.map[&k].claim, "a", "a later claim within the lease loses");
        keys.apply(k.clone(), rec(State::Done, "b", 20), 100);
        assert!(keys.map[&k].answer.is_none(), "a loser cannot complete");
        keys.apply(k.clone(), rec(State::Pending, "c", 150), 100);
        assert_eq!(keys.map[&k].claim, "c", "past the lease a pending claim is taken over");
        keys.apply(k.clone(), rec(State::Done, "c", 160), 100);
        keys.apply(k.clone(), rec(State::Pending, "d", 500), 100);
        assert_eq!(keys.map[&k].answer.as_ref().map(|a| a.get()), Some("\"c\""), "a done key holds for the window");
        keys.apply(k.clone(), rec(State::Pending, "e", 2000), 100);
        assert_eq!(keys.map[&k].claim, "e", "past the window the key is free");
        keys.apply(k.clone(), rec(State::Released, "x", 2001), 100);
        assert!(keys.map.contains_key(&k));
        keys.apply(k.clone(), rec(State::Released, "e", 2001), 100);
        assert!(!keys.map.contains_key(&k));
        assert!(check_key("").is_err() && check_key("a b").is_err() && check_key(&"x".repeat(256)).is_err());
        check_key("7f0c3c1e-8d3a-4b8e-9f61-1a2b3c4d5e6f").unwrap();
    }

    #[test]
    fn a_claim_is_decided_from_our_own_records_only_when_they_fill_the_gap() {
        let (k, other) = (Bytes::from_static(b"\0k"), Bytes::from_static(b"\0o"));
        let mut keys = Keys::default();
        keys.advance(10);
        // Offsets 10 and 11 are ours (another key, then an earlier claim of k); our claim "b" is at 12.
        keys.own.insert(10, (other.clone(), rec(State::Pending, "x", 5)));
        keys.own.insert(11, (k.clone(), rec(State::Pending, "a", 5)));
        assert_eq!(keys.decide(&k, "b", 12, 6, 100), Some(false), "our own earlier live claim of the key wins");
        assert_eq!(keys.decide(&other, "y", 12, 6, 100), Some(false));
        let fresh = Bytes::from_static(b"\0f");
        assert_eq!(keys.decide(&fresh, "c", 12, 6, 100), Some(true), "records of other keys do not matter");
        // A gap (offset 12 unknown: another gateway's record) leaves claim 13 undecided.
        assert_eq!(keys.decide(&fresh, "c", 13, 6, 100), None);
        // The follower applies 10..=12 (12 being another gateway's claim of `fresh`).
        keys.apply(other.clone(), rec(State::Pending, "x", 5), 100);
        keys.apply(k.clone(), rec(State::Pending, "a", 5), 100);
        keys.apply(fresh.clone(), rec(State::Pending, "z", 5), 100);
        keys.advance(13);
        assert!(keys.own.is_empty(), "records the follower passed are forgotten");
        assert_eq!(keys.decide(&fresh, "c", 13, 6, 100), Some(false), "decided from the map once applied");
        assert_eq!(keys.decide(&fresh, "z", 12, 6, 100), Some(true), "an applied claim is read from the map");
    }
}
