#!/usr/bin/env bash
# Fails when the committed generated files (CRDs, RBAC, deepcopy, the chart's copies) differ from
# what the markers generate now. It generates them in a copy of the tree: `make test` runs this
# beside the e2e lane, which builds from and installs this tree's chart, and a regeneration in place
# removed and rewrote the chart's files under a running `helm install` ("the chart has no file
# files/rbac/…"). When they were stale the fresh files are copied into the tree afterwards: review
# and commit them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

generated() {
	(cd "$1" && { find config/crd/bases config/rbac/generated config/rbac/tenant/tenant_roles.yaml charts/quartermaster/templates/crds charts/quartermaster/files -type f; find . -name zz_generated.deepcopy.go -not -path './.git/*' | sed 's|^\./||'; } | sort)
}
snapshot() { generated "$1" | while read -r f; do (cd "$1" && sha256sum "$f"); done; }

copy="$(mktemp -d)"
trap 'rm -rf "${copy}"' EXIT
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
	[[ -e "$f" ]] && printf '%s\0' "$f"
done | tar -cf - --null -T - | tar -xf - -C "${copy}"

(cd "${copy}" && make --no-print-directory manifests generate >/dev/null)
before="$(snapshot .)"
after="$(snapshot "${copy}")"
if [[ "${before}" != "${after}" ]]; then
	echo "generated files were stale (now regenerated; review and commit them):" >&2
	diff <(echo "${before}") <(echo "${after}") >&2 || true
	generated . | while read -r f; do [[ -e "${copy}/$f" ]] || rm -f "$f"; done
	generated "${copy}" | while read -r f; do mkdir -p "$(dirname "$f")" && cp "${copy}/$f" "$f"; done
	exit 1
fi
echo "generated files are up to date"
