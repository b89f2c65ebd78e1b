//! The console's pages over HTTP against a real broker, registry and gateway, with kcat as
//! the independent client: topics and records kcat made are shown (an Avro record decoded
//! through the registry), hostile keys, values, headers and group ids are escaped, a
//! kcat group's lag shows, topics are created and deleted through the forms (and kcat sees
//! it), a cross-site form post is refused, offsets are reset, and a broker or registry
//! that cannot be reached is a message on the page. A real mirror's group, lag, status
//! and recorded gaps are on `/ui/mirror`; a real loader's jobs, offsets and files on
//! `/ui/loads`; the overview's rates and a group's lag chart follow real traffic.

mod support;

use std::time::Duration;

use apache_avro::types::Value;
use fjord_console::{Console, ConsoleConfig};
use fjord_schema_registry::RegistryClient;
use support::{kcat, kcat_produce, until, System};

const HOSTILE_KEY: &str = "<script>alert('key')</script>";
const HOSTILE_VALUE: &str = "\"><img src=x onerror=alert(1)>";
const HOSTILE_GROUP: &str = "<b>grp\"&'</b>";

/// An Avro click, framed as Confluent's serializers do, made through the registry.
async fn avro_click(registry: &str, page: &str) -> Vec<u8> {
    let client = RegistryClient::new(registry).unwrap();
    let schema = r#"{"type":"record","name":"Click","fields":[{"name":"page","type":"string"},{"name":"n","type":"long"}]}"#;
    let value = Value::Record(vec![("page".into(), Value::String(page.into())), ("n".into(), Value::Long(7))]);
    client.serialize("clicks-value", schema, value).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_records_and_groups_made_by_kcat_are_shown_escaped() {
    let sys = System::start().await;
    kcat_produce(
        &sys.broker,
        "orders",
        &format!("k1\t{{\"item\":\"book\",\"qty\":2}}\n{HOSTILE_KEY}\t{HOSTILE_VALUE}\n"),
        Some("x-evil=<i>hdr</i>"),
    );
    // Avro, framed (magic byte, schema id) through the registry; no newline in its bytes.
    let avro = avro_click(&sys.registry, "/checkout").await;
    assert!(!avro.contains(&b'\n'));
    let (ok, _, err) = kcat(&["-b", &sys.broker, "-P", "-t", "clicks"], Some(&avro));
    assert!(ok, "{err}");

    let (status, list) = sys.get("/ui/topics").await;
    assert_eq!(status, 200, "{list}");
    assert!(list.contains(">orders</a>") && list.contains(">clicks</a>"), "{list}");

    let (status, page) = sys.get("/ui/topics/orders").await;
    assert_eq!(status, 200, "{page}");
    for raw in ["<script>alert", "<img src=x", "<i>hdr</i>"] {
        assert!(!page.contains(raw), "unescaped {raw:?} in the topic page");
    }
    assert!(page.contains("&lt;script&gt;alert('key')&lt;/script&gt;"), "{page}");
    assert!(page.contains("&quot;&gt;&lt;img src=x onerror=alert(1)&gt;"), "{page}");
    assert!(page.contains("&lt;i&gt;hdr&lt;/i&gt;"), "{page}");
    assert!(page.contains("&quot;item&quot;: &quot;book&quot;"), "JSON pretty-printed: {page}");
    assert!(page.contains("DEFAULT_CONFIG") || page.contains("STATIC_BROKER_CONFIG"), "config sources: {page}");

    let (status, page) = sys.get("/ui/topics/clicks").await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("avro · schema 1"), "{page}");
    assert!(page.contains("&quot;page&quot;: &quot;/checkout&quot;"), "Avro decoded: {page}");

    // By timestamp: from long ago every record, from the future none; a bad one is a 400.
    let (_, page) = sys.get("/ui/topics/orders?timestamp=2000-01-01T00:00Z").await;
    assert!(page.contains("2 records, newest first."), "{page}");
    let (_, page) = sys.get(&format!("/ui/topics/orders?timestamp={}", i64::MAX / 2)).await;
    assert!(page.contains("No records in this range."), "{page}");
    let (status, page) = sys.get("/ui/topics/orders?timestamp=yesterday").await;
    assert_eq!(status, 400);
    assert!(page.contains("timestamp: &quot;yesterday&quot; is neither"), "{page}");

    // Schemas: the subject, and candidate schemas checked against its latest version.
    let (status, page) = sys.get("/ui/schemas").await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains(">clicks-value</a>"), "{page}");
    let compatible = r#"{"type":"record","name":"Click","fields":[{"name":"page","type":"string"},{"name":"n","type":"long"},{"name":"ref","type":"string","default":""}]}"#;
    let page = sys.post_form("/ui/schemas/clicks-value/check", &[("schema", compatible)]).await.text().await.unwrap();
    assert!(page.contains("Compatible."), "{page}");
    let incompatible = r#"{"type":"record","name":"Click","fields":[{"name":"page","type":"int"},{"name":"n","type":"long"}]}"#;
    let page = sys.post_form("/ui/schemas/clicks-value/check", &[("schema", incompatible)]).await.text().await.unwrap();
    assert!(page.contains("Not compatible"), "{page}");

    // A kcat consumer group reads orders to its end and commits; then two more records.
    let (ok, _, err) = kcat(
        &[
            "-b",
            &sys.broker,
            "-G",
            HOSTILE_GROUP,
            "-X",
            "auto.offset.reset=earliest",
            "-X",
            "enable.auto.commit=true",
            "-e",
            "-q",
            "orders",
        ],
        None,
    );
    assert!(ok, "{err}");
    kcat_produce(&sys.broker, "orders", "k2\tmore\nk3\tmore\n", None);
    until(30, "the group's lag of 2", async || {
        let (_, page) = sys.get("/ui/groups").await;
        assert!(!page.contains("<b>grp"), "unescaped group id");
        page.contains("&lt;b&gt;grp&quot;&amp;'&lt;/b&gt;") && page.contains("<td class=\"num lag\">2</td>")
    })
    .await;
    let group_path = format!("/ui/groups/{}", support::enc(HOSTILE_GROUP));
    let (status, page) = sys.get(&group_path).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("id=\"total-lag\">2<"), "{page}");

    // Reset the (empty) group to earliest: its lag is every record (4).
    let r = sys.post_form(&format!("{group_path}/reset"), &[("topic", "orders"), ("to", "earliest"), ("value", "")]).await;
    assert_eq!(r.status(), 303, "{}", r.text().await.unwrap());
    let (_, page) = sys.get(&group_path).await;
    assert!(page.contains("id=\"total-lag\">4<"), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_are_created_and_deleted_through_the_forms() {
    let sys = System::start().await;
    let r = sys.post_form("/ui/topics", &[("name", "made-in-ui"), ("partitions", "3"), ("retention_ms", "3600000")]).await;
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/ui/topics/made-in-ui?created=1");
    let (ok, listing, err) = kcat(&["-b", &sys.broker, "-L", "-t", "made-in-ui"], None);
    assert!(ok, "{err}");
    assert!(listing.contains("topic \"made-in-ui\" with 3 partitions"), "{listing}");
    let (_, page) = sys.get("/ui/topics/made-in-ui?created=1").await;
    assert!(page.contains("Created topic made-in-ui."), "{page}");
    assert!(page.contains("<td>retention.ms</td><td>3600000</td><td>DYNAMIC_TOPIC_CONFIG</td>"), "{page}");
    let r = sys.post_form("/ui/topics/made-in-ui/configs", &[("name", "retention.ms"), ("value", "7200000")]).await;
    assert_eq!(r.status(), 303);
    let (_, page) = sys.get("/ui/topics/made-in-ui?altered=retention.ms").await;
    assert!(page.contains("<td>retention.ms</td><td>7200000</td><td>DYNAMIC_TOPIC_CONFIG</td>"), "{page}");
    let r = sys.post_form("/ui/topics/made-in-ui/configs", &[("name", "retention.ms"), ("value", "soon")]).await;
    assert_eq!(r.status(), 502, "the broker refuses a bad value");
    assert!(r.text().await.unwrap().contains("retention.ms"));

    // A bad name is refused on the page, with the form kept.
    let r = sys.post_form("/ui/topics", &[("name", "no spaces"), ("partitions", "1")]).await;
    assert_eq!(r.status(), 400);
    let page = r.text().await.unwrap();
    assert!(page.contains("is not a topic name") && page.contains("value=\"no spaces\""), "{page}");
    // A form posted from another site's page is refused and creates nothing.
    let r = reqwest::Client::new()
        .post(format!("{}/ui/topics", sys.http))
        .header("Origin", "http://evil.example")
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body("name=csrf&partitions=1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let (_, listing, _) = kcat(&["-b", &sys.broker, "-L"], None);
    assert!(!listing.contains("\"csrf\""), "{listing}");

    let r = sys.post_form("/ui/topics/made-in-ui/delete", &[]).await;
    assert_eq!(r.status(), 303);
    until(30, "the deleted topic to leave kcat's listing", async || {
        let (_, listing, _) = kcat(&["-b", &sys.broker, "-L"], None);
        !listing.contains("made-in-ui")
    })
    .await;
    let (status, page) = sys.get("/ui/topics/made-in-ui").await;
    assert_eq!(status, 404);
    assert!(page.contains("topic &quot;made-in-ui&quot; does not exist"), "{page}");
}

/// A console whose broker and registry are not there: every page renders a message.
#[tokio::test]
async fn unreachable_brokers_and_registry_are_messages_on_the_page() {
    // Ports nothing listens on: bound, then closed.
    let dead = |l: std::net::TcpListener| l.local_addr().unwrap().to_string();
    let broker = dead(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let registry = dead(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let config = ConsoleConfig {
        registry_url: Some(format!("http://{registry}")),
        timeout: Duration::from_secs(2),
        ..ConsoleConfig::new(&broker)
    };
    let console = Console::new(config, fjord_auth::http::HttpSecurity::open());
    let app = fjord_console::router(console);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    for path in ["/ui/", "/ui/topics", "/ui/topics/t", "/ui/groups", "/ui/groups/g", "/ui/schemas", "/ui/audit", "/ui/mirror"] {
        let r = reqwest::get(format!("{url}{path}")).await.unwrap();
        let status = r.status().as_u16();
        let page = r.text().await.unwrap();
        assert!((500..=504).contains(&status), "{path}: {status}");
        assert!(page.contains("<p class=\"error\" role=\"alert\">"), "{path}: {page}");
        assert!(page.contains("<nav aria-label=\"Sections\">"), "{path}: the page shell is there");
        if path == "/ui/schemas" {
            assert!(page.contains("schema registry"), "{page}");
        } else {
            assert!(page.contains("brokers") || page.contains("audit"), "{path}: {page}");
        }
    }
    let r = reqwest::get(format!("{url}/ui/assets/console.js")).await.unwrap();
    assert_eq!(r.status(), 200, "assets are served without the brokers");
}

/// With the gateway's Basic authentication and authorizer on, the console asks for the
/// same credentials and shows and does only what the ACLs allow the user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_authentication_and_acls_apply_to_the_console() {
    use fjord_auth::scram::{ScramCredential, ScramMechanism};
    use fjord_auth::{
        AccessControlEntry, AclBinding, Operation, PatternType, Permission, Principal, ResourcePattern, ResourceType,
    };

    let sys = System::start().await;
    kcat_produce(&sys.broker, "visible", "k\tv\n", None);
    kcat_produce(&sys.broker, "secret", "k\tv\n", None);
    let store = fjord_coord::open(None, &sys.dir.path().join("gateway-store")).await.unwrap();
    for (user, password) in [("alice", "alice-pw"), ("admin", "admin-pw")] {
        let credential = ScramCredential::generate(ScramMechanism::Sha256, password, 4096).unwrap();
        fjord_auth::store::set_credential(&*store, user, ScramMechanism::Sha256, &credential).await.unwrap();
    }
    let allow = |operation| AclBinding {
        pattern: ResourcePattern::new(ResourceType::Topic, "visible", PatternType::Literal).unwrap(),
        entry: AccessControlEntry::new(Principal::user("alice"), "*", operation, Permission::Allow).unwrap(),
    };
    fjord_auth::store::create_acls(&*store, &[allow(Operation::Describe), allow(Operation::Read)]).await.unwrap();
    let mut config = fjord_gateway::GatewayConfig::new(sys.broker.clone());
    for (key, value) in [("authentication.method", "BASIC"), ("authorizer.enable", "true"), ("super.users", "User:admin")] {
        config.set(key, value).unwrap();
    }
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", http.local_addr().unwrap());
    let shutdown = tokio_util::sync::CancellationToken::new();
    tokio::spawn(fjord_gateway::run_with_store(config, Some(store), http, grpc, shutdown.clone()));
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let get = |path: &str, user: Option<(&str, &str)>| {
        let mut r = client.get(format!("{url}{path}"));
        if let Some((u, p)) = user {
            r = r.basic_auth(u, Some(p));
        }
        r.send()
    };
    // The gateway serves once its store watchers are up.
    let mut r = get("/ui/topics", None).await;
    for _ in 0..100 {
        if r.as_ref().is_ok_and(|r| r.status() != 503) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        r = get("/ui/topics", None).await;
    }
    let r = r.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers()["www-authenticate"].to_str().unwrap().starts_with("Basic realm="));
    assert_eq!(get("/ui/topics", Some(("alice", "wrong"))).await.unwrap().status(), 401);

    let alice = Some(("alice", "alice-pw"));
    let page = get("/ui/topics", alice).await.unwrap().text().await.unwrap();
    assert!(page.contains(">visible</a>") && !page.contains("secret"), "{page}");
    assert!(!page.contains("Delete"), "alice may not delete: {page}");
    let r = get("/ui/topics/secret", alice).await.unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.text().await.unwrap().contains("User:alice may not Describe topic &quot;secret&quot;"));
    let page = get("/ui/topics/visible", alice).await.unwrap().text().await.unwrap();
    assert!(page.contains("<pre class=\"text\">v</pre>"), "alice reads visible: {page}");
    let r = client
        .post(format!("{url}/ui/topics"))
        .basic_auth("alice", Some("alice-pw"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body("name=alices&partitions=1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.text().await.unwrap().contains("User:alice may not Create topic &quot;alices&quot;"));
    assert_eq!(get("/ui/audit", alice).await.unwrap().status(), 403, "no Read on _audit");

    let page = get("/ui/topics", Some(("admin", "admin-pw"))).await.unwrap().text().await.unwrap();
    assert!(page.contains(">visible</a>") && page.contains(">secret</a>"), "{page}");
    shutdown.cancel();
}

/// A mirror copying `orders` within the cluster (to `dc1.orders`): its group `fjord-mirror`
/// with the position and lag of each source partition, its own status through its
/// metrics address, and the gaps recorded in `_mirror_gaps`, escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mirror_page_shows_its_group_lag_status_and_gaps() {
    // The mirror's metrics address, closed until the mirror starts on it: a listener kept
    // bound but never accepting would be a mirror that hangs, not one that is not running
    // (its page waits out the 10 s timeout instead).
    let metrics_addr = {
        let probe = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        probe.local_addr().unwrap().to_string()
    };
    let sys = System::start_with(|g| g.set("console.mirror.url", &metrics_addr).unwrap()).await;
    let (status, page) = sys.get("/ui/mirror").await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("id=\"no-mirror\"") && page.contains("No gaps recorded."), "{page}");
    assert!(
        page.contains("the mirror&#39;s status could not be read") || page.contains("the mirror's status could not be read"),
        "a mirror that is not running is a message: {page}"
    );

    kcat_produce(&sys.broker, "orders", "k1\tv1\nk2\tv2\nk3\tv3\n", None);
    // The target topic takes records up to 2000 bytes: a larger one is held (below).
    let admin = fjord_client::Admin::connect(fjord_client::ClientConfig::new(&sys.broker)).await.unwrap();
    let mut target = fjord_client::NewTopic::new("dc1.orders", 1);
    target.configs.insert("max.message.bytes".into(), "2000".into());
    admin.create_topics(&[target]).await.unwrap();
    let mut config = fjord_mirror::MirrorConfig::new(
        vec![fjord_mirror::SourceConfig::parse(&format!("dc1={}", sys.broker)).unwrap()],
        sys.broker.clone(),
        "orders",
    );
    config.rename = Some("{alias}.{topic}".into());
    config.commit_interval = Duration::from_millis(200);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let metrics = tokio::net::TcpListener::bind(&metrics_addr).await.unwrap();
    let mirror = tokio::spawn(fjord_mirror::run(config, Some(metrics), shutdown.clone()));
    until(60, "the mirror's group at the end of orders/0", async || {
        let (_, page) = sys.get("/ui/mirror").await;
        page.contains("/ui/groups/fjord-mirror\">fjord-mirror</a>")
            && page.contains("<tr data-tp=\"orders/0\"><td>orders</td><td class=\"num\">0</td><td class=\"num\">3</td><td class=\"num\">3</td><td class=\"num lag\">0</td>")
    })
    .await;
    // More records: the lag shows until the mirror copies them, and its status is there.
    kcat_produce(&sys.broker, "orders", "k4\tv4\n", None);
    until(60, "the position past the new record", async || {
        let (_, page) = sys.get("/ui/mirror").await;
        page.contains("<td class=\"num\">4</td><td class=\"num\">4</td><td class=\"num lag\">0</td>")
    })
    .await;
    let (_, page) = sys.get("/ui/mirror").await;
    assert!(page.contains("id=\"source-list\""), "{page}");
    assert!(page.contains("<td>dc1</td>") && page.contains("<td>up</td>"), "{page}");
    assert!(page.contains("<td>dc1.orders</td>"), "the target topic: {page}");
    assert!(!page.contains("id=\"held-partitions\""), "nothing is held yet: {page}");

    // A record the target refuses: its partition is held, and the page says so and why.
    kcat_produce(&sys.broker, "orders", &format!("k5\t{}\n", "x".repeat(5000)), None);
    until(60, "the partition held at the refused record", async || {
        let (_, page) = sys.get("/ui/mirror").await;
        page.contains("id=\"held-partitions\"")
            && page.contains("<tr class=\"warn held\">")
            && page.contains("<td class=\"refused\">the target refuses the record at offset ")
    })
    .await;

    // A gap as the mirror records it (JSON keyed source/topic-partition), with a hostile alias.
    let gap = fjord_audit::GapRecord {
        source: "<b>dc9</b>".into(),
        topic: "orders".into(),
        partition: 1,
        first_offset: 200,
        last_offset: 303,
        records: 104,
        detected_ms: 1_796_010_000_123,
    };
    let line = format!("<b>dc9</b>/orders-1\t{}\n", serde_json::to_string(&gap).unwrap());
    let (ok, _, err) = kcat(&["-b", &sys.broker, "-P", "-t", fjord_audit::GAPS_TOPIC, "-K", "\t"], Some(line.as_bytes()));
    assert!(ok, "{err}");
    let (status, page) = sys.get("/ui/mirror").await;
    assert_eq!(status, 200, "{page}");
    assert!(!page.contains("<b>dc9"), "unescaped alias");
    assert!(
        page.contains("<tr class=\"loss\"><td>2026-11-30T03:40:00.123Z</td><td>&lt;b&gt;dc9&lt;/b&gt;</td><td>orders</td><td class=\"num\">1</td><td class=\"num\">200</td><td class=\"num\">303</td><td class=\"num\">104</td></tr>"),
        "{page}"
    );
    shutdown.cancel();
    mirror.await.unwrap().unwrap();
}

/// Two runs of a real loader job into a local directory: `/ui/loads` shows the job's
/// committed offsets and each commit with the files it wrote (and only those); a
/// destination with no jobs and a bad URL are messages on the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loads_page_shows_jobs_offsets_and_files() {
    let dest = tempfile::tempdir().unwrap();
    let empty = tempfile::tempdir().unwrap();
    let loads = format!("file://{},file://{},ftp://nowhere/x", dest.path().display(), empty.path().display());
    let sys = System::start_with(|g| g.set("console.loads", &loads).unwrap()).await;
    kcat_produce(&sys.broker, "clicks", "a\t1\nb\t2\nc\t3\n", None);
    let config = fjord_hadoop_loader::LoaderConfig {
        bootstrap: sys.broker.clone(),
        topics: "clicks".into(),
        dest: format!("file://{}", dest.path().display()),
        job: "hourly-clicks".into(),
        idle_timeout: Duration::from_secs(20),
        ..fjord_hadoop_loader::LoaderConfig::default()
    };
    let first = fjord_hadoop_loader::run_once(&config, &()).await.unwrap();
    assert_eq!(first.committed_seq, Some(1));
    kcat_produce(&sys.broker, "clicks", "d\t4\ne\t5\n", None);
    let second = fjord_hadoop_loader::run_once(&config, &()).await.unwrap();
    assert_eq!(second.committed_seq, Some(2));

    let (status, page) = sys.get("/ui/loads").await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Job <span class=\"name\">hourly-clicks</span>"), "{page}");
    assert!(page.contains("Committed state <strong>2</strong>"), "{page}");
    assert!(page.contains("<td>clicks</td><td class=\"num\">0</td><td class=\"num offset\">5</td>"), "{page}");
    // Commit 2 wrote offsets 3-4 of partition 0, commit 1 offsets 0-2: each row lists its own file.
    let commits = &page[page.find("class=\"commits\"").expect("the commits table")..];
    let row2 = &commits[commits.find("<td class=\"num\">2</td>").unwrap()..commits.find("<td class=\"num\">1</td>").unwrap()];
    assert!(row2.contains("clicks+0+3+4.avro") && !row2.contains("clicks+0+0+2.avro"), "{row2}");
    assert!(row2.contains("<td class=\"num\">2</td>"), "2 records: {row2}");
    let row1 = &commits[commits.find("<td class=\"num\">1</td>").unwrap()..];
    assert!(row1.contains("clicks+0+0+2.avro") && !row1.contains("clicks+0+3+4.avro"), "{row1}");
    assert!(page.contains("No jobs have committed here yet."), "the empty destination: {page}");
    assert!(page.contains("the loader destination ftp://nowhere/x could not be read"), "{page}");

    // Without destinations the page says how to configure them.
    let plain = System::start().await;
    let (status, page) = plain.get("/ui/loads").await;
    assert_eq!(status, 200);
    assert!(page.contains("id=\"no-loads\"") && page.contains("console.loads="), "{page}");
}

