//! FindCoordinator: where a group's coordinator is, claiming it for this broker when
//! no broker holds it (transactional ids, key type 1, are `crate::handler::txn`'s).

use fjord_coord::{paths, registry};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::GroupCoordinator;

/// FindCoordinator's key type of a consumer group.
const KEY_TYPE_GROUP: i8 = 0;

impl GroupCoordinator {
    /// FindCoordinator, answered with the coordinators' addresses on `listener` (the one
    /// the client came in on).
    pub(crate) async fn find_coordinator(&self, request: FindCoordinatorRequest, version: i16, listener: &str) -> ResponseKind {
        let keys: Vec<StrBytes> = if version >= 4 { request.coordinator_keys.clone() } else { vec![request.key.clone()] };
        let mut coordinators = Vec::new();
        for key in keys {
            let answer = if request.key_type != KEY_TYPE_GROUP {
                Err(ResponseError::InvalidRequest)
            } else if key.is_empty() {
                Err(ResponseError::InvalidGroupId)
            } else {
                self.locate(&key, listener).await
            };
            let mut coordinator = Coordinator::default().with_key(key);
            match answer {
                Ok((broker_id, host, port)) => {
                    coordinator = coordinator
                        .with_node_id(BrokerId(broker_id))
                        .with_host(StrBytes::from_string(host))
                        .with_port(i32::from(port));
                }
                Err(e) => {
                    let message = e.to_string();
                    coordinator = coordinator
                        .with_error_code(e.code())
                        .with_node_id(BrokerId(-1))
                        .with_port(-1)
                        .with_error_message(Some(StrBytes::from_string(message)));
                }
            }
            coordinators.push(coordinator);
        }
        ResponseKind::FindCoordinator(coordinators_response(version, coordinators))
    }

    /// Where the group's coordinator is, on `listener`: this broker if it holds (or can
    /// take) the coordinator node, otherwise the registered broker that holds it (one
    /// without that listener is as good as unreachable). The node is taken here, so that
    /// every client of the group is sent to the same broker (answering "this broker"
    /// without taking it sent clients asking different brokers to different places, and
    /// librdkafka's `committed()` gives up on the NOT_COORDINATOR that follows); a node
    /// taken for a group no request then brings into memory is given up after
    /// [`super::FOUND_RELEASE`], so made-up group ids leave nothing behind.
    async fn locate(&self, group_id: &str, listener: &str) -> Result<(i32, String, u16), ResponseError> {
        let owner = match self.inner.holder(group_id).await? {
            Some(holder) => holder,
            None => {
                let owner = self.inner.claim(group_id).await?;
                if owner == self.inner.endpoint.broker_id {
                    self.inner.found.lock().expect("found lock").insert(group_id.to_owned(), std::time::Instant::now());
                }
                owner
            }
        };
        if owner == self.inner.endpoint.broker_id {
            let own = self.inner.endpoint.listeners.iter().find(|l| l.name == listener);
            return own.map(|l| (owner, l.host.clone(), l.port)).ok_or(ResponseError::CoordinatorNotAvailable);
        }
        match registry::read_json::<registry::BrokerRegistration>(&*self.inner.store, &paths::broker(owner)).await {
            Ok(Some((b, _))) => match b.endpoint(listener) {
                Some((host, port)) => Ok((owner, host.to_owned(), port)),
                None => Err(ResponseError::CoordinatorNotAvailable),
            },
            _ => Err(ResponseError::CoordinatorNotAvailable),
        }
    }
}

/// A FindCoordinator answer from one coordinator per key: v4+ lists them, older versions
/// asked for one key and carry its answer at the top level. Shared by the group and the
/// transaction coordinators.
pub(crate) fn coordinators_response(version: i16, mut coordinators: Vec<Coordinator>) -> FindCoordinatorResponse {
    let response = FindCoordinatorResponse::default();
    if version >= 4 {
        return response.with_coordinators(coordinators);
    }
    let c = coordinators.pop().unwrap_or_default();
    response
        .with_error_code(c.error_code)
        .with_error_message(c.error_message)
        .with_node_id(c.node_id)
        .with_host(c.host)
        .with_port(c.port)
}
