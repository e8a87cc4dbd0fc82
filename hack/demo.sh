#!/usr/bin/env bash
# make demo / make demo-down: from nothing to a running Quartermaster on the local cluster.
#
#   up:    remove a previous demo of the cluster, build what is missing, start the local cluster,
#          install CRDs and RBAC (config/local),
#          run the manager as a local process authenticated as its own ServiceAccount (bound to
#          the generated ClusterRole, not admin), apply config/samples, wait for them, and print
#          every Quartermaster kind with its status. AWS IAM is the project's IAM emulator
#          (cmd/iam-emulator), vCenter the vSphere simulator (cmd/vcenter-sim). Then a registry
#          mirror at work (an upstream that needs credentials, cmd/upstream-registry; the cache
#          and the node agent run as the StatefulSet and DaemonSet would; a containerd pulls
#          through it) and security intents (KubeArmor's and Kyverno's CRDs, a real Kyverno
#          refusing a privileged Pod), and a pipeline step that holds nothing but its CI job's
#          identity token getting its namespace through the exchange (keyless; hack/demo-helper
#          ci-issuer stands in for GitHub Actions' token service).
#   check: the same steps without the printing, failing at the first that does not hold
#          (test/e2e/demo_test.go runs it, so the demo cannot rot).
#   down:  stop everything up started, delete Kyverno's webhooks and the cluster, remove the folder.
#
# QM_DEMO_CLUSTER names the cluster (default quartermaster; its state lives in
# ${XDG_CACHE_HOME:-~/.cache}/quartermaster/demo, another cluster's in .../demo-NAME).
# containerd needs root (it mounts snapshots); without root the image is pulled through the
# cache by the project's client code (hack/demo-helper registry-pull) instead.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/.." && pwd)"
cache_root="${QM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/quartermaster}"
cluster="${QM_DEMO_CLUSTER:-quartermaster}"
state="${cache_root}/demo"
[[ "${cluster}" == quartermaster ]] || state="${cache_root}/demo-${cluster}"
mode="${1:-up}"
mirrors_ns=quartermaster-mirrors
mirror=demo-upstream
intents_ns=demo-intents
# Every process up starts, in the order down stops them.
processes=(kyverno node-agent mirror-cache containerd manager ci-issuer upstream-registry vcenter-sim iam-emulator)

log() { echo "demo: [${SECONDS}s] $*" >&2; }
# say: the one line telling the user what the next output shows; show: output for the user.
# Neither runs in check mode.
say() { [[ "${mode}" == check ]] || { echo; echo "--- $*"; }; }
header() { [[ "${mode}" == check ]] || { echo; echo "=== $*"; }; }
show() { [[ "${mode}" == check ]] || "$@"; }
# fail: a step that did not hold (the demo goes on in up mode, check stops there).
fail() {
	log "$*"
	[[ "${mode}" != check ]] || exit 1
}
die() { log "$*"; exit 1; }
# until_ok SECONDS WHAT CMD...: run CMD until it succeeds, at most SECONDS (then false).
until_ok() {
	local deadline=$((SECONDS + $1)) what=$2
	shift 2
	until "$@" >/dev/null 2>&1; do
		if ((SECONDS >= deadline)); then log "timed out waiting for ${what}"; return 1; fi
		sleep 0.2
	done
}

# stop NAME...: SIGTERM to each process named, then wait for all of them (SIGKILL after 20 s).
stop() {
	local name pid pids=()
	for name in "$@"; do
		[[ -f "${state}/${name}.pid" ]] || continue
		pid="$(cat "${state}/${name}.pid")"
		rm -f "${state}/${name}.pid"
		kill -0 "${pid}" 2>/dev/null || continue
		log "stopping the ${name} (pid ${pid})"
		kill "${pid}" 2>/dev/null || true
		pids+=("${pid}")
	done
	for pid in "${pids[@]}"; do
		for _ in $(seq 100); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.2; done
		kill -9 "${pid}" 2>/dev/null || true
	done
}

# start NAME CMD...: run CMD in the background, its output in NAME.log, its pid in NAME.pid.
start() {
	local name=$1
	shift
	stop "${name}"
	nohup "$@" >"${state}/${name}.log" 2>&1 &
	echo $! >"${state}/${name}.pid"
}

