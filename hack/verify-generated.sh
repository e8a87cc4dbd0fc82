#!/usr/bin/env bash
# Fails when the committed generated files (CRDs, RBAC, deepcopy) differ from what the markers
# generate now. It regenerates them in place, so after a failure the tree holds the fresh files:
# review and commit them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

generated() {
	{ find config/crd/bases config/rbac/generated config/rbac/tenant/tenant_roles.yaml charts/quartermaster/templates/crds charts/quartermaster/files -type f; find . -name zz_generated.deepcopy.go -not -path './.git/*'; } | sort
}
snapshot() { generated | while read -r f; do sha256sum "$f"; done; }

before="$(snapshot)"
make --no-print-directory manifests generate >/dev/null
after="$(snapshot)"
if [[ "${before}" != "${after}" ]]; then
	echo "generated files were stale (now regenerated; review and commit them):" >&2
	diff <(echo "${before}") <(echo "${after}") >&2 || true
	exit 1
fi
echo "generated files are up to date"
