#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| podhost::fuzzing::canonical_hash(data));
