//! `fjord reassign` (issue #22, Kafka's `kafka-reassign-partitions`) on three in-process
//! brokers on ZooKeeper (fjord-testkit): a plan in Kafka's JSON format is executed and
//! verified, a cancel of a finished reassignment is refused, and `--decommission`
//! moves every replica off a broker.

use std::process::{Command, Output};
use std::time::Duration;

use fjord_client::{Admin, NewTopic};
use fjord_testkit::{wait_until, Cluster};

const REACT: Duration = Duration::from_secs(30);
const TOPIC: &str = "plan";

/// Runs `fjord` off the runtime's threads (the brokers keep serving meanwhile).
async fn fjord(args: &[&str]) -> Output {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || Command::new(env!("CARGO_BIN_EXE_fjord")).args(&args).output().unwrap()).await.unwrap()
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "fjord failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

async fn replicas(cluster: &Cluster) -> Vec<i32> {
    cluster.assignment(TOPIC).await.unwrap().unwrap().partitions["0"].clone()
}

async fn wait_for_replicas(cluster: &Cluster, want: &[i32]) {
    wait_until(REACT, &format!("{TOPIC}-0 on {want:?}"), || async {
        let assignment = cluster.assignment(TOPIC).await?.expect("the topic exists");
        Ok((assignment.partitions["0"] == want && assignment.adding_replicas.is_empty()).then_some(()))
    })
    .await
    .unwrap();
    cluster.wait_for_isr(TOPIC, 0, want, REACT).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_is_executed_verified_and_a_broker_decommissioned() {
    let cluster = Cluster::builder().brokers(3).config("replica.fetch.wait.max.ms", 100).start().await.unwrap();
    let admin = Admin::connect(cluster.client_config()).await.unwrap();
    let mut topic = NewTopic::new(TOPIC, 1);
    topic.replication_factor = 2;
    admin.create_topics(&[topic]).await.unwrap();
    cluster.wait_fully_replicated(TOPIC, REACT).await.unwrap();
    let before = replicas(&cluster).await;
    let spare = *cluster.ids().iter().find(|id| !before.contains(id)).unwrap();
    let target = vec![spare, before[1]];

    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.json");
    let text = format!(
        r#"{{"version":1,"partitions":[{{"topic":"{TOPIC}","partition":0,"replicas":[{},{}],"log_dirs":["any","any"]}}]}}"#,
        target[0], target[1]
    );
    std::fs::write(&plan, text).unwrap();
    let (plan, bootstrap) = (plan.to_str().unwrap(), format!("--bootstrap={}", cluster.bootstrap()));

    let out = stdout(&fjord(&["reassign", "--execute", "--plan", plan, &bootstrap]).await);
    assert!(out.contains(&format!("Successfully started partition reassignments for {TOPIC}-0")), "{out}");
    assert!(out.contains(&format!("\"replicas\":{before:?}").replace(' ', "")), "the rollback plan: {out}");
    wait_for_replicas(&cluster, &target).await;
    let out = stdout(&fjord(&["reassign", "--verify", "--reassignment-json-file", plan, &bootstrap]).await);
    assert!(out.contains(&format!("Reassignment of partition {TOPIC}-0 is completed.")), "{out}");

    let cancel = fjord(&["reassign", "--cancel", "--plan", plan, &bootstrap]).await;
    assert!(!cancel.status.success(), "nothing to cancel");
    assert!(String::from_utf8_lossy(&cancel.stderr).contains("no reassignment of this partition is in progress"), "{cancel:?}");

    // The spare broker goes: its replica moves to the only broker without one.
    let out = stdout(&fjord(&["reassign", "--decommission", &spare.to_string(), &bootstrap]).await);
    assert!(out.contains("Proposed partition reassignment configuration"), "{out}");
    wait_for_replicas(&cluster, &[before[0], before[1]]).await;
    wait_until(REACT, "the decommissioned broker drops its copy", || async {
        Ok((!cluster.data_dir(spare).join(format!("{TOPIC}-0")).exists()).then_some(()))
    })
    .await
    .unwrap();
}
