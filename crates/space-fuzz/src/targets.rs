//! One function per target; see the crate docs for what each must hold.

use std::collections::BTreeMap;

use space_archive::crypto::{Key, LineageKeys};
use space_archive::Manifest as ArchiveManifest;
use space_guestd::egress::LineScanner;
use space_guestd::transport::{FrameTracker, Scan};
use space_image::dockerfile::{self, ignore::Ignore};
use space_image::spec;
use space_node::gateway::{hello, http1};
use space_proto::frame::FrameDecoder;

use crate::{cuts, pieces};

/// Splits off the first byte (it picks the cuts) from the stream the parser reads.
fn seed_and_stream(data: &[u8]) -> (u8, &[u8]) {
    match data.split_first() {
        Some((s, rest)) => (*s, rest),
        None => (0, data),
    }
}

/// The guest's record framing (exec output, stdin, file bodies): a small payload bound so
/// that the bound is reached; the records and the error must not depend on the reads.
pub fn guest_frames(data: &[u8]) {
    let (seed, stream) = seed_and_stream(data);
    let decode = |parts: &[&[u8]]| {
        let mut d = FrameDecoder::with_max_payload(64 + seed as usize);
        let mut out = Vec::new();
        for part in parts {
            d.push(part);
            loop {
                match d.next_frame() {
                    Ok(Some(f)) => {
                        assert!(
                            f.payload.len() <= 64 + seed as usize,
                            "payload past the bound"
                        );
                        out.push((f.kind, f.payload));
                    }
                    Ok(None) => break,
                    Err(e) => return (out, Some(e.to_string())),
                }
            }
            assert!(d.buffered() <= stream.len());
        }
        let end = d.finish().err().map(|e| e.to_string());
        (out, end)
    };
    let whole = decode(&[stream]);
    let cut = decode(&pieces(stream, &cuts(seed, stream.len())));
    // A cut stream may report a truncation where the whole one ends cleanly, never other
    // records or another fault.
    assert_eq!(whole.0, cut.0, "records depend on the reads");
    match (&whole.1, &cut.1) {
        (None, None) => {}
        (Some(a), Some(b)) => assert_eq!(a, b),
        (a, b) => panic!("whole {a:?}, cut {b:?}"),
    }
}

/// The daemon's HTTP/2 frame tracker on the control port (it spots a new host's preface
/// inside an old connection's bytes).
pub fn h2_frame_tracker(data: &[u8]) {
    let (seed, stream) = seed_and_stream(data);
    let mut t = FrameTracker::new();
    for part in pieces(stream, &cuts(seed, stream.len())) {
        match t.scan(part) {
            Scan::Clean => {}
            Scan::NewClient { deliver, rest } => {
                assert!(
                    deliver <= part.len() && rest <= part.len(),
                    "{deliver} {rest}"
                );
                t = FrameTracker::new();
            }
        }
    }
    let _ = (t.mid_frame(), t.started());
}

/// The line the guest waits for on the egress port before it trusts the channel: what comes
/// after it, or the refusal, must not depend on the reads.
pub fn egress_sync_line(data: &[u8]) {
    let (seed, stream) = seed_and_stream(data);
    let line = space_guestd::egress::handshake_line(&[0xab; 16]);
    let run = |parts: &[&[u8]]| -> Result<Option<Vec<u8>>, String> {
        let mut s = LineScanner::new(line.clone());
        for (i, part) in parts.iter().enumerate() {
            match s.push(part) {
                Ok(Some(rest)) => {
                    let mut rest = rest.to_vec();
                    for later in &parts[i + 1..] {
                        rest.extend_from_slice(later);
                    }
                    return Ok(Some(rest));
                }
                Ok(None) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(None)
    };
    let whole = run(&[stream]);
    let cut = run(&pieces(stream, &cuts(seed, stream.len())));
    assert_eq!(whole, cut, "the sync line depends on the reads");
}

/// The gateway's look at a TLS ClientHello (for the server name).
pub fn tls_client_hello(data: &[u8]) {
    if let hello::Hello::Complete { sni: Some(sni) } = hello::parse(data) {
        assert!(sni.is_ascii(), "{sni:?}");
    }
}

/// The gateway's HTTP/1 request-head parser: a parsed head is the same with more bytes after
/// it, and the same parsed from exactly its own bytes.
pub fn http1_head(data: &[u8]) {
    let Ok(Some(head)) = http1::parse_head(data) else {
        return;
    };
    assert!(head.len <= data.len());
    let alone = http1::parse_head(&data[..head.len]);
    assert_eq!(alone, Ok(Some(head.clone())));
    let mut more = data.to_vec();
    more.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
    assert_eq!(http1::parse_head(&more), Ok(Some(head.clone())));
    let _ = head.body_len();
    let _ = http1::absolute_target(&head.target);
}

/// Dockerfiles of template builds, with and without build arguments.
pub fn dockerfile(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = dockerfile::parse(text, &BTreeMap::new());
    let args = BTreeMap::from([
        ("A".to_owned(), "x".to_owned()),
        ("BASE".to_owned(), "minimal".to_owned()),
    ]);
    let _ = dockerfile::parse(text, &args);
    let _ = dockerfile::expand(text, &args, 1);
}

/// `.dockerignore` patterns, matched against paths taken from the same input.
pub fn dockerignore(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (patterns, paths) = text.split_once('\0').unwrap_or((&text, "a/b/c.txt"));
    let ignore = Ignore::parse(patterns);
    for path in paths.split('\n').take(64) {
        let _ = ignore.is_ignored(path);
    }
}

/// OCI image indexes, manifests and configs as a registry or an archive sends them.
pub fn oci_documents(data: &[u8]) {
    if let Ok(index) = spec::parse::<spec::Index>(data, "index") {
        let _ = spec::pick_amd64(&index);
    }
    let _ = spec::parse::<spec::Manifest>(data, "manifest");
    let _ = spec::parse::<spec::ImageConfig>(data, "config");
}

fn lineage_keys() -> LineageKeys {
    let key = Key::from_slice(&[7u8; 32]).expect("32 bytes are a key");
    LineageKeys::derive("lineage-fuzz", &key)
}

/// Snapshot manifests of the object store: the bytes as an object (outer framing and seal),
/// and as the plaintext of a correctly sealed object (what follows the seal: zstd, JSON and
/// every structural check).
pub fn archive_manifest(data: &[u8]) {
    let keys = lineage_keys();
    let _ = ArchiveManifest::decode(data, None, &keys, "sbx-0000000000000001", "snap-1");
    let z = zstd::bulk::compress(data, 1).expect("zstd of an in-memory buffer");
    let mut object = b"SPACEMF1".to_vec();
    object.extend_from_slice(&keys.seal_manifest("sbx-0000000000000001", "snap-1", &z));
    if let Ok(m) = ArchiveManifest::decode(&object, None, &keys, "sbx-0000000000000001", "snap-1") {
        let _ = m.stored_bytes();
        let _ = m.validate();
    }
}

/// Chunks of the object store: the stored encoding (raw or zstd) inside a correct seal, with
/// the length the manifest claims taken from the input.
pub fn archive_chunk(data: &[u8]) {
    let (seed, stored) = seed_and_stream(data);
    let keys = lineage_keys();
    let id = keys.chunk_id(b"chunk");
    let sealed = keys.seal_chunk(&id, stored);
    let len = seed as usize * 64;
    if let Ok(plain) = space_archive::pack::decode_stored(&keys, &id, len, &sealed) {
        assert_eq!(plain.len(), len);
    }
}
