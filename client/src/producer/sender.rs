//! The sender: one task per producer that drains the accumulator into produce requests
//! (one per leader, at most one batch per partition, up to `max.in.flight` pipelined),
//! and the handling of their answers: completing batches, retrying them in sequence
//! order, splitting one the broker found too large or whose records it refused in part.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::produce_response::BatchIndexAndErrorMessage;
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};

use super::accumulator::{OpenBatch, ReadyBatch, State, TopicsExt};
use super::batch::{split_batch, Completion, Outcome};
use super::idempotence::{add_sequence, reset_if_due, sequence_ahead, OutcomeKind, MAX_IN_FLIGHT_IDEMPOTENT};
use super::transaction::is_fencing;
use super::{request, Acks, Inner, ProducerConfig};
use crate::connection::BodyParts;
use crate::error::{Error, ResponseError, Result};

/// Highest Produce version used: v9 is the first flexible one; v13 switches to topic ids.
const PRODUCE_VERSION: i16 = 9;

/// Refusals that may come after the leader appended the batch (it waited for its
/// replicas in vain, or lost its place meanwhile, and a replica may keep it): the batch
/// is perhaps stored (`ReadyBatch::maybe_stored`).
const MAYBE_STORED: [ResponseError; 3] =
    [ResponseError::RequestTimedOut, ResponseError::NotEnoughReplicasAfterAppend, ResponseError::NotLeaderOrFollower];

impl Inner {
    /// Completes a batch: wakes its record futures and gives back its memory. A stamped
    /// batch that succeeded moves its partition's acknowledged sequence; one that failed
    /// leaves a hole in the sequence, which a new producer epoch closes.
    pub(super) fn complete(&self, batch: &ReadyBatch, outcome: Outcome) {
        let succeeded = !matches!(outcome, Outcome::Failed(_));
        let fencing = match &outcome {
            Outcome::Failed(e) if self.config.transactional_id.is_some() && is_fencing(e) => Some(e.clone()),
            _ => None,
        };
        let outcome_kind = if matches!(outcome, Outcome::PerRecord(_)) { OutcomeKind::Split } else { OutcomeKind::Whole };
        if let Some(audit) = self.config.audit.as_ref().filter(|_| !batch.audit.is_empty()) {
            let acked: Vec<i64> = match &outcome {
                Outcome::Sent { .. } => batch.audit.clone(),
                Outcome::PerRecord(results) => {
                    batch.audit.iter().zip(results).filter(|(_, r)| r.is_ok()).map(|(c, _)| *c).collect()
                }
                Outcome::Failed(_) => Vec::new(),
            };
            if self.config.transactional_id.is_some() {
                // Counted when the transaction commits: an aborted one's records never
                // reach a read_committed reader, so they are not counted either.
                let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                state.transaction.audit.push((batch.topic.to_string(), acked));
            } else if !acked.is_empty() {
                audit.acknowledged(&batch.topic, &acked);
            }
        }
        batch.completion.complete(outcome);
        self.memory.add_permits(batch.memory);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.incomplete -= 1;
        if let Some(stamp) = batch.stamp {
            let current = state.identity;
            // A split batch completes after its parts, which hold its sequence numbers now.
            let split = matches!(outcome_kind, OutcomeKind::Split);
            if let Some(queue) = state.queue(&batch.topic, batch.partition).filter(|q| q.identity == Some(stamp.identity)) {
                if !split {
                    if let Some(entry) = queue.window.iter_mut().find(|(sequence, _)| *sequence == stamp.sequence) {
                        entry.1 = true;
                    }
                    while queue.window.front().is_some_and(|(_, done)| *done) {
                        queue.window.pop_front();
                    }
                }
                if succeeded {
                    // Answers of different requests may be handled out of order: only move forward.
                    let acked = add_sequence(stamp.sequence, batch.records);
                    if sequence_ahead(acked, queue.acked_sequence) {
                        queue.acked_sequence = acked;
                    }
                }
            }
            // A hole in an older epoch's numbers needs no bump: the partition leaves
            // that epoch anyway once nothing of it may be stored. Nor does a fenced
            // producer's: it sends nothing more.
            if !succeeded && Some(stamp.identity) == current && fencing.is_none() && state.fenced.is_none() {
                state.reset_pending = true;
                self.wake_sender.notify_one();
            }
        }
        drop(state);
        if let Some(e) = fencing {
            self.fence(&e);
        }
        self.batch_done.notify_waiters();
    }

