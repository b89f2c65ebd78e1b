//! FindCoordinator: where a group's coordinator is; this broker when no broker holds it
//! (transactional ids, key type 1, are `crate::handler::txn`'s).

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

    /// Where the group's coordinator is, on `listener`: the registered broker that holds
    /// the coordinator node (one without that listener is as good as unreachable), or
    /// this broker when nobody does. The node is not taken here but by the request that
    /// follows (JoinGroup, OffsetCommit), so asking about made-up groups writes nothing
    /// in the registry; had it been taken here, each left a node behind for good. When
    /// another broker takes the group first, that request gets NOT_COORDINATOR and the
    /// client asks again, as after any coordinator move.
    async fn locate(&self, group_id: &str, listener: &str) -> Result<(i32, String, u16), ResponseError> {
        let owner = self.inner.holder(group_id).await?.unwrap_or(self.inner.endpoint.broker_id);
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
