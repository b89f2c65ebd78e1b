use super::*;
use crate::{create_all, delete_all};

fn store(dir: &Path) -> EmbeddedStore {
    reopen(dir).unwrap()
}

/// Opens the store a test just dropped. A test running beside it that spawns a process
/// (a tmpfs mount) can hold a copy of the lock file's descriptor between its fork and
/// exec, and the lock with it, for some milliseconds on a loaded machine: `InUse` is
/// retried for a while, any other answer is returned.
fn reopen(dir: &Path) -> Result<EmbeddedStore> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match EmbeddedStore::open(dir) {
            Err(Error::InUse { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

#[tokio::test]
async fn create_get_set_delete_with_versions() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    assert!(matches!(s.create("/a/b", b"x", CreateMode::Persistent).await, Err(Error::NoNode { .. })));
    s.create("/a", b"", CreateMode::Persistent).await.unwrap();
    s.create("/a/b", b"x", CreateMode::Persistent).await.unwrap();
    assert!(matches!(s.create("/a/b", b"y", CreateMode::Persistent).await, Err(Error::NodeExists { .. })));
    let (data, stat) = s.get("/a/b").await.unwrap().unwrap();
    assert_eq!((data.as_slice(), stat.version), (&b"x"[..], 0));
    assert_eq!(s.set("/a/b", b"y", Some(0)).await.unwrap().version, 1);
    assert!(matches!(s.set("/a/b", b"z", Some(0)).await, Err(Error::BadVersion { expected: 0, actual: 1, .. })));
    assert!(matches!(s.delete("/a", None).await, Err(Error::NotEmpty { .. })));
    assert!(matches!(s.delete("/a/b", Some(0)).await, Err(Error::BadVersion { .. })));
    s.delete("/a/b", Some(1)).await.unwrap();
    assert_eq!(s.get("/a/b").await.unwrap(), None);
    assert_eq!(s.children("/a").await.unwrap(), Vec::<String>::new());
}

#[tokio::test]
async fn persistent_nodes_survive_reopen_and_ephemerals_do_not() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = store(dir.path());
        create_all(&s, "/brokers/topics/t", b"{}", CreateMode::Persistent).await.unwrap();
        s.set("/brokers/topics/t", b"{\"v\":2}", None).await.unwrap();
        create_all(&s, "/brokers/ids/1", b"e", CreateMode::Ephemeral).await.unwrap();
        let seq = s.create("/brokers/s-", b"", CreateMode::PersistentSequential).await.unwrap();
        assert_eq!(seq, "/brokers/s-0000000000");
    }
    let s = store(dir.path());
    let (data, stat) = s.get("/brokers/topics/t").await.unwrap().unwrap();
    assert_eq!((data.as_slice(), stat.version), (&b"{\"v\":2}"[..], 1));
    assert_eq!(s.get("/brokers/ids/1").await.unwrap(), None);
    let seq = s.create("/brokers/s-", b"", CreateMode::PersistentSequential).await.unwrap();
    assert_eq!(seq, "/brokers/s-0000000001", "sequence numbers are never reused");
}

/// Five nodes `/n0`..`/n4`, one record each; returns the journal and each record's offset.
async fn five_records(dir: &Path) -> (PathBuf, Vec<usize>) {
    let s = store(dir);
    let mut offsets = Vec::new();
    for i in 0..5 {
        offsets.push(s.lock().journal_len as usize);
        s.create(&format!("/n{i}"), b"data", CreateMode::Persistent).await.unwrap();
    }
    (dir.join(JOURNAL), offsets)
}

#[tokio::test]
async fn one_process_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let first = store(dir.path());
    assert!(matches!(EmbeddedStore::open(dir.path()), Err(Error::InUse { .. })));
    drop(first);
    store(dir.path());
}

