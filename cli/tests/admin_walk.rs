//! Issue #22's "Done when": the admin-client walk against `fjord dev`. Two independent
//! admin clients, kafka-python 3's `KafkaAdminClient` and confluent-kafka's `AdminClient`
//! (librdkafka), call every public admin method they have against a real `fjord dev`
//! process, and each call's result is checked, not only its lack of error.
//!
//! Left out, as the issue's walk leaves them out (the security and transactions issues):
//! - ACL calls: `create_acls`, `describe_acls`, `delete_acls` (both clients);
//! - SCRAM calls: `alter_user_scram_credentials`, `describe_user_scram_credentials` (both);
//!   confluent-kafka's `set_sasl_credentials` only sets the client's own SASL login and
//!   sends nothing;
//! - transaction calls (kafka-python): `abort_transaction`, `describe_transactions`,
//!   `list_transactions`, `find_hanging_transactions`.
//!
//! Left out, the one KRaft-era call fjord does not serve (kafka-python refuses it itself,
//! IncompatibleBrokerVersion, since fjord's ApiVersions does not list it):
//! - `describe_metadata_quorum` (DescribeQuorum, API 55, KIP-595): describes the KRaft
//!   controller quorum's Raft state. fjord is a ZooKeeper-style cluster with no Raft quorum,
//!   and a ZooKeeper-mode Kafka broker never serves it either: from Kafka 3.0 to 3.9 (the
//!   last with ZooKeeper) its schema lists only the `broker` (KRaft) and `controller`
//!   listeners, not `zkBroker`.
//!
//! kafka-python's `update_features` (UpdateFeatures, API 57, KIP-584) is walked, served as
//! a ZooKeeper-mode Kafka 2.7-3.9 controller serves it. fjord supports and finalizes no
//! features (`describe_features` answers none), so each update comes back refused per
//! feature with INVALID_REQUEST and Kafka's message: an upgrade of an unsupported feature,
//! a deletion of a feature that is not finalized, with validate_only or not; the walk
//! checks those messages and that nothing got finalized.
//!
//! kafka-python's `describe_topic_partitions` (DescribeTopicPartitions, KIP-966) is walked,
//! paged by its cursor, although Kafka serves it on KRaft brokers only; confluent-kafka
//! 2.16's `describe_topics` asks Metadata, not DescribeTopicPartitions.
//! kafka-python's `list_config_resources` (ListConfigResources v1, KIP-1142, Kafka 4.1; v0
//! was 3.7's ListClientMetricsResources, KRaft brokers only as well) is walked too: it
//! lists the topics and brokers, the config resources fjord has.
//!
//! Neither client describes topics by id (confluent-kafka 2.16's `TopicCollection` takes
//! names only, kafka-python's `describe_topics` too), so the walk checks the ids instead:
//! CreateTopics' id is Metadata's, and both clients read the same one.
//!
//! Neither client has client-quota calls (DescribeClientQuotas / AlterClientQuotas): not in
//! kafka-python 3.0 nor confluent-kafka 2.16, so quotas are not part of this walk.
//!
//! kafka-python: 33 calls, confluent-kafka: 20 calls.

mod common;

use std::time::Duration;

use common::{free_port, start_dev};

/// How many calls each client makes (`ok` lines expected): a call dropped from the script
/// by mistake fails the test rather than shrinking the walk.
const KAFKA_PYTHON_CALLS: usize = 33;
const CONFLUENT_KAFKA_CALLS: usize = 20;

/// The walk: one line per call, `ok CLIENT.METHOD` or `FAIL CLIENT.METHOD: error`; a
/// failed call does not stop the walk, so one run shows every gap.
const SCRIPT: &str = r#"import sys, time, traceback, uuid, warnings
from kafka import KafkaConsumer, KafkaProducer, TopicPartition as TP
from kafka.admin import (KafkaAdminClient, NewTopic, NewPartitions, ConfigResource, ConfigResourceType,
                         OffsetSpec, MemberToRemove)
