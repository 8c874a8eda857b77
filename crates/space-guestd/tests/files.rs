//! End-to-end tests of files and watches: the real daemon binary on a Unix socket, driven by
//! the real client (large and aborted uploads, extended attributes, every file operation and
//! its errors, downloads of what is not a regular file, watches).

mod socket;

use std::time::{Duration, Instant};

use bytes::Bytes;
use space_proto::{ClientError, ErrorKind, ExecSpec, FileType, WatchEventKind, WriteOptions};

use socket::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_megabyte_file_round_trip() {
    let d = Daemon::start();
    let c = d.client().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/dir/big.bin");
    let path = path.to_str().unwrap();
    let data = Bytes::from(random_bytes(50 * 1024 * 1024, 23));
    let chunks: Vec<std::io::Result<Bytes>> = data
        .chunks(1024 * 1024)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    let stat = c
        .write_file_stream(
            path,
            futures::stream::iter(chunks),
            WriteOptions {
                mode: Some(0o600),
                create_parents: true,
                owner: Some((65534, 65534)),
                ..WriteOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(stat.size, data.len() as u64);
    assert_eq!(stat.mode, 0o600);
    assert_eq!(stat.file_type, FileType::File);
    // The file and the directories the write made have the owner asked for; the directory
    // that was there keeps its own.
    assert_eq!((stat.uid, stat.gid), (65534, 65534));
    for (d, want) in [("sub", 65534), ("sub/dir", 65534), ("", 0)] {
        let s = c.stat(dir.path().join(d).to_str().unwrap()).await.unwrap();
        assert_eq!(s.uid, want, "{d}");
    }
    // Written again without an owner: it keeps the one it has.
    let again = c
        .write_file(path, Bytes::from_static(b"x"), WriteOptions::default())
        .await
        .unwrap();
    assert_eq!((again.uid, again.size), (65534, 1));
    let data = Bytes::from(random_bytes(50 * 1024 * 1024, 23));
    c.write_file(path, data.clone(), WriteOptions::default())
        .await
        .unwrap();
    let back = c.read_file_bytes(path).await.unwrap();
    assert_eq!(back.len(), data.len());
    assert_eq!(sha(&back), sha(&data));
    // No temporary file was left next to it.
    let names: Vec<String> = c
        .list(dir.path().join("sub/dir").to_str().unwrap())
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec!["big.bin".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_upload_leaves_target_untouched() {
    let d = Daemon::start();
    let c = d.client().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keep.txt");
    std::fs::write(&path, b"original").unwrap();
    let stream = futures::stream::iter(vec![
        Ok(Bytes::from_static(b"partial data")),
        Err(std::io::Error::other("source failed")),
    ]);
    let r = c
        .write_file_stream(path.to_str().unwrap(), stream, WriteOptions::default())
        .await;
    assert!(r.is_err());
    // Give the daemon a moment to clean up, then check nothing changed.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(std::fs::read(&path).unwrap(), b"original");
    let entries: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(entries.len(), 1, "temporary upload file left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_attributes_are_set_by_writes_and_kept_by_rewrites() {
    let d = Daemon::start();
    let c = d.client().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tagged.txt");
    let path = path.to_str().unwrap();
    let with = |pairs: &[(&str, &str)]| WriteOptions {
        xattrs: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..WriteOptions::default()
    };
    let stat = c
        .write_file(
            path,
            Bytes::from_static(b"one"),
            with(&[("user.e2b.team", "infra"), ("user.a&b=c", "x y%z")]),
        )
        .await
        .unwrap();
    assert_eq!(stat.xattrs.get("user.e2b.team").unwrap(), "infra");
    assert_eq!(stat.xattrs.get("user.a&b=c").unwrap(), "x y%z");
    // A rewrite keeps them and sets its own on top; stat and list report them.
    c.write_file(
        path,
        Bytes::from_static(b"two"),
        with(&[("user.e2b.team", "web")]),
    )
    .await
    .unwrap();
    let s = c.stat(path).await.unwrap();
    assert_eq!(s.xattrs.len(), 2, "{:?}", s.xattrs);
    assert_eq!(s.xattrs.get("user.e2b.team").unwrap(), "web");
    let listed = c.list(dir.path().to_str().unwrap()).await.unwrap();
    assert_eq!(listed[0].stat.xattrs, s.xattrs);
    // Names outside user., and too many, are refused before anything is written.
    for bad in [
        with(&[("trusted.x", "1")]),
        with(&[("user.", "1")]),
        WriteOptions {
            xattrs: (0..40)
                .map(|i| (format!("user.k{i}"), "v".into()))
                .collect(),
            ..WriteOptions::default()
        },
    ] {
        // The client refuses them itself...
        match c.write_file(path, Bytes::from_static(b"bad"), bad).await {
            Err(ClientError::Invalid(e)) => assert_eq!(e.kind, ErrorKind::InvalidArgument),
            other => panic!("expected a refused attribute, got {other:?}"),
        }
    }
    // ...and so does the daemon, for whoever sends them anyway.
    let mut h2 = raw_h2(&d.sock).await;
    let uri = format!(
        "http://guest/v1/files?path={}&xattr.trusted.x=1",
        space_proto::query::encode_component(path)
    );
    let req = http::Request::put(uri)
        .body(http_body_util::Full::new(Bytes::from_static(b"bad")))
        .unwrap();
    h2.ready().await.unwrap();
    let resp = h2.send_request(req).await.unwrap();
    assert_eq!(resp.status(), http::StatusCode::BAD_REQUEST);
    assert_eq!(std::fs::read(path).unwrap(), b"two");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_place_write_keeps_the_inode_and_clears_what_it_is_told() {
    use std::os::unix::fs::MetadataExt;
    let d = Daemon::start();
    let c = d.client().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.txt");
    let path = path.to_str().unwrap();
    let opts = |pairs: &[(&str, &str)]| WriteOptions {
        xattrs: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        in_place: true,
        clear_xattrs: Some("user.e2b.".into()),
        ..WriteOptions::default()
    };
    c.write_file(
        path,
        Bytes::from_static(b"a longer first content"),
        opts(&[("user.e2b.a", "1"), ("user.e2b.b", "2"), ("user.keep", "k")]),
    )
    .await
    .unwrap();
    let ino = std::fs::metadata(path).unwrap().ino();
    let s = c
        .write_file(
            path,
            Bytes::from_static(b"short"),
            opts(&[("user.e2b.a", "3")]),
        )
        .await
        .unwrap();
    // The same file, truncated and written; of the cleared prefix only what this write set.
    assert_eq!(std::fs::metadata(path).unwrap().ino(), ino);
    assert_eq!(std::fs::read(path).unwrap(), b"short");
    assert_eq!(s.xattrs.get("user.e2b.a").map(String::as_str), Some("3"));
    assert!(!s.xattrs.contains_key("user.e2b.b"), "{:?}", s.xattrs);
    assert_eq!(s.xattrs.get("user.keep").map(String::as_str), Some("k"));
    // A write to a temporary file and a rename makes a new inode, and keeps the others.
    let s = c
        .write_file(
            path,
            Bytes::from_static(b"renamed"),
            WriteOptions {
                clear_xattrs: Some("user.e2b.".into()),
                ..WriteOptions::default()
            },
        )
        .await
        .unwrap();
    assert_ne!(std::fs::metadata(path).unwrap().ino(), ino);
    assert!(!s.xattrs.contains_key("user.e2b.a"), "{:?}", s.xattrs);
    assert_eq!(s.xattrs.get("user.keep").map(String::as_str), Some("k"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_operations() {
    let d = Daemon::start();
    let c = d.client().await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();

    let deep = format!("{root}/a/b/c");
    let st = c.mkdir(&deep, true).await.unwrap();
    assert_eq!(st.file_type, FileType::Dir);
    // mkdir -p of an existing directory succeeds; plain mkdir does not.
    c.mkdir(&deep, true).await.unwrap();
    let (kind, msg) = guest_kind(c.mkdir(&deep, false).await);
    assert_eq!(kind, ErrorKind::AlreadyExists);
    // A path that names a directory by its form is one to write to, like an existing one.
    for path in ["/", "/.", &format!("{root}/a/..")] {
        let write = c
            .write_file(path, b"x".to_vec(), WriteOptions::default())
            .await;
        let (kind, msg) = guest_kind(write);
        assert_eq!(kind, ErrorKind::IsADirectory, "{path}: {msg}");
    }
    assert!(msg.contains(&deep));

    let file = format!("{root}/a/b/c/f.txt");
    c.write_file(&file, "hello world", WriteOptions::default())
        .await
        .unwrap();
    let st = c.stat(&file).await.unwrap();
    assert_eq!(
        (st.file_type, st.size, st.mode),
        (FileType::File, 11, 0o644)
    );
    assert!(st.mtime_unix_ns > 0);
    let st = c.chmod(&file, 0o751).await.unwrap();
    assert_eq!(st.mode, 0o751);

    std::os::unix::fs::symlink("f.txt", format!("{root}/a/b/c/link")).unwrap();
    let entries = c.list(&format!("{root}/a/b/c")).await.unwrap();
    let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, vec!["f.txt", "link"]);
    assert_eq!(entries[1].stat.file_type, FileType::Symlink);
    assert_eq!(entries[1].stat.symlink_target.as_deref(), Some("f.txt"));

    let moved = format!("{root}/a/g.txt");
    let st = c.rename(&file, &moved).await.unwrap();
    assert_eq!(st.size, 11);
    assert_eq!(
        &c.read_file_bytes(&moved).await.unwrap()[..],
        b"hello world"
    );
    let (kind, _) = guest_kind(c.stat(&file).await);
    assert_eq!(kind, ErrorKind::NotFound);

    let (kind, msg) = guest_kind(c.remove(&format!("{root}/a"), false).await);
    assert_eq!(kind, ErrorKind::NotEmpty);
    assert!(msg.contains(&format!("{root}/a")));
    c.remove(&moved, false).await.unwrap();
    c.remove(&format!("{root}/a"), true).await.unwrap();
    assert!(c.list(&root).await.unwrap().is_empty());

    // Reading a directory, listing a file, bad paths.
    let (kind, _) = guest_kind(c.read_file_bytes(&root).await);
    assert_eq!(kind, ErrorKind::IsADirectory);
    // Only regular files are read: a FIFO without a writer (whose open would block), a
    // device that streams without end, and one that fails mid-read are refused up front.
    let fifo = format!("{root}/fifo");
    nix::unistd::mkfifo(
        fifo.as_str(),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    for special in [fifo.as_str(), "/dev/zero", "/dev/null"] {
        let (kind, msg) = guest_kind(c.read_file_bytes(special).await);
        assert_eq!(kind, ErrorKind::Unsupported, "{special}: {msg}");
        assert!(msg.contains("not a regular file"), "{msg}");
    }
    std::fs::remove_file(&fifo).unwrap();
    c.write_file(&format!("{root}/plain"), "x", WriteOptions::default())
        .await
        .unwrap();
    let (kind, _) = guest_kind(c.list(&format!("{root}/plain")).await);
    assert_eq!(kind, ErrorKind::NotADirectory);
    let r = c.stat("relative/path").await;
    assert_eq!(r.unwrap_err().kind(), Some(ErrorKind::InvalidArgument));
    // Paths with characters that need escaping survive the query string.
    let odd = format!("{root}/sp ace&x=1%?#ü");
    c.write_file(&odd, "odd", WriteOptions::default())
        .await
        .unwrap();
    assert_eq!(&c.read_file_bytes(&odd).await.unwrap()[..], b"odd");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sees_a_file_created_by_exec() {
    let d = Daemon::start();
    let c = d.client().await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let mut w = c.watch(&root, true).await.unwrap();
    let out = c
        .run(ExecSpec::shell(format!(
            "echo hi > {root}/created.txt && mkdir {root}/sub/new && touch {root}/sub/new/deep"
        )))
        .await
        .unwrap();
    assert!(out.status.success());
    let want = [
        format!("{root}/created.txt"),
        format!("{root}/sub/new"),
        format!("{root}/sub/new/deep"),
    ];
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !want.iter().all(|p| seen.contains(p)) {
        let ev = tokio::time::timeout_at(deadline.into(), w.next())
            .await
            .expect("watch events did not arrive")
            .unwrap()
            .unwrap();
        if ev.kind == WatchEventKind::Created {
            seen.push(ev.path);
        }
    }
    drop(w);
    // Watching a file is refused.
    let (kind, _) = guest_kind(
        c.watch(&format!("{root}/created.txt"), false)
            .await
            .map(|_| ()),
    );
    assert_eq!(kind, ErrorKind::NotADirectory);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_watchers_keep_events_for_any_connection() {
    let d = Daemon::start();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().to_str().unwrap().to_owned();
    let c = d.client().await;
    let id = c.create_watcher(&p, true).await.unwrap();
    c.run(ExecSpec::shell(format!(
        "mkdir {p}/sub && echo x > {p}/sub/f"
    )))
    .await
    .unwrap();
    // Taken from another connection, after the fact.
    let other = d.client().await;
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !seen.iter().any(|e: &space_proto::WatchEvent| {
        e.path.ends_with("/sub/f") && e.kind == WatchEventKind::Created
    }) {
        assert!(Instant::now() < deadline, "events: {seen:?}");
        seen.extend(other.watcher_events(&id).await.unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Taken once: the next call starts empty.
    assert!(other.watcher_events(&id).await.unwrap().is_empty());
    other.remove_watcher(&id).await.unwrap();
    assert_eq!(
        guest_kind(other.watcher_events(&id).await).0,
        ErrorKind::NotFound
    );
    assert_eq!(
        guest_kind(c.create_watcher("/no/such/dir", false).await).0,
        ErrorKind::NotFound
    );
}
