#!/usr/bin/env bash
# Helm, built from the Go module proxy as its release is built (its version and the Kubernetes
# version it assumes set by -ldflags) into a cache folder outside the repository, keyed by version,
# and run from anywhere:
#   hack/helm.sh template quartermaster charts/quartermaster -n quartermaster-system
# QM_HELM_MAJOR picks the major: 4 (the default; hack/tools/helm/go.mod) or 3 (hack/tools/helm3/go.mod).
# The chart is tested with both.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "${QM_HELM_MAJOR:-4}" in
4) module=helm ;;
3) module=helm3 ;;
*) echo "helm.sh: QM_HELM_MAJOR=${QM_HELM_MAJOR} (want 3 or 4)" >&2; exit 2 ;;
esac
pkg="helm.sh/helm/v${QM_HELM_MAJOR:-4}"
modfile="hack/tools/${module}/go.mod"
required() { awk -v m="$1" '$1 == m && $2 ~ /^v/ { print $2; exit }' "${root}/${modfile}"; }
version="$(required "${pkg}")"
cache_root="${QM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/quartermaster}"
bin="${cache_root}/helm-${version}/helm"

if [[ ! -x "${bin}" ]]; then
	mkdir -p "$(dirname "${bin}")"
	exec 9>"${bin}.lock"
	flock 9
	if [[ ! -x "${bin}" ]]; then
		echo "helm.sh: building helm ${version}; the first build takes minutes" >&2
		ldflags="-s -w -X ${pkg}/internal/version.version=${version}"
		if [[ "${pkg}" == helm.sh/helm/v3 ]]; then
			# Helm 3 assumes the Kubernetes version of its client-go (v0.X.Y: 1.X) only when told;
			# unset it assumes 1.20 and refuses charts that require newer.
			client_go="$(required k8s.io/client-go)"
			minor="${client_go#v0.}"; minor="${minor%%.*}"
			for p in lint/rules chartutil; do
				ldflags+=" -X ${pkg}/pkg/${p}.k8sVersionMajor=1 -X ${pkg}/pkg/${p}.k8sVersionMinor=${minor}"
			done
		fi
		(cd "${root}" && CGO_ENABLED=0 GOWORK=off go build -modfile="${modfile}" -trimpath -ldflags "${ldflags}" -o "${bin}.tmp" "${pkg}/cmd/helm")
		mv "${bin}.tmp" "${bin}"
	fi
	exec 9>&-
fi

exec "${bin}" "$@"