    /// Puts a batch back for another attempt, or fails it when out of attempts or time.
    fn retry_or_fail(&self, batch: ReadyBatch, error: Error) {
        let retriable = error.is_retriable();
        self.retry_or_fail_as(batch, error, retriable);
    }

    /// [`Inner::retry_or_fail`] with the caller deciding whether `error` is retriable.
    fn retry_or_fail_as(&self, mut batch: ReadyBatch, error: Error, retriable: bool) {
        let expired = batch.created.elapsed() >= self.config.delivery_timeout;
        if !retriable || batch.attempts >= self.config.retries || expired {
            let error = if expired && retriable { Error::DeliveryTimeout(self.config.delivery_timeout) } else { error };
            self.complete(&batch, Outcome::Failed(error));
            return;
        }
        tracing::debug!(topic = %batch.topic, partition = batch.partition, sequence = ?batch.stamp.map(|s| s.sequence), %error, "retrying batch");
        batch.attempts += 1;
        batch.retry_at = Some(Instant::now() + self.cluster.config().retry_backoff);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let partitions = state.topics.get(&*batch.topic).map_or(0, |t| t.partitions.len());
        let topic = state.topics.entry_ref(&batch.topic.clone(), partitions.max(batch.partition as usize + 1) as i32);
        let ready = &mut topic.partitions[batch.partition as usize].ready;
        match batch.stamp {
            // Back in sequence order: in front of every later batch, behind earlier retries.
            Some(stamp) => {
                let at = ready
                    .iter()
                    .position(|b| b.stamp.is_none_or(|s| s.identity != stamp.identity || s.sequence > stamp.sequence))
                    .unwrap_or(ready.len());
                ready.insert(at, batch);
            }
            None => ready.push_front(batch),
        }
        drop(state);
        // The sender may be asleep with nothing else to do: it must see the retry.
        self.wake_sender.notify_one();
    }
}

/// Drains ready batches into produce requests until the producer is closed and empty.
pub(super) async fn sender_loop(inner: Arc<Inner>) {
    let mut refresh_due = false;
    loop {
        let woken = inner.wake_sender.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        if refresh_due {
            refresh_due = false;
            // Errors here surface as retries of the batches themselves.
            let _ = inner.cluster.refresh(None).await;
        }
        if let Some(Err(e)) = reset_if_due(&inner).await {
            // Nothing can be sent without an id: try again after the backoff.
            tracing::warn!(%e, "could not get a new producer id");
            tokio::time::sleep(inner.cluster.config().retry_backoff).await;
            continue;
        }
        let metadata = inner.cluster.fresh_metadata().await;
        let Drained { requests, expired, next_deadline, finished, enlist } = {
            let mut state = inner.state.lock().unwrap_or_else(|e| e.into_inner());
            drain(&inner.config, &mut state, &metadata, &mut refresh_due)
        };
        for batch in expired {
            inner.complete(&batch, Outcome::Failed(Error::DeliveryTimeout(inner.config.delivery_timeout)));
        }
        if let Some((number, partitions)) = enlist {
            // Its end wakes this loop to send what it let through.
            tokio::spawn(inner.clone().enlist(number, partitions));
        }
        let sent_any = !requests.is_empty();
        for (broker, batches) in requests {
            send_request(&inner, broker, batches).await;
        }
        if finished {
            return;
        }
        if sent_any {
            // More may be sendable right away (a partition sends one batch per request).
            continue;
        }
        let sleep = next_deadline.map(|d| tokio::time::sleep_until(d.into()));
        match sleep {
            _ if refresh_due => tokio::time::sleep(inner.cluster.config().retry_backoff).await,
            Some(sleep) => {
                tokio::select! {
                    _ = &mut woken => {}
                    _ = sleep => {}
                }
            }
            None => woken.await,
        }
    }
}

