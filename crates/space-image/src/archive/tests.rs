use std::io::Write;

use super::*;

fn layer(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_600_000_000);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, path, *data).unwrap();
    }
    b.into_inner().unwrap()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(data).unwrap();
    gz.finish().unwrap()
}

/// A tar file of `members`.
fn archive(dir: &Path, members: &[(String, Vec<u8>)]) -> PathBuf {
    let path = dir.join("image.tar");
    let mut b = tar::Builder::new(File::create(&path).unwrap());
    for (name, data) in members {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, name, &data[..]).unwrap();
    }
    b.into_inner().unwrap().flush().unwrap();
    path
}

const CONFIG: &str = r#"{"architecture":"amd64","os":"linux","config":{"Env":["A=1"],"WorkingDir":"/w","Cmd":["sh"]},"rootfs":{"type":"layers","diff_ids":[DIFFS]}}"#;

fn config(diff_ids: &[&[u8]]) -> Vec<u8> {
    let ids: Vec<String> = diff_ids
        .iter()
        .map(|l| format!("\"{}\"", Digest::of(l)))
        .collect();
    CONFIG.replace("DIFFS", &ids.join(",")).into_bytes()
}

fn oci_members(layers: &[Vec<u8>]) -> Vec<(String, Vec<u8>)> {
    let stored: Vec<Vec<u8>> = layers.iter().map(|l| gzip(l)).collect();
    let raw: Vec<&[u8]> = layers.iter().map(Vec::as_slice).collect();
    let cfg = config(&raw);
    let desc = |media: &str, data: &[u8]| {
        format!(
            r#"{{"mediaType":"{media}","digest":"{}","size":{}}}"#,
            Digest::of(data),
            data.len()
        )
    };
    let layer_descs: Vec<String> = stored
        .iter()
        .map(|s| desc("application/vnd.oci.image.layer.v1.tar+gzip", s))
        .collect();
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"{}","config":{},"layers":[{}]}}"#,
        spec::MEDIA_OCI_MANIFEST,
        desc(spec::MEDIA_OCI_CONFIG, &cfg),
        layer_descs.join(",")
    )
    .into_bytes();
    let index = format!(
        r#"{{"schemaVersion":2,"manifests":[{}]}}"#,
        desc(spec::MEDIA_OCI_MANIFEST, &manifest)
    )
    .into_bytes();
    let blob = |d: &[u8]| (format!("blobs/sha256/{}", Digest::of(d).hex()), d.to_vec());
    let mut m = vec![
        (
            "oci-layout".to_owned(),
            br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
        ),
        ("index.json".to_owned(), index),
        blob(&manifest),
        blob(&cfg),
    ];
    m.extend(stored.iter().map(|s| blob(s)));
    m
}

#[test]
fn an_oci_archive_is_read_checked_and_applied() {
    let dir = tempfile::tempdir().unwrap();
    let layers = vec![
        layer(&[("etc/one", b"1"), ("etc/gone", b"g")]),
        layer(&[("etc/.wh.gone", b""), ("etc/two", b"2")]),
    ];
    let path = archive(dir.path(), &oci_members(&layers));
    let image = ArchiveImage::open(&path, None).unwrap();
    assert_eq!(image.layer_count(), 2);
    assert_eq!(image.config.config.working_dir, "/w");
    assert_eq!(image.config.env(), [("A".into(), "1".into())]);
    let root = tempfile::tempdir().unwrap();
    let mut budget = Budget {
        bytes: 1 << 20,
        entries: 100,
    };
    let stats = image.apply(root.path(), &mut budget).unwrap();
    assert_eq!(stats.len(), 2);
    assert_eq!(stats[1].whiteouts, 1);
    assert_eq!(std::fs::read(root.path().join("etc/two")).unwrap(), b"2");
    assert!(!root.path().join("etc/gone").exists());
}

#[test]
fn a_docker_archive_is_checked_by_diff_ids() {
    let dir = tempfile::tempdir().unwrap();
    let l1 = layer(&[("hello", b"docker")]);
    let cfg = config(&[&l1]);
    let cfg_name = format!("{}.json", Digest::of(&cfg).hex());
    let manifest = format!(
        r#"[{{"Config":"{cfg_name}","RepoTags":["local/test:1"],"Layers":["abc/layer.tar"]}}]"#
    );
    let path = archive(
        dir.path(),
        &[
            ("manifest.json".into(), manifest.clone().into_bytes()),
            (cfg_name.clone(), cfg.clone()),
            ("abc/layer.tar".into(), l1.clone()),
        ],
    );
    let image = ArchiveImage::open(&path, Some("local/test:1")).unwrap();
    let root = tempfile::tempdir().unwrap();
    let mut budget = Budget {
        bytes: 1 << 20,
        entries: 100,
    };
    image.apply(root.path(), &mut budget).unwrap();
    assert_eq!(std::fs::read(root.path().join("hello")).unwrap(), b"docker");
    assert!(ArchiveImage::open(&path, Some("local/other:2"))
        .unwrap_err()
        .to_string()
        .contains("no image tagged"));

    // A layer that is not what the config says fails when applied.
    let other = layer(&[("hello", b"tampered")]);
    let path = archive(
        dir.path(),
        &[
            ("manifest.json".into(), manifest.into_bytes()),
            (cfg_name, cfg),
            ("abc/layer.tar".into(), other),
        ],
    );
    let image = ArchiveImage::open(&path, None).unwrap();
    let e = image
        .apply(tempfile::tempdir().unwrap().path(), &mut budget)
        .unwrap_err();
    assert!(e.to_string().contains("does not match its diff id"), "{e}");
}

#[test]
fn broken_archives_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let layers = vec![layer(&[("a", &[5u8; 20_000])])];
    let members = oci_members(&layers);
    let path = archive(dir.path(), &members);
    // Cut short: the last member (the layer) ends past the end of the file.
    let full = std::fs::read(&path).unwrap();
    let cut = dir.path().join("cut.tar");
    std::fs::write(&cut, &full[..full.len() - 1300]).unwrap();
    let e = ArchiveImage::open(&cut, None).unwrap_err().to_string();
    assert!(e.contains("cut short"), "{e}");
    // A blob whose bytes are not its digest's.
    let mut bad = members.clone();
    let last = bad.len() - 1;
    let n = bad[last].1.len();
    bad[last].1[n / 2] ^= 0xff;
    let path = archive(dir.path(), &bad);
    let image = ArchiveImage::open(&path, None).unwrap();
    let e = image
        .apply(
            tempfile::tempdir().unwrap().path(),
            &mut Budget {
                bytes: 1 << 20,
                entries: 100,
            },
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not match") || e.contains("layer"), "{e}");
    // A member the manifest names but the archive lacks.
    let missing: Vec<_> = members[..members.len() - 1].to_vec();
    let path = archive(dir.path(), &missing);
    let e = ArchiveImage::open(&path, None).unwrap_err().to_string();
    assert!(e.contains("has no member"), "{e}");
    // Not an image at all.
    let path = archive(dir.path(), &[("hello.txt".into(), b"hi".to_vec())]);
    let e = ArchiveImage::open(&path, None).unwrap_err().to_string();
    assert!(e.contains("neither an OCI archive"), "{e}");
    std::fs::write(dir.path().join("junk.tar"), b"this is not tar").unwrap();
    assert!(ArchiveImage::open(&dir.path().join("junk.tar"), None).is_err());
}