#[tokio::test]
async fn a_torn_journal_tail_is_cut_and_earlier_changes_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, offsets) = five_records(dir.path()).await;
    let full = std::fs::read(&journal).unwrap();
    let record_len = full.len() - offsets[4];
    for cut in 1..record_len {
        std::fs::write(&journal, &full[..full.len() - cut]).unwrap();
        let s = store(dir.path());
        assert_eq!(s.children("/").await.unwrap(), vec!["n0", "n1", "n2", "n3"], "cut {cut}");
        drop(s);
        assert_eq!(std::fs::metadata(&journal).unwrap().len() as usize, offsets[4], "the torn tail is cut off the file");
    }
    // A last record that is whole but fails its checksum is the same torn write.
    let mut flipped = full.clone();
    flipped[offsets[4] + FRAME_LEN + 2] ^= 0x10;
    std::fs::write(&journal, &flipped).unwrap();
    assert_eq!(store(dir.path()).children("/").await.unwrap(), vec!["n0", "n1", "n2", "n3"]);
    // Appends after a repair land after the cut, not after the garbage.
    std::fs::write(&journal, &full[..full.len() - 3]).unwrap();
    store(dir.path()).create("/n9", b"", CreateMode::Persistent).await.unwrap();
    assert_eq!(store(dir.path()).children("/").await.unwrap(), vec!["n0", "n1", "n2", "n3", "n9"]);
}

#[tokio::test]
async fn a_damaged_record_in_the_middle_refuses_to_open_and_leaves_the_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, offsets) = five_records(dir.path()).await;
    let full = std::fs::read(&journal).unwrap();
    // A flipped bit in a payload, in a CRC, and in a length field (which makes the
    // record run past the end of the file, like a torn one).
    for (at, bit) in [(offsets[2] + FRAME_LEN + 5, 0x01), (offsets[2] + 5, 0x80), (offsets[2] + 1, 0x40)] {
        let mut damaged = full.clone();
        damaged[at] ^= bit;
        std::fs::write(&journal, &damaged).unwrap();
        match reopen(dir.path()) {
            Err(e @ Error::CorruptJournal { .. }) => {
                let Error::CorruptJournal { path, offset, next_valid } = &e else { unreachable!() };
                assert_eq!((path, *offset, *next_valid), (&journal, offsets[2] as u64, offsets[3] as u64), "byte {at}");
                let message = e.to_string();
                assert!(message.contains(&journal.display().to_string()), "{message}");
                assert!(message.contains(&format!("byte offset {}", offsets[2])), "{message}");
            }
            other => panic!("damage at byte {at} opened as {other:?}"),
        }
        assert_eq!(std::fs::read(&journal).unwrap(), damaged, "a refused journal is not touched");
    }
}

#[tokio::test]
async fn a_failed_append_on_a_full_disk_is_cut_back_and_the_store_works_when_space_returns() {
    let disk = fjord_testkit::Tmpfs::mount(2).unwrap();
    let dir = disk.path().join("store");
    let s = store(&dir);
    s.create("/kept", b"before", CreateMode::Persistent).await.unwrap();
    let journal = dir.join(JOURNAL);
    let good_len = std::fs::metadata(&journal).unwrap().len();
    disk.fill("filler").unwrap();
    // Bigger than any slack left in the journal's last page: part of it is written
    // before the disk refuses the rest.
    let big = vec![7u8; 3 * 4096];
    for attempt in 0..3 {
        let failed = s.create("/lost", &big, CreateMode::Persistent).await.unwrap_err();
        assert!(matches!(&failed, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::StorageFull), "{failed}");
        assert!(s.set("/kept", &big, Some(0)).await.is_err(), "attempt {attempt}");
        assert_eq!(std::fs::metadata(&journal).unwrap().len(), good_len, "attempt {attempt}: the partial record was cut back");
    }
    assert_eq!(s.get("/lost").await.unwrap(), None, "a failed create leaves the tree unchanged");
    assert_eq!(s.get("/kept").await.unwrap().unwrap().0, b"before");
    std::fs::remove_file(disk.path().join("filler")).unwrap();
    s.create("/after", b"acknowledged", CreateMode::Persistent).await.unwrap();
    s.set("/kept", b"changed", Some(0)).await.unwrap();
    drop(s);
    let s = store(&dir);
    assert_eq!(s.children("/").await.unwrap(), vec!["after", "kept"]);
    assert_eq!(s.get("/kept").await.unwrap().unwrap().0, b"changed");
    assert_eq!(s.get("/after").await.unwrap().unwrap().0, b"acknowledged");
}

