#!/usr/bin/env bash
# make test-k8s-min: the envtests hack/k8s-min-tests.txt lists (what depends on the API server's
# version), each package with its own -run pattern (go test's -run splits a pattern at every "/",
# so one alternation cannot name subtests of several tests), against KUBEBUILDER_ASSETS. Prints
# go test -json events; fails when any run fails, after running them all.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
failed=0
while read -r pkg pattern; do
	[[ -z "${pkg}" || "${pkg}" == \#* ]] && continue
	go test -json -count=1 -timeout 10m -run "${pattern}" "${pkg}" || failed=1
done < hack/k8s-min-tests.txt
exit "${failed}"
