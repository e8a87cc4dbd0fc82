#!/usr/bin/env bash
# make demo / make demo-down: from nothing to a running Quartermaster on the local cluster.
#
#   up:   build what is missing, start the local cluster "quartermaster", install CRDs and RBAC
#         (config/local), run the manager as a local process authenticated as its own
#         ServiceAccount (bound to the generated ClusterRole, not admin), apply config/samples,
#         wait for them, and print every Quartermaster kind with its status. AWS IAM is the
#         project's IAM emulator (cmd/iam-emulator), vCenter the vSphere simulator (cmd/vcenter-sim).
#   down: stop the manager and the simulators, and delete the cluster.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/.." && pwd)"
cache_root="${QM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/quartermaster}"
cluster=quartermaster
state="${cache_root}/demo"
probe_addr=127.0.0.1:18081
metrics_addr=127.0.0.1:18443

log() { echo "demo: $*" >&2; }

stop_pid() { # stop_pid NAME
	if [[ -f "${state}/$1.pid" ]]; then
		pid="$(cat "${state}/$1.pid")"
		if kill -0 "${pid}" 2>/dev/null; then
			log "stopping the $1 (pid ${pid})"
			kill "${pid}"
			for _ in $(seq 50); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.2; done
		fi
		rm -f "${state}/$1.pid"
	fi
}

case "${1:-up}" in
down)
	stop_pid manager
	stop_pid vcenter-sim
	stop_pid iam-emulator
	"${here}/cluster.sh" down "${cluster}"
	rm -rf "${state}"
	exit 0
	;;
up) ;;
*) echo "usage: $0 up|down" >&2; exit 2 ;;
esac

bin_dir="$("${here}/k8s-bin.sh" | tail -n1)"
kubeconfig="$("${here}/cluster.sh" up "${cluster}" 3 | tail -n1)"
kubectl() { "${bin_dir}/kubectl" --kubeconfig "${kubeconfig}" "$@"; }
mkdir -p "${state}"
cd "${root}"

log "installing CRDs, RBAC and the namespace (config/local)"
kubectl apply --server-side --force-conflicts -k config/local >/dev/null
kubectl wait --for=condition=Established crd -l app.kubernetes.io/part-of=quartermaster --timeout=60s >/dev/null 2>&1 || true

log "building the manager, the development vCenter and the IAM emulator"
go build -o bin/quartermaster ./cmd/quartermaster
go build -o bin/vcenter-sim ./cmd/vcenter-sim
go build -o bin/iam-emulator ./cmd/iam-emulator

# A development vCenter (govmomi's simulator with a template) for the vmgroups controller; its
# connection goes into the Secret the manager is pointed at with --vsphere-secret.
stop_pid vcenter-sim
rm -f "${state}/vcenter.env"
nohup "${root}/bin/vcenter-sim" --env-file "${state}/vcenter.env" >"${state}/vcenter-sim.log" 2>&1 &
echo $! >"${state}/vcenter-sim.pid"
for _ in $(seq 100); do [[ -s "${state}/vcenter.env" ]] && break; sleep 0.1; done
[[ -s "${state}/vcenter.env" ]] || { log "the development vCenter did not start:"; cat "${state}/vcenter-sim.log" >&2; exit 1; }
kubectl -n quartermaster-system create secret generic vcenter --from-env-file="${state}/vcenter.env" \
	--dry-run=client -o yaml | kubectl apply --server-side --force-conflicts -f - >/dev/null

# AWS IAM for the iam controller: the emulator on a free port, which it logs. The manager's AWS
# SDK finds it through the standard AWS_ENDPOINT_URL_IAM / AWS_ENDPOINT_URL_STS variables and
# signs with dummy keys (the emulator accepts any signature).
stop_pid iam-emulator
nohup "${root}/bin/iam-emulator" --listen 127.0.0.1:0 >"${state}/iam-emulator.log" 2>&1 &
echo $! >"${state}/iam-emulator.pid"
iam_url=""
for _ in $(seq 100); do
	iam_url="$(grep -o 'listening on http://[^ ]*' "${state}/iam-emulator.log" | head -n1 | cut -d' ' -f3 || true)"
	[[ -n "${iam_url}" ]] && break
	sleep 0.1
