//! KafkaJS, a fourth independent client: the protocol written again in JavaScript (no
//! librdkafka, no Java), and the client a Node.js service reaches for. Issue #20 began
//! with a KafkaJS transactional producer that could not find its coordinator. Here it
//! produces (idempotent, gzip), consumes in a group of two that rebalances, administers
//! topics, configs, records, offsets, groups and ACLs, runs transactions with offsets
//! (read_committed and read_uncommitted consumers, a fenced zombie), and authenticates
//! over SASL_SSL with PLAIN and SCRAM under ACLs.
//!
//! Node.js runs the scripts with KafkaJS from `$FJORD_TEST_NODE_MODULES` (set by `cargo
//! xtask test`, which installs it), else the workspace's `target/node/node_modules`.

mod common;

use std::time::Duration;

use common::TestBroker;
use fjord_testkit::Cluster;

/// What every script starts with: the client, `step` (an awaited call that must not
/// throw), `refused` (one that must fail with the named Kafka error), `until` (polls with
/// a deadline) and the exit: `ok` printed last, or the error and exit code 1.
const PRELUDE: &str = r#"
const assert = require('assert');
const fs = require('fs');
const { Kafka, logLevel, CompressionTypes, ConfigResourceTypes, AclResourceTypes, AclOperationTypes,
        AclPermissionTypes, ResourcePatternTypes } = require('kafkajs');
const [bootstrap, ...rest] = process.argv.slice(1);
const kafka = (extra = {}) => new Kafka({ clientId: 'fjord-kafkajs-test', brokers: [bootstrap], logLevel: logLevel.NOTHING,
                                          retry: { retries: 8 }, ...extra });
const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));
async function refused(what, type, f) {
    try { await f(); } catch (e) {
        const types = [e.type, ...(e.groups || []).map(g => g.error && g.error.type), e.originalError && e.originalError.type];
        assert(types.includes(type), `${what}: expected ${type}, got ${e.name}: ${e.message} ${JSON.stringify(types)}`);
        return;
    }
    throw new Error(`${what}: expected ${type}, it succeeded`);
}
async function until(what, f, ms = 30000) {
    const deadline = Date.now() + ms;
    while (!(await f())) {
        if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
        await sleep(100);
    }
}
function main(body) {
    body().then(() => { console.log('ok'); process.exit(0); },
                e => { console.error('FAILED', e); process.exit(1); });
}
"#;