#[tokio::test]
async fn a_format_1_journal_is_read_then_rewritten_in_format_2() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join(JOURNAL);
    let record = |op, path: &str, version, data: &[u8]| {
        encode_v1(&JournalRecord { op, path: path.into(), version, time_ms: 5, data: data.to_vec() })
    };
    let mut v1 = Vec::new();
    v1.extend(record(OP_CREATE, "/a", 0, b"1"));
    v1.extend(record(OP_CREATE, "/a/b", 0, b"2"));
    v1.extend(record(OP_SET, "/a/b", 1, b"3"));
    let whole = v1.len();
    v1.extend(&record(OP_CREATE, "/torn", 0, b"x")[..10]);
    std::fs::write(&journal, &v1).unwrap();
    let s = store(dir.path());
    let (data, stat) = s.get("/a/b").await.unwrap().unwrap();
    assert_eq!((data.as_slice(), stat.version), (&b"3"[..], 1));
    assert_eq!(s.get("/torn").await.unwrap(), None);
    s.create("/c", b"", CreateMode::Persistent).await.unwrap();
    drop(s);
    let rewritten = std::fs::read(&journal).unwrap();
    assert_eq!(header(&rewritten), Header::Versioned(FORMAT_VERSION));
    assert_eq!(store(dir.path()).children("/").await.unwrap(), vec!["a", "c"]);
    // Format 1 follows the same rules: damage in the middle refuses to open.
    let mut damaged = v1[..whole].to_vec();
    damaged[FRAME_LEN + 3] ^= 1;
    std::fs::write(&journal, &damaged).unwrap();
    assert!(matches!(reopen(dir.path()), Err(Error::CorruptJournal { offset: 0, .. })));
}

#[tokio::test]
async fn headers_cut_short_stale_rewrites_and_newer_formats() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join(JOURNAL);
    for cut in 0..HEADER_LEN {
        let mut h = MAGIC.to_vec();
        h.extend(FORMAT_VERSION.to_be_bytes());
        std::fs::write(&journal, &h[..cut]).unwrap();
        let s = store(dir.path());
        s.create("/x", b"", CreateMode::Persistent).await.unwrap();
        drop(s);
        assert_eq!(store(dir.path()).children("/").await.unwrap(), vec!["x"], "header cut at {cut}");
    }
    // A rewrite interrupted before its rename is discarded.
    std::fs::write(dir.path().join(JOURNAL_TMP), b"half a rewrite").unwrap();
    assert_eq!(store(dir.path()).children("/").await.unwrap(), vec!["x"]);
    assert!(!dir.path().join(JOURNAL_TMP).exists());
    let mut newer = MAGIC.to_vec();
    newer.extend(3u16.to_be_bytes());
    std::fs::write(&journal, &newer).unwrap();
    let refused = reopen(dir.path()).unwrap_err();
    assert!(refused.to_string().contains("format version 3"), "{refused}");
}

/// A record as format 1 framed it: the CRC over the payload only.
fn encode_v1(r: &JournalRecord) -> Vec<u8> {
    let mut out = encode_record(r);
    let crc = crc32c::crc32c(&out[FRAME_LEN..]);
    out[4..8].copy_from_slice(&crc.to_be_bytes());
    out
}

