#!/usr/bin/env bash
# make test-k8s-min: the envtests hack/k8s-min-tests.txt lists (what depends on the API server's
# version), each line one go test with its own -run pattern (go test's -run splits a pattern at
# every "/", so one alternation cannot name subtests of several tests), two at a time, against
# KUBEBUILDER_ASSETS. Prints go test -json events (each line whole); fails when any run fails,
# after running them all.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
grep -v -e '^#' -e '^[[:space:]]*$' hack/k8s-min-tests.txt |
	xargs -P 2 -L 1 sh -c 'go test -json -count=1 -timeout 10m -run "$2" "$1"' sh
