//! Headless Chromium (over the DevTools protocol) on the console's real pages, served by
//! the gateway at `/ui/` in front of a real broker and registry, with kcat as the
//! independent client: a kcat topic is listed; its records are on its page, an Avro record
//! decoded through the registry; a kcat group's lag shows, rises and falls live (Server-
//! Sent Events) as records arrive and the group consumes them; a topic created with the
//! page's form is listed by kcat -L; an audit loss is highlighted; the mirror and loads
//! pages render (a real loader job's files listed); at phone width no page is wider than
//! the screen; the keyboard reaches the navigation and the forms; no page has a
//! JavaScript error. Each page's screenshot is kept in `target/console-screenshots/`.

mod support;

use apache_avro::types::Value;
use fjord_audit::{AuditRecord, AUDIT_TOPIC, DEFAULT_WINDOW_MS};
use fjord_schema_registry::RegistryClient;
use support::cdp::{screenshot_dir, Browser};
use support::{kcat, kcat_produce, System};

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Audit counts for `orders`: a window two hours ago where every tier agrees, and one an
/// hour ago (past the grace period) where the broker has 3 fewer than the gateway took.
fn induce_audit_loss(broker: &str) {
    let window = DEFAULT_WINDOW_MS;
    let start = |ago: i64| (now_ms() - ago) - (now_ms() - ago).rem_euclid(window);
    let record = |tier: &str, start: i64, count: u64| AuditRecord {
        id: format!("it/{tier}/{start}"),
        tier: tier.into(),
        host: "it".into(),
        cluster: "local".into(),
        topic: "orders".into(),
        window_start_ms: start,
        window_ms: window,
        count,
        published_ms: now_ms(),
        isolation: None,
    };
    let lines: Vec<String> = [
        record("gateway", start(7_200_000), 100),
        record("broker", start(7_200_000), 100),
        record("gateway", start(3_600_000), 100),
        record("broker", start(3_600_000), 97),
    ]
    .iter()
    .map(|r| String::from_utf8(r.encode()).unwrap())
    .collect();
    let (ok, _, err) = kcat(&["-b", broker, "-P", "-t", AUDIT_TOPIC], Some(format!("{}\n", lines.join("\n")).as_bytes()));
    assert!(ok, "{err}");
}

