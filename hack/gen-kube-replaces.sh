#!/usr/bin/env bash
# gen-kube-replaces.sh — (re)generate the replace block of tools/kube/go.mod.
#
# k8s.io/kubernetes is not meant to be used as a module dependency: its go.mod
# requires every k8s.io/<staging> module at v0.0.0 and points them at
# ./staging/src/... with local replaces, which do not apply to a consumer. A
# consumer has to replace each staging module with its published tag
# (k8s.io/kubernetes v1.X.Y <-> k8s.io/<staging> v0.X.Y). The list of staging
# modules changes between releases, so we read it from the exact go.mod of the
# pinned k8s.io/kubernetes version instead of typing it by hand.
#
# Usage: hack/gen-kube-replaces.sh [KUBE_VERSION]   (default: the version
# tools/kube/go.mod requires). Then run `go mod tidy` in tools/kube.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mod_dir="$repo_root/tools/kube"

cd "$mod_dir"
kube_version=${1:-$(go list -m -f '{{.Version}}' k8s.io/kubernetes)}
if [[ ! $kube_version =~ ^v1\.([0-9]+\.[0-9]+)$ ]]; then
	echo "gen-kube-replaces: unexpected k8s.io/kubernetes version '$kube_version' (want v1.X.Y)" >&2
	exit 1
fi
staging_version="v0.${BASH_REMATCH[1]}"

# Path of the pinned k8s.io/kubernetes go.mod in the module cache (downloads
# only the .mod file's module if needed; verified against the checksum db).
gomod=$(go mod download -json "k8s.io/kubernetes@$kube_version" |
	sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
if [[ -z $gomod || ! -f $gomod ]]; then
	echo "gen-kube-replaces: could not locate go.mod of k8s.io/kubernetes@$kube_version" >&2
	exit 1
fi

# Staging modules = the left-hand side of every "k8s.io/X => ./staging/..."
# replace in upstream's go.mod (block or single-line form).
mapfile -t staging < <(
	sed -n 's#^[[:space:]]*\(replace[[:space:]]\+\)\{0,1\}\(k8s\.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/.*#\2#p' "$gomod" | sort -u
)
if ((${#staging[@]} == 0)); then
	echo "gen-kube-replaces: no staging replaces found in $gomod" >&2
	exit 1
fi

# Replace every staging module (go mod edit updates an existing replace in
# place, so a re-run leaves go.mod byte-identical), and drop k8s.io/* replaces
# for modules upstream no longer has, so none lingers.
args=()
while read -r old; do
	keep=0
	for m in "${staging[@]}"; do
		[[ $m == "$old" ]] && keep=1 && break
	done
	((keep)) || args+=("-dropreplace=$old")
done < <(sed -n 's#^[[:space:]]*\(replace[[:space:]]\+\)\{0,1\}\(k8s\.io/[^[:space:]]*\)[[:space:]]*=>.*#\2#p' go.mod | sort -u)
for m in "${staging[@]}"; do
	args+=("-replace=$m=$m@$staging_version")
done
go mod edit "-require=k8s.io/kubernetes@$kube_version" "${args[@]}"

echo "gen-kube-replaces: k8s.io/kubernetes $kube_version: ${#staging[@]} staging modules replaced at $staging_version" >&2