/// What one pass of the sender found to do.
struct Drained {
    /// Produce requests to send: leader broker id and its batches.
    requests: Vec<(i32, Vec<ReadyBatch>)>,
    /// Batches past `delivery.timeout.ms` that were never sent (no leader, say).
    expired: Vec<ReadyBatch>,
    /// The earliest time something else becomes sendable.
    next_deadline: Option<Instant>,
    /// Closed, with nothing left.
    finished: bool,
    /// Partitions holding records of open transaction `.0` that have not joined it, to
    /// add now (with [`super::transaction::Transaction::enlisting`] set by `drain`).
    enlist: Option<(u64, Vec<crate::TopicPartition>)>,
}

/// Takes every batch that may be sent now, grouped by leader, respecting the in-flight
/// limit and one batch per partition per request. A transactional producer's batches of
/// a partition that has not joined the open transaction stay; the partition is listed to
/// join it, unless an AddPartitionsToTxn is under way (its end makes another pass) or an
/// epoch bump is due (the partition joins in the new epoch).
fn drain(config: &ProducerConfig, state: &mut State, metadata: &crate::cluster::Metadata, refresh_due: &mut bool) -> Drained {
    let now = Instant::now();
    let mut expired = Vec::new();
    let force = state.flushing > 0 || state.closing;
    let mut next_deadline: Option<Instant> = None;
    let mut per_broker: HashMap<i32, Vec<Vec<ReadyBatch>>> = HashMap::new();
    let mut request_sizes: HashMap<i32, usize> = HashMap::new();
    let State { topics, in_flight, identity, reset_pending, transaction, transactions, .. } = state;
    // A hole in a sequence: nothing goes out until the producer has a new id.
    let stalled = *reset_pending;
    let transactional = config.transactional_id.is_some();
    let mut to_enlist = Vec::new();
    for topic in topics.values_mut() {
        let leaders = metadata.topics.get(&*topic.name);
        for (p, queue) in topic.partitions.iter_mut().enumerate() {
            while queue.ready.front().is_some_and(|b| b.created.elapsed() >= config.delivery_timeout) {
                expired.extend(queue.ready.pop_front());
            }
            if queue.open.as_ref().is_some_and(|o| o.created.elapsed() >= config.delivery_timeout) {
                expired.extend(queue.open.take().and_then(|o| o.close(&topic.name, p as i32, config.compression).ok()));
            }
            if transactional && queue.enlisted != *transactions {
                // Not while an epoch bump is due: the partition joins in the new epoch.
                if !stalled && !transaction.enlisting && (queue.open.is_some() || !queue.ready.is_empty()) {
                    to_enlist.push(crate::TopicPartition::new(topic.name.to_string(), p as i32));
                }
                continue;
            }
            let linger_over = |o: &OpenBatch| force || o.created + config.linger <= now;
            let open_sendable = force || queue.open_sendable();
            if let Some(open) = &queue.open {
                if !linger_over(open) {
                    let deadline = open.created + config.linger;
                    next_deadline = Some(next_deadline.map_or(deadline, |d| d.min(deadline)));
                }
            }
            let has_ready = queue.ready.front().is_some() || (open_sendable && queue.open.as_ref().is_some_and(linger_over));
            if !has_ready || stalled {
                continue;
            }
            if let Some(retry_at) = queue.ready.front().and_then(|b| b.retry_at).filter(|&t| t > now) {
                next_deadline = Some(next_deadline.map_or(retry_at, |d| d.min(retry_at)));
                continue;
            }
            // Idempotence: a new batch waits while 5 numbered ones are unresolved (see
            // `PartitionQueue::window`), and while the partition is still on an older
            // epoch (see `PartitionQueue::holds_unresolved`); retries go first anyway,
            // in sequence order.
            if let Some(current) = *identity {
                if queue.identity.is_some_and(|id| id != current) && queue.sending == 0 && !queue.holds_unresolved() {
                    queue.restart_sequences(current);
                }
                let id = *queue.identity.get_or_insert(current);
                let front_is_new = queue.ready.front().is_none_or(|b| b.stamp.is_none_or(|s| s.identity != id));
                if front_is_new && (id != current || queue.window.len() >= MAX_IN_FLIGHT_IDEMPOTENT) {
                    continue;
                }
            }
            let leader = leaders.and_then(|t| t.partitions.get(p)).map_or(-1, |pm| pm.leader);
            queue.leader = (leader >= 0).then_some(leader);
            if leader < 0 || !metadata.brokers.contains_key(&leader) {
                *refresh_due = true;
                continue;
            }
            let requests = per_broker.entry(leader).or_default();
            let used = in_flight.get(&leader).copied().unwrap_or(0) + requests.len();
            let size = request_sizes.entry(leader).or_insert(usize::MAX);
            let next_size =
                queue.ready.front().map_or_else(|| queue.open.as_ref().map_or(0, |o| o.builder.size()), |b| b.bytes.len());
            let fits = size.saturating_add(next_size) <= config.max_request_size;
            if !fits && used >= config.max_in_flight {
                continue;
            }
            let mut batch = match queue.ready.pop_front() {
                Some(b) => b,
                None => match queue.open.take().map(|o| o.close(&topic.name, p as i32, config.compression)) {
                    Some(Ok(b)) => {
                        if topic.sticky == Some(p as i32) {
                            topic.sticky = None;
                        }
                        b
                    }
                    Some(Err(e)) => {
                        // Compression into memory does not fail in practice; if it does,
                        // the batch's records fail with the reason.
                        tracing::error!(%e, "could not build batch");
                        continue;
                    }
                    None => continue,
                },
            };
            if let Some(identity) = queue.identity {
                if batch.stamp.is_none_or(|s| s.identity != identity) {
                    let sequence = queue.next_sequence;
                    queue.next_sequence = add_sequence(sequence, batch.records);
                    queue.window.push_back((sequence, false));
                    batch.stamp(identity, sequence);
                }
            }
            queue.sending += 1;
            if fits {
                *size += batch.bytes.len();
                requests.last_mut().expect("size is MAX until a request exists").push(batch);
            } else {
                *size = batch.bytes.len();
                requests.push(vec![batch]);
            }
        }
    }
    let mut out = Vec::new();
    for (broker, requests) in per_broker {
        for batches in requests {
            *in_flight.entry(broker).or_default() += 1;
            out.push((broker, batches));
        }
    }
    let enlist = (!to_enlist.is_empty()).then(|| {
        state.transaction.enlisting = true;
        (state.transactions, to_enlist)
    });
    let finished = state.closing && state.incomplete == 0;
    Drained { requests: out, expired, next_deadline, finished, enlist }
}

