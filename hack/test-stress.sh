#!/usr/bin/env bash
# The unit + envtest suite run twice at once, ROUNDS (default 3) rounds in a row: the load of a
# busy CI machine, where caches lag and timings stretch. Fails at the first round with a failing
# run and prints its failures; the full logs stay in the folder it names.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

rounds="${ROUNDS:-3}"
assets="$(hack/k8s-bin.sh | tail -n1)"
logs="$(mktemp -d "${TMPDIR:-/tmp}/qm-stress.XXXXXX")"
export KUBEBUILDER_ASSETS="${assets}"

# Compile once, so both runs start testing at the same time.
go test -race -count=1 -run '^$' ./... >/dev/null

for round in $(seq 1 "${rounds}"); do
	start=$(date +%s)
	go test -race -count=1 -timeout 30m ./... >"${logs}/round${round}-a.log" 2>&1 & a=$!
	go test -race -count=1 -timeout 30m ./... >"${logs}/round${round}-b.log" 2>&1 & b=$!
	failed=0
	wait "${a}" || failed=1
	wait "${b}" || failed=1
	echo "round ${round}/${rounds}: $(( $(date +%s) - start ))s, $([[ ${failed} == 0 ]] && echo passed || echo FAILED)"
	if [[ ${failed} != 0 ]]; then
		grep -hE '^(--- FAIL|FAIL|panic:)|_test\.go:[0-9]+:' "${logs}/round${round}-"*.log | grep -v '^ok' | head -n 60 || true
		echo "logs: ${logs}"
		exit 1
	fi
done
echo "all ${rounds} rounds passed (logs: ${logs})"
