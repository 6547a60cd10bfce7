//! Sizes (`volumeAttributes.size`, `--capacity`): any text parses to bytes or to an error, never a panic,
//! and a value it accepts prints back to one it accepts again.
#![no_main]

use inlet_host::quantity::{format_bytes, parse_bytes};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(bytes) = parse_bytes(text) {
        assert_eq!(parse_bytes(&format_bytes(bytes)), Ok(bytes), "{text:?}");
    }
});