/// Produce, consume in a group, and the admin calls a Node.js service makes.
const CLIENTS_SCRIPT: &str = r#"
main(async () => {
    const client = kafka();
    const admin = client.admin();
    await admin.connect();
    assert.strictEqual(await admin.createTopics({ topics: [{ topic: 'kjs', numPartitions: 3 }] }), true);
    // A second create of the same topic answers TOPIC_ALREADY_EXISTS, which KafkaJS returns as false.
    assert.strictEqual(await admin.createTopics({ topics: [{ topic: 'kjs', numPartitions: 3 }] }), false);

    // The idempotent producer (InitProducerId, sequence numbers), plain and gzip.
    const producer = client.producer({ idempotent: true });
    await producer.connect();
    const values = [];
    for (const compression of [CompressionTypes.None, CompressionTypes.GZIP]) {
        const messages = Array.from({ length: 150 }, (_, i) => ({ key: `k${i}`, value: `${compression}-${i}`, headers: { h: `x${i}` } }));
        const answers = await producer.send({ topic: 'kjs', compression, acks: -1, messages });
        assert(answers.every(a => a.errorCode === 0), JSON.stringify(answers));
        values.push(...messages.map(m => m.value));
    }
    const ends = await admin.fetchTopicOffsets('kjs');
    assert.strictEqual(ends.reduce((n, p) => n + Number(p.high), 0), 300, JSON.stringify(ends));

    // Two members of one group: the second joins while the first consumes, and the
    // partitions are shared between them. Every record is seen.
    const seen = new Map();
    const assignments = {};
    const member = async name => {
        const consumer = client.consumer({ groupId: 'kjs-group', heartbeatInterval: 500, maxWaitTimeInMs: 500 });
        consumer.on(consumer.events.GROUP_JOIN, e => { assignments[name] = e.payload.memberAssignment.kjs || []; });
        await consumer.connect();
        await consumer.subscribe({ topic: 'kjs', fromBeginning: true });
        await consumer.run({ eachMessage: async ({ message }) => {
            const v = message.value.toString();
            seen.set(v, (seen.get(v) || 0) + 1);
            assert.strictEqual(message.headers.h.toString(), `x${v.split('-')[1]}`);
        } });
        return consumer;
    };
    const first = await member('first');
    await until('the first member to read something', () => seen.size > 0);
    const second = await member('second');
    await until('both members in one generation sharing the partitions', () => {
        const a = assignments.first || [], b = assignments.second || [];
        return a.length > 0 && b.length > 0 && [...a, ...b].sort().join() === '0,1,2';
    });
    await until('every record consumed', () => values.every(v => seen.has(v)));
    const more = Array.from({ length: 30 }, (_, i) => ({ value: `late-${i}`, headers: { h: `x${i}` } }));
    await producer.send({ topic: 'kjs', acks: -1, messages: more });
    await until('the records sent after the rebalance', () => more.every(m => seen.has(m.value)));
    await first.disconnect();
    await second.disconnect();
    await producer.disconnect();

    // What the group committed is where each partition ends, and the group is empty.
    const committed = (await admin.fetchOffsets({ groupId: 'kjs-group', topics: ['kjs'] }))[0].partitions;
    const high = await admin.fetchTopicOffsets('kjs');
    for (const p of high) {
        assert.strictEqual(committed.find(c => c.partition === p.partition).offset, p.high, JSON.stringify([committed, high]));
    }
    const described = (await admin.describeGroups(['kjs-group'])).groups[0];
    assert.strictEqual(described.state, 'Empty', JSON.stringify(described));
    assert((await admin.listGroups()).groups.some(g => g.groupId === 'kjs-group'));

    // Partitions, configs, records by time, deleted records, offsets, groups, ACLs.
    await admin.createPartitions({ topicPartitions: [{ topic: 'kjs', count: 4 }] });
    assert.strictEqual((await admin.fetchTopicMetadata({ topics: ['kjs'] })).topics[0].partitions.length, 4);
    const retention = async () => (await admin.describeConfigs({ includeSynonyms: false,
        resources: [{ type: ConfigResourceTypes.TOPIC, name: 'kjs', configNames: ['retention.ms'] }] })).resources[0].configEntries[0].configValue;
    await admin.alterConfigs({ resources: [{ type: ConfigResourceTypes.TOPIC, name: 'kjs', configEntries: [{ name: 'retention.ms', value: '7200000' }] }] });
    assert.strictEqual(await retention(), '7200000');
    const timed = client.producer();
    await timed.connect();
    const t0 = Date.now() - 60000;
    await timed.send({ topic: 'kjs', acks: -1, messages: Array.from({ length: 10 }, (_, i) => ({ partition: 3, value: `t${i}`, timestamp: String(t0 + i * 1000) })) });
    await timed.disconnect();
    const byTime = await admin.fetchTopicOffsetsByTimestamp('kjs', t0 + 4500);
    assert.strictEqual(byTime.find(p => p.partition === 3).offset, '5', JSON.stringify(byTime));
    await admin.deleteTopicRecords({ topic: 'kjs', partitions: [{ partition: 3, offset: '4' }] });
    assert.strictEqual((await admin.fetchTopicOffsets('kjs')).find(p => p.partition === 3).low, '4');
    await admin.setOffsets({ groupId: 'kjs-set', topic: 'kjs', partitions: [{ partition: 3, offset: '6' }] });
    const set = (await admin.fetchOffsets({ groupId: 'kjs-set', topics: ['kjs'] }))[0].partitions;
    assert.strictEqual(set.find(p => p.partition === 3).offset, '6', JSON.stringify(set));
    await admin.deleteGroups(['kjs-set']);
    await refused('deleting a group that does not exist', 'GROUP_ID_NOT_FOUND', () => admin.deleteGroups(['kjs-nobody']));
    const acl = { resourceType: AclResourceTypes.TOPIC, resourceName: 'kjs', resourcePatternType: ResourcePatternTypes.LITERAL,
                  principal: 'User:bob', host: '*', operation: AclOperationTypes.READ, permissionType: AclPermissionTypes.ALLOW };
    await admin.createAcls({ acl: [acl] });
    const acls = await admin.describeAcls({ resourceType: AclResourceTypes.TOPIC, resourceName: 'kjs', resourcePatternType: ResourcePatternTypes.LITERAL,
                                            operation: AclOperationTypes.ANY, permissionType: AclPermissionTypes.ANY });
    assert.deepStrictEqual(acls.resources.flatMap(r => r.acls.map(a => a.principal)), ['User:bob'], JSON.stringify(acls));
    const deleted = await admin.deleteAcls({ filters: [acl] });
    assert.strictEqual(deleted.filterResponses[0].matchingAcls.length, 1, JSON.stringify(deleted));
    await admin.deleteTopics({ topics: ['kjs'] });
    await until('the topic deleted', async () => !(await admin.listTopics()).includes('kjs'));
    await admin.disconnect();
});
"#;

