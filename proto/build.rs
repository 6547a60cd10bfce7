//! Compiles the vendored .proto files with protox (a protobuf compiler in Rust), so a fresh machine needs
//! only cargo: no system protoc. Every file is listed here so a reader sees what is generated.

use std::path::PathBuf;

/// (include root, files under it). Roots are kept apart because containerd imports by Go path.
const PROTOS: &[(&str, &[&str])] = &[
    ("protos/csi", &["csi.proto"]),
    ("protos/cri", &["api.proto"]),
    (
        "protos/pluginregistration",
        &["v1/pluginregistration.proto"],
    ),
    (
        "protos/containerd",
        &[
            "github.com/containerd/containerd/api/types/descriptor.proto",
            "github.com/containerd/containerd/api/types/mount.proto",
            "github.com/containerd/containerd/api/types/platform.proto",
            "github.com/containerd/containerd/api/services/content/v1/content.proto",
            "github.com/containerd/containerd/api/services/images/v1/images.proto",
            "github.com/containerd/containerd/api/services/leases/v1/leases.proto",
            "github.com/containerd/containerd/api/services/snapshots/v1/snapshots.proto",
        ],
    ),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let roots: Vec<PathBuf> = PROTOS.iter().map(|(root, _)| PathBuf::from(root)).collect();
    let files: Vec<PathBuf> = PROTOS
        .iter()
        .flat_map(|(root, files)| files.iter().map(move |f| PathBuf::from(root).join(f)))
        .collect();
    for root in &roots {
        println!("cargo:rerun-if-changed={}", root.display());
    }

    let descriptors = protox::compile(&files, &roots)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Unimplemented RPCs answer UNIMPLEMENTED, as the CSI spec asks of optional calls.
        .generate_default_stubs(true)
        // prost's codec with small buffers (src/codec.rs).
        .codec_path("crate::codec::SmallBufferCodec")
        .include_file("_includes.rs")
        .compile_fds(descriptors)?;
    Ok(())
}
