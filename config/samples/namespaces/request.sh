#!/usr/bin/env bash
# Ask for a namespace with kubectl alone, with only the rights of pipeline-rbac.yaml (get, no
# watch): what `quartermaster request NAME` does, for pipelines without the binary.
#
#   request.sh NAME [TTL] > kubeconfig      e.g. request.sh ci-pr-123 2h > kubeconfig
#
# Exits 0 with the kubeconfig on stdout once the namespace is ready; 2 at once when the request is
# refused (Invalid or Conflict: the controller's reason on stderr); 1 after REQUEST_TIMEOUT seconds
# (default 120). REQUESTS_NAMESPACE defaults to namespace-requests.
set -euo pipefail
name="$1"
ttl="${2:-}"
ns="${REQUESTS_NAMESPACE:-namespace-requests}"
annotation() { kubectl -n "${ns}" get configmap "${name}" -o "jsonpath={.metadata.annotations.quartermaster\.dev/$1}"; }

if ! kubectl -n "${ns}" get configmap "${name}" >/dev/null 2>&1; then
	kubectl -n "${ns}" create configmap "${name}" ${ttl:+--from-literal=ttl="${ttl}"} >/dev/null
fi
deadline=$(( $(date +%s) + ${REQUEST_TIMEOUT:-120} ))
while :; do
	status="$(annotation status)"
	case "${status}" in
	Ready) break ;;
	Invalid | Conflict)
		echo "request ${ns}/${name} is ${status} ($(annotation reason)): $(annotation message)" >&2
		exit 2 ;;
	esac
	if (( $(date +%s) >= deadline )); then
		echo "request ${ns}/${name} not served in time; last status: ${status:-none} $(annotation message)" >&2
		exit 1
	fi
	sleep 1
done
kubectl -n "${ns}" get secret "${name}" -o jsonpath='{.data.kubeconfig}' | base64 -d