/// Transactions across two partitions with the offsets of a consumed input, one aborted,
/// and a zombie fenced by a second producer with the same transactional id.
const TRANSACTIONS_SCRIPT: &str = r#"
main(async () => {
    const client = kafka();
    const admin = client.admin();
    await admin.connect();
    await admin.createTopics({ topics: [{ topic: 'kjs-out', numPartitions: 2 }, { topic: 'kjs-in', numPartitions: 1 }] });
    const producer = client.producer({ transactionalId: 'kjs-txn', idempotent: true, maxInFlightRequests: 1 });
    await producer.connect();
    const commit = async (values, offset) => {
        const txn = await producer.transaction();
        await txn.send({ topic: 'kjs-out', messages: values.map((value, i) => ({ partition: i % 2, value })) });
        if (offset !== undefined) {
            await txn.sendOffsets({ consumerGroupId: 'kjs-txn-group', topics: [{ topic: 'kjs-in', partitions: [{ partition: 0, offset }] }] });
        }
        await txn.commit();
    };
    await commit(['c1', 'c2'], '7');
    const aborted = await producer.transaction();
    await aborted.send({ topic: 'kjs-out', messages: [{ partition: 0, value: 'a1' }, { partition: 1, value: 'a2' }] });
    await aborted.sendOffsets({ consumerGroupId: 'kjs-txn-group', topics: [{ topic: 'kjs-in', partitions: [{ partition: 0, offset: '99' }] }] });
    await aborted.abort();
    await commit(['c3', 'c4'], '9');

    // The offsets of the committed transactions only.
    const offsets = (await admin.fetchOffsets({ groupId: 'kjs-txn-group', topics: ['kjs-in'] }))[0].partitions;
    assert.strictEqual(offsets[0].offset, '9', JSON.stringify(offsets));

    // A second producer with the same id fences the first: its next transaction is
    // refused. (KafkaJS sends the transactional InitProducerId at a producer's first
    // transaction, not at connect. It speaks AddPartitionsToTxn v0-v1, where
    // PRODUCER_FENCED, KIP-588, is answered as INVALID_PRODUCER_EPOCH.)
    const successor = client.producer({ transactionalId: 'kjs-txn', idempotent: true, maxInFlightRequests: 1 });
    await successor.connect();
    const last = await successor.transaction();
    const zombie = await producer.transaction();
    await refused('the fenced producer writing', 'INVALID_PRODUCER_EPOCH', async () => {
        await zombie.send({ topic: 'kjs-out', messages: [{ partition: 0, value: 'zombie' }] });
        await zombie.commit();
    });
    await last.send({ topic: 'kjs-out', messages: [{ partition: 1, value: 'c5' }] });
    await last.commit();
    await successor.disconnect();
    await producer.disconnect().catch(() => {});

    // read_committed sees the committed records, read_uncommitted the aborted ones too.
    const read = async (group, readUncommitted, expected) => {
        const consumer = client.consumer({ groupId: group, readUncommitted, maxWaitTimeInMs: 200 });
        await consumer.connect();
        await consumer.subscribe({ topic: 'kjs-out', fromBeginning: true });
        const seen = [];
        await consumer.run({ eachMessage: async ({ message }) => { seen.push(message.value.toString()); } });
        await until(`${group} to read ${expected}`, () => expected.every(v => seen.includes(v)));
        await sleep(1000); // anything else that was to come
        await consumer.disconnect();
        return seen.sort();
    };
    assert.deepStrictEqual(await read('kjs-committed', false, ['c1', 'c2', 'c3', 'c4', 'c5']), ['c1', 'c2', 'c3', 'c4', 'c5']);
    assert.deepStrictEqual(await read('kjs-uncommitted', true, ['a1', 'a2', 'c5']), ['a1', 'a2', 'c1', 'c2', 'c3', 'c4', 'c5']);
    await admin.disconnect();
});
"#;

