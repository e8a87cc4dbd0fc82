#!/usr/bin/env bash
# make test: every stage CI runs, in two lanes side by side, then the table of where the time went.
#
#   lane "code":    lint, generated files, unit + envtest (Kubernetes 1.37, -race), envtest on 1.30
#   lane "cluster": e2e on the kwok cluster, then the chart on a real node
#
# The lanes share nothing but the Go build cache and the machine: the code lane is CPU-bound, the
# cluster lane mostly waits on clusters, so together they take little more than the longer one.
# Each stage is run by bin/testreport (hack/testreport): its wall and CPU time and its result go to
# bin/test-report/NAME.stage.json, a go test stage's events to NAME.jsonl, and the summary (the
# stage table and the slowest tests) to bin/test-report/summary.txt, which CI keeps. Each lane's
# output goes to bin/test-report/LANE.log and is printed whole when the lane ends, so the two do
# not interleave. QM_TEST_LANES=serial runs the same stages one after another.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

report="${QM_TEST_REPORT_DIR:-bin/test-report}"
export QM_TEST_REPORT_DIR="${report}"
rm -rf "${report}"
mkdir -p "${report}"
make --no-print-directory bin/testreport >/dev/null

# The binaries every stage needs are built (or found in the cache) first, once: two lanes
# building the same cache entry would wait on each other's lock anyway.
if ! bin/testreport stage prepare -- make --no-print-directory test-prepare; then
	bin/testreport summary
	exit 1
fi

lane() {
	local name="$1"
	shift
	local log="${report}/${name}.log" status=0
	for target in "$@"; do
		echo "[${name}] ${target} started $(date -u +%H:%M:%S)"
		if ! make --no-print-directory "${target}" >>"${log}" 2>&1; then
			status=1
			echo "[${name}] ${target} FAILED $(date -u +%H:%M:%S)"
			break
		fi
		echo "[${name}] ${target} passed $(date -u +%H:%M:%S)"
	done
	echo "===== lane ${name}: ${log} ====="
	cat "${log}"
	return "${status}"
}

code=(test-lint test-generated test-unit test-k8s-min)
clusters=(test-e2e test-real-node)
failed=0
if [[ "${QM_TEST_LANES:-}" == serial ]]; then
	lane code "${code[@]}" || failed=1
	lane cluster "${clusters[@]}" || failed=1
else
	lane code "${code[@]}" & code_pid=$!
	lane cluster "${clusters[@]}" & cluster_pid=$!
	wait "${code_pid}" || failed=1
	wait "${cluster_pid}" || failed=1
fi
echo
bin/testreport summary
exit "${failed}"
