//! Named listeners and connection hardening, against a broker on several listeners:
//! Metadata and FindCoordinator answer with the addresses of the listener the client
//! came in on, the registration carries every listener, replica fetches are honoured
//! only from the inter-broker listener and a registered broker's address, idle and
//! unauthenticated connections are closed, and the connection limits refuse by closing.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use common::{topic_name, RawClient};
use fjord_broker::BrokerConfig;
use fjord_coord::registry::{read_json, to_json, BrokerRegistration};
use fjord_coord::{create_all, paths, CreateMode, Store};
use fjord_testkit::StandaloneBroker;
use kafka_protocol::messages::create_topics_request::{CreatableReplicaAssignment, CreatableTopic};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{
    metadata_request, ApiKey, ApiVersionsRequest, ApiVersionsResponse, BrokerId, CreateTopicsRequest, CreateTopicsResponse,
    FetchRequest, FetchResponse, FindCoordinatorRequest, FindCoordinatorResponse, MetadataRequest, MetadataResponse,
};
use kafka_protocol::protocol::StrBytes;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// A broker on the listeners of `listeners` (`NAME://127.0.0.1:0,...`), with its store.
struct MultiBroker {
    broker: StandaloneBroker,
}

impl MultiBroker {
    async fn start(listeners: &str, configure: impl FnOnce(&mut BrokerConfig)) -> Self {
        common::init_tracing();
        let broker = StandaloneBroker::builder().set("listeners", listeners).configure(configure).start().await.unwrap();
        Self { broker }
    }

    fn addr(&self, listener: &str) -> SocketAddr {
        self.broker.listener(listener)
    }

    fn store(&self) -> &Store {
        self.broker.store()
    }

    async fn client(&self, listener: &str) -> RawClient {
        RawClient::connect(self.addr(listener)).await.unwrap()
    }

    async fn stop(self) {
        self.broker.stop().await.unwrap();
    }
}

async fn metadata(client: &mut RawClient) -> MetadataResponse {
    let request = MetadataRequest::default().with_topics(Some(Vec::<metadata_request::MetadataRequestTopic>::new()));
    client.call(ApiKey::Metadata, 12, &request).await.unwrap()
}

async fn api_versions(client: &mut RawClient) -> anyhow::Result<ApiVersionsResponse> {
    client.call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default()).await
}

fn replica_fetch(topic: &str, replica: i32, offset: i64) -> FetchRequest {
    FetchRequest::default().with_replica_id(BrokerId(replica)).with_max_wait_ms(0).with_max_bytes(1 << 20).with_topics(vec![
        FetchTopic::default().with_topic(topic_name(topic)).with_partitions(vec![FetchPartition::default()
            .with_partition(0)
            .with_fetch_offset(offset)
            .with_partition_max_bytes(1 << 20)]),
    ])
}

async fn fetch_error(client: &mut RawClient, request: &FetchRequest) -> i16 {
    let response: FetchResponse = client.call(ApiKey::Fetch, 12, request).await.unwrap();
    response.responses[0].partitions[0].error_code
}

const TOPIC_AUTHORIZATION_FAILED: i16 = 29;

#[tokio::test]
async fn metadata_and_find_coordinator_answer_with_the_listener_the_client_came_in_on() {
    let broker = MultiBroker::start("INTERNAL://127.0.0.1:0,EXTERNAL://127.0.0.1:0", |c| {
        c.set("listener.security.protocol.map", "INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT").unwrap();
        c.set("inter.broker.listener.name", "INTERNAL").unwrap();
    })
    .await;
    let (internal, external) = (broker.addr("INTERNAL"), broker.addr("EXTERNAL"));
    // Kafka's registration: every listener's endpoint and the protocol map; host and
    // port are the inter-broker listener's.
    let (registration, _) = read_json::<BrokerRegistration>(&**broker.store(), &paths::broker(0)).await.unwrap().unwrap();
    assert_eq!(
        registration.endpoints,
        [format!("INTERNAL://127.0.0.1:{}", internal.port()), format!("EXTERNAL://127.0.0.1:{}", external.port())]
    );
    assert_eq!(registration.listener_security_protocol_map["EXTERNAL"], "PLAINTEXT");
    assert_eq!((registration.host.as_str(), registration.port), ("127.0.0.1", internal.port()));

    for (name, addr) in [("INTERNAL", internal), ("EXTERNAL", external)] {
        let mut client = broker.client(name).await;
        let response = metadata(&mut client).await;
        let ports: Vec<i32> = response.brokers.iter().map(|b| b.port).collect();
        assert_eq!(ports, [i32::from(addr.port())], "Metadata on {name}");
        let request = FindCoordinatorRequest::default().with_key(StrBytes::from_static_str("group-a"));
        let response: FindCoordinatorResponse = client.call(ApiKey::FindCoordinator, 3, &request).await.unwrap();
        assert_eq!((response.error_code, response.port), (0, i32::from(addr.port())), "FindCoordinator on {name}");
    }
    broker.stop().await;
}

