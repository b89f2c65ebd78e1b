"""Transactions against a running broker, beside their references in the same run
(issue #20's benchmark; confluent-kafka, 200-byte records, one partition, rounds
alternated, medians):
- produce: transactional, COMMIT_EVERY records a transaction, vs idempotent non-transactional;
- consume: read_committed vs read_uncommitted of the transactional topic (markers included).

Usage: [LINGER=ms] target/venv/bin/python xtask/bench/transactions.py BOOTSTRAP [RECORDS] [ROUNDS]
against e.g. `fjord broker --id 0 --data-dir DIR --listen 127.0.0.1:PORT` (release build)."""
import os, statistics, sys, time, uuid
from confluent_kafka import Producer, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

bootstrap = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 200_000
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
COMMIT_EVERY, SIZE = 100, 200
value = b'x' * SIZE
common = {'bootstrap.servers': bootstrap, 'linger.ms': int(os.environ.get('LINGER', '0')), 'batch.num.messages': 10000, 'queue.buffering.max.messages': 1000000}

def produce_idempotent(topic):
    p = Producer(dict(common, **{'enable.idempotence': True}))
    start = time.perf_counter()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, value, partition=0)
                break
            except BufferError:
                p.poll(0.01)
    assert p.flush(120) == 0
    return n / (time.perf_counter() - start)

def produce_transactional(topic):
    p = Producer(dict(common, **{'transactional.id': 'bench-' + uuid.uuid4().hex}))
    p.init_transactions(30)
    start = time.perf_counter()
    for i in range(0, n, COMMIT_EVERY):
        p.begin_transaction()
        for _ in range(COMMIT_EVERY):
            p.produce(topic, value, partition=0)
        p.commit_transaction(60)
    return n / (time.perf_counter() - start)

def consume(topic, isolation, expected):
    c = Consumer({'bootstrap.servers': bootstrap, 'group.id': 'bench-' + uuid.uuid4().hex, 'enable.auto.commit': False,
                  'isolation.level': isolation, 'fetch.max.bytes': 52428800, 'max.partition.fetch.bytes': 10485760})
    c.assign([TopicPartition(topic, 0, 0)])
    got, start = 0, time.perf_counter()
    while got < expected:
        for m in c.consume(10000, 1.0):
            if not m.error():
                got += 1
    rate = got / (time.perf_counter() - start)
    c.close()
    return rate

admin = AdminClient({'bootstrap.servers': bootstrap})
suffix = uuid.uuid4().hex[:8]
IDEM, TXN = 'bench-idem-' + suffix, 'bench-txn-' + suffix
for f in admin.create_topics([NewTopic(t, 1, 1) for t in (IDEM, TXN)]).values():
    f.result()
time.sleep(1)

idem, txn = [], []
for r in range(rounds):
    idem.append(produce_idempotent(IDEM))
    txn.append(produce_transactional(TXN))
    print(f'round {r}: idempotent {idem[-1]:,.0f}/s  transactional {txn[-1]:,.0f}/s', flush=True)
total = n * rounds
rc, ru = [], []
for r in range(rounds):
    ru.append(consume(TXN, 'read_uncommitted', total))
    rc.append(consume(TXN, 'read_committed', total))
    print(f'round {r}: read_uncommitted {ru[-1]:,.0f}/s  read_committed {rc[-1]:,.0f}/s', flush=True)
mi, mt, mu, mc = (statistics.median(x) for x in (idem, txn, ru, rc))
print(f'produce: transactional ({COMMIT_EVERY}/txn) {mt:,.0f}/s vs idempotent {mi:,.0f}/s = {mt / mi:.0%}')
print(f'consume: read_committed {mc:,.0f}/s vs read_uncommitted {mu:,.0f}/s = {mc / mu:.0%}')