/// SASL_SSL with each mechanism KafkaJS has, as the user `carol` under her ACLs.
const SECURITY_SCRIPT: &str = r#"
const [ca, password] = rest;
const carol = (mechanism, pass = password, extra = {}) => kafka({
    ssl: { ca: [fs.readFileSync(ca, 'utf-8')] },
    sasl: { mechanism, username: 'carol', password: pass },
    retry: { retries: 2 },
    ...extra,
});
const mechanisms = ['plain', 'scram-sha-256', 'scram-sha-512'];
main(async () => {
    for (const mechanism of mechanisms) {
        const producer = carol(mechanism).producer();
        await producer.connect();
        await producer.send({ topic: 'granted', acks: -1, messages: Array.from({ length: 10 }, (_, i) => ({ value: `${mechanism}-${i}` })) });
        // `visible` she may only describe: Produce refuses her.
        await refused(`${mechanism}: a write to visible`, 'TOPIC_AUTHORIZATION_FAILED',
                      () => producer.send({ topic: 'visible', acks: -1, messages: [{ value: 'x' }] }));
        await producer.disconnect();
    }
    const expected = mechanisms.flatMap(m => Array.from({ length: 10 }, (_, i) => `${m}-${i}`));
    const consumer = carol('scram-sha-512').consumer({ groupId: 'carol-kafkajs', maxWaitTimeInMs: 200 });
    await consumer.connect();
    await consumer.subscribe({ topic: 'granted', fromBeginning: true });
    const seen = [];
    await consumer.run({ eachMessage: async ({ message }) => { seen.push(message.value.toString()); } });
    await until('carol to read what she wrote', () => seen.length >= expected.length);
    assert.deepStrictEqual(seen, expected);
    await consumer.disconnect();

    // A group she has no ACL on: FindCoordinator refuses it. KafkaJS reports any
    // refusal there as "Failed to find group coordinator" and logs the broker's error.
    const logged = [];
    const logCreator = () => ({ log }) => { logged.push(JSON.stringify(log)); };
    const outsider = carol('plain', password, { logLevel: logLevel.DEBUG, logCreator })
        .consumer({ groupId: 'not-hers', retry: { retries: 0 } });
    await outsider.connect();
    await outsider.subscribe({ topic: 'granted', fromBeginning: true });
    const error = await new Promise(resolve => {
        outsider.on(outsider.events.CRASH, e => resolve(e.payload.error));
        outsider.run({ eachMessage: async () => {} }).catch(resolve);
    });
    assert.strictEqual(error.name, 'KafkaJSGroupCoordinatorNotFound', `${error.name}: ${error.message}`);
    assert(logged.some(l => l.includes('GROUP_AUTHORIZATION_FAILED')), logged.join('\n'));
    await outsider.disconnect();

    // A wrong password, with each mechanism.
    for (const mechanism of mechanisms) {
        const admin = carol(mechanism, 'wrong').admin();
        await admin.connect().then(() => { throw new Error(`${mechanism}: a wrong password was accepted`); }, e => {
            assert(/SASL|[Aa]uthentication/.test(`${e.name} ${e.message}`), `${mechanism}: ${e.name}: ${e.message}`);
        });
    }
});
"#;

async fn run_node(script: &str, args: &[&str]) {
    let output = fjord_testkit::run_node(&format!("{PRELUDE}{script}"), args, Duration::from_secs(240)).await.unwrap();
    assert!(output.ok(), "the KafkaJS script failed {}", output.transcript());
}

/// `script` against a fresh single broker.
async fn on_one_broker(script: &str) {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |_| {}).await.unwrap();
    run_node(script, &[&broker.bootstrap()]).await;
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafkajs_produces_consumes_in_a_rebalancing_group_and_administers() {
    on_one_broker(CLIENTS_SCRIPT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafkajs_transactions_commit_abort_send_offsets_and_fence_a_zombie() {
    on_one_broker(TRANSACTIONS_SCRIPT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafkajs_over_sasl_ssl_with_plain_and_scram_under_acls() {
    common::init_tracing();
    const PASSWORD: &str = "carol-secret";
    let cluster = Cluster::builder().brokers(1).sasl_ssl().scram_user("carol", PASSWORD).start().await.unwrap();
    for topic in ["granted", "visible"] {
        cluster.create_topic(topic, 1, &[], Duration::from_secs(30)).await.unwrap();
    }
    common::grant_carol(&cluster).await;
    let ca = cluster.secure().unwrap().ca.to_str().unwrap().to_owned();
    run_node(SECURITY_SCRIPT, &[&cluster.bootstrap(), &ca, PASSWORD]).await;
}