/// The overview's produce and consume rates follow real traffic between two samples, and
/// a group's page draws its lag over time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rates_and_the_lag_chart_follow_traffic() {
    let sys = System::start().await;
    let consume = || {
        let (ok, _, err) =
            kcat(&["-b", &sys.broker, "-G", "readers", "-X", "auto.offset.reset=earliest", "-e", "-q", "events"], None);
        assert!(ok, "{err}");
    };
    // The group exists before the first sample: a group new since the last sample is not
    // counted (its first commit is no rate).
    kcat_produce(&sys.broker, "events", "k\tv\n", None);
    consume();
    let (_, page) = sys.get("/ui/").await;
    assert!(page.contains("The first rates appear after two samples."), "{page}");
    // The topic list has no messages/s before two samples either.
    let (_, page) = sys.get("/ui/topics").await;
    assert_eq!(cell(&page, "events", "rate"), "—", "{page}");
    // After the first sample (started by that view): 50 records, read and committed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let lines: String = (0..50).map(|i| format!("k{i}\tv{i}\n")).collect();
    kcat_produce(&sys.broker, "events", &lines, None);
    consume();
    let rate = |page: &str, id: &str| -> f64 {
        let at = page.find(&format!("id=\"{id}\">")).map(|i| i + id.len() + 6).unwrap_or(0);
        page[at..].split('<').next().unwrap_or("").parse().unwrap_or(0.0)
    };
    // The production and the commit may fall into different samples.
    let (mut produced, mut consumed) = (false, false);
    until(40, "produce and consume rates above 0", async || {
        let (_, page) = sys.get("/ui/").await;
        produced |= rate(&page, "produce-rate") > 0.0;
        consumed |= rate(&page, "consume-rate") > 0.0;
        produced && consumed && page.contains("<svg class=\"chart\"")
    })
    .await;
    // Now the topic list shows the topic's latest rate, a number.
    let (_, page) = sys.get("/ui/topics").await;
    let shown = cell(&page, "events", "rate");
    assert!(shown.parse::<f64>().is_ok_and(|r| r >= 0.0), "messages/s {shown:?}: {page}");
    // The group's page: two reads of its lag make a chart.
    sys.get("/ui/groups/readers").await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (_, page) = sys.get("/ui/groups/readers").await;
    let chart = &page[page.find("id=\"lag-chart\"").unwrap()..];
    assert!(chart.starts_with("id=\"lag-chart\"><svg class=\"chart\""), "{chart}");
}