# start_in_mounts NAME "SOURCE:TARGET ..." CMD...: start CMD in a mount namespace of its own where
# each SOURCE folder is bound at TARGET, as a container's volumes are (root only). A TARGET that
# does not exist is made on a tmpfs laid over its deepest existing parent, for that process only:
# nothing outside the demo's folder is created or changed.
start_in_mounts() {
	local name=$1 mounts=$2 m parent script="set -e"
	shift 2
	local -a tmpfs=()
	for m in ${mounts}; do
		[[ -e "${m#*:}" ]] && continue
		parent="$(dirname "${m#*:}")"
		while [[ ! -e "${parent}" ]]; do parent="$(dirname "${parent}")"; done
		tmpfs+=("${parent}")
	done
	if ((${#tmpfs[@]})); then
		while read -r parent; do script+=$'\n'"mount -t tmpfs tmpfs $(printf %q "${parent}")"; done < <(printf '%s\n' "${tmpfs[@]}" | sort -u)
	fi
	for m in ${mounts}; do
		script+=$'\n'"mkdir -p $(printf %q "${m#*:}") && mount --bind $(printf %q "${m%%:*}") $(printf %q "${m#*:}")"
	done
	script+=$'\n''exec "$@"'
	start "${name}" unshare --mount --propagation private -- /bin/sh -c "${script}" sh "$@"
}

# alive NAME: the process NAME.pid names runs (else its log's end is shown).
alive() {
	kill -0 "$(cat "${state}/$1.pid")" 2>/dev/null && return 0
	log "the $1 exited:"
	tail -n 20 "${state}/$1.log" >&2
	return 1
}

# down: stop every process up started, delete Kyverno's webhooks and the cluster, remove the folder.
down() {
	local kubeconfig
	kubeconfig="$("${here}/cluster.sh" kubeconfig "${cluster}")"
	stop "${processes[@]}"
	# Kyverno's webhooks (failurePolicy Fail) go with it; should it have been killed instead of
	# stopped, they are deleted here, or the cluster would refuse what they match.
	if [[ -f "${kubeconfig}" ]]; then
		"$("${here}/k8s-bin.sh" | tail -n1)/kubectl" --kubeconfig "${kubeconfig}" delete validatingwebhookconfigurations,mutatingwebhookconfigurations \
			-l webhook.kyverno.io/managed-by --ignore-not-found --request-timeout=10s >/dev/null 2>&1 || true
	fi
	"${here}/cluster.sh" down "${cluster}"
	rm -rf "${state}"
}

case "${mode}" in
down)
	down
	exit 0
	;;
up | check) ;;
*) echo "usage: $0 up|check|down" >&2; exit 2 ;;
esac

# Always from nothing: what a previous demo left (a mirror of an upstream that is gone, say) would
# not be what this one starts.
if [[ -d "${state}" ]]; then
	log "removing the previous demo on cluster ${cluster}"
	down
fi
bin_dir="$("${here}/k8s-bin.sh" | tail -n1)"
kubeconfig="$("${here}/cluster.sh" up "${cluster}" 3 | tail -n1)"
kubectl() { "${bin_dir}/kubectl" --kubeconfig "${kubeconfig}" "$@"; }
mkdir -p "${state}"
cd "${root}"
as_root=false
[[ "$(id -u)" == 0 && -z "${QM_DEMO_ROOTLESS:-}" ]] && as_root=true

log "building the manager, the development vCenter, the IAM emulator, the upstream registry and the demo's helper"
go build -o bin/ ./cmd/quartermaster ./cmd/vcenter-sim ./cmd/iam-emulator ./cmd/upstream-registry ./hack/demo-helper
kyverno_bin="$("${here}/kyverno-bin.sh" | tail -n1)"
containerd_bin=""
if ${as_root}; then containerd_bin="$("${here}/containerd-bin.sh" | tail -n1)/containerd"; fi
# Loopback addresses for the manager's probes, metrics and token exchange and the cache's two ports.
mapfile -t addrs < <(bin/demo-helper free-addrs 5)
probe_addr=${addrs[0]} metrics_addr=${addrs[1]} cache_addr=${addrs[2]} cache_debug_addr=${addrs[3]} exchange_addr=${addrs[4]}
echo "${probe_addr}" >"${state}/probe.addr"

log "installing CRDs, RBAC and the namespace (config/local), and KubeArmor's and Kyverno's CRDs"
kubectl apply --server-side --force-conflicts -k config/local >/dev/null
mkdir -p "${state}/kubearmor-crds"
bin/demo-helper kubearmor-crds "${state}/kubearmor-crds"
kubectl apply --server-side --force-conflicts -f "${state}/kubearmor-crds" -f "${kyverno_bin}/crds" >/dev/null
# Polled: a CRD just created may have no conditions yet, which kubectl wait reports as an error.
# Each attempt waits up to 60 s: under load (make test's lanes beside another run) one kubectl wait
# over all of Kyverno's and KubeArmor's CRDs took longer than 5 s, and every attempt failed however
# long the loop ran. The limits bound a failure only.
until_ok 300 "the CRDs to be Established" kubectl wait --for=condition=Established crd --all --timeout=60s || die "not every CRD is served"

# The services the controllers talk to, started at once; each is waited for where it is used.
# A development vCenter (govmomi's simulator with a template) for the vmgroups controller.
rm -f "${state}/vcenter.env" "${state}/upstream.env" "${state}/kyverno.ready"
start vcenter-sim bin/vcenter-sim --env-file "${state}/vcenter.env"
# AWS IAM for the iam controller: the emulator on a free port, which it logs.
start iam-emulator bin/iam-emulator --listen 127.0.0.1:0
# The registry a mirror pulls through from: it needs credentials and holds one small image.
start upstream-registry bin/upstream-registry --env-file "${state}/upstream.env"
# A CI system's identity tokens (GitHub Actions' shape): its OIDC issuer and the endpoint a job gets
# its token from, and a serving certificate for the manager's exchange.
ci="${state}/ci"
mkdir -p "${ci}"
start ci-issuer bin/demo-helper ci-issuer "${ci}"
# Kyverno, as the e2e tests run it: its admission, background and reports controllers as processes, under
# the RBAC its chart installs, webhooks registered by URL. Ready in about 10 s.
start kyverno bin/demo-helper kyverno "${kubeconfig}" "${state}/kyverno" "${state}/kyverno.ready"
# A node's containerd: its own root, state and socket, and the node's /etc/containerd a folder of
# the demo (where the node agent writes), with the one-directory config_path docs/mirrors.md asks for.
node_root="${state}/node"
containerd_sock="${state}/containerd/containerd.sock"
if ${as_root}; then
	mkdir -p "${node_root}/etc/containerd" "${state}/containerd"
	cat >"${node_root}/etc/containerd/config.toml" <<TOML
version = 3
root = "${state}/containerd/root"
state = "${state}/containerd/state"
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = "${containerd_sock}"

[ttrpc]
  address = "${containerd_sock}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "${state}/containerd/opt"

[plugins."io.containerd.cri.v1.images".registry]
  config_path = "/etc/containerd/certs.d"
TOML
	start_in_mounts containerd "${node_root}/etc/containerd:/etc/containerd" "${containerd_bin}" --config /etc/containerd/config.toml
fi

until_ok 20 "the development vCenter" test -s "${state}/vcenter.env" || { alive vcenter-sim; die "the development vCenter did not start"; }
kubectl -n quartermaster-system create secret generic vcenter --from-env-file="${state}/vcenter.env" \
	--dry-run=client -o yaml | kubectl apply --server-side --force-conflicts -f - >/dev/null
until_ok 20 "the IAM emulator" grep -q 'listening on http://' "${state}/iam-emulator.log" || { alive iam-emulator; die "the IAM emulator did not start"; }
iam_url="$(grep -o 'listening on http://[^ ]*' "${state}/iam-emulator.log" | head -n1 | cut -d' ' -f3)"
echo "${iam_url}" >"${state}/iam-emulator.url"

# sa_kubeconfig NAMESPACE SERVICEACCOUNT FILE: a kubeconfig with a token of the ServiceAccount, so a
# process runs with exactly the permissions it has in a real cluster.
server="$(kubectl config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')"
kubectl config view --raw --minify --flatten -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d >"${state}/ca.crt"
sa_kubeconfig() {
	local token
	token="$(kubectl -n "$1" create token "$2" --duration=24h)"
	rm -f "$3"
	"${bin_dir}/kubectl" --kubeconfig "$3" config set-cluster local --server="${server}" --certificate-authority="${state}/ca.crt" --embed-certs >/dev/null
	"${bin_dir}/kubectl" --kubeconfig "$3" config set-credentials "$2" --token="${token}" >/dev/null
	"${bin_dir}/kubectl" --kubeconfig "$3" config set-context "$2" --cluster=local --user="$2" --namespace="$1" >/dev/null
	"${bin_dir}/kubectl" --kubeconfig "$3" config use-context "$2" >/dev/null
}
manager_kubeconfig="${state}/manager.kubeconfig"
sa_kubeconfig quartermaster-system quartermaster-manager "${manager_kubeconfig}"

# The shipped defaults, and a smaller profile that the keyless pull-request rule gives its namespaces.
cat config/manager/namespace-defaults.yaml - >"${state}/namespace-defaults.yaml" <<'YAML'
profiles:
  pull-requests:
    resourceQuota: {hard: {requests.cpu: "1", requests.memory: 2Gi, pods: "10"}}
    isolateNetwork: true
YAML
until_ok 20 "the CI system's issuer" test -e "${ci}/ready" || { alive ci-issuer; die "the CI system's issuer did not start"; }

log "starting the manager (logs: ${state}/manager.log)"
# The manager's AWS SDK finds the IAM emulator through the standard AWS_ENDPOINT_URL_IAM /
# AWS_ENDPOINT_URL_STS variables and signs with dummy keys (the emulator accepts any signature). It
# trusts the CI system's issuer's certificate as it would a public CA's (SSL_CERT_FILE).
# shellcheck disable=SC2086 # QM_DEMO_ARGS is a list of flags
AWS_ENDPOINT_URL_IAM="${iam_url}" AWS_ENDPOINT_URL_STS="${iam_url}" AWS_REGION=us-east-1 \
	AWS_ACCESS_KEY_ID=AKIDDEMOEXAMPLE AWS_SECRET_ACCESS_KEY=demo-not-a-secret AWS_EC2_METADATA_DISABLED=true \
	SSL_CERT_FILE="${ci}/ca.pem" \
	start manager "${root}/bin/quartermaster" --kubeconfig="${manager_kubeconfig}" \
	--leader-elect --leader-election-namespace=quartermaster-system \
	--health-probe-bind-address="${probe_addr}" --metrics-bind-address="${metrics_addr}" \
	--namespace-defaults="${state}/namespace-defaults.yaml" \
	--exchange-bind-address="${exchange_addr}" --exchange-cert-dir="${ci}/exchange-tls" \
	--vsphere-secret=quartermaster-system/vcenter --vsphere-insecure \
	--cluster-name=demo --oidc-issuer=https://oidc.eks.us-east-1.amazonaws.com/id/DEMO \
	--allowed-policy-arns='arn:aws:iam::aws:policy/ReadOnlyAccess' \
	--intents-exception-namespace=kyverno-exceptions \
	${QM_DEMO_ARGS:-}
manager_ready() { alive manager && curl -fsS "http://${probe_addr}/readyz"; }
until_ok 30 "the manager to be ready" manager_ready || die "the manager did not become ready"

log "applying config/samples, a RegistryMirror of the upstream registry and two security intents"
if [[ -n "$(kubectl kustomize config/samples)" ]]; then
	kubectl apply --server-side -k config/samples >/dev/null
fi
# The mirror: its credentials Secret, and a volume for its cache pod's claim (no provisioner runs).
until_ok 30 "the upstream registry" test -s "${state}/upstream.env" || { alive upstream-registry; die "the upstream registry did not start"; }
# shellcheck source=/dev/null
source "${state}/upstream.env"
kubectl -n "${mirrors_ns}" create secret generic "${mirror}-pull" \
	--from-literal=username="${UPSTREAM_USERNAME}" --from-literal=password="${UPSTREAM_PASSWORD}" \
	--dry-run=client -o yaml | kubectl apply --server-side --force-conflicts -f - >/dev/null
kubectl apply --server-side -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolume
metadata: {name: demo-mirror-cache}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  hostPath: {path: /var/lib/demo-mirror-cache}
---
apiVersion: registry.quartermaster.dev/v1alpha1
kind: RegistryMirror
metadata: {name: ${mirror}}
spec:
  upstreamUrl: ${UPSTREAM_URL}
  credentialsSecret: ${mirror}-pull
  replicas: 1
  storage: {size: 1Gi, storageClassName: ""}
YAML
# The intents (as config/samples/intents): escapeToHost (KubeArmor and Kyverno's restricted pod
# security) and denyExternalNetworkAccess (a NetworkPolicy) for the pods labelled app=nginx.
kubectl create namespace "${intents_ns}" --dry-run=client -o yaml | kubectl apply --server-side -f - >/dev/null
kubectl apply --server-side -n "${intents_ns}" -f - >/dev/null <<YAML
apiVersion: intent.security.nimbus.com/v1alpha1
kind: SecurityIntent
metadata: {name: escape-to-host}
spec:
  intent: {id: escapeToHost, action: Block, params: {psaLevel: [restricted]}}
---
apiVersion: intent.security.nimbus.com/v1alpha1
kind: SecurityIntent
metadata: {name: deny-external-network}
spec:
  intent: {id: denyExternalNetworkAccess, action: Block}
---
apiVersion: intent.security.nimbus.com/v1alpha1
kind: SecurityIntentBinding
metadata: {name: escape-to-host-binding}
spec:
  intents: [{name: escape-to-host}, {name: deny-external-network}]
  selector: {workloadSelector: {matchLabels: {app: nginx}}}
YAML

# Namespace requests are ConfigMaps: wait for each to be served.
for cm in $(kubectl kustomize config/samples | awk '/^kind: ConfigMap/{c=1} c&&/^  name:/{print $2; c=0}'); do
	served() { [[ "$(kubectl -n namespace-requests get configmap "$1" -o jsonpath='{.metadata.annotations.quartermaster\.dev/status}')" == Ready ]]; }
	until_ok 60 "namespace request ${cm}" served "${cm}" || fail "namespace request ${cm} is not Ready"
done
kinds="$(kubectl api-resources -o name 2>/dev/null | grep -E '\.quartermaster\.dev$' | sort || true)"
for kind in ${kinds}; do
	[[ -n "$(kubectl get "${kind}" -A -o name 2>/dev/null)" ]] || continue # no sample of this kind
	kubectl wait --for=condition=Ready "${kind}" --all -A --timeout=180s >/dev/null 2>&1 ||
		fail "not every ${kind} is Ready"
done

if [[ "${mode}" != check ]]; then
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
fi

header "Keyless pipelines: a CI job's identity token instead of a stored credential (namespaces controller; docs/namespaces.md)"
audience=https://quartermaster.demo
kubectl apply --server-side -f - >/dev/null <<YAML
apiVersion: namespaces.quartermaster.dev/v1alpha1
kind: TrustedIssuer
metadata: {name: demo-github}
spec:
  issuerURL: $(cat "${ci}/issuer.url")
  audience: ${audience}
  identityClaim: repository
  maxNamespacesPerIdentity: 3
  rules:
    - name: pull-requests
      claims: {repository: ["acme/*"], event_name: [pull_request]}
      namespace: demo-{repository|last}-pr-{ref|pull}
      ttl: 2h
      defaults: pull-requests
YAML
kubectl wait tiss/demo-github --for=condition=Ready --timeout=60s >/dev/null || fail "TrustedIssuer demo-github is not Ready"
say "the platform trusts one CI issuer (hack/demo-helper ci-issuer, shaped as GitHub Actions'); Ready once its signing keys were read:"
show kubectl get tiss
# job_token REPOSITORY: the identity token a job of REPOSITORY's pull request 7 gets from its CI system
# (as a GitHub job calls \$ACTIONS_ID_TOKEN_REQUEST_URL), for the exchange's audience.
job_token() {
	curl -fsS "$(cat "${ci}/token.url")?audience=${audience}&repository=$1&ref=refs/pull/7/merge&event_name=pull_request" | jq -r .value
}
# job_step TOKEN: a pipeline step holding nothing but its token (no kubeconfig, no HOME with one)
# asks the exchange for its namespace; prints what it said and returns its exit status.
mkdir -p "${ci}/job"
job_step() {
	env -i PATH=/usr/bin:/bin HOME="${ci}/job" QM_ID_TOKEN="$1" "${root}/bin/quartermaster" request \
		--exchange-url "https://${exchange_addr}" --exchange-ca-file "${ci}/exchange-tls/tls.crt" \
		--id-token-env QM_ID_TOKEN --kubeconfig-out "${ci}/job/kubeconfig" 2>&1
}
token="$(job_token acme/web)"
out="$(job_step "${token}")" || fail "the pipeline step of acme/web's pull request 7 failed: ${out}"
[[ "${out}" == *"namespace demo-web-pr-7 is ready"* ]] || fail "the pipeline step did not get demo-web-pr-7: ${out}"
say "a job of acme/web's pull request 7, holding only its identity token, runs: quartermaster request --exchange-url https://${exchange_addr} --id-token-env QM_ID_TOKEN"
show sed 's/^/  /' <<<"${out}"
job_kubectl() { "${bin_dir}/kubectl" --kubeconfig "${ci}/job/kubeconfig" "$@"; }
[[ "$(job_kubectl auth can-i create deployments)" == yes ]] || fail "the handed-out kubeconfig may not create deployments in demo-web-pr-7"
[[ "$(job_kubectl auth can-i create deployments -n default 2>/dev/null)" == no ]] || fail "the handed-out kubeconfig may create deployments in default"
say "the kubeconfig it got works in its namespace and nowhere else:"
show echo "  authenticates as $(job_kubectl auth whoami -o jsonpath='{.status.userInfo.username}'); create deployments in demo-web-pr-7: $(job_kubectl auth can-i create deployments), in default: $(job_kubectl auth can-i create deployments -n default 2>/dev/null || true)"
recorded="$(kubectl -n namespace-requests get configmap demo-web-pr-7 -o jsonpath='{.metadata.annotations.quartermaster\.dev/identity} {.metadata.annotations.quartermaster\.dev/defaults}')"
[[ "${recorded}" == "demo-github:acme/web pull-requests" ]] || fail "the request records ${recorded:-nothing}, want the identity demo-github:acme/web and the profile pull-requests"
quota="$(kubectl -n demo-web-pr-7 get resourcequota quartermaster-defaults -o jsonpath='{.spec.hard.pods}')"
[[ "${quota}" == 10 ]] || fail "demo-web-pr-7's quota allows ${quota:-no} pods, want the pull-requests profile's 10"
say "the request records which identity asked (never the token) and the rule's defaults profile, whose quota the namespace got:"
show kubectl -n namespace-requests get configmap demo-web-pr-7 \
	-o custom-columns='REQUEST:.metadata.name,STATUS:.metadata.annotations.quartermaster\.dev/status,IDENTITY:.metadata.annotations.quartermaster\.dev/identity,DEFAULTS:.metadata.annotations.quartermaster\.dev/defaults'
show kubectl -n demo-web-pr-7 get resourcequota
code=0
out="$(job_step "${token}")" || code=$?
[[ "${code}" == 2 && "${out}" == *replay* ]] || fail "the same token again: exit ${code}, ${out}; want exit 2 naming the replay"
say "the same token again (a stolen copy): refused, exit ${code}"
show sed 's/^/  /' <<<"${out}"
code=0
out="$(job_step "$(job_token evil/web)")" || code=$?
[[ "${code}" == 2 && "${out}" == *claims* ]] || fail "a fork's token: exit ${code}, ${out}; want exit 2 naming the claims"
say "a fork's job (repository evil/web) asks: no rule admits its claims, exit ${code}"
show sed 's/^/  /' <<<"${out}"

header "A registry mirror at work (mirrors controller; docs/mirrors.md)"
say "the upstream: a private registry (cmd/upstream-registry, distribution with htpasswd) holding ${IMAGE}; anonymous pulls are refused:"
show curl -sS -o /dev/null -w '  GET %{url} without credentials: HTTP %{http_code}\n' "${UPSTREAM_URL}/v2/"
kubectl wait "rm/${mirror}" --for=condition=Ready --timeout=120s >/dev/null || die "RegistryMirror ${mirror} is not Ready"
say "RegistryMirror ${mirror}: Ready once its credentials (Secret ${mirrors_ns}/${mirror}-pull) work upstream, its cache pod and its node agents (one per node) run:"
show kubectl get rm "${mirror}" -o wide
show kubectl -n "${mirrors_ns}" get sts,ds,svc,secret,pvc -l "registry.quartermaster.dev/mirror=${mirror}"

# The cache, as its StatefulSet's pod runs it: the rendered container's args and env, the cache
# Secret's keys as files at the Secret volume's mount path and a folder at the volume claim's.
# Only its listen addresses are loopback ports (a pod has a network namespace of its own).
sts="$(kubectl -n "${mirrors_ns}" get sts "mirror-${mirror}" -o json)"
mapfile -t cache_args < <(jq -r '.spec.template.spec.containers[0].args[]' <<<"${sts}")
# The pod's name and namespace come from the downward API; with a ServiceAccount the cache notes its
# pins on its Pod (--report-to-pod) with that account's token, as the kubelet would mount it.
mapfile -t cache_env < <(jq -r --arg pod "mirror-${mirror}-0" --arg ns "${mirrors_ns}" '.spec.template.spec.containers[0].env[]? |
	"\(.name)=\(.value // ({"metadata.name": $pod, "metadata.namespace": $ns}[.valueFrom.fieldRef.fieldPath]))"' <<<"${sts}")
cache_sa="$(jq -r '.spec.template.spec.serviceAccountName // ""' <<<"${sts}")"
if [[ -n "${cache_sa}" ]]; then
	sa_kubeconfig "${mirrors_ns}" "${cache_sa}" "${state}/mirror-cache.kubeconfig"
	cache_env+=("KUBECONFIG=${state}/mirror-cache.kubeconfig")
fi
claim="$(jq -r '.spec.volumeClaimTemplates[0].metadata.name' <<<"${sts}")"
secret_volume="$(jq -r --arg s "mirror-${mirror}-cache" '.spec.template.spec.volumes[] | select(.secret.secretName == $s) | .name' <<<"${sts}")"
secret_path="$(jq -r --arg v "${secret_volume}" '.spec.template.spec.containers[0].volumeMounts[] | select(.name == $v) | .mountPath' <<<"${sts}")"
claim_path="$(jq -r --arg v "${claim}" '.spec.template.spec.containers[0].volumeMounts[] | select(.name == $v) | .mountPath' <<<"${sts}")"
rm -rf "${state}/cache" && mkdir -p "${state}/cache/secret" "${state}/cache/volume"
kubectl -n "${mirrors_ns}" get secret "mirror-${mirror}-cache" -o json |
	jq -r '.data | to_entries[] | "\(.key) \(.value)"' | while read -r key value; do
	base64 -d <<<"${value}" >"${state}/cache/secret/${key}"
done
cache_args+=("--address=${cache_addr}" "--metrics-address=${cache_debug_addr}")
if ${as_root}; then
	start_in_mounts mirror-cache "${state}/cache/secret:${secret_path} ${state}/cache/volume:${claim_path}" \
		env "${cache_env[@]}" "${root}/bin/quartermaster" "${cache_args[@]}"
else # the same files where this user may put them: the paths in the args and the storage directory moved
	start mirror-cache env "${cache_env[@]}" \
		"${root}/bin/quartermaster" "${cache_args[@]//${secret_path}/${state}/cache/secret}" --storage-dir="${state}/cache/volume"
fi
cache_ready() { alive mirror-cache && curl -fsS "http://${cache_addr}/v2/"; }
until_ok 30 "the cache to be ready" cache_ready || die "the mirror's cache did not become ready"
say "its cache serving (quartermaster ${cache_args[*]}, as the StatefulSet runs it; logs ${state}/mirror-cache.log):"
show echo "  GET http://${cache_addr}/v2/: $(curl -sS -o /dev/null -w 'HTTP %{http_code}' "http://${cache_addr}/v2/")"

# The node agent, as its DaemonSet's pod on the first node runs it, as the agents' ServiceAccount:
# the rendered args and env, the node's root at the demo's folder, the cache at its loopback port
# (where a node reaches the mirror's Service).
ds="$(kubectl -n "${mirrors_ns}" get ds "mirror-${mirror}-agent" -o json)"
pod="$(kubectl -n "${mirrors_ns}" get pods -l "registry.quartermaster.dev/mirror=${mirror},app.kubernetes.io/component=node-agent" -o json | jq '.items | sort_by(.spec.nodeName) | .[0]')"
pod_name="$(jq -r .metadata.name <<<"${pod}")" node_name="$(jq -r .spec.nodeName <<<"${pod}")"
agent_args=()
while read -r a; do
	case "${a}" in
	--endpoint=*) a="--endpoint=http://${cache_addr}" ;;
	--root=*) a="--root=${node_root}" ;;
	--probe-address=*) a="--probe-address=127.0.0.1:0" ;;
	esac
	agent_args+=("${a}")
