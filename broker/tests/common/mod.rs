//! Shared test helpers: an in-process broker on 127.0.0.1:0 (through the production
//! `run`), a raw Kafka-protocol client with the requests most tests send (Produce of
//! one batch, ListOffsets of one partition), kcat and the Python clients.
#![allow(dead_code)] // each test binary uses a different subset

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use fjord_broker::BrokerConfig;
use fjord_testkit::StandaloneBroker;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, BrokerId, ListOffsetsRequest, ListOffsetsResponse, ProduceRequest, ProduceResponse, RequestHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub(crate) fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
}

/// A broker running in this process (testkit's [`StandaloneBroker`] with its data in a
/// dir the test chose, so it can be restarted on the same data).
pub(crate) struct TestBroker {
    pub(crate) addr: SocketAddr,
    pub(crate) data_dir: PathBuf,
    broker: StandaloneBroker,
}

impl TestBroker {
    /// Starts a broker on a fresh port with its data in `data_dir`; returns once it serves.
    pub(crate) async fn start_in(data_dir: PathBuf, configure: impl FnOnce(&mut BrokerConfig)) -> anyhow::Result<Self> {
        init_tracing();
        let broker = StandaloneBroker::builder().data_dir(data_dir.clone()).configure(configure).audit_tier().start().await?;
        Ok(Self { addr: broker.addr.parse()?, data_dir, broker })
    }

    /// Clean shutdown; returns what `run` returned.
    pub(crate) async fn stop(self) -> anyhow::Result<()> {
        self.broker.stop().await
    }

    pub(crate) fn bootstrap(&self) -> String {
        self.addr.to_string()
    }
}

/// ListOffsets timestamps: the log end (high watermark) and the log start.
pub(crate) const LATEST: i64 = -1;
pub(crate) const EARLIEST: i64 = -2;

pub(crate) fn topic_name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_owned()))
}

/// A Produce request of one record batch to one partition.
pub(crate) fn produce_request(topic: &str, partition: i32, acks: i16, timeout_ms: i32, records: Bytes) -> ProduceRequest {
    ProduceRequest::default().with_acks(acks).with_timeout_ms(timeout_ms).with_topic_data(vec![TopicProduceData::default()
        .with_name(topic_name(topic))
        .with_partition_data(vec![PartitionProduceData::default().with_index(partition).with_records(Some(records))])])
}

/// A raw Kafka-protocol connection: typed requests out, raw response bodies back.
pub(crate) struct RawClient {
    pub(crate) stream: TcpStream,
    correlation_id: i32,
    /// The client id in every request header; `fjord-test` unless set.
    pub(crate) client_id: &'static str,
}