from kafka.errors import NoError, LogDirNotFoundError
from kafka.structs import OffsetAndMetadata
import confluent_kafka
from confluent_kafka import Consumer, Producer, TopicCollection, TopicPartition as CTP, ConsumerGroupTopicPartitions, ElectionType
from confluent_kafka.admin import (AdminClient, NewTopic as CNewTopic, NewPartitions as CNewPartitions,
                                   ConfigResource as CR, ConfigEntry, AlterConfigOpType, ResourceType,
                                   OffsetSpec as COffsetSpec)

bootstrap = sys.argv[1]
# confluent-kafka's alter_configs and list_groups are deprecated, and still called here.
warnings.simplefilter('ignore', DeprecationWarning)

def call(client, name, body):
    try:
        body()
        print('ok %s.%s' % (client, name), flush=True)
    except Exception as e:
        detail = (traceback.format_exc().strip().splitlines() or [''])[-2:]
        print('FAIL %s.%s: %r %s' % (client, name, e, ' | '.join(l.strip() for l in detail)), flush=True)

def produce(topic, n):
    p = Producer({'bootstrap.servers': bootstrap, 'enable.idempotence': True, 'linger.ms': 0})
    for i in range(n):
        p.produce(topic, partition=0, value=b'v%d' % i)
    assert p.flush(20) == 0

def until(check, what, timeout=20):
    deadline = time.time() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.time() < deadline, what
        time.sleep(0.2)

# ---- kafka-python 3 KafkaAdminClient ----
ka = KafkaAdminClient(bootstrap_servers=bootstrap)
K = lambda name, body: call('kafka-python', name, body)
T = 'kp-walk'
tp0 = TP(T, 0)

def api_versions():
    versions = {int(k): v for k, v in ka.api_versions().items()}
    for key in (37, 21, 35, 45, 46, 61, 43, 60):  # CreatePartitions ... DescribeCluster
        assert key in versions, (key, versions)
K('api_versions', api_versions)

def broker_version_data():
    data = ka.get_broker_version_data(0)
    assert data is not None and data.api_versions, data
K('get_broker_version_data', broker_version_data)

def describe_features():
    # fjord finalizes no features (no KRaft metadata.version); an empty answer, not an error.
    features = ka.describe_features()
    assert isinstance(features, dict), features
K('describe_features', describe_features)

def update_features():
    # KIP-584 as a ZooKeeper-mode Kafka answers it: no feature is supported, none finalized.
    unsupported = '[Error 42] InvalidRequestError: Could not apply finalized feature update because the provided feature is not supported.'
    not_finalized = '[Error 42] InvalidRequestError: Can not delete non-existing finalized feature.'
    answer = ka.update_features({'metadata.version': 20, 'group.version': ('SAFE_DOWNGRADE', 0)})
    assert answer == {'metadata.version': unsupported, 'group.version': not_finalized}, answer
    checked = ka.update_features({'transaction.version': ('UPGRADE', 2)}, validate_only=True)
    assert checked == {'transaction.version': unsupported}, checked
    assert ka.describe_features() == {}, ka.describe_features()  # nothing finalized
K('update_features', update_features)

cluster, topic_ids = {}, {}
def describe_cluster():
    c = ka.describe_cluster()
    assert c['controller_id'] == 0 and [b['broker_id'] for b in c['brokers']] == [0], c
    assert c['cluster_id'], c
    cluster['id'] = c['cluster_id']
K('describe_cluster', describe_cluster)

def create_topics():
    answer = ka.create_topics([NewTopic(T, 1, 1, topic_configs={'retention.ms': '3600000'})])
    [t] = answer['topics']
    assert t['error_code'] == 0 and t['num_partitions'] == 1, t
    topic_ids[T] = t['topic_id']
K('create_topics', create_topics)

K('wait_for_topics', lambda: ka.wait_for_topics([T], timeout_ms=20000))

def list_topics():
    assert T in ka.list_topics(), ka.list_topics()
K('list_topics', list_topics)