fn group_consume(broker: &str, group: &str, topic: &str) {
    let (ok, _, err) = kcat(&["-b", broker, "-G", group, "-X", "auto.offset.reset=earliest", "-e", "-q", topic], None);
    assert!(ok, "kcat group consumer: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_browses_the_console_pages() {
    let loads = tempfile::tempdir().unwrap();
    let loads_url = format!("file://{}", loads.path().display());
    let sys = System::start_with(|g| g.set("console.loads", &loads_url).unwrap()).await;
    kcat_produce(
        &sys.broker,
        "orders",
        "o-1\t{\"item\":\"book\",\"qty\":2}\no-2\t<script>window.pwned=1</script>\n",
        Some("source=kcat"),
    );
    let registry = RegistryClient::new(&sys.registry).unwrap();
    let schema = r#"{"type":"record","name":"Click","fields":[{"name":"page","type":"string"},{"name":"user","type":"string"}]}"#;
    let value =
        Value::Record(vec![("page".into(), Value::String("/checkout".into())), ("user".into(), Value::String("u-7".into()))]);
    let avro = registry.serialize("clicks-value", schema, value).await.unwrap();
    assert!(!avro.contains(&b'\n'));
    let (ok, _, err) = kcat(&["-b", &sys.broker, "-P", "-t", "clicks"], Some(&avro));
    assert!(ok, "{err}");
    group_consume(&sys.broker, "shop", "orders");
    kcat_produce(&sys.broker, "orders", "o-3\tthree\no-4\tfour\no-5\tfive\n", None);
    induce_audit_loss(&sys.broker);

    let shots = screenshot_dir();
    let profile = tempfile::tempdir().unwrap();
    let mut b = Browser::start(profile.path()).await.unwrap();
    let ui = format!("{}/ui", sys.http);

    b.goto(&format!("{ui}/")).await.unwrap();
    assert_eq!(b.eval("document.querySelector('#offline .n').textContent").await.unwrap(), "0");
    b.screenshot(&shots.join("overview.png")).await.unwrap();

    // The topic kcat made is listed; the filter hides the others as one types.
    b.goto(&format!("{ui}/topics")).await.unwrap();
    b.wait_for("!!document.querySelector('#topics tr[data-name=\"orders\"]')", 10).await.unwrap();
    b.screenshot(&shots.join("topics.png")).await.unwrap();
    b.eval("const f = document.getElementById('filter'); f.value = 'click'; f.dispatchEvent(new Event('input'));").await.unwrap();
    assert_eq!(b.eval("document.querySelector('#topics tr[data-name=\"orders\"]').hidden").await.unwrap(), true);
    assert_eq!(b.eval("document.querySelector('#topics tr[data-name=\"clicks\"]').hidden").await.unwrap(), false);

    // Its records, newest first; the script in a value is text, never run.
    b.goto(&format!("{ui}/topics/orders")).await.unwrap();
    let values = b.eval("Array.from(document.querySelectorAll('#records td.value')).map(td => td.innerText)").await.unwrap();
    let values: Vec<String> = serde_json::from_value(values).unwrap();
    assert_eq!(values.len(), 5, "{values:?}");
    assert!(values.iter().any(|v| v.contains("<script>window.pwned=1</script>")), "{values:?}");
    assert!(values.iter().any(|v| v.contains("\"item\": \"book\"")), "JSON pretty-printed: {values:?}");
    assert_eq!(b.eval("window.pwned === undefined").await.unwrap(), true);
    b.screenshot(&shots.join("topic.png")).await.unwrap();

    b.goto(&format!("{ui}/topics/clicks")).await.unwrap();
    assert_eq!(b.eval("document.querySelector('#records td.value').dataset.kind").await.unwrap(), "avro");
    let avro_text = b.eval("document.querySelector('#records td.value pre').innerText").await.unwrap();
    assert!(avro_text.as_str().unwrap().contains("\"page\": \"/checkout\""), "{avro_text}");
    b.screenshot(&shots.join("topic-avro.png")).await.unwrap();

    // The group's lag: 3 on the list and its page, then live as records come and go.
    b.goto(&format!("{ui}/groups")).await.unwrap();
    assert_eq!(b.eval("document.querySelector('#groups tr[data-name=\"shop\"] td.lag').textContent").await.unwrap(), "3");
    b.screenshot(&shots.join("groups.png")).await.unwrap();
    b.goto(&format!("{ui}/groups/shop")).await.unwrap();
    assert_eq!(b.eval("document.getElementById('total-lag').textContent").await.unwrap(), "3");
    b.wait_for("document.querySelector('.live') && document.querySelector('.live').textContent.startsWith('live')", 20)
        .await
        .unwrap();
    kcat_produce(&sys.broker, "orders", "o-6\tsix\no-7\tseven\n", None);
    b.wait_for("document.getElementById('total-lag').textContent === '5'", 30).await.unwrap();
    group_consume(&sys.broker, "shop", "orders");
    b.wait_for("document.getElementById('total-lag').textContent === '0'", 30).await.unwrap();
    b.screenshot(&shots.join("group.png")).await.unwrap();

    // A topic created with the form: the browser lands on its page and kcat -L lists it.
    b.goto(&format!("{ui}/topics")).await.unwrap();
    b.eval("document.querySelector('form.create input[name=name]').value = 'made-in-browser'; document.querySelector('form.create input[name=partitions]').value = '4';").await.unwrap();
    b.eval_and_wait("document.querySelector('form.create button').click()").await.unwrap();
    assert_eq!(b.eval("location.pathname").await.unwrap(), "/ui/topics/made-in-browser");
    let (ok, listing, err) = kcat(&["-b", &sys.broker, "-L", "-t", "made-in-browser"], None);
    assert!(ok, "{err}");
    assert!(listing.contains("topic \"made-in-browser\" with 4 partitions"), "{listing}");

    b.goto(&format!("{ui}/schemas")).await.unwrap();
    assert!(b.eval("document.querySelector('#subjects').innerText").await.unwrap().as_str().unwrap().contains("clicks-value"));
    b.screenshot(&shots.join("schemas.png")).await.unwrap();
    b.goto(&format!("{ui}/schemas/clicks-value")).await.unwrap();
    b.screenshot(&shots.join("schema.png")).await.unwrap();

    // The induced loss is highlighted and listed first, linking to its window's counts.
    b.goto(&format!("{ui}/audit")).await.unwrap();
    assert_eq!(b.eval("document.querySelectorAll('table.audit tr.loss').length").await.unwrap(), 1);
    assert_eq!(b.eval("document.querySelectorAll('table.audit tr.complete').length").await.unwrap(), 1);
    let problem = b.eval("document.querySelector('#problems li.loss').innerText").await.unwrap();
    assert!(problem.as_str().unwrap().contains("broker -3"), "{problem}");
    assert_eq!(
        b.eval("getComputedStyle(document.querySelector('table.audit tr.loss td')).backgroundColor").await.unwrap(),
        "rgb(248, 201, 201)"
    );
    b.screenshot(&shots.join("audit.png")).await.unwrap();

    // The mirror page (no mirror here: a message) and a real loader job's commit.
    b.goto(&format!("{ui}/mirror")).await.unwrap();
    assert_eq!(b.eval("!!document.getElementById('no-mirror')").await.unwrap(), true);
    b.screenshot(&shots.join("mirror.png")).await.unwrap();
    let loader = fjord_hadoop_loader::LoaderConfig {
        bootstrap: sys.broker.clone(),
        topics: "orders".into(),
        dest: loads_url.clone(),
        job: "orders-hourly".into(),
        idle_timeout: std::time::Duration::from_secs(20),
        ..fjord_hadoop_loader::LoaderConfig::default()
    };
    fjord_hadoop_loader::run_once(&loader, &()).await.unwrap();
    b.goto(&format!("{ui}/loads")).await.unwrap();
    let files = b.eval("document.querySelector('table.commits ul.files').innerText").await.unwrap();
    assert!(files.as_str().unwrap().contains("orders+0+0+6.avro"), "{files}");
    b.screenshot(&shots.join("loads.png")).await.unwrap();

    // The overview's rates chart, once the console has sampled twice.
    b.goto(&format!("{ui}/")).await.unwrap();
    b.wait_for("!!document.querySelector('#rates-chart svg')", 30).await.unwrap();
    b.screenshot(&shots.join("overview-rates.png")).await.unwrap();

    // The keyboard: the first Tab is the skip link; Tab reaches the create form.
    b.goto(&format!("{ui}/topics")).await.unwrap();
    let tab = async |b: &mut Browser| {
        for kind in ["keyDown", "keyUp"] {
            b.call(
                "Input.dispatchKeyEvent",
                serde_json::json!({"type": kind, "key": "Tab", "code": "Tab", "windowsVirtualKeyCode": 9}),
            )
            .await
            .unwrap();
        }
    };
    tab(&mut b).await;
    assert_eq!(b.eval("document.activeElement.className").await.unwrap(), "skip");
    assert_ne!(b.eval("getComputedStyle(document.activeElement).left").await.unwrap(), "-9999px", "visible when focused");
    let mut reached = false;
    for _ in 0..80 {
        tab(&mut b).await;
        if b.eval("document.activeElement.matches('form.create input[name=name]')").await.unwrap() == true {
            reached = true;
            break;
        }
    }
    assert!(reached, "the create form is reachable with Tab");
    assert_ne!(b.eval("getComputedStyle(document.activeElement).outlineStyle").await.unwrap(), "none", "focus is visible");

    // Phone width: no page is wider than the screen (tables scroll inside themselves).
    b.call(
        "Emulation.setDeviceMetricsOverride",
        serde_json::json!({"width": 375, "height": 740, "deviceScaleFactor": 1, "mobile": true}),
    )
    .await
    .unwrap();
    for (path, shot) in [
        ("/", "phone-overview"),
        ("/topics", "phone-topics"),
        ("/topics/orders", "phone-topic"),
        ("/groups/shop", "phone-group"),
        ("/audit", "phone-audit"),
        ("/loads", "phone-loads"),
        ("/mirror", "phone-mirror"),
    ] {
        b.goto(&format!("{ui}{path}")).await.unwrap();
        let (page, screen) =
            (b.eval("document.documentElement.scrollWidth").await.unwrap(), b.eval("window.innerWidth").await.unwrap());
        assert!(page.as_i64().unwrap() <= screen.as_i64().unwrap(), "{path}: {page} px wide on a {screen} px screen");
        b.screenshot(&shots.join(format!("{shot}.png"))).await.unwrap();
    }

    assert!(b.errors.is_empty(), "JavaScript or console errors: {:#?}", b.errors);
}
