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

# kwokctl logs a JSON line per step: keep them in a file, show them only when a step fails.
kwok_log="${cache_root}/clusters/${name}.kwokctl.log"
mkdir -p "$(dirname "${kwok_log}")"
quiet() {
	if ! "$@" >>"${kwok_log}" 2>&1; then
		tail -n 30 "${kwok_log}" >&2
		return 1
	fi
}

bin_dir="$("${here}/k8s-bin.sh" | tail -n1)"
kwokctl="${bin_dir}/kwokctl"

# all_running: every component kwokctl started for the cluster still runs.
all_running() {
	local f
	for f in "${KWOK_WORKDIR}/clusters/${name}/pids/"*.pid; do
		[[ -f "${f}" ]] || return 1
		if ! kill -0 "$(cat "${f}")" 2>/dev/null; then
			log "$(basename "${f}" .pid) of cluster ${name} exited: $(tail -n 1 "${KWOK_WORKDIR}/clusters/${name}/logs/$(basename "${f}" .pid).log" 2>/dev/null | cut -c1-200)"
			return 1
		fi
	done
}

exists() { "${kwokctl}" get clusters 2>/dev/null | grep -qx "${name}"; }

case "${cmd}" in
up)
	mkdir -p "$(dirname "${kubeconfig}")"
	if exists; then
		log "cluster ${name} exists; starting it"
		quiet "${kwokctl}" start cluster --name "${name}"
	else
		# kwokctl picks each component's port when it creates the cluster; a cluster created at the
		# same moment by someone else may take one first, and that component exits at once
		# ("address already in use"). Such a cluster is deleted and created again.
		for attempt in 1 2 3; do
			log "creating cluster ${name}"
			# Versions must be given so kwokctl renders flags for the binaries we built, not its defaults.
			if KWOK_KUBE_VERSION="$("${bin_dir}/kube-apiserver" --version | awk '{print $2}')" \
				quiet "${kwokctl}" create cluster --name "${name}" --runtime binary \
				--config "${bin_dir}/kwok-stages.yaml" \
				--etcd-binary "${bin_dir}/etcd" \
				--kube-apiserver-binary "${bin_dir}/kube-apiserver" \
				--kube-controller-manager-binary "${bin_dir}/kube-controller-manager" \
				--kube-scheduler-binary "${bin_dir}/kube-scheduler" \
				--kwok-controller-binary "${bin_dir}/kwok" \
				--kubeconfig "${kubeconfig}" \
				--wait 3m && all_running; then
				break
			fi
			((attempt < 3)) || { log "cluster ${name} did not start"; exit 1; }
			log "cluster ${name} did not start (attempt ${attempt}); deleting it and trying again"
			quiet "${kwokctl}" delete cluster --name "${name}" || true
		done
	fi
	have="$("${bin_dir}/kubectl" --kubeconfig "${kubeconfig}" get nodes --no-headers 2>/dev/null | wc -l)"
	if (( have < nodes )); then
		# kwokctl's default node template gives each node a spec.podCIDR (10.0.N.0/24).
		quiet "${kwokctl}" scale node --name "${name}" --replicas "${nodes}"
	fi
	quiet "${bin_dir}/kubectl" --kubeconfig "${kubeconfig}" wait --for=condition=Ready nodes --all --timeout=2m
	log "cluster ${name} is up with ${nodes} nodes; kubeconfig: ${kubeconfig}"
	echo "${kubeconfig}"
	;;
down)
	if exists; then
		log "deleting cluster ${name}"
		quiet "${kwokctl}" delete cluster --name "${name}"
	fi
	rm -rf "$(dirname "${kubeconfig}")" "${kwok_log}"
	;;
kubeconfig)
	echo "${kubeconfig}"
	;;
*)
	echo "usage: $0 up|down|kubeconfig [NAME] [NODES]" >&2
	exit 2
	;;
esac