def partitions_of(topic):
    [t] = ka.describe_topics([topic])
    assert t['error_code'] == 0, t
    return sorted(p['partition_index'] for p in t['partitions'])

def describe_topics():
    assert partitions_of(T) == [0], partitions_of(T)
    # The topic id (KIP-516) CreateTopics answered is the one Metadata reports.
    [t] = ka.describe_topics([T])
    assert t['topic_id'] == topic_ids[T] and t['topic_id'] != str(uuid.UUID(int=0)), (t, topic_ids)
K('describe_topics', describe_topics)

def create_partitions():
    ka.create_partitions({T: NewPartitions(3)})
    until(lambda: partitions_of(T) == [0, 1, 2], 'partitions after create_partitions: %s' % partitions_of(T))
K('create_partitions', create_partitions)

def describe_topic_partitions():
    # KIP-966's paged describe: 2 partitions a page over 3 partitions takes the cursor once.
    pages, cursor, seen = 0, None, []
    while True:
        page = ka.describe_topic_partitions([T], response_partition_limit=2, cursor=cursor)
        pages += 1
        [t] = page['topics']
        assert t['error_code'] == 0 and t['name'] == T and str(t['topic_id']) == str(topic_ids[T]), (t, topic_ids)
        assert not t['is_internal'] and len(t['partitions']) <= 2, t
        for p in t['partitions']:
            assert (p['error_code'], p['leader_id'], p['replica_nodes'], p['isr_nodes']) == (0, 0, [0], [0]), p
            seen.append(p['partition_index'])
        cursor = page['next_cursor']
        if cursor is None:
            break
        assert cursor == {'topic_name': T, 'partition_index': 2}, cursor
    assert (pages, seen) == (2, [0, 1, 2]), (pages, seen)
K('describe_topic_partitions', describe_topic_partitions)

topic_res = lambda **configs: ConfigResource(ConfigResourceType.TOPIC, T, configs=configs or None)
broker_res = lambda **configs: ConfigResource(ConfigResourceType.BROKER, '0', configs=configs or None)
def topic_overrides():
    return {k: v['value'] for k, v in ka.describe_configs([topic_res()])['topic'][T].items()}
def broker_configs():
    return {k: v['value'] for k, v in ka.describe_configs([broker_res()], config_filter='all')['broker']['0'].items()}

def describe_configs():
    assert topic_overrides() == {'retention.ms': '3600000'}, topic_overrides()
    every = {k: v['value'] for k, v in ka.describe_configs([topic_res()], config_filter='all')['topic'][T].items()}
    assert every['retention.ms'] == '3600000' and 'segment.bytes' in every, every
    b = broker_configs()
    assert b['leader.replication.throttled.rate'] == str(2**63 - 1), b
    assert b['follower.replication.throttled.rate'] == str(2**63 - 1), b
K('describe_configs', describe_configs)

def alter_configs():
    throttled = {'leader.replication.throttled.replicas': '0:0,1:0', 'follower.replication.throttled.replicas': '*'}
    assert ka.alter_configs([topic_res(**throttled)]) == {'topic': {T: 'OK'}}
    assert topic_overrides() == dict(throttled, **{'retention.ms': '3600000'}), topic_overrides()
    # Legacy AlterConfigs (kafka-python resends the other overrides with it).
    assert ka.alter_configs([topic_res(**{'max.message.bytes': '5000'})], incremental=False) == {'topic': {T: 'OK'}}
    assert topic_overrides() == dict(throttled, **{'retention.ms': '3600000', 'max.message.bytes': '5000'}), topic_overrides()
    rates = {'leader.replication.throttled.rate': '1048576', 'follower.replication.throttled.rate': '2097152'}
    assert ka.alter_configs([broker_res(**rates)]) == {'broker': {'0': 'OK'}}
    b = broker_configs()
    assert {k: b[k] for k in rates} == rates, b
K('alter_configs', alter_configs)

