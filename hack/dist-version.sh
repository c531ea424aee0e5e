#!/usr/bin/env bash
# dist-version.sh — the version `make dist` gives the plugin archives and
# the krew manifest: the tag on HEAD (a release is built from its tag, so
# `kubectl etcdbackup version` names it). An untagged commit gets
# v0.0.0-dev+COMMIT, never the previous release's tag: archives claiming a
# release they were not built from would be worse than an obvious dev
# version. krew wants a semantic version with a leading v; a tag that is not
# one is refused here rather than by krew's validation later.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if tag=$(git describe --tags --exact-match HEAD 2>/dev/null); then
	if [[ ! $tag =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$ ]]; then
		echo "dist-version: tag $tag on HEAD is not a semantic version vMAJOR.MINOR.PATCH[-PRE] that krew accepts; set DIST_VERSION=vX.Y.Z" >&2
		exit 1
	fi
	echo "$tag"
	exit 0
fi
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
dirty=""
if [[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]]; then
	dirty=.dirty
fi
latest=$(git describe --tags --abbrev=0 HEAD 2>/dev/null || true)
echo "dist-version: HEAD ($commit) has no tag${latest:+ (the latest tag, $latest, is on an earlier commit)}: building v0.0.0-dev+$commit$dirty. For a release, tag it (git tag vX.Y.Z) or set DIST_VERSION=vX.Y.Z." >&2
echo "v0.0.0-dev+$commit$dirty"
