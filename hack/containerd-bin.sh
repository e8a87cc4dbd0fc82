#!/usr/bin/env bash
# Builds containerd v2 (the daemon only) from source through the Go module proxy into the same
# cache folder outside the repository as hack/k8s-bin.sh, keyed by version. The e2e tests run it
# as a daemon of their own to pull through a mirror as a kubelet would (CRI PullImage).
# Idempotent: a binary already in the cache is not rebuilt. Prints the binary's folder on the
# last line of stdout.
set -euo pipefail

CONTAINERD_VERSION=v2.4.2

cache_root="${QM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/quartermaster}"
bin_dir="${cache_root}/containerd-${CONTAINERD_VERSION}"
mkdir -p "${bin_dir}"

log() { echo "containerd-bin: $*" >&2; }

# Test packages may ask at once: build once.
exec 9>"${cache_root}/.containerd-bin.lock"
flock 9

if [[ ! -x "${bin_dir}/containerd" ]]; then
	log "building containerd ${CONTAINERD_VERSION}; the first build takes minutes"
	tmp="$(mktemp -d)"
	trap 'rm -rf "${tmp}"' EXIT
	# No cgo: the snapshotters that need C (btrfs, devmapper) are left out by their build tags;
	# pulling needs only the content store and the overlayfs/native snapshotters.
	GOBIN="${tmp}" CGO_ENABLED=0 GOWORK=off GOFLAGS=-mod=mod go install -trimpath \
		-tags "no_btrfs no_devmapper no_zfs" \
		-ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=${CONTAINERD_VERSION}" \
		"github.com/containerd/containerd/v2/cmd/containerd@${CONTAINERD_VERSION}"
	# mv within one file system: the binary appears whole or not at all.
	mv "${tmp}/containerd" "${bin_dir}/.containerd.tmp"
	mv "${bin_dir}/.containerd.tmp" "${bin_dir}/containerd"
fi

echo "${bin_dir}"