done
[[ -n "${iam_url}" ]] || { log "the IAM emulator did not start:"; cat "${state}/iam-emulator.log" >&2; exit 1; }
echo "${iam_url}" >"${state}/iam-emulator.url"

# The manager authenticates with a token of its own ServiceAccount, so it runs with exactly the
# permissions the generated ClusterRole gives it in a real cluster.
server="$(kubectl config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')"
kubectl config view --raw --minify --flatten -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d >"${state}/ca.crt"
token="$(kubectl -n quartermaster-system create token quartermaster-manager --duration=24h)"
manager_kubeconfig="${state}/manager.kubeconfig"
rm -f "${manager_kubeconfig}"
mk() { "${bin_dir}/kubectl" --kubeconfig "${manager_kubeconfig}" "$@" >/dev/null; }
mk config set-cluster local --server="${server}" --certificate-authority="${state}/ca.crt" --embed-certs
mk config set-credentials quartermaster-manager --token="${token}"
mk config set-context manager --cluster=local --user=quartermaster-manager --namespace=quartermaster-system
mk config use-context manager

stop_pid manager
log "starting the manager (logs: ${state}/manager.log)"
AWS_ENDPOINT_URL_IAM="${iam_url}" AWS_ENDPOINT_URL_STS="${iam_url}" AWS_REGION=us-east-1 \
	AWS_ACCESS_KEY_ID=AKIDDEMOEXAMPLE AWS_SECRET_ACCESS_KEY=demo-not-a-secret AWS_EC2_METADATA_DISABLED=true \
	nohup "${root}/bin/quartermaster" --kubeconfig="${manager_kubeconfig}" \
	--leader-elect --leader-election-namespace=quartermaster-system \
	--health-probe-bind-address="${probe_addr}" --metrics-bind-address="${metrics_addr}" \
	--namespace-defaults="${root}/config/manager/namespace-defaults.yaml" \
	--vsphere-secret=quartermaster-system/vcenter --vsphere-insecure \
	--cluster-name=demo --oidc-issuer=https://oidc.eks.us-east-1.amazonaws.com/id/DEMO \
	--allowed-policy-arns='arn:aws:iam::aws:policy/ReadOnlyAccess' \
	${QM_DEMO_ARGS:-} >"${state}/manager.log" 2>&1 &
echo $! >"${state}/manager.pid"
for i in $(seq 100); do
	if curl -fsS "http://${probe_addr}/readyz" >/dev/null 2>&1; then break; fi
	if ! kill -0 "$(cat "${state}/manager.pid")" 2>/dev/null; then
		log "the manager exited:"; tail -20 "${state}/manager.log" >&2; exit 1
	fi
	if (( i == 100 )); then log "the manager did not become ready"; tail -20 "${state}/manager.log" >&2; exit 1; fi
	sleep 0.2
done

log "applying config/samples"
if [[ -n "$(kubectl kustomize config/samples)" ]]; then
	kubectl apply --server-side -k config/samples >/dev/null
fi
# Namespace requests are ConfigMaps: wait for each to be served.
for cm in $(kubectl kustomize config/samples | awk '/^kind: ConfigMap/{c=1} c&&/^  name:/{print $2; c=0}'); do
	for _ in $(seq 120); do
		status="$(kubectl -n namespace-requests get configmap "${cm}" -o jsonpath='{.metadata.annotations.quartermaster\.dev/status}' 2>/dev/null || true)"
		[[ "${status}" == Ready ]] && break
		sleep 0.5
	done
	[[ "${status}" == Ready ]] || log "namespace request ${cm} is ${status:-not served yet}"
