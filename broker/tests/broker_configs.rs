//! AlterConfigs and IncrementalAlterConfigs on a BROKER resource (#27, librdkafka test
//! 0081's AlterConfigs sub-tests): Kafka's dynamic keys that mean nothing in Fjord are
//! taken for this broker (`"0"`) and the cluster default (`""`), stored, described with
//! their dynamic sources and kept across a restart; Fjord's own (static) keys are
//! INVALID_REQUEST, unknown keys and bad values INVALID_CONFIG, another broker's id
//! INVALID_REQUEST, and a refused request changes nothing.

mod common;

use std::collections::BTreeMap;

use common::{RawClient, TestBroker};

const INVALID_CONFIG: i16 = 40;
const INVALID_REQUEST: i16 = 42;
const BROKER: i8 = 4;
/// IncrementalAlterConfigs operations.
const SET: i8 = 0;
const DELETE: i8 = 1;
const APPEND: i8 = 2;
/// DescribeConfigs sources.
const DYNAMIC_BROKER: i8 = 2;
const DYNAMIC_DEFAULT_BROKER: i8 = 3;

/// One IncrementalAlterConfigs v1 of one broker resource: (error code, error message).
async fn alter_incrementally(
    client: &mut RawClient,
    resource: &str,
    ops: &[(&str, i8, Option<&str>)],
    validate_only: bool,
) -> (i16, String) {
    let (code, message) = common::alter_incrementally(client, BROKER, resource, ops, validate_only).await;
    (code, message.unwrap_or_default())
}

/// One legacy AlterConfigs (v1) of one broker resource: (error code, error message).
async fn alter_replacing(client: &mut RawClient, resource: &str, configs: &[(&str, &str)]) -> (i16, String) {
    let configs: Vec<(&str, Option<&str>)> = configs.iter().map(|&(k, v)| (k, Some(v))).collect();
    let (code, message) = common::alter_replacing(client, 1, BROKER, resource, &configs).await;
    (code, message.unwrap_or_default())
}

/// A broker resource's configs as DescribeConfigs v4 reports them: name → (value, source).
async fn broker_configs(client: &mut RawClient, resource: &str) -> BTreeMap<String, (String, i8)> {
    common::describe_configs(client, BROKER, resource).await
}

