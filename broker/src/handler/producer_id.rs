//! InitProducerId: hands idempotent producers a cluster-wide unique producer id.
//!
//! Ids come from blocks claimed in the metadata store, as Kafka's ZooKeeper mode does:
//! `/latest_producer_id_block` holds the last block handed out; a broker claims the
//! next one with a compare-and-set on the node's version (or by creating the node for
//! the first block), so two brokers — or one broker before and after a restart — never
//! hand out the same id. Ids of a block not used before a restart are skipped, never
//! reused. Works the same on ZooKeeper and on the embedded store.
//!
//! A request with a transactional id goes to the transaction coordinator
//! (`crate::handler::txn`). An idempotent producer gets a new id with epoch 0 on every
//! call, as Kafka does for non-transactional producers (the v3+ `producer_id`/
//! `producer_epoch` fields only matter for transactions).

use fjord_coord::registry::{read_json, to_json, ProducerIdBlock};
use fjord_coord::{paths, CreateMode, Store};
use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId, ResponseKind};
use tokio::sync::Mutex;

use crate::codec::error_code;
use crate::handler::Broker;
use crate::{Error, Result};

/// Ids per claimed block (Kafka's `ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE`).
pub(crate) const BLOCK_SIZE: i64 = 1000;

/// Allocates producer ids from blocks claimed in the metadata store.
pub(crate) struct ProducerIdManager {
    store: Store,
    broker_id: i32,
    /// `(next, end)` of the current block, `end` inclusive; exhausted when `next > end`.
    block: Mutex<(i64, i64)>,
}

impl ProducerIdManager {
    pub(crate) fn new(store: Store, broker_id: i32) -> Self {
        Self { store, broker_id, block: Mutex::new((0, -1)) }
    }

    /// The next unused producer id, claiming a new block when the current one is used up.
    pub(crate) async fn next_id(&self) -> Result<i64> {
        let mut block = self.block.lock().await;
        if block.0 > block.1 {
            *block = self.claim_block().await?;
        }
        let id = block.0;
        block.0 += 1;
        Ok(id)
    }

    async fn claim_block(&self) -> Result<(i64, i64)> {
        let path = paths::LATEST_PRODUCER_ID_BLOCK;
        let bad = |reason| Error::ProducerIdBlock { path: path.to_owned(), reason };
        let document = |start: i64| ProducerIdBlock {
            version: 1,
            broker: self.broker_id,
            block_start: start.to_string(),
            block_end: (start + BLOCK_SIZE - 1).to_string(),
        };
        loop {
            let claimed = match read_json::<ProducerIdBlock>(&*self.store, path).await? {
                None => match self.store.create(path, &to_json(&document(0)), CreateMode::Persistent).await {
                    Ok(_) => 0,
                    Err(fjord_coord::Error::NodeExists { .. }) => continue, // another broker was first
                    Err(e) => return Err(e.into()),
                },
                Some((previous, stat)) => {
                    let end: i64 = previous.block_end.parse().map_err(|_| bad("block_end is not a number"))?;
                    let start =
                        end.checked_add(1).filter(|s| *s <= i64::MAX - BLOCK_SIZE).ok_or(bad("producer ids exhausted"))?;
                    match self.store.set(path, &to_json(&document(start)), Some(stat.version)).await {
                        Ok(_) => start,
                        Err(fjord_coord::Error::BadVersion { .. }) => continue, // lost the race: read again
                        Err(e) => return Err(e.into()),
                    }
                }
            };
            tracing::info!(
                broker_id = self.broker_id,
                start = claimed,
                end = claimed + BLOCK_SIZE - 1,
                "claimed a producer id block"
            );
            return Ok((claimed, claimed + BLOCK_SIZE - 1));
        }
    }
}

impl Broker {
    pub(crate) async fn init_producer_id(&self, request: InitProducerIdRequest, version: i16) -> ResponseKind {
        if let Some(id) = request.transactional_id.clone() {
            return self.init_txn_producer_id(request, version, &id).await;
        }
        let response = InitProducerIdResponse::default().with_producer_id(ProducerId(-1)).with_producer_epoch(-1);
        let response = {
            match self.producer_ids.next_id().await {
                Ok(id) => response.with_producer_id(ProducerId(id)).with_producer_epoch(0),
                Err(e) => {
                    tracing::warn!(error = %e, "could not allocate a producer id");
                    // Retriable: clients ask again (the store may be briefly unreachable).
                    response.with_error_code(error_code::COORDINATOR_NOT_AVAILABLE)
                }
            }
        };
        ResponseKind::InitProducerId(response)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn brokers_sharing_a_store_never_hand_out_the_same_id() {
        let dir = tempfile::tempdir().unwrap();
        let store: Store = Arc::new(fjord_coord::EmbeddedStore::open(dir.path()).unwrap());
        let managers: Vec<Arc<ProducerIdManager>> = (0..3).map(|b| Arc::new(ProducerIdManager::new(store.clone(), b))).collect();
        let mut tasks = Vec::new();
        for m in &managers {
            for _ in 0..4 {
                let m = m.clone();
                tasks.push(tokio::spawn(async move {
                    let mut ids = Vec::new();
                    for _ in 0..600 {
                        ids.push(m.next_id().await.unwrap());
                    }
                    ids
                }));
            }
        }
        let mut all = HashSet::new();
        for t in tasks {
            for id in t.await.unwrap() {
                assert!(all.insert(id), "id {id} handed out twice");
            }
        }
        assert_eq!(all.len(), 3 * 4 * 600);
        // A restarted broker (a new manager) continues after the last claimed block.
        let (block, _) = read_json::<ProducerIdBlock>(&*store, paths::LATEST_PRODUCER_ID_BLOCK).await.unwrap().unwrap();
        let restarted = ProducerIdManager::new(store.clone(), 0);
        assert_eq!(restarted.next_id().await.unwrap(), block.block_end.parse::<i64>().unwrap() + 1);
        // A damaged document is an error, not a reuse of ids.
        store
            .set(paths::LATEST_PRODUCER_ID_BLOCK, b"{\"version\":1,\"broker\":0,\"block_start\":\"x\",\"block_end\":\"y\"}", None)
            .await
            .unwrap();
        let fresh = ProducerIdManager::new(store, 1);
        assert!(matches!(fresh.next_id().await, Err(Error::ProducerIdBlock { .. })));
    }
}