done
kinds="$(kubectl api-resources -o name 2>/dev/null | grep -E '\.quartermaster\.dev$' | sort || true)"
for kind in ${kinds}; do
	[[ -n "$(kubectl get "${kind}" -A -o name 2>/dev/null)" ]] || continue # no sample of this kind
	kubectl wait --for=condition=Ready "${kind}" --all -A --timeout=180s >/dev/null 2>&1 ||
		log "not every ${kind} is Ready yet"
done

echo
echo "=== Quartermaster is running ==="
echo "manager:    pid $(cat "${state}/manager.pid"), readyz $(curl -fsS "http://${probe_addr}/readyz"), logs ${state}/manager.log"
holder=""
for _ in $(seq 60); do
	holder="$(kubectl -n quartermaster-system get lease quartermaster.quartermaster.dev -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true)"
	[[ -n "${holder}" ]] && break
	sleep 0.5
done
echo "leader:     ${holder:-(electing)}"
echo "controllers: $(grep -o '"controllers":\[[^]]*\]' "${state}/manager.log" | tail -n1 | cut -d: -f2)"
echo
kubectl get nodes
echo; echo "--- namespace requests (namespaces controller)"
kubectl -n namespace-requests get configmaps -l '!quartermaster.dev/ignore' --field-selector metadata.name!=kube-root-ca.crt \
	-o custom-columns='REQUEST:.metadata.name,STATUS:.metadata.annotations.quartermaster\.dev/status,MESSAGE:.metadata.annotations.quartermaster\.dev/message'
echo; kubectl get namespaces -l quartermaster.dev/managed-by=quartermaster -L quartermaster.dev/request
echo; kubectl -n namespace-requests get secrets -l quartermaster.dev/managed-by=quartermaster \
	-o custom-columns='SECRET:.metadata.name,TOKEN-EXPIRES-AT:.metadata.annotations.quartermaster\.dev/token-expires-at'
for kind in ${kinds}; do
	echo; echo "--- ${kind}"; kubectl get "${kind}" -A
done
if kubectl -n default get iamserviceaccount reports >/dev/null 2>&1; then
	echo; echo "--- IAM role of ServiceAccount default/reports (AWS: the IAM emulator at ${iam_url})"
	kubectl -n default get iamserviceaccount reports -o wide
	echo; kubectl -n default get serviceaccount reports -o yaml | sed -n '/^metadata:/,/^  name:/p'
	echo "in AWS:"
	curl -fsS "${iam_url}/_emulator/state" | jq -r --arg role "$(kubectl -n default get iamserviceaccount reports -o jsonpath='{.status.roleName}')" \
		'.roles[] | select(.name == $role) | "  role \(.arn)\n    trusts \(.assumeRolePolicyDocument | fromjson | .Statement[0].Condition.StringEquals | to_entries | map(select(.key | endswith(":sub"))) | .[0].value)\n    policies \(.attachedPolicies | join(", "))"' ||
		log "could not read the IAM emulator's state"
fi
if kubectl -n namespace-requests get secret demo-ci-branch >/dev/null 2>&1; then
	kubectl -n namespace-requests get secret demo-ci-branch -o jsonpath='{.data.kubeconfig}' | base64 -d >"${state}/demo-ci-branch.kubeconfig"
	echo; echo "the handed-out kubeconfig authenticates as: $("${bin_dir}/kubectl" --kubeconfig "${state}/demo-ci-branch.kubeconfig" auth whoami -o jsonpath='{.status.userInfo.username}')"
	echo "  and may create deployments in demo-ci-branch: $("${bin_dir}/kubectl" --kubeconfig "${state}/demo-ci-branch.kubeconfig" auth can-i create deployments)," \
		"in default: $("${bin_dir}/kubectl" --kubeconfig "${state}/demo-ci-branch.kubeconfig" auth can-i create deployments -n default || true)"
fi
echo
echo "export KUBECONFIG=${kubeconfig}   # then: kubectl get <kind>; make demo-down to clean up"
