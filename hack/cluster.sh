#!/usr/bin/env bash
# A local Kubernetes cluster for the e2e tests, the demo and the benchmarks: kwokctl's binary runtime
# running the locally built etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok,
# with fake nodes whose pods turn Running. Real garbage collection, namespace lifecycle,
# TokenRequest and RBAC.
#
#   hack/cluster.sh up [NAME] [NODES]   create (or restart) the cluster; prints the kubeconfig path
#   hack/cluster.sh down [NAME]         delete it
#   hack/cluster.sh kubeconfig [NAME]   print the kubeconfig path
#
# NAME defaults to "quartermaster", NODES to 3. The admin kubeconfig is written to
# ${XDG_CACHE_HOME:-$HOME/.cache}/quartermaster/clusters/NAME/kubeconfig (never to ~/.kube/config).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${QM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/quartermaster}"
cmd="${1:-up}"
name="${2:-quartermaster}"
nodes="${3:-3}"

export KWOK_WORKDIR="${cache_root}/kwok"
kubeconfig="${cache_root}/clusters/${name}/kubeconfig"

log() { echo "cluster: $*" >&2; }

bin_dir="$("${here}/k8s-bin.sh" | tail -n1)"
kwokctl="${bin_dir}/kwokctl"

exists() { "${kwokctl}" get clusters 2>/dev/null | grep -qx "${name}"; }

case "${cmd}" in
up)
	mkdir -p "$(dirname "${kubeconfig}")"
	if exists; then
		log "cluster ${name} exists; starting it"
		"${kwokctl}" start cluster --name "${name}" >&2
	else
		log "creating cluster ${name}"
		# Versions must be given so kwokctl renders flags for the binaries we built, not its defaults.
		KWOK_KUBE_VERSION="$("${bin_dir}/kube-apiserver" --version | awk '{print $2}')" \
			"${kwokctl}" create cluster --name "${name}" --runtime binary \
			--config "${bin_dir}/kwok-stages.yaml" \
			--etcd-binary "${bin_dir}/etcd" \
			--kube-apiserver-binary "${bin_dir}/kube-apiserver" \
			--kube-controller-manager-binary "${bin_dir}/kube-controller-manager" \
			--kube-scheduler-binary "${bin_dir}/kube-scheduler" \
			--kwok-controller-binary "${bin_dir}/kwok" \
			--kubeconfig "${kubeconfig}" \
			--wait 3m >&2
	fi
	have="$("${bin_dir}/kubectl" --kubeconfig "${kubeconfig}" get nodes --no-headers 2>/dev/null | wc -l)"
	if (( have < nodes )); then
		# kwokctl's default node template gives each node a spec.podCIDR (10.0.N.0/24).
		"${kwokctl}" scale node --name "${name}" --replicas "${nodes}" >&2
	fi
	"${bin_dir}/kubectl" --kubeconfig "${kubeconfig}" wait --for=condition=Ready nodes --all --timeout=2m >&2
	echo "${kubeconfig}"
	;;
down)
	if exists; then
		log "deleting cluster ${name}"
		"${kwokctl}" delete cluster --name "${name}" >&2
	fi
	rm -rf "$(dirname "${kubeconfig}")"
	;;
kubeconfig)
	echo "${kubeconfig}"
	;;
*)
	echo "usage: $0 up|down|kubeconfig [NAME] [NODES]" >&2
	exit 2
	;;
esac