#[tokio::test]
async fn broker_resources_take_kafkas_dynamic_keys_and_refuse_static_and_unknown_ones() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = TestBroker::start_in(data.clone(), |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();

    // What 0081 sends: a Kerberos relogin time for this broker, through both APIs.
    let relogin = [("sasl.kerberos.min.time.before.relogin", SET, Some("58000"))];
    assert_eq!(alter_incrementally(&mut client, "0", &relogin, false).await, (0, String::new()));
    assert_eq!(alter_replacing(&mut client, "0", &[("sasl.kerberos.min.time.before.relogin", "58000")]).await.0, 0);
    let ops = [("background.threads", SET, Some("9"))];
    assert_eq!(alter_incrementally(&mut client, "0", &ops, false).await.0, 0);
    // The cluster default, and this broker's value winning over it.
    assert_eq!(alter_replacing(&mut client, "", &[("background.threads", "4"), ("num.io.threads", "16")]).await.0, 0);
    let configs = broker_configs(&mut client, "0").await;
    assert_eq!(configs["sasl.kerberos.min.time.before.relogin"], ("58000".to_owned(), DYNAMIC_BROKER));
    assert_eq!(configs["background.threads"], ("9".to_owned(), DYNAMIC_BROKER));
    assert_eq!(configs["num.io.threads"], ("16".to_owned(), DYNAMIC_DEFAULT_BROKER));
    assert!(configs.contains_key("num.partitions"), "the static configs are still described");
    let defaults = broker_configs(&mut client, "").await;
    assert_eq!(
        defaults,
        BTreeMap::from([
            ("background.threads".to_owned(), ("4".to_owned(), DYNAMIC_DEFAULT_BROKER)),
            ("num.io.threads".to_owned(), ("16".to_owned(), DYNAMIC_DEFAULT_BROKER)),
        ])
    );
    // validate_only changes nothing; DELETE drops this broker's own value.
    let ops = [("background.threads", SET, Some("2"))];
    assert_eq!(alter_incrementally(&mut client, "0", &ops, true).await.0, 0);
    assert_eq!(broker_configs(&mut client, "0").await["background.threads"].0, "9");
    assert_eq!(alter_incrementally(&mut client, "0", &[("background.threads", DELETE, None)], false).await.0, 0);
    assert_eq!(broker_configs(&mut client, "0").await["background.threads"], ("4".to_owned(), DYNAMIC_DEFAULT_BROKER));

    // Bad input: the code Kafka answers, a message naming the key, and no change.
    let before = broker_configs(&mut client, "0").await;
    let (code, message) = alter_incrementally(&mut client, "0", &[("log.retention.ms", SET, Some("1"))], false).await;
    assert_eq!(code, INVALID_REQUEST, "Fjord's broker keys are static: {message}");
    assert!(message.contains("log.retention.ms") && message.contains("static"), "{message}");
    let (code, message) = alter_replacing(&mut client, "", &[("num.partitions", "8")]).await;
    assert_eq!(code, INVALID_REQUEST, "{message}");
    let (code, message) = alter_incrementally(&mut client, "0", &[("no.such.config", SET, Some("1"))], false).await;
    assert_eq!(code, INVALID_CONFIG);
    assert!(message.contains("no.such.config"), "{message}");
    let (code, message) = alter_incrementally(&mut client, "0", &[("background.threads", SET, Some("0"))], false).await;
    assert_eq!(code, INVALID_CONFIG);
    assert!(message.contains("background.threads"), "{message}");
    let (code, _) = alter_replacing(&mut client, "0", &[("sasl.kerberos.min.time.before.relogin", "soon")]).await;
    assert_eq!(code, INVALID_CONFIG);
    let (code, message) = alter_incrementally(&mut client, "7", &relogin, false).await;
    assert_eq!(code, INVALID_REQUEST, "another broker's configs go to that broker");
    assert!(message.contains('7'), "{message}");
    for ops in [
        &[("background.threads", APPEND, Some("1"))][..],
        &[("background.threads", SET, None)],
        &[("background.threads", 9, Some("1"))],
        &[("background.threads", SET, Some("1")), ("background.threads", DELETE, None)],
    ] {
        assert_eq!(alter_incrementally(&mut client, "0", ops, false).await.0, INVALID_REQUEST, "{ops:?}");
    }
    assert_eq!(broker_configs(&mut client, "0").await, before);

    // Stored, so a restart finds them.
    broker.stop().await.unwrap();
    let broker = TestBroker::start_in(data, |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    assert_eq!(broker_configs(&mut client, "0").await, before);
    broker.stop().await.unwrap();
}

/// The replication throttles (#22): the two rates are dynamic broker keys (non-negative
/// longs, described at Long.MAX_VALUE until set), the two replica lists are topic keys in
/// Kafka's syntax (`*` or `partition:broker,...`); anything else is INVALID_CONFIG and
/// changes nothing.
#[tokio::test]
async fn replication_throttles_are_a_dynamic_broker_rate_and_topic_replica_lists() {
    const TOPIC: i8 = 2;
    const DEFAULT: i8 = 5;
    const DYNAMIC_TOPIC: i8 = 1;
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let (leader_rate, follower_rate) = ("leader.replication.throttled.rate", "follower.replication.throttled.rate");

    let configs = broker_configs(&mut client, "0").await;
    assert_eq!(configs[leader_rate], (i64::MAX.to_string(), DEFAULT));
    assert_eq!(configs[follower_rate], (i64::MAX.to_string(), DEFAULT));
    assert_eq!(alter_incrementally(&mut client, "0", &[(leader_rate, SET, Some("2000000"))], false).await.0, 0);
    assert_eq!(alter_incrementally(&mut client, "", &[(follower_rate, SET, Some("1000"))], false).await.0, 0);
    let configs = broker_configs(&mut client, "0").await;
    assert_eq!(configs[leader_rate], ("2000000".to_owned(), DYNAMIC_BROKER));
    assert_eq!(configs[follower_rate], ("1000".to_owned(), DYNAMIC_DEFAULT_BROKER));
    for bad in ["-1", "2MB", ""] {
        let (code, message) = alter_incrementally(&mut client, "0", &[(leader_rate, SET, Some(bad))], false).await;
        assert_eq!(code, INVALID_CONFIG, "{bad:?}: {message}");
        assert!(message.contains(leader_rate), "{message}");
    }
    assert_eq!(broker_configs(&mut client, "0").await[leader_rate].0, "2000000");

    let admin = fjord_client::Admin::connect(fjord_client::ClientConfig::new(&broker.bootstrap())).await.unwrap();
    admin.create_topics(&[fjord_client::NewTopic::new("moving", 2)]).await.unwrap();
    let (leader_list, follower_list) = ("leader.replication.throttled.replicas", "follower.replication.throttled.replicas");
    let topic = common::describe_configs(&mut client, TOPIC, "moving").await;
    assert_eq!(topic[leader_list], (String::new(), DEFAULT));
    let ops = [(leader_list, SET, Some("0:0,1:0")), (follower_list, SET, Some("*"))];
    assert_eq!(common::alter_incrementally(&mut client, TOPIC, "moving", &ops, false).await.0, 0);
    let topic = common::describe_configs(&mut client, TOPIC, "moving").await;
    assert_eq!(topic[leader_list], ("0:0,1:0".to_owned(), DYNAMIC_TOPIC));
    assert_eq!(topic[follower_list], ("*".to_owned(), DYNAMIC_TOPIC));
    for bad in ["0", "0:x", "*,0:1", "0:1;1:1"] {
        let (code, message) =
            common::alter_incrementally(&mut client, TOPIC, "moving", &[(follower_list, SET, Some(bad))], false).await;
        assert_eq!(code, INVALID_CONFIG, "{bad:?}: {message:?}");
        assert!(message.unwrap_or_default().contains(follower_list));
    }
    assert_eq!(common::describe_configs(&mut client, TOPIC, "moving").await, topic);
    broker.stop().await.unwrap();
}