def reset_configs():
    ka.reset_configs([topic_res(**{'max.message.bytes': None, 'leader.replication.throttled.replicas': None,
                                   'follower.replication.throttled.replicas': None})])
    assert topic_overrides() == {'retention.ms': '3600000'}, topic_overrides()
    ka.reset_configs([broker_res(**{'leader.replication.throttled.rate': None, 'follower.replication.throttled.rate': None})])
    b = broker_configs()
    assert b['leader.replication.throttled.rate'] == str(2**63 - 1), b
K('reset_configs', reset_configs)

def list_config_resources():
    # KIP-1142: every topic and broker; fjord has no broker-logger, client-metrics or group configs.
    every = ka.list_config_resources()
    assert T in every['topic'] and every['broker'] == ['0'] and set(every) == {'topic', 'broker'}, every
    assert ka.list_config_resources(['BROKER']) == {'broker': ['0']}, ka.list_config_resources(['BROKER'])
    assert ka.list_config_resources(['GROUP', 'CLIENT_METRICS']) == {}
K('list_config_resources', list_config_resources)

produce(T, 10)

def offsets(spec):
    return ka.list_partition_offsets({tp0: spec})[tp0].offset

def list_partition_offsets():
    assert (offsets(OffsetSpec.EARLIEST), offsets(OffsetSpec.LATEST)) == (0, 10), (offsets(OffsetSpec.EARLIEST), offsets(OffsetSpec.LATEST))
K('list_partition_offsets', list_partition_offsets)

def delete_records():
    answer = ka.delete_records({tp0: 4})
    assert answer[tp0]['low_watermark'] == 4, answer
    assert (offsets(OffsetSpec.EARLIEST), offsets(OffsetSpec.LATEST)) == (4, 10)
K('delete_records', delete_records)

def describe_log_dirs():
    [broker] = ka.describe_log_dirs()
    [d] = broker['log_dirs']
    sizes = {(t['name'], p['partition_index']): p['partition_size'] for t in d['topics'] for p in t['partitions']}
    assert {(T, 0), (T, 1), (T, 2)} <= set(sizes) and sizes[(T, 0)] > 0 and sizes[(T, 1)] == 0, sizes
K('describe_log_dirs', describe_log_dirs)

def alter_replica_log_dirs():
    # One log dir (JBOD is not built): a replica asked into it is there already; any other
    # path is not a log dir of the broker.
    [broker] = ka.describe_log_dirs()
    [d] = broker['log_dirs']
    answer = ka.alter_replica_log_dirs({(T, 0, 0): d['log_dir'], (T, 1, 0): d['log_dir'] + '-elsewhere'})
    assert {(r.topic, r.partition): e for r, e in answer.items()} == {(T, 0): NoError, (T, 1): LogDirNotFoundError}, answer
K('alter_replica_log_dirs', alter_replica_log_dirs)

def describe_producers():
    [state] = ka.describe_producers([tp0]).values()
    [p] = state.active_producers
    assert p.last_sequence == 9, p
K('describe_producers', describe_producers)

def elect_leaders():
    # One broker: its replica is the preferred leader already (ELECTION_NOT_NEEDED, 84).
    answer = ka.elect_leaders(0, {T: [0]}, raise_errors=False)
    [t] = answer.replica_election_results
    [p] = t.partition_result
    assert (answer.error_code, t.topic, p.partition_id, p.error_code) == (0, T, 0, 84), answer
K('elect_leaders', elect_leaders)

def list_partition_reassignments():
    assert ka.list_partition_reassignments() == {}, ka.list_partition_reassignments()
K('list_partition_reassignments', list_partition_reassignments)

def alter_partition_reassignments():
    # On one broker the only target is the replica set it has: accepted, done at once.
    answer = ka.alter_partition_reassignments({TP(T, 1): [0]})
    assert answer == {TP(T, 1): None}, answer
    until(lambda: ka.list_partition_reassignments() == {}, 'reassignment still listed')
K('alter_partition_reassignments', alter_partition_reassignments)

G = 'kp-walk-group'
def alter_group_offsets():
    answer = ka.alter_group_offsets(G, {tp0: OffsetAndMetadata(7, '', -1), TP(T, 1): OffsetAndMetadata(0, '', -1)})
    assert set(answer.values()) == {NoError}, answer
