#!/usr/bin/env bash
# Builds Kubernetes binaries from source through the Go module proxy into a cache folder outside the
# repository, keyed by version. Idempotent: a binary that is already in the cache is not rebuilt.
# Prints the cache folder on the last line of stdout (callers use it as KUBEBUILDER_ASSETS).
#
#   hack/k8s-bin.sh        the version the project runs on (wrapper module hack/k8s-bin): the control
#                          plane, kubectl, etcd, kwok and kwokctl (envtest and the local cluster)
#   hack/k8s-bin.sh 1.30   the oldest version docs/install.md supports (hack/k8s-bin-1.30):
#                          kube-apiserver, kubectl and etcd, what envtest runs (make test-k8s-min)
#
# The versions are the wrapper module's: k8s.io/kubernetes and go.etcd.io/etcd/server/v3 in its go.mod.
set -euo pipefail

KWOK_VERSION=v0.8.0

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
series="${1:-}"
module="k8s-bin${series:+-${series}}"
if [[ ! -f "${here}/${module}/go.mod" ]]; then
	echo "usage: $0 [SERIES]: no wrapper module hack/${module}" >&2
	exit 2
fi
required() { awk -v m="$1" '$1 == m && $2 ~ /^v/ { print $2; exit }' "${here}/${module}/go.mod"; }
K8S_VERSION="$(required k8s.io/kubernetes)"
ETCD_VERSION="$(required go.etcd.io/etcd/server/v3)"

cache_root="${QM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/quartermaster}"
if [[ -z "${series}" ]]; then
	bin_dir="${cache_root}/k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}-kwok-${KWOK_VERSION}"
	commands=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
else
	bin_dir="${cache_root}/k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}"
	commands=(kube-apiserver kubectl)
fi
mkdir -p "${bin_dir}"

log() { echo "k8s-bin: $*" >&2; }

# Parallel test packages may all ask for the binaries at once: build them once.
exec 9>"${cache_root}/.${module}.lock"
flock 9

# Build with a private GOBIN-like output so a half-written binary never lands in the cache:
# go build writes to a temporary name, then mv makes it appear atomically.
build() { # build NAME PACKAGE [extra go build args...]
	local name="$1" pkg="$2"; shift 2
	if [[ -x "${bin_dir}/${name}" ]]; then return; fi
	log "building ${name} (${pkg}); the first build takes minutes"
	(cd "${here}/${module}" && CGO_ENABLED=0 GOWORK=off go build -trimpath "$@" -o "${bin_dir}/.${name}.tmp" "${pkg}")
	mv "${bin_dir}/.${name}.tmp" "${bin_dir}/${name}"
}

major="${K8S_VERSION#v}"; major="${major%%.*}"
minor="${K8S_VERSION#v*.}"; minor="${minor%%.*}"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${K8S_VERSION} -X k8s.io/component-base/version.gitMajor=${major} -X k8s.io/component-base/version.gitMinor=${minor} -X k8s.io/component-base/version.gitTreeState=clean"
ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=${K8S_VERSION} -X k8s.io/client-go/pkg/version.gitMajor=${major} -X k8s.io/client-go/pkg/version.gitMinor=${minor}"

build etcd go.etcd.io/etcd/server/v3 -ldflags "-s -w"
for cmd in "${commands[@]}"; do
	build "${cmd}" "k8s.io/kubernetes/cmd/${cmd}" -ldflags "${ldflags}"
done

if [[ -n "${series}" ]]; then
	echo "${bin_dir}"
	exit
fi

# kwok and kwokctl are their own module; go install resolves it from the proxy at the pinned version.
for cmd in kwok kwokctl; do
	if [[ -x "${bin_dir}/${cmd}" ]]; then continue; fi
	log "building ${cmd} ${KWOK_VERSION}"
	tmp="$(mktemp -d)"
	GOBIN="${tmp}" CGO_ENABLED=0 GOWORK=off GOFLAGS=-mod=mod go install -trimpath "sigs.k8s.io/kwok/cmd/${cmd}@${KWOK_VERSION}"
	mv "${tmp}/${cmd}" "${bin_dir}/${cmd}"
	rmdir "${tmp}"
done

# kwok's stage definitions (what makes fake nodes Ready and fake pods Running) ship inside its module;
# kwokctl's binary runtime needs them passed explicitly.
stages="${bin_dir}/kwok-stages.yaml"
if [[ ! -s "${stages}" ]]; then
	kwok_dir="$(cd "${here}/k8s-bin" && GOWORK=off GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kwok@${KWOK_VERSION}" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
	: >"${stages}.tmp"
	for f in node/fast/node-initialize.yaml node/heartbeat/node-heartbeat.yaml pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
		if [[ -f "${kwok_dir}/kustomize/stage/${f}" ]]; then
			echo "---" >>"${stages}.tmp"; cat "${kwok_dir}/kustomize/stage/${f}" >>"${stages}.tmp"
		else
			log "warning: kwok stage ${f} not found in ${kwok_dir}"
		fi
	done
	mv "${stages}.tmp" "${stages}"
fi

echo "${bin_dir}"