/// The text of `topic`'s cell of class `class` on the topic list.
fn cell(page: &str, topic: &str, class: &str) -> String {
    let row = &page[page.find(&format!("<tr data-name=\"{topic}\">")).expect("the topic's row")..];
    let row = &row[..row.find("</tr>").unwrap()];
    let at = row.find(&format!("class=\"num {class}\">")).expect("the cell") + class.len() + 13;
    let text = &row[at..row[at..].find("</td>").unwrap() + at];
    // Strip the span a size is in.
    text.rsplit_once("\">").map_or(text, |(_, t)| t).trim_end_matches("</span>").to_string()
}

/// The exact bytes (`data-bytes`) of the first size at or after `from` in `page`.
fn bytes_after(page: &str, from: &str) -> i64 {
    let rest = &page[page.find(from).unwrap_or_else(|| panic!("{from} in {page}"))..];
    let at = rest.find("data-bytes=\"").expect("a size") + 12;
    rest[at..].split('"').next().unwrap().parse().unwrap()
}

/// A topic with records shows its size on the list (the sum over its partitions) and each
/// partition's on its page: the bytes of the leader's copy that DescribeLogDirs reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_and_partition_sizes_are_the_leader_copies_on_disk() {
    let sys = System::start().await;
    let admin = fjord_client::Admin::connect(fjord_client::ClientConfig::new(&sys.broker)).await.unwrap();
    admin.create_topics(&[fjord_client::NewTopic::new("sized", 2)]).await.unwrap();
    let lines: String = (0..200).map(|i| format!("key{i}\tvalue number {i}\n")).collect();
    kcat_produce(&sys.broker, "sized", &lines, None);
    let metadata = admin.describe_topic("sized").await.unwrap();
    let mut expected = std::collections::BTreeMap::new();
    for p in &metadata.partitions {
        let dirs = admin.describe_log_dirs(p.leader, &[("sized".to_string(), p.partition)]).await.unwrap();
        let size: i64 = dirs.iter().flat_map(|d| &d.replicas).filter(|r| !r.is_future).map(|r| r.size).sum();
        expected.insert(p.partition, size);
    }
    let total: i64 = expected.values().sum();
    assert!(total > 200 * 10, "{expected:?}");

    let (status, page) = sys.get("/ui/topics").await;
    assert_eq!(status, 200);
    assert!(page.contains("size (leader copies)"), "{page}");
    assert_eq!(bytes_after(&page, "<tr data-name=\"sized\">"), total, "{page}");
    assert!(cell(&page, "sized", "size").ends_with("KiB"), "{page}");

    let (status, page) = sys.get("/ui/topics/sized").await;
    assert_eq!(status, 200);
    let table = &page[page.find("id=\"partitions\"").unwrap()..];
    let rows: Vec<&str> = table.split("<tr").skip(2).take(2).collect();
    for (p, row) in rows.iter().enumerate() {
        assert_eq!(bytes_after(row, "data-bytes"), expected[&(p as i32)], "partition {p}: {row}");
    }
}
