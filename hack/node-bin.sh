#!/usr/bin/env bash
# Builds what a real Kubernetes node runs, from source through the Go module proxy, into cache
# folders outside the repository keyed by version, as hack/k8s-bin.sh does for the control plane:
#
#   kubelet, kube-proxy                 k8s.io/kubernetes (hack/k8s-bin's wrapper module, its version)
#   containerd, containerd-shim-runc-v2, ctr    hack/containerd-bin.sh (one containerd version)
#   runc                                github.com/opencontainers/runc, cgo with the seccomp tag
#   bridge, host-local, loopback, portmap   github.com/containernetworking/plugins
#   coredns                             github.com/coredns/coredns
#
# hack/real-cluster.sh runs them. Idempotent: a binary already in the cache that answers --version
# with the version pinned here is reused; a missing one, or one of another version, is (re)built.
# As root on Debian it first installs the packages the node needs and lacks (libseccomp-dev for
# runc's build, iptables for kube-proxy and the bridge plugin).
#
# Prints one NAME=FOLDER line per component (k8s, containerd, runc, cni, coredns) on stdout.
set -euo pipefail

RUNC_VERSION=v1.5.2
CNI_VERSION=v1.10.0
COREDNS_VERSION=v1.15.0

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${QM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/quartermaster}"
mkdir -p "${cache_root}"
log() { echo "node-bin: $*" >&2; }

# Debian packages: libseccomp-dev (runc links libseccomp), iptables (kube-proxy, the bridge plugin's
# masquerade and portmap). nsenter and ip come with util-linux and iproute2.
missing=()
[[ -e /usr/include/seccomp.h ]] || missing+=(libseccomp-dev)
command -v iptables-restore >/dev/null || missing+=(iptables)
command -v nsenter >/dev/null || missing+=(util-linux)
command -v ip >/dev/null || missing+=(iproute2)
if ((${#missing[@]})); then
	if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
		log "installing Debian's ${missing[*]}"
		(apt-get install -y -qq --no-install-recommends "${missing[@]}" || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; }) >&2
	else
		log "the node needs Debian's ${missing[*]}: install them (as root: apt-get install ${missing[*]})"
		exit 1
	fi
fi

exec 9>"${cache_root}/.node-bin.lock"
flock 9

required() { awk -v m="$1" '$1 == m && $2 ~ /^v/ { print $2; exit }' "${here}/k8s-bin/go.mod"; }
K8S_VERSION="$(required k8s.io/kubernetes)"

# fresh NAME PATH VERSION: PATH exists and its --version output names VERSION.
fresh() {
	local out
	[[ -x "$2" ]] || return 1
	out="$("$2" --version 2>&1 || "$2" version 2>&1 || true)"
	if [[ "${out}" != *"$3"* ]]; then
		log "$1 in the cache is not ${3} ($(head -n1 <<<"${out}" | cut -c1-80)): rebuilding it"
		return 1
	fi
}

# go_install DIR NAME PACKAGE@VERSION [go install args...]: go install into a temporary GOBIN, then
# move the binary into DIR (one file system: it appears whole or not at all).
go_install() {
	local dir="$1" name="$2" pkg="$3"; shift 3
	local tmp
	tmp="$(mktemp -d)"
	log "building ${name} (${pkg}); the first build takes minutes"
	GOBIN="${tmp}" GOWORK=off GOFLAGS=-mod=mod go install -trimpath "$@" "${pkg}"
	mkdir -p "${dir}"
	mv "${tmp}/$(basename "${pkg%@*}")" "${dir}/.${name}.tmp"
	mv "${dir}/.${name}.tmp" "${dir}/${name}"
	rm -rf "${tmp}"
}

# kubelet and kube-proxy: built in the control plane's wrapper module, versions stamped as there.
k8s_dir="${cache_root}/node-k8s-${K8S_VERSION}"
major="${K8S_VERSION#v}"; major="${major%%.*}"
minor="${K8S_VERSION#v*.}"; minor="${minor%%.*}"
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${K8S_VERSION} -X k8s.io/component-base/version.gitMajor=${major} -X k8s.io/component-base/version.gitMinor=${minor} -X k8s.io/component-base/version.gitTreeState=clean"
for cmd in kubelet kube-proxy; do
	fresh "${cmd}" "${k8s_dir}/${cmd}" "${K8S_VERSION}" && continue
	log "building ${cmd} ${K8S_VERSION}; the first build takes minutes"
	mkdir -p "${k8s_dir}"
	(cd "${here}/k8s-bin" && CGO_ENABLED=0 GOWORK=off GOFLAGS=-mod=mod go build -trimpath -ldflags "${ldflags}" -o "${k8s_dir}/.${cmd}.tmp" "k8s.io/kubernetes/cmd/${cmd}")
	mv "${k8s_dir}/.${cmd}.tmp" "${k8s_dir}/${cmd}"
done

containerd_dir="$("${here}/containerd-bin.sh" | tail -n1)"

runc_dir="${cache_root}/runc-${RUNC_VERSION}"
if ! fresh runc "${runc_dir}/runc" "${RUNC_VERSION#v}"; then
	# runc's version string comes from its main package's version variable.
	go_install "${runc_dir}" runc "github.com/opencontainers/runc@${RUNC_VERSION}" \
		-tags seccomp -ldflags "-s -w -X main.version=${RUNC_VERSION#v}"
fi

cni_dir="${cache_root}/cni-${CNI_VERSION}"
for p in main/bridge ipam/host-local main/loopback meta/portmap; do
	name="$(basename "${p}")"
	# The plugins answer --version only through the CNI protocol; their folder carries the version.
	[[ -x "${cni_dir}/${name}" ]] && continue
	CGO_ENABLED=0 go_install "${cni_dir}" "${name}" "github.com/containernetworking/plugins/plugins/${p}@${CNI_VERSION}" -ldflags "-s -w"
done

coredns_dir="${cache_root}/coredns-${COREDNS_VERSION}"
if ! fresh coredns "${coredns_dir}/coredns" "${COREDNS_VERSION#v}"; then
	CGO_ENABLED=0 go_install "${coredns_dir}" coredns "github.com/coredns/coredns@${COREDNS_VERSION}" -ldflags "-s -w"
fi

echo "k8s=${k8s_dir}"
echo "containerd=${containerd_dir}"
echo "runc=${runc_dir}"
echo "cni=${cni_dir}"
echo "coredns=${coredns_dir}"