K('alter_group_offsets', alter_group_offsets)

def committed(group):
    return {tp: o.offset for tp, o in ka.list_group_offsets({group: None})[group].items() if o.offset >= 0}
def list_group_offsets():
    assert committed(G) == {tp0: 7, TP(T, 1): 0}, committed(G)
K('list_group_offsets', list_group_offsets)

def reset_group_offsets():
    ka.reset_group_offsets(G, {tp0: OffsetSpec.EARLIEST})
    assert committed(G)[tp0] == 4, committed(G)
K('reset_group_offsets', reset_group_offsets)

def delete_group_offsets():
    assert ka.delete_group_offsets(G, [TP(T, 1)]) == {TP(T, 1): NoError}
    assert committed(G) == {tp0: 4}, committed(G)
K('delete_group_offsets', delete_group_offsets)

# A live static member, for the group calls that need one.
member = KafkaConsumer(T, bootstrap_servers=bootstrap, group_id=G, group_instance_id='walker',
                       enable_auto_commit=False, session_timeout_ms=10000)
until(lambda: member.poll(200) is not None and member.assignment(), 'the consumer never joined')

def group_states():
    return {g['group_id']: g['group_state'] for g in ka.list_groups()}

def list_groups():
    assert group_states().get(G) == 'Stable', group_states()
K('list_groups', list_groups)

def describe_groups():
    g = ka.describe_groups([G])[G]
    assert g['group_state'] == 'Stable' and [m['group_instance_id'] for m in g['members']] == ['walker'], g
K('describe_groups', describe_groups)

def remove_group_members():
    answer = ka.remove_group_members(G, [MemberToRemove(group_instance_id='walker')])
    assert answer == {'walker': NoError}, answer
    # Its committed offsets keep the group (Empty), as in Kafka.
    g = ka.describe_groups([G])[G]
    assert (g['group_state'], g['members']) == ('Empty', []), g
K('remove_group_members', remove_group_members)
member.close()

def delete_groups():
    assert ka.delete_groups([G]) == {G: 'OK'}
    assert G not in group_states() and committed(G) == {}, (group_states(), committed(G))
K('delete_groups', delete_groups)

def delete_topics():
    ka.delete_topics([T])
    until(lambda: T not in ka.list_topics(), 'topic still listed')
K('delete_topics', delete_topics)

K('close', ka.close)

# ---- confluent-kafka AdminClient (librdkafka) ----
ca = AdminClient({'bootstrap.servers': bootstrap})
C = lambda name, body: call('confluent-kafka', name, body)
T = 'ck-walk'
ctp0 = CTP(T, 0)
done = lambda futures: {k: f.result(30) for k, f in futures.items()}

def cluster_id():
    assert ca.cluster_id(timeout=20) == cluster['id'], ca.cluster_id()
C('cluster_id', cluster_id)

def describe_cluster():
    d = ca.describe_cluster(include_authorized_operations=True).result(30)
    assert d.cluster_id == cluster['id'] and d.controller.id == 0 and [n.id for n in d.nodes] == [0], d
    assert d.authorized_operations, d
C('describe_cluster', describe_cluster)

C('create_topics', lambda: done(ca.create_topics([CNewTopic(T, 1, 1, config={'retention.ms': '3600000'})])))

def list_topics():
    md = ca.list_topics(timeout=20)
    assert T in md.topics and len(md.topics[T].partitions) == 1 and md.brokers[0].id == 0, md.topics
C('list_topics', list_topics)

def describe():
    [d] = done(ca.describe_topics(TopicCollection([T]))).values()
    return d
def describe_topics():
    d = describe()
    assert d.name == T and [p.id for p in d.partitions] == [0] and d.partitions[0].leader.id == 0, d
    # The same id through kafka-python (Metadata v10+) as through librdkafka.
    msb, lsb = d.topic_id.get_most_significant_bits(), d.topic_id.get_least_significant_bits()
    ours = str(uuid.UUID(int=((msb & (2**64 - 1)) << 64) | (lsb & (2**64 - 1))))
    other = KafkaAdminClient(bootstrap_servers=bootstrap)
    [t] = other.describe_topics([T])
    other.close()
    assert ours == t['topic_id'] and ours != str(uuid.UUID(int=0)), (ours, t['topic_id'])
