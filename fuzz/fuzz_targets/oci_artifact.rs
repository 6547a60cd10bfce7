//! OCI artifact manifests as a registry sends them: any bytes give a fetch plan or an error, never a
//! panic, and a plan names only sha256 blobs and relative paths inside the volume.
#![no_main]

use std::path::Component;

use inlet_image::artifact::plan;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|raw: &[u8]| {
    if let Ok((_, files)) = plan(raw, "fuzz") {
        for (blob, path) in files {
            assert!(
                blob.len() == 64 && blob.bytes().all(|b| b.is_ascii_hexdigit()),
                "{blob:?}"
            );
            assert!(
                path.components().all(|c| matches!(c, Component::Normal(_))),
                "{path:?}"
            );
        }
    }
});
