#!/usr/bin/env bash
# scripts/oci-image.sh [HAUL_BINARY] [OUT.tar]
#
# Builds an OCI image of longhaul without a container engine or a base image: the `haul`
# binary (a release build by default, made here when HAUL_BINARY is not given), the shared
# libraries it links against (from ldd), an account `haul` (uid/gid 5811) and its state
# directory /var/lib/haul. Written as an OCI archive (OUT.tar, default target/oci/haul.tar)
# that `podman load -i`, `skopeo copy oci-archive:OUT.tar docker-daemon:haul:VERSION` and
# containerd's `ctr image import` take. Entrypoint `haul`; no default command (give
# `meta serve ...`, `node serve ...` or `serve ...`); ports 5811 (metadata server gRPC, and
# `haul serve`), 5812 (a storage node's data service), 5880 (the dashboard, metrics).
#
# Needs root (umoci unpacks and repacks the image's files with their owners) and umoci
# (Debian package umoci; installed here when missing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
bin=${1:-}
out=${2:-$repo/target/oci/haul.tar}
if [ "$(id -u)" != 0 ]; then
  echo "oci-image: run as root (the image's files are owned by root and by uid 5811)" >&2
  exit 2
fi
if ! command -v umoci >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q umoci) >/dev/null
  else
    echo "oci-image: umoci is needed (Debian: apt-get install umoci)" >&2
    exit 2
  fi
fi
if [ -z "$bin" ]; then
  (cd "$repo" && cargo build --release --locked -p haul)
  bin=${CARGO_TARGET_DIR:-$repo/target}/release/haul
fi
[ -x "$bin" ] || { echo "oci-image: $bin: no such executable" >&2; exit 2; }
bin=$(realpath "$bin")
version=$("$bin" --version | awk '{print $2}')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
layout=$work/layout
umoci init --layout "$layout"
umoci new --image "$layout:$version"
umoci unpack --image "$layout:$version" "$work/bundle" >/dev/null
root=$work/bundle/rootfs
install -D -m 0755 "$bin" "$root/usr/local/bin/haul"
# The dynamic loader and every library the binary needs, at the paths it looks for them.
# (A static binary needs none: ldd then says so and exits 1.)
{ ldd "$bin" || true; } | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u | while read -r lib; do
  install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
done
mkdir -p "$root/etc" "$root/tmp" "$root/var/lib/haul"
chmod 1777 "$root/tmp"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nhaul:x:5811:5811:longhaul:/var/lib/haul:/usr/sbin/nologin\n' > "$root/etc/passwd"
printf 'root:x:0:\nhaul:x:5811:\n' > "$root/etc/group"
chown 5811:5811 "$root/var/lib/haul"
umoci repack --image "$layout:$version" "$work/bundle"
umoci config --image "$layout:$version" \
  --config.entrypoint /usr/local/bin/haul \
  --config.user haul \
  --config.workingdir /var/lib/haul \
  --config.volume /var/lib/haul \
  --config.exposedports 5811/tcp --config.exposedports 5812/tcp --config.exposedports 5880/tcp \
  --config.env HAUL_LOG=info \
  --config.label "org.opencontainers.image.title=longhaul" \
  --config.label "org.opencontainers.image.version=$version" \
  --config.label "org.opencontainers.image.description=haul: grid data farm and fast wide-area transfers" \
  --history.created_by "scripts/oci-image.sh"
umoci gc --layout "$layout"
mkdir -p "$(dirname "$out")"
tar -C "$layout" -cf "$out.part" .
mv "$out.part" "$out"
echo "oci-image: $out (haul $version; load with: podman load -i $out)"