impl RawClient {
    pub(crate) async fn connect(addr: SocketAddr) -> anyhow::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self { stream, correlation_id: 0, client_id: "fjord-test" })
    }

    /// Connects from the local address `from` (e.g. 127.0.0.2, another loopback address).
    pub(crate) async fn connect_from(from: std::net::IpAddr, addr: SocketAddr) -> anyhow::Result<Self> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(SocketAddr::new(from, 0))?;
        let stream = socket.connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self { stream, correlation_id: 0, client_id: "fjord-test" })
    }

    /// Encodes a request (header + body), without the length prefix.
    pub(crate) fn encode<T: Encodable>(&mut self, key: ApiKey, version: i16, body: &T) -> Bytes {
        self.correlation_id += 1;
        let mut buf = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(StrBytes::from_static_str(self.client_id)))
            .encode(&mut buf, key.request_header_version(version))
            .unwrap();
        body.encode(&mut buf, version).unwrap();
        buf.freeze()
    }

    pub(crate) async fn send_frame(&mut self, frame: &[u8]) -> anyhow::Result<()> {
        let mut buf = BytesMut::with_capacity(frame.len() + 4);
        buf.put_i32(frame.len() as i32);
        buf.put_slice(frame);
        self.stream.write_all(&buf).await?;
        Ok(())
    }

    /// Reads one response frame: (correlation id, the rest).
    pub(crate) async fn read_frame(&mut self) -> anyhow::Result<Bytes> {
        let len = self.stream.read_i32().await? as usize;
        let mut buf = vec![0; len];
        self.stream.read_exact(&mut buf).await?;
        Ok(Bytes::from(buf))
    }

    /// Sends a request and decodes the typed response.
    pub(crate) async fn call<Req: Encodable, Resp: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        body: &Req,
    ) -> anyhow::Result<Resp> {
        let frame = self.encode(key, version, body);
        self.send_frame(&frame).await?;
        let expected = self.correlation_id;
        self.read_response(key, version, expected).await
    }

    pub(crate) async fn read_response<Resp: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        correlation_id: i32,
    ) -> anyhow::Result<Resp> {
        let mut frame = self.read_frame().await?;
        let got = frame.get_i32();
        if got != correlation_id {
            bail!("correlation id {got}, expected {correlation_id}");
        }
        if key.response_header_version(version) >= 1 {
            let tagged = frame.get_u8();
            assert_eq!(tagged, 0, "no tagged fields in the response header");
        }
        let response = Resp::decode(&mut frame, version)?;
        if frame.has_remaining() {
            bail!("{} bytes left after the {key:?} v{version} response", frame.remaining());
        }
        Ok(response)
    }

    /// Sends a Produce request of one partition ([`produce_request`]) at `version`:
    /// (error code, base offset).
    pub(crate) async fn produce(&mut self, version: i16, request: &ProduceRequest) -> (i16, i64) {
        let response: ProduceResponse = self.call(ApiKey::Produce, version, request).await.unwrap();
        let p = &response.responses[0].partition_responses[0];
        (p.error_code, p.base_offset)
    }

    /// ListOffsets (v5) of one partition at `timestamp` ([`LATEST`], [`EARLIEST`] or ms):
    /// (error code, offset).
    pub(crate) async fn list_offset(&mut self, topic: &str, partition: i32, timestamp: i64) -> (i16, i64) {
        self.list_offset_in(topic, partition, timestamp, 0).await
    }

    /// [`RawClient::list_offset`] at `isolation_level` (1: read_committed, whose latest
    /// is the last stable offset).
    pub(crate) async fn list_offset_in(
        &mut self,
        topic: &str,
        partition: i32,
        timestamp: i64,
        isolation_level: i8,
    ) -> (i16, i64) {
        let request = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_isolation_level(isolation_level)
            .with_topics(vec![ListOffsetsTopic::default().with_name(topic_name(topic)).with_partitions(vec![
                ListOffsetsPartition::default().with_partition_index(partition).with_timestamp(timestamp),
            ])]);
        let response: ListOffsetsResponse = self.call(ApiKey::ListOffsets, 5, &request).await.unwrap();
        let p = &response.topics[0].partitions[0];
        (p.error_code, p.offset)
    }

    /// [`RawClient::list_offset`] of partition 0 at [`LATEST`].
    pub(crate) async fn latest_offset(&mut self, topic: &str) -> (i16, i64) {
        self.list_offset(topic, 0, LATEST).await
    }

    /// True when the broker closed the connection (EOF or reset) within a few seconds.
    pub(crate) async fn is_closed_by_broker(&mut self) -> bool {
        let mut byte = [0u8; 1];
        match tokio::time::timeout(Duration::from_secs(5), self.stream.read(&mut byte)).await {
            Ok(Ok(0)) | Ok(Err(_)) => true,
            Ok(Ok(_)) | Err(_) => false,
        }
    }
}

/// A resource's configs as DescribeConfigs v4 reports them (`resource_type` 2 a topic, 4
/// a broker): name → (value, config source); fails unless the resource is answered.
pub(crate) async fn describe_configs(
    client: &mut RawClient,
    resource_type: i8,
    resource: &str,
) -> std::collections::BTreeMap<String, (String, i8)> {
    use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
    use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
    let describe = DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
        .with_resource_type(resource_type)
        .with_resource_name(StrBytes::from_string(resource.to_owned()))
        .with_configuration_keys(None)]);
    let response: DescribeConfigsResponse = client.call(ApiKey::DescribeConfigs, 4, &describe).await.unwrap();
    assert_eq!(response.results[0].error_code, 0, "{:?}", response.results[0].error_message);
    response.results[0]
        .configs
        .iter()
        .map(|c| (c.name.to_string(), (c.value.as_deref().unwrap_or_default().to_owned(), c.config_source)))
        .collect()
}

