#!/usr/bin/env bash
# make test: every stage CI runs, in three lanes side by side, then the table of where the time went.
#
#   lane "code":      lint, generated files, unit + envtest (Kubernetes 1.37, -race), envtest on 1.30
#   lane "e2e":       e2e on the kwok cluster (qm-e2e)
#   lane "real-node": the chart on a real node (a cluster of its own, in network namespaces)
#
# The lanes share nothing but the Go build cache and the machine: the code lane is CPU-bound, the
# cluster lanes mostly wait on their clusters (the real node's 4.5 minutes cost 1.5 of CPU), so
# together they take little more than the longest.
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

failed=0
if [[ "${QM_TEST_LANES:-}" == serial ]]; then
	lane code test-lint test-generated test-unit test-k8s-min test-e2e test-real-node || failed=1
else
	lane code test-lint test-generated test-unit test-k8s-min & code=$!
	lane e2e test-e2e & e2e=$!
	lane real-node test-real-node & realnode=$!
	for pid in "${code}" "${e2e}" "${realnode}"; do
		wait "${pid}" || failed=1
	done
fi
echo
bin/testreport summary
exit "${failed}"