C('describe_topics', describe_topics)

def create_partitions():
    done(ca.create_partitions([CNewPartitions(T, 4)]))
    until(lambda: [p.id for p in describe().partitions] == [0, 1, 2, 3], 'partitions after create_partitions')
    assert len(ca.list_topics(T, timeout=20).topics[T].partitions) == 4
C('create_partitions', create_partitions)

topic_cr = CR(ResourceType.TOPIC, T)
broker_cr = CR(ResourceType.BROKER, '0')
def configs(resource):
    [entries] = done(ca.describe_configs([resource])).values()
    return entries
def c_overrides():
    return {n: c.value for n, c in configs(topic_cr).items() if not c.is_default}

def describe_configs():
    topic = configs(topic_cr)
    assert topic['retention.ms'].value == '3600000' and 'segment.bytes' in topic, topic
    b = configs(broker_cr)
    assert b['leader.replication.throttled.rate'].value == str(2**63 - 1), b['leader.replication.throttled.rate']
C('describe_configs', describe_configs)

def incremental_alter_configs():
    set_ = lambda name, value: ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
    delete = lambda name: ConfigEntry(name, '', incremental_operation=AlterConfigOpType.DELETE)
    done(ca.incremental_alter_configs([CR(ResourceType.TOPIC, T, incremental_configs=[
        set_('leader.replication.throttled.replicas', '0:0'), set_('follower.replication.throttled.replicas', '0:0'),
        delete('retention.ms')])]))
    o = c_overrides()
    assert (o.get('leader.replication.throttled.replicas'), o.get('follower.replication.throttled.replicas')) == ('0:0', '0:0'), o
    assert 'retention.ms' not in o or configs(topic_cr)['retention.ms'].value != '3600000', o
    done(ca.incremental_alter_configs([CR(ResourceType.BROKER, '0', incremental_configs=[
        set_('leader.replication.throttled.rate', '4194304'), set_('follower.replication.throttled.rate', '4194304')])]))
    b = configs(broker_cr)
    assert b['leader.replication.throttled.rate'].value == '4194304' == b['follower.replication.throttled.rate'].value, b
    done(ca.incremental_alter_configs([CR(ResourceType.BROKER, '0', incremental_configs=[
        delete('leader.replication.throttled.rate'), delete('follower.replication.throttled.rate')])]))
    assert configs(broker_cr)['leader.replication.throttled.rate'].value == str(2**63 - 1)
C('incremental_alter_configs', incremental_alter_configs)

def alter_configs():
    # Legacy AlterConfigs: the set given replaces every override of the topic.
    done(ca.alter_configs([CR(ResourceType.TOPIC, T, set_config={'max.message.bytes': '6000'})]))
    o = c_overrides()
    assert o.get('max.message.bytes') == '6000' and 'leader.replication.throttled.replicas' not in o, o
C('alter_configs', alter_configs)

produce(T, 10)

def c_offsets(spec):
    return done(ca.list_offsets({ctp0: spec}))[ctp0].offset

def list_offsets():
    assert (c_offsets(COffsetSpec.earliest()), c_offsets(COffsetSpec.latest())) == (0, 10)
C('list_offsets', list_offsets)

def delete_records():
    [deleted] = done(ca.delete_records([CTP(T, 0, 6)])).values()
    assert deleted.low_watermark == 6, deleted
    assert (c_offsets(COffsetSpec.earliest()), c_offsets(COffsetSpec.latest())) == (6, 10)
C('delete_records', delete_records)

