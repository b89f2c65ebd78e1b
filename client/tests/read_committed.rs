//! A read_committed consumer against an in-process broker: it never returns the records
//! of an aborted transaction, and its position moves past the transaction markers and
//! aborted batches no record shows, up to the high watermark.

use std::time::Duration;

use fjord_client::{
    ClientConfig, Consumer, ConsumerConfig, IsolationLevel, OffsetReset, Producer, ProducerConfig, ProducerRecord, TopicPartition,
};
use fjord_testkit::StandaloneBroker;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_position_of_a_read_committed_consumer_passes_markers_and_aborted_batches() {
    let broker = StandaloneBroker::start_with(|c| {
        c.set("transaction.state.log.num.partitions", "1").unwrap();
    })
    .await
    .expect("broker starts");
    let producer = Producer::connect(ProducerConfig {
        client: ClientConfig::new(&broker.addr),
        transactional_id: Some("position".into()),
        ..ProducerConfig::default()
    })
    .await
    .unwrap();
    // Offsets 0-2 committed (marker at 3), then 4-5 aborted (marker at 6): the log ends at 7.
    for (values, commit) in [(&["a", "b", "c"][..], true), (&["x", "y"][..], false)] {
        producer.begin_transaction().unwrap();
        for v in values {
            drop(producer.send(ProducerRecord::new("rc", *v).partition(0)).await.unwrap());
        }
        match commit {
            true => producer.commit_transaction().await.unwrap(),
            false => producer.abort_transaction().await.unwrap(),
        }
    }
    let mut consumer = Consumer::connect(ConsumerConfig {
        client: ClientConfig::new(&broker.addr),
        auto_offset_reset: OffsetReset::Earliest,
        isolation_level: IsolationLevel::ReadCommitted,
        fetch_max_wait: Duration::from_millis(50),
        ..ConsumerConfig::default()
    })
    .await
    .unwrap();
    let tp = TopicPartition::new("rc", 0);
    consumer.assign([tp.clone()]).await.unwrap();
    let mut values = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while consumer.position(&tp).await.unwrap() < 7 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "position stuck at {}, read {values:?}",
            consumer.position(&tp).await.unwrap()
        );
        for r in consumer.poll(Duration::from_millis(200)).await.unwrap() {
            values.push(String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned());
        }
    }
    assert_eq!(values, ["a", "b", "c"]);
    assert_eq!(consumer.position(&tp).await.unwrap(), 7, "the position stops at the high watermark");
}
