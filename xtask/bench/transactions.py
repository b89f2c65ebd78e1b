"""Transactions against a running broker, beside their references in the same run
(issue #20's benchmark; confluent-kafka, 200-byte records, one partition, rounds
alternated, medians):
- produce: transactional, COMMIT_EVERY records a transaction, vs idempotent non-transactional;
- consume: read_committed vs read_uncommitted of the transactional topic (markers included).

Usage: [LINGER=ms] [PRODUCERS=n] target/venv/bin/python xtask/bench/transactions.py BOOTSTRAP [RECORDS] [ROUNDS]
against e.g. `fjord broker --id 0 --data-dir DIR --listen 127.0.0.1:PORT` (release build).

PRODUCERS (default 1) runs that many producer processes at once on each side, each with
RECORDS / PRODUCERS records (and its own transactional id). A transaction is a sequence of
round trips that one producer cannot overlap (librdkafka also holds each transaction's
AddPartitionsToTxn on a 1 ms timer), so one producer measures the client's latency per
transaction; several measure what the broker sustains for an application with several
transactional producers. Both sides always run the same number of producers, and each
side's clock starts once all its producers are constructed (and, transactional, initialized)."""
import multiprocessing, os, statistics, sys, time, uuid
from confluent_kafka import Producer, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

COMMIT_EVERY, SIZE = 100, 200
VALUE = b'x' * SIZE


def settings(bootstrap):
    return {'bootstrap.servers': bootstrap, 'linger.ms': int(os.environ.get('LINGER', '0')), 'batch.num.messages': 10000,
            'queue.buffering.max.messages': 1000000}


def produce_idempotent(bootstrap, topic, n, ready):
    p = Producer(dict(settings(bootstrap), **{'enable.idempotence': True}))
    ready.wait()
    for _ in range(n):
        while True:
            try:
                p.produce(topic, VALUE, partition=0)
                break
            except BufferError:
                p.poll(0.01)
    assert p.flush(120) == 0


def produce_transactional(bootstrap, topic, n, ready):
    p = Producer(dict(settings(bootstrap), **{'transactional.id': 'bench-' + uuid.uuid4().hex}))
    p.init_transactions(30)
    ready.wait()
    for _ in range(0, n, COMMIT_EVERY):
        p.begin_transaction()
        for _ in range(COMMIT_EVERY):
            p.produce(topic, VALUE, partition=0)
        p.commit_transaction(60)


def produce(work, bootstrap, topic, n, producers):
    """Records per second of `producers` processes producing n records between them."""
    # Spawned, not forked: the parent holds librdkafka threads (the admin client).
    context = multiprocessing.get_context('spawn')
    per = n // producers
    ready = context.Barrier(producers + 1)
    procs = [context.Process(target=work, args=(bootstrap, topic, per, ready)) for _ in range(producers)]
    for proc in procs:
        proc.start()
    ready.wait()
    start = time.perf_counter()
    for proc in procs:
        proc.join()
        assert proc.exitcode == 0, f'{work.__name__} failed'
    return per * producers / (time.perf_counter() - start)


def consume(bootstrap, topic, isolation, expected):
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


def main():
    bootstrap = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 200_000
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    producers = int(os.environ.get('PRODUCERS', '1'))
    admin = AdminClient({'bootstrap.servers': bootstrap})
    suffix = uuid.uuid4().hex[:8]
    idem_topic, txn_topic = 'bench-idem-' + suffix, 'bench-txn-' + suffix
    for f in admin.create_topics([NewTopic(t, 1, 1) for t in (idem_topic, txn_topic)]).values():
        f.result()
    time.sleep(1)

    idem, txn = [], []
    for r in range(rounds):
        idem.append(produce(produce_idempotent, bootstrap, idem_topic, n, producers))
        txn.append(produce(produce_transactional, bootstrap, txn_topic, n, producers))
        print(f'round {r}: idempotent {idem[-1]:,.0f}/s  transactional {txn[-1]:,.0f}/s', flush=True)
    total = n // producers * producers * rounds
    rc, ru = [], []
    for r in range(rounds):
        ru.append(consume(bootstrap, txn_topic, 'read_uncommitted', total))
        rc.append(consume(bootstrap, txn_topic, 'read_committed', total))
        print(f'round {r}: read_uncommitted {ru[-1]:,.0f}/s  read_committed {rc[-1]:,.0f}/s', flush=True)
    mi, mt, mu, mc = (statistics.median(x) for x in (idem, txn, ru, rc))
    print(f'produce, {producers} producer(s) a side: transactional ({COMMIT_EVERY}/txn) {mt:,.0f}/s '
          f'vs idempotent {mi:,.0f}/s = {mt / mi:.0%}')
    print(f'consume: read_committed {mc:,.0f}/s vs read_uncommitted {mu:,.0f}/s = {mc / mu:.0%}')


if __name__ == '__main__':
    main()
