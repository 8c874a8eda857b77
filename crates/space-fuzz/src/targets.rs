//! One function per target; see the crate docs for what each must hold.

use std::collections::BTreeMap;

use space_archive::crypto::{Key, LineageKeys};
use space_archive::Manifest as ArchiveManifest;
use space_gateway::{hello, http1};
use space_guestd::transport::{FrameTracker, Scan};
use space_image::dockerfile::{self, ignore::Ignore};
use space_image::spec;
use space_proto::frame::FrameDecoder;
use space_proto::sync::SyncScanner;

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

/// The synchronisation line of the egress port, as the guest looks for its own line and the
/// host for any: what comes after it, or the refusal, must not depend on the reads.
pub fn egress_sync_line(data: &[u8]) {
    let (seed, stream) = seed_and_stream(data);
    let line = space_proto::sync::sync_line(&[0xab; 16]);
    type Found = Result<Option<(Vec<u8>, Vec<u8>)>, String>;
    let run = |make: &dyn Fn() -> SyncScanner, parts: &[&[u8]]| -> Found {
        let mut s = make();
        for (i, part) in parts.iter().enumerate() {
            match s.push(part) {
                Ok(Some((found, rest))) => {
                    let mut rest = rest.to_vec();
                    for later in &parts[i + 1..] {
                        rest.extend_from_slice(later);
                    }
                    return Ok(Some((found, rest)));
                }
                Ok(None) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(None)
    };
    let exact = || SyncScanner::exact(line.clone());
    let scanners: [&dyn Fn() -> SyncScanner; 2] = [&exact, &SyncScanner::any_token];
    let parts = pieces(stream, &cuts(seed, stream.len()));
    for make in scanners {
        let whole = run(make, &[stream]);
        let cut = run(make, &parts);
        assert_eq!(whole, cut, "the sync line depends on the reads");
        if let Ok(Some((found, _))) = &whole {
            assert_eq!(found.len(), space_proto::sync::SYNC_LINE_LEN);
        }
    }
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

/// QEMU's QMP stream (QEMU runs guest-controlled emulation): the greeting, then replies and
/// events, split into bounded lines; the lines, and where the stream is refused, must not
/// depend on the reads, and a reply parses into what the host asks for.
pub fn qmp_stream(data: &[u8]) {
    use space_runtime::qmp::{self, LineSplitter, Message, MAX_LINE};
    let (seed, stream) = seed_and_stream(data);
    let split = |parts: &[&[u8]]| {
        let mut s = LineSplitter::new();
        let mut lines = Vec::new();
        for part in parts {
            s.push(part);
            loop {
                match s.next_line() {
                    Ok(Some(line)) => {
                        assert!(line.len() <= MAX_LINE, "a line past the bound");
                        lines.push(line);
                    }
                    Ok(None) => break,
                    Err(e) => return (lines, Some(e.to_string())),
                }
            }
            assert!(s.pending() <= MAX_LINE + part.len());
        }
        (lines, None)
    };
    let whole = split(&[stream]);
    let cut = split(&pieces(stream, &cuts(seed, stream.len())));
    assert_eq!(whole, cut, "QMP lines depend on the reads");
    let mut lines = whole.0.iter();
    if let Some(greeting) = lines.next() {
        if let Ok(v) = qmp::parse_greeting(greeting) {
            let _ = v.to_string();
        }
    }
    for line in lines {
        if let Ok(Message::Reply {
            result: Ok(value), ..
        }) = qmp::parse_message(line)
        {
            let _ = serde_json::from_value::<qmp::Status>(value.clone());
            let _ = serde_json::from_value::<qmp::MigrationInfo>(value);
        }
    }
}

/// A full snapshot's manifest (`manifest.json`, also carried through the object store): a
/// parsed manifest writes back to the same manifest.
pub fn snapshot_manifest(data: &[u8]) {
    use space_runtime::manifest::Manifest;
    let Ok(m) = Manifest::parse(data) else {
        return;
    };
    let _ = m.memory_bytes();
    let json = serde_json::to_vec(&m).expect("a manifest serializes");
    let back = Manifest::parse(&json).expect("a written manifest parses");
    assert_eq!(back, m);
}

/// Every JSON answer the host reads from space-guestd (the first byte picks the type): what
/// parses writes back to the same value, and an error answer maps to an error kind.
pub fn guest_json(data: &[u8]) {
    use space_proto::types as t;
    use space_proto::ProtoError;
    fn round<T>(bytes: &[u8])
    where
        T: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug,
    {
        let Ok(v) = serde_json::from_slice::<T>(bytes) else {
            return;
        };
        let json = serde_json::to_vec(&v).expect("a parsed answer serializes");
        let back: T = serde_json::from_slice(&json).expect("a written answer parses");
        assert_eq!(back, v);
    }
    let (pick, body) = seed_and_stream(data);
    match pick % 13 {
        0 => round::<t::Health>(body),
        1 => round::<t::Started>(body),
        2 => round::<t::ExitStatus>(body),
        3 => round::<t::ProcessInfo>(body),
        4 => round::<t::ProcessList>(body),
        5 => round::<t::WatcherCreated>(body),
        6 => round::<t::WatcherEvents>(body),
        7 => round::<t::FileStat>(body),
        8 => round::<t::DirListing>(body),
        9 => round::<t::WatchEvent>(body),
        10 => round::<t::GrowFsResult>(body),
        11 => round::<t::IdentityApplied>(body),
        _ => {
            round::<ProtoError>(body);
            if let Ok(e) = serde_json::from_slice::<ProtoError>(body) {
                let _ = e.to_string();
            }
        }
    }
    let status = u16::from_be_bytes([pick, body.first().copied().unwrap_or(0)]);
    let _ = space_proto::ErrorKind::from_http_status(status);
}

/// The Connect framing of the E2B facade's client streams (`[flags][len BE][message]`): the
/// envelopes, and where the stream is refused, must not depend on how the body was cut into
/// frames, and the buffer never holds more than one message and one frame.
pub fn connect_envelopes(data: &[u8]) {
    use space_control::e2b::connect::{self, Envelope, Envelopes, MAX_MESSAGE};
    let (seed, stream) = seed_and_stream(data);
    let split = |parts: &[&[u8]]| {
        let mut e = Envelopes::new();
        let mut out = Vec::new();
        for part in parts {
            e.push(part);
            loop {
                match e.next_envelope() {
                    Ok(Some(env)) => {
                        if let Envelope::Message(m) = &env {
                            assert!(m.len() <= MAX_MESSAGE);
                        }
                        let end = env == Envelope::End;
                        out.push(env);
                        if end {
                            return (out, None);
                        }
                    }
                    Ok(None) => break,
                    Err(err) => return (out, Some(err.code)),
                }
            }
            assert!(e.buffered() <= MAX_MESSAGE + 5 + part.len());
        }
        let end = e.finish().err().map(|err| err.code);
        (out, end)
    };
    let whole = split(&[stream]);
    let cut = split(&pieces(stream, &cuts(seed, stream.len())));
    assert_eq!(whole, cut, "envelopes depend on the reads");
    for env in &whole.0 {
        if let Envelope::Message(m) = env {
            let _ = connect::parse_message::<serde_json::Value>(m);
        }
    }
}