async fn send_request(inner: &Arc<Inner>, broker: i32, batches: Vec<ReadyBatch>) {
    // The batches' partitions, named apart from the batches: they may be gone (completed,
    // split, retried) by the time the request stops counting as in flight.
    let counted: Vec<(Arc<str>, i32)> = batches.iter().map(|b| (b.topic.clone(), b.partition)).collect();
    // Ends the request's count in flight, for the broker and for each of those partitions.
    let release = move |inner: &Inner, partitions: &[(Arc<str>, i32)]| {
        let mut state = inner.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = state.in_flight.get_mut(&broker) {
            *n = n.saturating_sub(1);
        }
        for (topic, partition) in partitions {
            if let Some(queue) = state.queue(topic, *partition) {
                queue.sending = queue.sending.saturating_sub(1);
            }
        }
        drop(state);
        inner.wake_sender.notify_one();
    };
    let conn = match inner.cluster.broker(broker).await {
        Ok(c) => c,
        Err(e) => {
            release(inner, &counted);
            // A leader that refuses connections has usually died: until the metadata
            // names its successor, every retry would go to it again.
            let refresh = e.needs_metadata_refresh();
            for b in batches {
                inner.retry_or_fail(b, e.clone());
            }
            if refresh {
                refresh_in_background(inner);
            }
            return;
        }
    };
    let version = match conn.version::<ProduceRequest>(PRODUCE_VERSION) {
        Ok(v) => v,
        Err(e) => {
            release(inner, &counted);
            for b in batches {
                inner.complete(&b, Outcome::Failed(e.clone()));
            }
            return;
        }
    };
    let transactional_id = inner.config.transactional_id.as_deref();
    let body = produce_body(inner.config.acks, inner.config.client.request_timeout, version, transactional_id, &batches);
    if inner.config.acks == Acks::None {
        let written = conn.send_parts_oneway::<ProduceRequest>(body, version).await;
        let inner = inner.clone();
        tokio::spawn(async move {
            let result = match written {
                Ok(w) => w.await,
                Err(e) => Err(e),
            };
            release(&inner, &counted);
            for b in batches {
                match &result {
                    Ok(()) => inner.complete(&b, Outcome::Sent { base_offset: -1 }),
                    Err(e) => inner.retry_or_fail(b, e.clone()),
                }
            }
        });
        return;
    }
    // The response is handled on the connection's reader task, as it arrives: no task
    // and no timer per request (each cost more than the handling itself).
    let then = {
        let inner = inner.clone();
        let addr = conn.shared_addr();
        move |result: Result<ProduceResponse>| {
            // The request counts as in flight until its answer is handled: the epoch
            // bump after a failed batch waits for nothing to be in flight, and must not
            // come between this answer and its handling. It did: an OUT_OF_ORDER_SEQUENCE
            // answer to a batch sent behind the failed one (refused only because of the
            // hole) was then judged against the new epoch, found not retriable, and
            // failed a record the broker never refused.
            match result {
                Ok(response) => handle_response(&inner, &addr, batches, response),
                Err(e) => {
                    let refresh = e.needs_metadata_refresh();
                    for mut b in batches {
                        // The request went out and no answer came back.
                        b.maybe_stored = true;
                        inner.retry_or_fail(b, e.clone());
                    }
                    if refresh {
                        refresh_in_background(&inner);
                    }
                }
            }
            release(&inner, &counted);
        }
    };
    conn.send_parts_then::<ProduceRequest>(body, version, then).await;
}

