#!/usr/bin/env bash
# Builds inlet's container images offline, with no Docker, no registry and no base image:
#   target/images/inlet-plugin.tar   the CSI drivers (deploy/'s DaemonSets run it)
#   target/images/kubelet-sim.tar    the simulated kubelet
# Each is one static release binary (glibc, crt-static; checked with ldd) on an empty (`scratch`) image,
# built with podman (or buildah) and saved as an OCI archive tagged localhost/<name>:<crate version>.
# deploy/Containerfile builds the same inlet-plugin image from a Rust base image, for those with registries.
#
# Usage: deploy/build-images.sh [NAME...]   (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."

names=("$@")
[ ${#names[@]} -gt 0 ] || names=(inlet-plugin kubelet-sim)
for name in "${names[@]}"; do
  case "$name" in inlet-plugin|kubelet-sim) ;; *) echo "build-images.sh: unknown image $name (inlet-plugin, kubelet-sim)" >&2; exit 2 ;; esac
done
if command -v podman >/dev/null; then builder=podman
elif command -v buildah >/dev/null; then builder=buildah
else echo "build-images.sh: needs podman or buildah (Debian: apt-get install podman)" >&2; exit 1
fi

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
[ -n "$version" ] || { echo "build-images.sh: no version in Cargo.toml's [workspace.package]" >&2; exit 1; }
target=$(rustc -vV | sed -n 's/^host: //p')
# --target keeps the static flag off build scripts and proc macros (they must stay dynamic).
packages=()
for name in "${names[@]}"; do packages+=(-p "$name"); done
# In a clean environment: run from `cargo test` (the images' tests), the variables cargo gives a test
# (LD_LIBRARY_PATH, CARGO_*) differ from a shell's, and build scripts that watch the environment would
# rebuild everything on every switch between the two.
keep=(PATH="$PATH" HOME="$HOME")
for var in RUSTUP_HOME CARGO_HOME CARGO_TARGET_DIR TMPDIR; do
  [ -z "${!var:-}" ] || keep+=("$var=${!var}")
done
env -i "${keep[@]}" RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" CARGO_PROFILE_RELEASE_STRIP=symbols \
  cargo build --release --locked --target "$target" "${packages[@]}"

mkdir -p target/images
for name in "${names[@]}"; do
  bin="target/$target/release/$name"
  linked=$(ldd "$bin" 2>&1 || true)   # ldd exits 1 for a static non-PIE binary
  if ! grep -qE 'statically linked|not a dynamic executable' <<<"$linked"; then
    echo "build-images.sh: $bin is not static:" >&2; echo "$linked" >&2; exit 1
  fi
  context=$(mktemp -d)
  trap 'rm -rf "$context"' EXIT
  cp "$bin" "$context/$name"
  cat > "$context/Containerfile" <<CONTAINERFILE
FROM scratch
COPY $name /$name
ENTRYPOINT ["/$name"]
CONTAINERFILE
  image="localhost/$name:$version"
  archive="target/images/$name.tar"
  "$builder" build --quiet --format oci -t "$image" -f "$context/Containerfile" "$context" >/dev/null
  # Written aside, then renamed: a reader never sees half an archive.
  rm -f "$archive.new"
  if [ "$builder" = podman ]; then podman save --quiet --format oci-archive -o "$archive.new" "$image"
  else buildah push --quiet "$image" "oci-archive:$archive.new:$image"
  fi
  mv -f "$archive.new" "$archive"
  rm -rf "$context"; trap - EXIT
  echo "$image  $archive  $(du -h "$archive" | cut -f1)"
done

cat <<HELP

Load an archive where the image is run (tag $version):
  podman:      podman load -i target/images/inlet-plugin.tar
  containerd:  ctr -n k8s.io images import target/images/inlet-plugin.tar
  CRI-O:       skopeo copy oci-archive:target/images/inlet-plugin.tar containers-storage:localhost/inlet-plugin:$version
  kind:        kind load image-archive target/images/inlet-plugin.tar
Run one:       podman run --rm oci-archive:target/images/inlet-plugin.tar --version
Then deploy:   kubectl apply -k deploy/overlays/containerd   (or deploy/overlays/crio); see deploy/README.md
HELP
