#!/usr/bin/env bash
# The manager's OCI image without a Docker engine (make image, make image-push):
#   hack/image.sh build [--out bin/image] [--tag dev] [--platforms linux/amd64,linux/arm64]
#   hack/image.sh push [--layout bin/image/oci] [--insecure] REGISTRY/quartermaster:TAG
# It runs hack/image (go run; its comment says what the image holds), after making sure the build
# machine has what the image takes from it: the CA certificates of Debian's ca-certificates
# package (installed with apt-get when this runs as root) and GNU tar.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ "${1:-}" == build ]]; then
	if [[ -z "$(ls /usr/share/ca-certificates/mozilla/*.crt 2>/dev/null)" ]]; then
		if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
			echo "hack/image.sh: installing Debian's ca-certificates (the image's CA certificates)" >&2
			apt-get update -qq >&2
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ca-certificates >&2
		else
			echo "hack/image.sh: the image's CA certificates come from Debian's ca-certificates package, which is not installed: run 'sudo apt-get install ca-certificates' (or run this as root on Debian or Ubuntu)" >&2
			exit 1
		fi
	fi
	if ! tar --version 2>/dev/null | grep -q 'GNU tar'; then
		echo "hack/image.sh: GNU tar is needed to make reproducible layers: install it (Debian: tar; macOS: brew install gnu-tar and put its gnubin first in PATH)" >&2
		exit 1
	fi
fi
exec go run ./hack/image "$@"