/// A Produce request's body for `batches`, grouped by topic in order of appearance,
/// naming the producer's transactional id (a broker takes transactional batches only
/// with it).
fn produce_body(
    acks: Acks,
    timeout: Duration,
    version: i16,
    transactional_id: Option<&str>,
    batches: &[ReadyBatch],
) -> BodyParts {
    let mut topics: Vec<request::TopicBatches<'_>> = Vec::new();
    for b in batches {
        match topics.iter_mut().find(|(name, _)| **name == *b.topic) {
            Some((_, partitions)) => partitions.push((b.partition, &b.bytes)),
            None => topics.push((&b.topic, vec![(b.partition, &b.bytes)])),
        }
    }
    request::produce_body(version, transactional_id, acks.wire(), timeout.as_millis() as i32, &topics)
}

fn handle_response(inner: &Arc<Inner>, broker: &str, batches: Vec<ReadyBatch>, response: ProduceResponse) {
    let mut refresh = false;
    for mut batch in batches {
        let result = response
            .responses
            .iter()
            .filter(|t| *t.name.0 == *batch.topic)
            .flat_map(|t| &t.partition_responses)
            .find(|p| p.index == batch.partition);
        let Some(result) = result else {
            let detail = format!("no produce result for {}-{}", batch.topic, batch.partition);
            inner.complete(&batch, Outcome::Failed(Error::Protocol { broker: broker.to_string(), detail }));
            continue;
        };
        let context = || format!("produce to {}-{}", batch.topic, batch.partition);
        match Error::kafka(result.error_code, context(), result.error_message.as_ref().map(|m| m.to_string())) {
            None => inner.complete(&batch, Outcome::Sent { base_offset: result.base_offset }),
            // Older brokers answer a retry of an appended batch this way: it is stored.
            Some(e) if e.code() == Some(ResponseError::DuplicateSequenceNumber) => {
                inner.complete(&batch, Outcome::Sent { base_offset: result.base_offset })
            }
            Some(e) if e.code() == Some(ResponseError::OutOfOrderSequenceNumber) => {
                // Whatever an earlier attempt came to, the batch is not stored: had it
                // been, the broker would have recognised it as a duplicate.
                batch.maybe_stored = false;
                let retriable = inner.state.lock().unwrap_or_else(|e| e.into_inner()).out_of_order_is_retriable(&batch);
                inner.retry_or_fail_as(batch, e, retriable);
            }
            Some(e) if e.code() == Some(ResponseError::MessageTooLarge) && batch.records > 1 => {
                split_and_resend(inner, batch);
            }
            // The broker named the records it refused (KIP-467) and they are not all of
            // the batch: sent one per batch, only those fail, and the rest are stored in
            // order. (Kafka's producer fails the whole batch, leaving the caller to tell
            // the innocent records from the refused ones and send them again.)
            Some(e) if refused_some_records(&e, &result.record_errors, batch.records) => {
                split_and_resend(inner, batch);
            }
            Some(e) => {
                refresh |= e.needs_metadata_refresh();
                batch.maybe_stored |= e.code().is_some_and(|c| MAYBE_STORED.contains(&c));
                inner.retry_or_fail(batch, e);
            }
        }
    }
    if refresh {
        refresh_in_background(inner);
    } else {
        inner.wake_sender.notify_one();
    }
}

