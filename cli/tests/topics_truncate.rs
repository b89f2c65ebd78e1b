//! `fjord topics truncate TOPIC --before OFFSET` (issue #22, Kafka's DeleteRecords as
//! kafka-delete-records runs it) against an in-process broker: the records below the
//! offset go, so a consumer from the beginning starts there; an offset beyond the end is
//! refused with Kafka's OFFSET_OUT_OF_RANGE for that partition and a failed exit.

mod common;

use fjord_client::{ClientConfig, Producer, ProducerConfig, ProducerRecord};
use fjord_testkit::StandaloneBroker;

use common::{fjord, stdout};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncate_moves_the_start_consumers_follow_and_an_offset_past_the_end_is_refused() {
    let b = StandaloneBroker::start().await.unwrap();
    stdout(&fjord(&["topics", "--bootstrap", &b.addr, "create", "--topic", "t", "--partitions", "1"]).await);
    let producer =
        Producer::connect(ProducerConfig { client: ClientConfig::new(&b.addr), ..ProducerConfig::default() }).await.unwrap();
    for i in 0..10 {
        producer.send(ProducerRecord::new("t", format!("v{i}")).partition(0)).await.unwrap().await.unwrap();
    }

    let out = stdout(&fjord(&["topics", "--bootstrap", &b.addr, "truncate", "t", "--before", "5"]).await);
    assert_eq!(out, "t-0  low watermark 5\n");
    let consumed = ["consume", "--bootstrap", &b.addr, "--topic", "t", "--from", "beginning", "--max-messages", "5"];
    assert_eq!(stdout(&fjord(&consumed).await), "v5\nv6\nv7\nv8\nv9\n", "a consumer from the beginning starts at 5");

    let refused = fjord(&["topics", "--bootstrap", &b.addr, "truncate", "t", "--before", "11", "--partition", "0"]).await;
    assert!(!refused.status.success(), "an offset past the end fails the run");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("t-0  error OFFSET_OUT_OF_RANGE"), "the partition and Kafka's error are named: {stderr}");

    // -1: everything below the high watermark.
    let out = stdout(&fjord(&["topics", "--bootstrap", &b.addr, "truncate", "t", "--before", "-1"]).await);
    assert_eq!(out, "t-0  low watermark 10\n");
}
