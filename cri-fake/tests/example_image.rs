//! The example image the README's main command mounts (`deploy/images/site`, an OCI layout) is built by
//! [`ImageBuilder`], deterministically; this test fails when the committed layout differs from what the
//! builder makes. Regenerate it with `INLET_WRITE_EXAMPLE_IMAGES=1 cargo test -p cri-fake --test example_image`.

use std::path::{Path, PathBuf};

use cri_fake::layout::ImageBuilder;

fn site() -> ImageBuilder {
    ImageBuilder::new()
        .file(
            "index.html",
            "<!doctype html>\n<title>inlet</title>\n<h1>Served from an image volume</h1>\n",
        )
        .file(
            "data/motd.txt",
            "This file came from the image's first layer.\n",
        )
        .layer()
        .file("data/version.txt", "v1\n")
        .annotation("org.opencontainers.image.title", "inlet example site")
        .annotation(
            "org.opencontainers.image.source",
            "cri-fake/tests/example_image.rs",
        )
}

fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut found: Vec<_> = walk(dir)
        .into_iter()
        .map(|p| {
            (
                p.strip_prefix(dir).unwrap().to_path_buf(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    found.sort();
    found
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[test]
fn the_committed_example_image_is_what_the_builder_makes() {
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/images/site");
    if std::env::var_os("INLET_WRITE_EXAMPLE_IMAGES").is_some() {
        let _ = std::fs::remove_dir_all(&committed);
        site().write_layout(&committed, "v1").unwrap();
    }
    let fresh = tempfile::tempdir().unwrap();
    site().write_layout(fresh.path(), "v1").unwrap();
    assert_eq!(
        files(&committed),
        files(fresh.path()),
        "deploy/images/site is stale; regenerate it (see this file's doc)"
    );
}