#[tokio::test]
async fn advertised_listeners_are_per_listener_name() {
    let broker = MultiBroker::start("INTERNAL://127.0.0.1:0,EXTERNAL://127.0.0.1:0", |c| {
        c.set("listener.security.protocol.map", "INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT").unwrap();
        c.set("advertised.listeners", "EXTERNAL://kafka.example:19094").unwrap();
    })
    .await;
    let mut client = broker.client("EXTERNAL").await;
    let broker_row = metadata(&mut client).await.brokers.remove(0);
    assert_eq!((broker_row.host.to_string(), broker_row.port), ("kafka.example".to_owned(), 19094));
    let mut client = broker.client("INTERNAL").await;
    let broker_row = metadata(&mut client).await.brokers.remove(0);
    assert_eq!(
        (broker_row.host.to_string(), broker_row.port),
        ("127.0.0.1".to_owned(), i32::from(broker.addr("INTERNAL").port()))
    );
    broker.stop().await;
}

/// Registers a broker 1 that never runs, at 127.0.0.1 on both listeners: a follower
/// that only a client pretending to be it could keep in the ISR.
async fn register_absent_follower(broker: &MultiBroker) {
    let registration = BrokerRegistration {
        host: "127.0.0.1".into(),
        port: 1,
        rack: None,
        endpoints: vec!["INTERNAL://127.0.0.1:1".into(), "EXTERNAL://127.0.0.1:2".into()],
        listener_security_protocol_map: Default::default(),
    };
    create_all(&**broker.store(), &paths::broker(1), &to_json(&registration), CreateMode::Ephemeral).await.unwrap();
}

#[tokio::test]
async fn a_replica_fetch_from_a_client_is_refused_and_moves_no_follower() {
    let broker = MultiBroker::start("INTERNAL://127.0.0.1:0,EXTERNAL://127.0.0.1:0", |c| {
        c.set("listener.security.protocol.map", "INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT").unwrap();
        c.set("inter.broker.listener.name", "INTERNAL").unwrap();
        c.set("replica.lag.time.max.ms", "1500").unwrap();
    })
    .await;
    register_absent_follower(&broker).await;
    let mut admin = broker.client("EXTERNAL").await;
    let topic = CreatableTopic::default()
        .with_name(topic_name("guarded"))
        .with_num_partitions(-1)
        .with_replication_factor(-1)
        .with_assignments(vec![CreatableReplicaAssignment::default()
            .with_partition_index(0)
            .with_broker_ids(vec![BrokerId(0), BrokerId(1)])]);
    let request = CreateTopicsRequest::default().with_timeout_ms(10_000).with_topics(vec![topic]);
    let response: CreateTopicsResponse = admin.call(ApiKey::CreateTopics, 7, &request).await.unwrap();
    assert_eq!(response.topics[0].error_code, 0, "{:?}", response.topics[0].error_message);

    // Clients pretend to be broker 1, caught up (offset 0 is the log end): one on the
    // client-facing listener, one on the inter-broker listener from an address broker 1
    // is not registered at.
    let mut outside = broker.client("EXTERNAL").await;
    let mut elsewhere = RawClient::connect_from(IpAddr::from([127, 0, 0, 2]), broker.addr("INTERNAL")).await.unwrap();
    let fetch = replica_fetch("guarded", 1, 0);
    let isr = |response: &MetadataResponse| -> Vec<i32> {
        let topic = response.topics.iter().find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == "guarded"));
        topic.map(|t| t.partitions[0].isr_nodes.iter().map(|b| b.0).collect()).unwrap_or_default()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        assert_eq!(fetch_error(&mut outside, &fetch).await, TOPIC_AUTHORIZATION_FAILED, "client-facing listener");
        assert_eq!(fetch_error(&mut elsewhere, &fetch).await, TOPIC_AUTHORIZATION_FAILED, "unregistered address");
        let request = MetadataRequest::default()
            .with_topics(Some(vec![metadata_request::MetadataRequestTopic::default().with_name(Some(topic_name("guarded")))]));
        let response: MetadataResponse = admin.call(ApiKey::Metadata, 12, &request).await.unwrap();
        if isr(&response) == [0] {
            break; // the absent follower left the ISR despite the fetches in its name
        }
        assert!(tokio::time::Instant::now() < deadline, "broker 1 stayed in the ISR: {:?}", isr(&response));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // From the inter-broker listener at broker 1's registered address, the replica id
    // is honoured (this is how followers fetch).
    let mut follower = broker.client("INTERNAL").await;
    assert_eq!(fetch_error(&mut follower, &fetch).await, 0);
    broker.stop().await;
}

