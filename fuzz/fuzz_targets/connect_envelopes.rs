#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| space_fuzz::targets::connect_envelopes(data));
