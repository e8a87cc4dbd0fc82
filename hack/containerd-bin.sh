#!/usr/bin/env bash
# Builds containerd v2 (the daemon, its runc shim and ctr) from source through the Go module proxy into the same
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

tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT
# The daemon, its runc shim (a real node's Pods: hack/real-cluster.sh) and ctr (loads images into a
# node). No cgo: the snapshotters that need C (btrfs, devmapper) are left out by their build tags;
# pulling and running need only the content store and the overlayfs/native snapshotters.
for cmd in containerd containerd-shim-runc-v2 ctr; do
	if [[ -x "${bin_dir}/${cmd}" ]]; then continue; fi
	log "building ${cmd} ${CONTAINERD_VERSION}; the first build takes minutes"
	GOBIN="${tmp}" CGO_ENABLED=0 GOWORK=off GOFLAGS=-mod=mod go install -trimpath \
		-tags "no_btrfs no_devmapper no_zfs" \
		-ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=${CONTAINERD_VERSION}" \
		"github.com/containerd/containerd/v2/cmd/${cmd}@${CONTAINERD_VERSION}"
	# mv within one file system: the binary appears whole or not at all.
	mv "${tmp}/${cmd}" "${bin_dir}/.${cmd}.tmp"
	mv "${bin_dir}/.${cmd}.tmp" "${bin_dir}/${cmd}"
done

echo "${bin_dir}"