#[tokio::test]
async fn watches_fire_once() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let (none, created) = s.watch_data("/w").await.unwrap();
    assert!(none.is_none());
    s.create("/w", b"1", CreateMode::Persistent).await.unwrap();
    assert_eq!(created.await, WatchEvent::Created);
    let (_, changed) = s.watch_data("/w").await.unwrap();
    let (_, children) = s.watch_children("/").await.unwrap();
    s.set("/w", b"2", None).await.unwrap();
    assert_eq!(changed.await, WatchEvent::DataChanged);
    s.create("/v", b"", CreateMode::Ephemeral).await.unwrap();
    assert_eq!(children.await, WatchEvent::ChildrenChanged);
    let (_, deleted) = s.watch_data("/v").await.unwrap();
    s.close_session();
    assert_eq!(deleted.await, WatchEvent::Deleted);
}

#[tokio::test]
async fn compaction_keeps_the_tree_and_versions() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = store(dir.path());
        s.create("/c", b"", CreateMode::Persistent).await.unwrap();
        for i in 0..(COMPACT_SLACK + 10) {
            s.set("/c", format!("{i}").as_bytes(), None).await.unwrap();
        }
        assert!(s.lock().journal_records < 100, "journal was compacted");
    }
    let s = store(dir.path());
    let (data, stat) = s.get("/c").await.unwrap().unwrap();
    assert_eq!(data, format!("{}", COMPACT_SLACK + 9).into_bytes());
    assert_eq!(stat.version, (COMPACT_SLACK + 10) as i32);
    delete_all(&s, "/c").await.unwrap();
    assert_eq!(s.get("/c").await.unwrap(), None);
}

/// The change whose record makes the journal due for a rewrite survives a reopen, for
/// each kind of change: the rewrite ran between the record and the change's application
/// to the tree, so it wrote the tree without that change and dropped the record with the
/// old journal (a deleted node came back, a set was undone, a created node was gone).
#[tokio::test]
async fn the_change_that_triggers_a_rewrite_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    // Puts the journal past due for a rewrite (as after a create following a failed one),
    // so the next change of any kind triggers it.
    let make_due = |s: &EmbeddedStore| {
        let mut state = s.lock();
        state.journal_records = state.nodes.len() + COMPACT_SLACK + 1;
    };
    let rewritten = |s: &EmbeddedStore| s.lock().journal_records < COMPACT_SLACK;
    {
        let s = store(dir.path());
        s.create("/set", b"old", CreateMode::Persistent).await.unwrap();
        s.create("/gone", b"", CreateMode::Persistent).await.unwrap();
    }
    // Each change is checked after a reopen of its own: a later rewrite would write the
    // tree again, with the earlier change in it.
    let s = store(dir.path());
    make_due(&s);
    s.set("/set", b"new", None).await.unwrap();
    assert!(rewritten(&s), "the set triggered a rewrite");
    drop(s);
    let s = store(dir.path());
    let (data, stat) = s.get("/set").await.unwrap().unwrap();
    assert_eq!((data.as_slice(), stat.version), (&b"new"[..], 1), "the set that triggered the rewrite");

    make_due(&s);
    s.create("/made", b"x", CreateMode::Persistent).await.unwrap();
    assert!(rewritten(&s), "the create triggered a rewrite");
    drop(s);
    let s = store(dir.path());
    assert!(s.get("/made").await.unwrap().is_some(), "the create that triggered the rewrite");

    make_due(&s);
    s.delete("/gone", None).await.unwrap();
    assert!(rewritten(&s), "the delete triggered a rewrite");
    drop(s);
    let s = store(dir.path());
    assert_eq!(s.get("/gone").await.unwrap(), None, "the delete that triggered the rewrite");
}

#[tokio::test]
async fn ephemerals_cannot_have_children() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    s.create("/e", b"", CreateMode::Ephemeral).await.unwrap();
    assert!(matches!(s.create("/e/x", b"", CreateMode::Persistent).await, Err(Error::NoChildrenForEphemerals { .. })));
}