/// Whether a batch of `records` refused with `error` holds records the broker did not
/// refuse: it named (in `record_errors`) some of them, not all, as invalid on their own.
fn refused_some_records(error: &Error, record_errors: &[BatchIndexAndErrorMessage], records: usize) -> bool {
    let own_fault = matches!(error.code(), Some(ResponseError::InvalidRecord | ResponseError::InvalidTimestamp));
    own_fault && !record_errors.is_empty() && record_errors.len() < records
}

/// Refreshes the metadata off the sender task, then wakes the sender to retry on it.
fn refresh_in_background(inner: &Arc<Inner>) {
    let inner = inner.clone();
    tokio::spawn(async move {
        let _ = inner.cluster.refresh(None).await;
        inner.wake_sender.notify_one();
    });
}

/// Replaces a batch the broker found too large by one batch per record; the original
/// batch completes record by record when they do.
fn split_and_resend(inner: &Arc<Inner>, batch: ReadyBatch) {
    let parts = match split_batch(&batch.bytes, inner.config.compression) {
        Ok(parts) => parts,
        Err(e) => {
            inner.complete(&batch, Outcome::Failed(e));
            return;
        }
    };
    let completions: Vec<Arc<Completion>> = parts.iter().map(|_| Arc::new(Completion::default())).collect();
    {
        let mut state = inner.state.lock().unwrap_or_else(|e| e.into_inner());
        state.incomplete += parts.len();
        let partitions = state.topics.get(&*batch.topic).map_or(0, |t| t.partitions.len()) as i32;
        let queue = &mut state.topics.entry_ref(&batch.topic.clone(), partitions).partitions[batch.partition as usize];
        if let Some(stamp) = batch.stamp {
            // The parts take the original's place in the window, one sequence each.
            if let Some(at) = queue.window.iter().position(|(sequence, _)| *sequence == stamp.sequence) {
                queue.window.remove(at);
                for i in (0..parts.len()).rev() {
                    queue.window.insert(at, (add_sequence(stamp.sequence, i), false));
                }
            }
        }
        for (i, (bytes, completion)) in parts.into_iter().zip(&completions).enumerate().rev() {
            let mut part = ReadyBatch {
                topic: batch.topic.clone(),
                partition: batch.partition,
                bytes,
                records: 1,
                completion: completion.clone(),
                memory: 0,
                created: batch.created,
                attempts: batch.attempts,
                retry_at: None,
                stamp: None,
                maybe_stored: false,
                audit: Vec::new(),
            };
            // The parts take the original batch's sequence numbers, one each.
            if let Some(stamp) = batch.stamp {
                part.stamp(stamp.identity, add_sequence(stamp.sequence, i));
            }
            queue.ready.push_front(part);
        }
    }
    inner.wake_sender.notify_one();
    let inner = inner.clone();
    tokio::spawn(async move {
        let mut results = Vec::with_capacity(completions.len());
        for c in &completions {
            results.push(c.wait().await);
        }
        inner.complete(&batch, Outcome::PerRecord(results));
    });
}
