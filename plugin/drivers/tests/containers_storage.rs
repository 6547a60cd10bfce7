//! The containers/storage backend against storage that podman wrote (the library CRI-O uses): an image
//! with two layers and a deletion is pushed to a real registry, pulled by `podman --root DIR`, and mounted
//! by the image engine read-only (shared) and writable (copy-on-write).
//!
//! Needs `podman` and `docker-registry` (`.ci/run` installs them); mounts need root. Otherwise it says
//! SKIPPED for what it cannot check.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use cri_fake::layout::{ImageBuilder, push};
use cri_fake::registry::{LocalRegistry, installed};
use inlet_host::mount::{LinuxMounter, MountLayer, RecordingMounter, can_mount};
use inlet_image::store::Mountable;
use inlet_image::{ContainersStorage, ImageStore, ImageVolume, ImageVolumes};
use oci_client::secrets::RegistryAuth;

fn podman_pull(root: &Path, reference: &str) {
    let out = Command::new("podman")
        .arg("--root")
        .arg(root.join("storage"))
        .arg("--runroot")
        .arg(root.join("run"))
        .args([
            "--storage-driver",
            "overlay",
            "pull",
            "--quiet",
            "--tls-verify=false",
            reference,
        ])
        .output()
        .expect("podman runs");
    assert!(
        out.status.success(),
        "podman pull: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn mounts_images_that_podman_stored() {
    if !installed("podman") || !LocalRegistry::available() {
        eprintln!(
            "SKIPPED mounts_images_that_podman_stored: podman or docker-registry is not installed"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let registry = LocalRegistry::start(&dir.path().join("registry"), None).unwrap();
    let image = ImageBuilder::new()
        .file("data/kept.txt", "kept\n")
        .file("data/gone.txt", "gone\n")
        .layer()
        .file("data/new.txt", "new\n")
        .remove("data/gone.txt")
        .build()
        .unwrap();
    let reference = format!("{}/test/data:v1", registry.address);
    push(
        &image,
        &reference.parse().unwrap(),
        &RegistryAuth::Anonymous,
        std::slice::from_ref(&registry.address),
    )
    .await
    .unwrap();
    podman_pull(dir.path(), &reference);

    let storage = ContainersStorage::new(&dir.path().join("storage"), &dir.path().join("state"));
    // podman names the image by its reference; the store finds it by name or by id.
    let layers = match storage.view(&reference, "k").await.unwrap() {
        Mountable::Overlay(overlay) => overlay.lower,
        other => panic!("two layers make an overlay, not {other:?}"),
    };
    assert_eq!(layers.len(), 2, "{layers:?}");
    assert!(
        layers[0].join("data/new.txt").exists(),
        "the top layer comes first: {layers:?}"
    );
    let missing = storage.view("0123456789abcdef", "k").await.unwrap_err();
    assert!(missing.to_string().contains("not found"), "{missing}");

    if !can_mount() {
        eprintln!("SKIPPED (not root): mounting the podman-stored image");
        let recorded: Arc<dyn MountLayer> = Arc::new(RecordingMounter::new());
        let volumes =
            ImageVolumes::open(Arc::new(storage), recorded, &dir.path().join("state")).unwrap();
        assert_eq!(volumes.recover().await.unwrap(), 0);
        return;
    }
    let mounter: Arc<dyn MountLayer> = Arc::new(LinuxMounter);
    let volumes = ImageVolumes::open(
        Arc::new(storage),
        Arc::clone(&mounter),
        &dir.path().join("state"),
    )
    .unwrap();
    let target = |name: &str| dir.path().join("kubelet").join(name);
    let volume = |name: &str, writable: bool| ImageVolume {
        volume_id: name.into(),
        target: target(name),
        image: reference.clone(),
        image_id: reference.clone(),
        writable,
        metadata: false,
    };
    for v in [
        volume("ro-1", false),
        volume("ro-2", false),
        volume("rw", true),
    ] {
        volumes.publish(&v).await.unwrap();
    }
    let read = |name: &str, file: &str| std::fs::read_to_string(target(name).join(file)).ok();
    assert_eq!(read("ro-1", "data/kept.txt").as_deref(), Some("kept\n"));
    assert_eq!(read("ro-2", "data/new.txt").as_deref(), Some("new\n"));
    assert_eq!(
        read("ro-1", "data/gone.txt"),
        None,
        "the whiteout hides the file"
    );
    assert!(
        std::fs::write(target("ro-1").join("x"), "x").is_err(),
        "read-only"
    );
    std::fs::write(target("rw").join("data/kept.txt"), "changed\n").unwrap();
    assert_eq!(read("rw", "data/kept.txt").as_deref(), Some("changed\n"));
    assert_eq!(
        read("ro-2", "data/kept.txt").as_deref(),
        Some("kept\n"),
        "copy-on-write"
    );
    let key = volume("ro-1", false).key();
    assert_eq!(
        volumes.users(&key),
        2,
        "one shared mount for both read-only volumes"
    );

    for name in ["ro-1", "ro-2", "rw"] {
        volumes.unpublish(&target(name)).await.unwrap();
        assert!(!target(name).exists());
    }
    assert!(
        inlet_image::leftovers(&dir.path().join("state")).is_empty(),
        "{:?}",
        inlet_image::leftovers(&dir.path().join("state"))
    );
    // podman's storage is untouched: its own image is still whole.
    let listed = Command::new("podman")
        .arg("--root")
        .arg(dir.path().join("storage"))
        .arg("--runroot")
        .arg(dir.path().join("run"))
        .args([
            "--storage-driver",
            "overlay",
            "images",
            "--format",
            "{{.Repository}}",
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&listed.stdout).contains("test/data"));
}
