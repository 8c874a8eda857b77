//! Replays every checked-in corpus file of every target, then a deterministic batch of
//! mutations of them (bit flips, byte changes, insertions, deletions, duplicated runs and
//! splices of two files), so `make test` exercises each parser with more than its seeds.
//! `make fuzz` runs the coverage-guided fuzzer on the same targets and corpora.

use std::path::PathBuf;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use space_fuzz::TARGETS;

/// Mutations per target (spread over its corpus files).
const MUTATIONS: usize = 4000;

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir(target);
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

/// One to four random edits of `a` (some splice in bytes of `b`); the seeded generator
/// makes the same mutations on every run.
fn mutate(rng: &mut StdRng, a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut out = a.to_vec();
    for _ in 0..1 + rng.gen_range(0..4) {
        let at = rng.gen_range(0..=out.len());
        match rng.gen_range(0..7) {
            0 if !out.is_empty() => {
                let i = at.min(out.len() - 1);
                out[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if !out.is_empty() => {
                let i = at.min(out.len() - 1);
                out[i] = [0, 0xff, 0x7f, 0x80, b'\n', b'\r', b'"', b'{'][rng.gen_range(0..8)];
            }
            2 => out.insert(at, rng.gen::<u8>()),
            3 if at < out.len() => {
                let end = (at + 1 + rng.gen_range(0..16)).min(out.len());
                out.drain(at..end);
            }
            4 if at < out.len() => {
                let end = (at + 1 + rng.gen_range(0..32)).min(out.len());
                let run = out[at..end].to_vec();
                let times = 1 + rng.gen_range(0..8);
                for _ in 0..times {
                    out.splice(at..at, run.iter().copied());
                }
            }
            5 => {
                let from = rng.gen_range(0..=b.len());
                let end = (from + rng.gen_range(0..64)).min(b.len());
                out.splice(at..at, b[from..end].iter().copied());
            }
            _ => out.truncate(at),
        }
    }
    out
}

#[test]
fn every_target_has_a_corpus() {
    let on_disk: Vec<String> = std::fs::read_dir(corpus_dir(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for (name, _) in TARGETS {
        assert!(on_disk.contains(&name.to_string()), "no corpus for {name}");
        assert!(!corpus(name).is_empty(), "the corpus of {name} is empty");
    }
    for dir in &on_disk {
        assert!(
            TARGETS.iter().any(|(n, _)| n == dir),
            "fuzz/corpus/{dir} belongs to no target"
        );
    }
    let wrappers = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/fuzz_targets");
    for (name, _) in TARGETS {
        let file = wrappers.join(format!("{name}.rs"));
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(
            text.contains(&format!("targets::{name}(")),
            "{} does not call its target",
            file.display()
        );
    }
}

#[test]
fn corpora_and_their_mutations_replay_cleanly() {
    for (name, target) in TARGETS {
        let files = corpus(name);
        for (file, data) in &files {
            let r = std::panic::catch_unwind(|| target(data));
            assert!(r.is_ok(), "{name}: corpus file {file} fails");
        }
        let mut rng = StdRng::seed_from_u64(0x9e37_79b9_7f4a_7c15 ^ name.len() as u64);
        for i in 0..MUTATIONS {
            let (_, a) = &files[i % files.len()];
            let (_, b) = &files[rng.gen_range(0..files.len())];
            let input = mutate(&mut rng, a, b);
            let r = std::panic::catch_unwind(|| target(&input));
            if r.is_err() {
                let path = std::env::temp_dir().join(format!("space-fuzz-{name}-{i}"));
                std::fs::write(&path, &input).unwrap();
                panic!(
                    "{name}: mutation {i} fails; its input is in {} (add it to fuzz/corpus/{name} \
                     once fixed)",
                    path.display()
                );
            }
        }
    }
}

/// The seeds reach past the first check of their parsers (a corpus of garbage alone would
/// leave the fuzzer to find the format by itself).
#[test]
fn the_seeds_are_what_their_parsers_accept() {
    use space_runtime::qmp::{self, LineSplitter, Message};
    let seed = |target: &str, name: &str| -> Vec<u8> {
        std::fs::read(corpus_dir(target).join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
    };

    let session = seed("qmp_stream", "session");
    let mut lines = LineSplitter::new();
    lines.push(&session[1..]);
    let greeting = lines.next_line().unwrap().unwrap();
    assert_eq!(qmp::parse_greeting(&greeting).unwrap().major, 10);
    let mut replies = 0;
    while let Some(line) = lines.next_line().unwrap() {
        match qmp::parse_message(&line).unwrap() {
            Message::Reply { .. } => replies += 1,
            Message::Event(e) => assert_eq!(e.name, "STOP"),
        }
    }
    assert_eq!(replies, 4);

    let m = space_runtime::manifest::Manifest::parse(&seed("snapshot_manifest", "tcg")).unwrap();
    assert_eq!(m.memory_bytes(), 512 << 20);
    assert!(
        space_runtime::manifest::Manifest::parse(&seed("snapshot_manifest", "wrong_format"))
            .is_err()
    );

    for (name, pick) in [
        ("health", 0u8),
        ("started", 1),
        ("exit", 2),
        ("stat", 7),
        ("listing", 8),
        ("error", 12),
        ("error_unknown", 12),
    ] {
        let bytes = seed("guest_json", name);
        assert_eq!(bytes[0] % 13, pick, "{name}");
        let parsed = match pick {
            0 => serde_json::from_slice::<space_proto::Health>(&bytes[1..]).map(drop),
            1 => serde_json::from_slice::<space_proto::Started>(&bytes[1..]).map(drop),
            2 => serde_json::from_slice::<space_proto::ExitStatus>(&bytes[1..]).map(drop),
            7 => serde_json::from_slice::<space_proto::FileStat>(&bytes[1..]).map(drop),
            8 => serde_json::from_slice::<space_proto::DirListing>(&bytes[1..]).map(drop),
            _ => serde_json::from_slice::<space_proto::ProtoError>(&bytes[1..]).map(drop),
        };
        parsed.unwrap_or_else(|e| panic!("guest_json/{name}: {e}"));
    }

    let stream = seed("connect_envelopes", "stream");
    let mut e = space_control::e2b::connect::Envelopes::new();
    e.push(&stream[1..]);
    let mut messages = 0;
    while let Some(env) = e.next_envelope().unwrap() {
        match env {
            space_control::e2b::connect::Envelope::Message(m) => {
                serde_json::from_slice::<serde_json::Value>(&m).unwrap();
                messages += 1;
            }
            space_control::e2b::connect::Envelope::End => break,
        }
    }
    assert_eq!(messages, 3);
    e.finish().unwrap();
}
