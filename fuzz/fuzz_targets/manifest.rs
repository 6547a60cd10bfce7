//! Manifests: any bytes as YAML give manifests or an error naming the document, never a panic or a hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let _ = kubelet_sim::api::manifest::parse(text, "fuzz.yaml");
});