done < <(jq -r '.spec.template.spec.containers[0].args[]' <<<"${ds}")
mapfile -t agent_env < <(jq -r --arg pod "${pod_name}" --arg ns "${mirrors_ns}" --arg node "${node_name}" '.spec.template.spec.containers[0].env[]? |
	"\(.name)=\(.value // ({"metadata.name": $pod, "metadata.namespace": $ns, "spec.nodeName": $node}[.valueFrom.fieldRef.fieldPath]))"' <<<"${ds}")
sa_kubeconfig "${mirrors_ns}" "$(jq -r .spec.template.spec.serviceAccountName <<<"${ds}")" "${state}/node-agent.kubeconfig"
mkdir -p "${node_root}/etc/containerd"
start node-agent env KUBECONFIG="${state}/node-agent.kubeconfig" "${agent_env[@]}" "${root}/bin/quartermaster" "${agent_args[@]}"
configured() {
	alive node-agent && [[ "$(kubectl -n "${mirrors_ns}" get pod "${pod_name}" -o jsonpath='{.metadata.annotations.registry\.quartermaster\.dev/node-configured}')" == true ]]
}
hosts_toml="${node_root}/etc/containerd/certs.d/${UPSTREAM_HOST}/hosts.toml"
if ${as_root}; then
	until_ok 30 "the node agent to report node ${node_name} configured" configured ||
		fail "the node agent did not configure ${node_name}: its Pod says $(kubectl -n "${mirrors_ns}" get pod "${pod_name}" -o jsonpath='node-configured={.metadata.annotations.registry\.quartermaster\.dev/node-configured} ({.metadata.annotations.registry\.quartermaster\.dev/node-configured-reason}: {.metadata.annotations.registry\.quartermaster\.dev/node-configured-message})' 2>&1)"
else # no containerd here, so nothing reads the file: the agent reports that, and wrote it anyway
	until_ok 30 "the node agent to write ${hosts_toml}" test -s "${hosts_toml}" || fail "the node agent wrote no hosts.toml"
fi
log "the mirror's node agent runs"
say "the node's hosts.toml the node agent wrote (quartermaster node-agent as the DaemonSet runs it, --root=${node_root}); its Pod ${pod_name} reports:"
${as_root} || show echo "  (no containerd runs here, so the agent rightly reports the node not configured)"
show kubectl -n "${mirrors_ns}" get pod "${pod_name}" -o jsonpath='  node-configured={.metadata.annotations.registry\.quartermaster\.dev/node-configured} ({.metadata.annotations.registry\.quartermaster\.dev/node-configured-reason}){"\n"}'
show sed 's/^/  /' "${hosts_toml}"

if ${as_root}; then
	say "${IMAGE} pulled twice by a real containerd ${containerd_bin%/containerd} (CRI PullImage, as a kubelet, no credentials): the first fills the cache, the second is served from it"
	for _ in 1 2; do
		out="$(bin/demo-helper cri-pull "${containerd_sock}" "${IMAGE}" 2>&1)" || { alive containerd; die "${out}"; }
		show echo "  ${out}"
	done
else
	say "${IMAGE} pulled twice through the cache by the project's client code (not root: no containerd): the first fills the cache, the second is served from it"
	for _ in 1 2; do
		out="$(bin/demo-helper registry-pull "${cache_addr}" "${IMAGE}" 2>&1)" || die "${out}"
		show echo "  ${out}"
	done
fi
log "pulled through the mirror"
metrics="$(curl -fsS "http://${cache_debug_addr}/metrics")"
served="$(awk '$1 == "quartermaster_mirror_http_requests_total{code=\"200\",method=\"get\"}" {print $2}' <<<"${metrics}")"
hits="$(awk '$1 == "quartermaster_mirror_cache_requests_total{result=\"hit\",type=\"blob\"}" {print $2}' <<<"${metrics}")"
[[ "${served:-0}" -ge 6 && "${hits:-0}" -ge 2 ]] || fail "the cache served ${served:-no} GETs and ${hits:-no} blob hits, want the manifest and two blobs twice, the second time from its store"
say "the cache's counters (http://${cache_debug_addr}/metrics): requests it answered, its hits and misses, what it fetched upstream (each blob once)"
show grep -E '^quartermaster_mirror_(http_requests|cache_requests|upstream_requests|upstream_bytes|coalesced_requests|fills)_total' <<<"${metrics}"

header "Security intents (intents controller; docs/intents.md)"
say "the engines' CRDs installed: KubeArmor's (from its Go module) and Kyverno's (hack/kyverno-bin.sh, ${kyverno_bin})"
show kubectl get crd kubearmorpolicies.security.kubearmor.com policies.kyverno.io clusterpolicies.kyverno.io
until_ok 180 "Kyverno to be ready" test -s "${state}/kyverno.ready" || { alive kyverno; die "Kyverno did not become ready (log: ${state}/kyverno.log)"; }
log "Kyverno is ready"
say "Kyverno ${kyverno_bin##*-} running (its admission, background and reports controllers as processes, webhooks at https://$(cat "${state}/kyverno.ready")):"
show kubectl get validatingwebhookconfigurations -l webhook.kyverno.io/managed-by
for kind in si sib np; do
	kubectl wait -n "${intents_ns}" "${kind}" --all --for=condition=Ready --timeout=60s >/dev/null || fail "not every ${kind} in ${intents_ns} is Ready"
done
say "a SecurityIntent per threat and a binding choosing the pods (app=nginx in ${intents_ns}); its NimbusPolicy, Ready once every engine enforces it:"
show kubectl get -n "${intents_ns}" si,sib,np
say "what the intents controller generated for the engines: KubeArmor policies, a NetworkPolicy and a Kyverno Policy (Ready in Kyverno):"
# (kubectl warns that kyverno.io/v1 is deprecated: it is what the intents controller writes, as Nimbus does.)
generated="$(kubectl get -n "${intents_ns}" kubearmorpolicies,networkpolicies,policies.kyverno.io -o name 2>/dev/null)"
for want in kubearmorpolicy networkpolicy policy.kyverno.io; do
	grep -q "^${want}" <<<"${generated}" || fail "no ${want} was generated in ${intents_ns}"
done
show kubectl get -n "${intents_ns}" kubearmorpolicies,networkpolicies,policies.kyverno.io 2>/dev/null
# A privileged Pod labelled app=nginx: Kyverno refuses it (the API server applies a webhook a moment
# after Kyverno registers it, and the policy a moment after it is Ready: polled, as dry runs).
privileged_pod() {
	kubectl run -n "${intents_ns}" privileged-nginx --image=nginx --labels=app=nginx --restart=Never "$@" \
		--overrides='{"spec":{"containers":[{"name":"privileged-nginx","image":"nginx","securityContext":{"privileged":true}}]}}' 2>&1
}
refused() { [[ "$(privileged_pod --dry-run=server)" == *"blocked due to the following policies"* ]]; }
until_ok 60 "Kyverno to refuse a privileged app=nginx Pod" refused || fail "Kyverno did not refuse a privileged app=nginx Pod"
say "a privileged Pod labelled app=nginx, refused by Kyverno (kubectl run -n ${intents_ns} privileged-nginx --labels=app=nginx, privileged):"
out="$(privileged_pod)" && fail "the privileged Pod was admitted: ${out}"
grep -q 'blocked due to the following policies' <<<"${out}" || fail "the privileged Pod was refused, but not by Kyverno: ${out}"
show sed 's/^/  /' <<<"${out}"

# Impact before promotion: a privileged app=legacy Pod that already runs, an Audit intent bound to it;
# Kyverno's reports controller scans it, the intent's status names it, and promotion is refused.
kubectl apply --server-side -n "${intents_ns}" -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: legacy-agent, labels: {app: legacy}}
spec: {containers: [{name: agent, image: nginx, securityContext: {privileged: true}}]}
---
apiVersion: intent.security.nimbus.com/v1alpha1
kind: SecurityIntent
metadata: {name: escape-to-host-audit}
spec:
  intent: {id: escapeToHost, action: Audit}
---
apiVersion: intent.security.nimbus.com/v1alpha1
kind: SecurityIntentBinding
metadata: {name: legacy-audit}
spec:
  intents: [{name: escape-to-host-audit}]
  selector: {workloadSelector: {matchLabels: {app: legacy}}}
YAML
impact() { [[ "$(kubectl get si escape-to-host-audit -o jsonpath='{.status.impact.state} {.status.impact.violations}')" == "Current 1" ]]; }
until_ok 120 "the Audit intent's impact to name the privileged Pod" impact || fail "si/escape-to-host-audit impact: $(kubectl get si escape-to-host-audit -o jsonpath='{.status.impact}')"
say "an Audit intent over a privileged Pod that already runs: the existing workloads that violate it, from Kyverno's own reports (kubectl get si):"
show kubectl get si escape-to-host-audit
show kubectl get si escape-to-host-audit -o jsonpath='{range .status.impact.violating[*]}{.namespace}/{.kind}/{.name}: {.message}{"\n"}{end}'
say "promotion to Block is refused while it would break something (quartermaster promote escape-to-host-audit; exit 2):"
code=0
out="$("${root}/bin/quartermaster" promote --kubeconfig "${kubeconfig}" escape-to-host-audit 2>&1)" || code=$?
[[ ${code} == 2 && "${out}" == *legacy-agent* ]] || fail "promote: exit ${code}, want 2 naming legacy-agent: ${out}"
show sed 's/^/  /' <<<"${out}"

# An exception for the Pod (owner, reason, expiry): Kyverno's own PolicyException, in the namespace
# Kyverno accepts them in (kyverno-exceptions, as its chart's features.policyExceptions); Kyverno's
# rescan skips the Pod under it, the impact falls to 0, and the promotion goes through.
kubectl apply --server-side -n "${intents_ns}" -f - >/dev/null <<YAML
apiVersion: security.quartermaster.dev/v1alpha1
kind: SecurityIntentException
metadata: {name: legacy-agent}
spec:
  intent: escape-to-host-audit
  workloads: {selector: {matchLabels: {app: legacy}}}
  owner: team-legacy
  reason: the vendor's agent needs privileged until its v2 ships
  expires: "$(date -u -d '+7 days' +%Y-%m-%dT%H:%M:%SZ)"
YAML
exempted() { [[ "$(kubectl get sie -n "${intents_ns}" legacy-agent -o jsonpath='{.status.exempted}')" == "1" &&
	"$(kubectl get si escape-to-host-audit -o jsonpath='{.status.impact.state} {.status.impact.violations}')" == "Current 0" ]]; }
until_ok 120 "Kyverno to skip the Pod under the exception" exempted ||
	fail "sie/legacy-agent: $(kubectl get sie -n "${intents_ns}" legacy-agent -o jsonpath='{.status}'); impact $(kubectl get si escape-to-host-audit -o jsonpath='{.status.impact}')"
say "an exception with an owner, a reason and an expiry: Kyverno's own PolicyException, which Kyverno's reports say it skipped the Pod under (kubectl get sie):"
show kubectl get sie -n "${intents_ns}" legacy-agent
show kubectl get policyexceptions.kyverno.io -n kyverno-exceptions
say "the intent's impact falls to 0, and the promotion goes through (quartermaster promote escape-to-host-audit):"
code=0
out="$("${root}/bin/quartermaster" promote --kubeconfig "${kubeconfig}" --timeout 2m escape-to-host-audit 2>&1)" || code=$?
[[ ${code} == 0 && "${out}" == *"Block is in force"* ]] || fail "promote: exit ${code}, want 0 and Block in force: ${out}"
show sed 's/^/  /' <<<"${out}"

show echo
show echo "export KUBECONFIG=${kubeconfig}   # then: kubectl get <kind>; make demo-down to clean up"
