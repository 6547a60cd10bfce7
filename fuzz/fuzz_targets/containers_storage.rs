//! containers/storage's metadata (`overlay-images/images.json`, `overlay-layers/layers.json`), as the image
//! driver reads it from the runtime's store: any content gives layers or an error, never a panic or a
//! loop, and every layer dir it hands to a mount lies inside the store.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use inlet_image::ContainersStorage;
use inlet_image::store::{ImageStore, Mountable};
use libfuzzer_sys::fuzz_target;

fn root() -> &'static PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("inlet-fuzz-cs-{}", std::process::id()));
        std::fs::create_dir_all(root.join("overlay-images")).unwrap();
        std::fs::create_dir_all(root.join("overlay-layers")).unwrap();
        std::fs::create_dir_all(root.join("state")).unwrap();
        root
    })
}

// The input is `images.json`, NUL, `layers.json`, NUL, the image id: easy to seed with real metadata.
fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |b| *b == 0);
    let (images, layers) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let image_id = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let image_id = image_id.as_ref();
    let root = root();
    std::fs::write(root.join("overlay-images/images.json"), images).unwrap();
    std::fs::write(root.join("overlay-layers/layers.json"), layers).unwrap();
    let store = ContainersStorage::new(root, &root.join("state"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    if let Ok(mountable) = runtime.block_on(store.view(image_id, "key")) {
        let dirs = match mountable {
            Mountable::Bind(dir) => vec![dir],
            Mountable::Overlay(overlay) => overlay.lower,
        };
        for dir in dirs {
            let inside = dir
                .components()
                .all(|c| c != std::path::Component::ParentDir)
                && dir.starts_with(root.join("overlay"));
            assert!(
                inside,
                "{image_id:?}: a layer dir outside the store: {dir:?}"
            );
        }
    }
});