/// One IncrementalAlterConfigs v1 of one resource (`resource_type` 2 a topic, 4 a
/// broker), `ops` as (key, operation, value): (error code, error message).
pub(crate) async fn alter_incrementally(
    client: &mut RawClient,
    resource_type: i8,
    resource: &str,
    ops: &[(&str, i8, Option<&str>)],
    validate_only: bool,
) -> (i16, Option<String>) {
    use kafka_protocol::messages::incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
    use kafka_protocol::messages::{IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse};
    let configs = ops
        .iter()
        .map(|(k, op, v)| {
            AlterableConfig::default()
                .with_name(StrBytes::from_string(k.to_string()))
                .with_config_operation(*op)
                .with_value(v.map(|v| StrBytes::from_string(v.to_owned())))
        })
        .collect();
    let request = IncrementalAlterConfigsRequest::default().with_validate_only(validate_only).with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(resource_type)
            .with_resource_name(StrBytes::from_string(resource.to_owned()))
            .with_configs(configs),
    ]);
    let response: IncrementalAlterConfigsResponse = client.call(ApiKey::IncrementalAlterConfigs, 1, &request).await.unwrap();
    assert_eq!(response.responses.len(), 1);
    let r = &response.responses[0];
    assert_eq!((r.resource_type, r.resource_name.as_str()), (resource_type, resource));
    (r.error_code, r.error_message.as_ref().map(|m| m.to_string()))
}

/// One legacy AlterConfigs of one resource at `version`, replacing its configs with
/// `configs` (a `None` value is null): (error code, error message).
pub(crate) async fn alter_replacing(
    client: &mut RawClient,
    version: i16,
    resource_type: i8,
    resource: &str,
    configs: &[(&str, Option<&str>)],
) -> (i16, Option<String>) {
    use kafka_protocol::messages::alter_configs_request::{AlterConfigsResource, AlterableConfig};
    use kafka_protocol::messages::{AlterConfigsRequest, AlterConfigsResponse};
    let configs = configs
        .iter()
        .map(|(k, v)| {
            AlterableConfig::default()
                .with_name(StrBytes::from_string(k.to_string()))
                .with_value(v.map(|v| StrBytes::from_string(v.to_owned())))
        })
        .collect();
    let request = AlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
        .with_resource_type(resource_type)
        .with_resource_name(StrBytes::from_string(resource.to_owned()))
        .with_configs(configs)]);
    let response: AlterConfigsResponse = client.call(ApiKey::AlterConfigs, version, &request).await.unwrap();
    let r = &response.responses[0];
    (r.error_code, r.error_message.as_ref().map(|m| m.to_string()))
}

/// Runs `script` with the tests' Python ([`fjord_testkit::run_python`]) and `args`; fails
/// unless it exits 0 within `timeout` having printed `ok`, showing its output.
pub(crate) async fn run_python(script: &str, args: &[&str], timeout: Duration) {
    let output = fjord_testkit::run_python(script, args, timeout).await.unwrap();
    assert!(output.said_ok(), "the Python script failed {}", output.transcript());
}

/// Runs kcat with `args`, feeding `stdin`; fails on a non-zero exit.
pub(crate) async fn kcat(args: &[&str], stdin: Option<&[u8]>) -> anyhow::Result<Vec<u8>> {
    use std::process::Stdio;
    let mut child = tokio::process::Command::new("kcat")
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("kcat must be installed (cargo xtask test installs it)")?;
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(input).await?;
        drop(pipe);
    }
    let output = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output()).await.context("kcat timed out")??;
    if !output.status.success() {
        bail!("kcat {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(output.stdout)
}

#[allow(unused_imports)] // only the TLS tests use it
pub(crate) use fjord_testkit::Certs;

/// The ACLs of the SASL tests' user `carol`: Write and Read on topic `granted`, only
/// Describe on `visible`, Read on the groups named `carol-*`; nothing on anything else.
pub(crate) async fn grant_carol(cluster: &fjord_testkit::Cluster) {
    use fjord_auth::{
        AccessControlEntry, AclBinding, Operation, PatternType, Permission, Principal, ResourcePattern, ResourceType,
    };
    let allow = |resource_type, name: &str, pattern_type, operation| AclBinding {
        pattern: ResourcePattern::new(resource_type, name, pattern_type).unwrap(),
        entry: AccessControlEntry::new(Principal::user("carol"), "*", operation, Permission::Allow).unwrap(),
    };
    let acls = [
        allow(ResourceType::Topic, "granted", PatternType::Literal, Operation::Write),
        allow(ResourceType::Topic, "granted", PatternType::Literal, Operation::Read),
        allow(ResourceType::Topic, "visible", PatternType::Literal, Operation::Describe),
        allow(ResourceType::Group, "carol-", PatternType::Prefixed, Operation::Read),
    ];
    fjord_auth::store::create_acls(&**cluster.store(), &acls).await.unwrap();
}
