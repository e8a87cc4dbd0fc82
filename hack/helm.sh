#!/usr/bin/env bash
# Helm (v4, built from the module proxy by hack/tools/helm/go.mod, cached by Go's build cache), run
# from anywhere: hack/helm.sh template quartermaster charts/quartermaster -n quartermaster-system.
# Relative paths in the arguments are taken from the current folder.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# go tool needs a main module for -modfile, so helm runs in the repository: the arguments that name
# existing files or folders are made absolute first.
args=()
for a in "$@"; do
	if [[ "$a" != -* && -e "$a" ]]; then a="$(cd "$(dirname "$a")" && pwd)/$(basename "$a")"; fi
	args+=("$a")
done
cd "${root}"
exec go tool -modfile=hack/tools/helm/go.mod helm "${args[@]}"