def elect_leaders():
    # One broker: its replica is the preferred leader already.
    try:
        answer = ca.elect_leaders(ElectionType.PREFERRED, [ctp0]).result(30)
        assert answer[ctp0] is None or answer[ctp0].code() == confluent_kafka.KafkaError.ELECTION_NOT_NEEDED, answer
    except confluent_kafka.KafkaException as e:
        assert e.args[0].code() == confluent_kafka.KafkaError.ELECTION_NOT_NEEDED, e
C('elect_leaders', elect_leaders)

G = 'ck-walk-group'
def c_committed():
    [r] = done(ca.list_consumer_group_offsets([ConsumerGroupTopicPartitions(G)])).values()
    return {(tp.topic, tp.partition): tp.offset for tp in r.topic_partitions if tp.offset >= 0}

def alter_consumer_group_offsets():
    done(ca.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(G, [CTP(T, 0, 8), CTP(T, 1, 0)])]))
C('alter_consumer_group_offsets', alter_consumer_group_offsets)
def list_consumer_group_offsets():
    assert c_committed() == {(T, 0): 8, (T, 1): 0}, c_committed()
C('list_consumer_group_offsets', list_consumer_group_offsets)

consumer = Consumer({'bootstrap.servers': bootstrap, 'group.id': G, 'enable.auto.commit': False, 'session.timeout.ms': 6000})
consumer.subscribe([T])
first = until(lambda: consumer.poll(0.5), 'the consumer read nothing')
assert (first.partition(), first.offset()) == (0, 8), (first.partition(), first.offset())

def list_consumer_groups():
    listed = ca.list_consumer_groups().result(30)
    states = {g.group_id: g.state for g in listed.valid}
    assert G in states and str(states[G]).endswith('STABLE'), states
C('list_consumer_groups', list_consumer_groups)

def list_groups():
    assert G in [g.id for g in ca.list_groups(timeout=20)]
C('list_groups', list_groups)

def describe_consumer_groups():
    [d] = done(ca.describe_consumer_groups([G])).values()
    assert str(d.state).endswith('STABLE') and len(d.members) == 1, d
    assigned = sorted(tp.partition for tp in d.members[0].assignment.topic_partitions)
    assert assigned == [0, 1, 2, 3], assigned
C('describe_consumer_groups', describe_consumer_groups)
consumer.close()

def delete_consumer_groups():
    done(ca.delete_consumer_groups([G]))
    assert G not in [g.group_id for g in ca.list_consumer_groups().result(30).valid]
C('delete_consumer_groups', delete_consumer_groups)

def delete_topics():
    done(ca.delete_topics([T]))
    until(lambda: T not in ca.list_topics(timeout=20).topics, 'topic still listed')
C('delete_topics', delete_topics)

C('poll', lambda: ca.poll(0))
"#;

#[tokio::test(flavor = "multi_thread")]
async fn every_admin_call_of_kafka_python_and_confluent_kafka_passes_against_fjord_dev() {
    let dir = tempfile::tempdir().unwrap();
    let (port, registry) = (free_port(), free_port());
    let _dev = start_dev(port, registry, &dir.path().join("data"), &dir.path().join("dev.log"));
    let bootstrap = format!("127.0.0.1:{port}");
    let output = fjord_testkit::run_python(SCRIPT, &[&bootstrap], Duration::from_secs(300)).await.unwrap();

    let calls: Vec<&String> = output.lines.iter().filter(|l| l.starts_with("ok ") || l.starts_with("FAIL ")).collect();
    println!("admin walk against fjord dev ({} calls):", calls.len());
    for line in &calls {
        println!("  {line}");
    }
    let failed: Vec<&&String> = calls.iter().filter(|l| l.starts_with("FAIL ")).collect();
    assert!(output.status.success() && failed.is_empty(), "calls failed: {failed:#?}\n{}", output.transcript());
    let passed = |client: &str| calls.iter().filter(|l| l.starts_with(&format!("ok {client}."))).count();
    assert_eq!(
        (passed("kafka-python"), passed("confluent-kafka")),
        (KAFKA_PYTHON_CALLS, CONFLUENT_KAFKA_CALLS),
        "{}",
        output.transcript()
    );
}
