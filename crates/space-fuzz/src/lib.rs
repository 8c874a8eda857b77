//! The fuzz targets: one function per parser of hostile input, each taking arbitrary bytes.
//!
//! A target must never panic, whatever the bytes; where a parser reads a stream, the target
//! also checks that the result does not depend on how the stream was cut into reads (the
//! first input byte picks the cuts). `fuzz/` wraps each target for libFuzzer (`make fuzz`);
//! `tests/corpus.rs` replays the checked-in corpora under `fuzz/corpus/<target>/` and a
//! deterministic batch of mutations of them on every `make test`.

pub mod targets;

/// A fuzz target: takes any bytes, panics only on a defect.
pub type Target = fn(&[u8]);

/// Every target by name; the names are the directories of `fuzz/corpus/` and the binaries of
/// `fuzz/fuzz_targets/`.
pub const TARGETS: &[(&str, Target)] = &[
    ("guest_frames", targets::guest_frames),
    ("h2_frame_tracker", targets::h2_frame_tracker),
    ("egress_sync_line", targets::egress_sync_line),
    ("tls_client_hello", targets::tls_client_hello),
    ("http1_head", targets::http1_head),
    ("dockerfile", targets::dockerfile),
    ("dockerignore", targets::dockerignore),
    ("oci_documents", targets::oci_documents),
    ("archive_manifest", targets::archive_manifest),
    ("archive_chunk", targets::archive_chunk),
    ("qmp_stream", targets::qmp_stream),
    ("snapshot_manifest", targets::snapshot_manifest),
    ("guest_json", targets::guest_json),
    ("connect_envelopes", targets::connect_envelopes),
];

/// Cut points for a stream of `len` bytes, chosen by `seed`: strictly increasing, inside
/// `1..len`.
pub fn cuts(seed: u8, len: usize) -> Vec<usize> {
    if len < 2 {
        return Vec::new();
    }
    let step = 1 + seed as usize % 17;
    (step..len).step_by(step).collect()
}

/// `data` cut at `cuts` into consecutive pieces.
pub fn pieces<'a>(data: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut out = Vec::with_capacity(cuts.len() + 1);
    let mut at = 0;
    for &c in cuts {
        out.push(&data[at..c]);
        at = c;
    }
    out.push(&data[at..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_input_in_order() {
        let data: Vec<u8> = (0..100).collect();
        for seed in 0..=255u8 {
            let c = cuts(seed, data.len());
            assert!(c.windows(2).all(|w| w[0] < w[1]));
            assert_eq!(pieces(&data, &c).concat(), data);
        }
        assert!(cuts(3, 1).is_empty());
    }
}