mod model {
    //! The store against a plain map of what every acknowledged change left, over random
    //! changes, journal rewrites and reopens: whatever was acknowledged is there after
    //! every reopen, exactly (data and version), and nothing else is.

    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// The paths the changes pick from: parents and children, so creates and deletes
    /// fail as often as they succeed.
    const PATHS: [&str; 6] = ["/a", "/a/x", "/a/y", "/b", "/b/z", "/b/z/deep"];

    #[derive(Debug, Clone)]
    enum Change {
        Create(usize, u8),
        Set(usize, u8),
        Delete(usize),
        /// The journal is past due, so the next change triggers a rewrite.
        RewriteDue,
        Reopen,
    }

    fn change() -> impl Strategy<Value = Change> {
        let path = 0..PATHS.len();
        prop_oneof![
            4 => (path.clone(), any::<u8>()).prop_map(|(p, d)| Change::Create(p, d)),
            4 => (path.clone(), any::<u8>()).prop_map(|(p, d)| Change::Set(p, d)),
            3 => path.prop_map(Change::Delete),
            1 => Just(Change::RewriteDue),
            1 => Just(Change::Reopen),
        ]
    }

    /// (data, version) of every persistent node but the root.
    fn tree(s: &EmbeddedStore) -> BTreeMap<String, (Vec<u8>, i32)> {
        let state = s.lock();
        state
            .nodes
            .iter()
            .filter(|(p, _)| p.as_str() != "/")
            .map(|(p, n)| (p.clone(), (n.data.clone(), n.stat.version)))
            .collect()
    }

    fn parent(path: &str) -> &str {
        split(path).0
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        #[test]
        fn acknowledged_changes_survive_rewrites_and_reopens(changes in prop::collection::vec(change(), 1..120)) {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let dir = tempfile::tempdir().unwrap();
            let mut s = store(dir.path());
            let mut model: BTreeMap<String, (Vec<u8>, i32)> = BTreeMap::new();
            for change in changes {
                match change {
                    Change::Create(p, d) => {
                        let path = PATHS[p];
                        let parent_there = parent(path) == "/" || model.contains_key(parent(path));
                        let result = runtime.block_on(s.create(path, &[d], CreateMode::Persistent));
                        prop_assert_eq!(result.is_ok(), parent_there && !model.contains_key(path), "create {} {:?}", path, result);
                        if result.is_ok() {
                            model.insert(path.to_string(), (vec![d], 0));
                        }
                    }
                    Change::Set(p, d) => {
                        let path = PATHS[p];
                        let result = runtime.block_on(s.set(path, &[d], None));
                        prop_assert_eq!(result.is_ok(), model.contains_key(path), "set {} {:?}", path, result);
                        if let Some((data, version)) = model.get_mut(path) {
                            *data = vec![d];
                            *version += 1;
                        }
                    }
                    Change::Delete(p) => {
                        let path = PATHS[p];
                        let has_children = model.keys().any(|k| parent(k) == path);
                        let result = runtime.block_on(s.delete(path, None));
                        prop_assert_eq!(result.is_ok(), model.contains_key(path) && !has_children, "delete {} {:?}", path, result);
                        if result.is_ok() {
                            model.remove(path);
                        }
                    }
                    Change::RewriteDue => {
                        let mut state = s.lock();
                        state.journal_records = state.nodes.len() + COMPACT_SLACK + 1;
                    }
                    Change::Reopen => {
                        drop(s);
                        s = store(dir.path());
                        prop_assert_eq!(&tree(&s), &model);
                    }
                }
                prop_assert_eq!(&tree(&s), &model, "in memory");
            }
            drop(s);
            let s = store(dir.path());
            prop_assert_eq!(&tree(&s), &model, "after the last reopen");
        }
    }
}
