#!/usr/bin/env bash
# Builds Kyverno's admission, background and reports controllers (v1.19.1, the newest the Go
# module proxy serves) from source into a cache folder outside the repository, keyed by version, as
# hack/k8s-bin.sh does for Kubernetes. `go install kyverno@version` refuses (Kyverno's go.mod has a
# replace), so hack/kyverno-bin/go.mod is a wrapper module that copies that replace.
# Idempotent; prints the cache folder on the last line of stdout. The folder also holds Kyverno's
# CRDs (crds/), copied from the same module, so tests install exactly the version they run.
set -euo pipefail

KYVERNO_VERSION=v1.19.1

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${QM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/quartermaster}"
bin_dir="${cache_root}/kyverno-${KYVERNO_VERSION}"
mkdir -p "${bin_dir}"

log() { echo "kyverno-bin: $*" >&2; }

exec 9>"${cache_root}/.kyverno-bin.lock"
flock 9

for cmd in kyverno background-controller reports-controller; do
	if [[ -x "${bin_dir}/${cmd}" ]]; then continue; fi
	log "building ${cmd} ${KYVERNO_VERSION}; the first build takes about 5 minutes on 2 cores"
	(cd "${here}/kyverno-bin" && CGO_ENABLED=0 GOWORK=off GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" \
		-o "${bin_dir}/.${cmd}.tmp" "github.com/kyverno/kyverno/cmd/${cmd}")
	mv "${bin_dir}/.${cmd}.tmp" "${bin_dir}/${cmd}"
done

if [[ ! -d "${bin_dir}/crds" ]]; then
	dir="$(cd "${here}/kyverno-bin" && GOWORK=off GOFLAGS=-mod=mod go mod download -json "github.com/kyverno/kyverno@${KYVERNO_VERSION}" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
	rm -rf "${bin_dir}/.crds.tmp" && mkdir -p "${bin_dir}/.crds.tmp"
	find "${dir}/config/crds" -name '*.yaml' -exec cp {} "${bin_dir}/.crds.tmp/" \;
	chmod u+w "${bin_dir}/.crds.tmp"/*
	mv "${bin_dir}/.crds.tmp" "${bin_dir}/crds"
fi

echo "${bin_dir}"