#[tokio::test]
async fn idle_connections_are_closed_and_active_ones_are_not() {
    let broker = MultiBroker::start("PLAINTEXT://127.0.0.1:0", |c| c.set("connections.max.idle.ms", "600").unwrap()).await;
    let mut idle = broker.client("PLAINTEXT").await;
    let mut active = broker.client("PLAINTEXT").await;
    let started = tokio::time::Instant::now();
    while started.elapsed() < Duration::from_millis(1500) {
        api_versions(&mut active).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(idle.is_closed_by_broker().await, "a silent connection is closed after connections.max.idle.ms");
    api_versions(&mut active).await.expect("a connection in use stays open");
    broker.stop().await;
}

#[tokio::test]
async fn connections_beyond_the_limits_are_closed_and_others_served() {
    let broker = MultiBroker::start("PLAINTEXT://127.0.0.1:0", |c| {
        c.set("max.connections.per.ip", "2").unwrap();
        c.set("max.connections", "3").unwrap();
    })
    .await;
    let addr = broker.addr("PLAINTEXT");
    let (here, there, third) = (IpAddr::from([127, 0, 0, 1]), IpAddr::from([127, 0, 0, 2]), IpAddr::from([127, 0, 0, 3]));
    let mut first = RawClient::connect_from(here, addr).await.unwrap();
    let mut second = RawClient::connect_from(here, addr).await.unwrap();
    api_versions(&mut first).await.unwrap();
    api_versions(&mut second).await.unwrap();
    let mut over_per_ip = RawClient::connect_from(here, addr).await.unwrap();
    assert!(over_per_ip.is_closed_by_broker().await, "a third connection from one address is closed");
    let mut other = RawClient::connect_from(there, addr).await.unwrap();
    api_versions(&mut other).await.expect("another address is served");
    let mut over_total = RawClient::connect_from(third, addr).await.unwrap();
    assert!(over_total.is_closed_by_broker().await, "a fourth connection in all is closed");
    drop(first);
    // The slot comes back once the broker has seen the close.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut again = RawClient::connect_from(here, addr).await.unwrap();
        if api_versions(&mut again).await.is_ok() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "a closed connection's slot was not given back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    api_versions(&mut second).await.expect("the connections within the limits were never affected");
    broker.stop().await;
}

#[tokio::test]
async fn before_sasl_authentication_only_api_versions_and_small_frames_are_answered() {
    let broker = MultiBroker::start("SASL_PLAINTEXT://127.0.0.1:0,PLAINTEXT://127.0.0.1:0", |c| {
        c.set("inter.broker.listener.name", "PLAINTEXT").unwrap();
        c.set("connection.authentication.timeout.ms", "800").unwrap();
    })
    .await;
    // ApiVersions is answered; Metadata closes the connection.
    let mut client = broker.client("SASL_PLAINTEXT").await;
    api_versions(&mut client).await.unwrap();
    let frame = client.encode(ApiKey::Metadata, 12, &MetadataRequest::default());
    client.send_frame(&frame).await.unwrap();
    assert!(client.is_closed_by_broker().await, "Metadata before authentication closes the connection");
    // A frame over sasl.server.max.receive.size is refused by its length alone.
    let mut client = broker.client("SASL_PLAINTEXT").await;
    use tokio::io::AsyncWriteExt;
    client.stream.write_all(&(600 * 1024i32).to_be_bytes()).await.unwrap();
    assert!(client.is_closed_by_broker().await, "a 600 KiB frame before authentication closes the connection");
    // A client that never authenticates is dropped after the timeout.
    let mut stalled = broker.client("SASL_PLAINTEXT").await;
    api_versions(&mut stalled).await.unwrap();
    assert!(stalled.is_closed_by_broker().await, "an unauthenticated connection is dropped after the timeout");
    // The plaintext listener serves everything, untouched by the above.
    let mut plain = broker.client("PLAINTEXT").await;
    assert!(!metadata(&mut plain).await.brokers.is_empty());
    broker.stop().await;
}

#[tokio::test]
async fn the_single_address_form_of_listeners_still_works() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = BrokerConfig { log_dir: dir.path().to_path_buf(), listeners: addr.into(), ..BrokerConfig::default() };
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(fjord_broker::run(config, listener, shutdown.clone()));
    let mut client = loop {
        if let Ok(client) = RawClient::connect(addr).await {
            break client;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let response = metadata(&mut client).await;
    assert_eq!(response.brokers[0].port, i32::from(addr.port()));
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// The inter-broker listener is Kafka's protected listener: when clients have used up
/// `max.connections`, a broker (here a connection to INTERNAL) still gets in, while
/// another client is closed.
#[tokio::test]
async fn the_inter_broker_listener_is_not_refused_at_max_connections() {
    let broker = MultiBroker::start("CLIENT://127.0.0.1:0,INTERNAL://127.0.0.1:0", |c| {
        c.set("listener.security.protocol.map", "CLIENT:PLAINTEXT,INTERNAL:PLAINTEXT").unwrap();
        c.set("inter.broker.listener.name", "INTERNAL").unwrap();
        c.set("max.connections", "2").unwrap();
    })
    .await;
    let mut first = broker.client("CLIENT").await;
    let mut second = broker.client("CLIENT").await;
    api_versions(&mut first).await.unwrap();
    api_versions(&mut second).await.unwrap();
    let mut over = broker.client("CLIENT").await;
    assert!(over.is_closed_by_broker().await, "a third client connection is closed");
    let mut replica = broker.client("INTERNAL").await;
    api_versions(&mut replica).await.expect("the inter-broker listener is served past max.connections");
    broker.stop().await;
}
