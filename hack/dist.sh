#!/usr/bin/env bash
# dist.sh [VERSION] — build the plugin for every platform krew serves into
# dist/, one .tar.gz each (binary, the kubectl_complete-etcdbackup
# completion shim, LICENSE) with its SHA-256, and write the krew manifest
# dist/etcdbackup.yaml from krew/etcdbackup.yaml.tmpl. VERSION defaults to
# the tag on HEAD (hack/dist-version.sh). DIST_DIR writes elsewhere than
# dist/ (make test's krew check does, so as not to remove dist/images, which
# the end-to-end tests beside it read).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=${1:-$("$root/hack/dist-version.sh")}
dist=${DIST_DIR:-$root/dist}
url=${RELEASE_URL:-https://github.com/kubectl-etcdbackup/kubectl-etcdbackup/releases/download/$version}
# Every platform in krew/platforms; DIST_PLATFORMS narrows the list (CI
# checks the manifest with this machine's platform only, to spare four cold
# cross-builds; `make cross-check` type-checks the others).
read -r -a platforms <<<"${DIST_PLATFORMS:-$(tr '\n' ' ' <"$root/krew/platforms")}"
rm -rf "$dist" && mkdir -p "$dist"
entries=""
for p in "${platforms[@]}"; do
	os=${p%/*} arch=${p#*/}
	bin=kubectl-etcdbackup
	[[ $os == windows ]] && bin=$bin.exe
	stage=$dist/stage/$os-$arch
	mkdir -p "$stage"
	(cd "$root" && CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath \
		-ldflags "-s -w -X github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/version.Version=$version" \
		-o "$stage/$bin" ./cmd/kubectl-etcdbackup)
	cp "$root/LICENSE" "$stage/LICENSE"
	# kubectl (1.26+) completes `kubectl etcdbackup <TAB>` through an
	# executable named kubectl_complete-etcdbackup on PATH: a shell script
	# on Unix; on Windows the binary itself answers under that name.
	shim=kubectl_complete-etcdbackup
	if [[ $os == windows ]]; then
		shim=$shim.exe
		cp "$stage/$bin" "$stage/$shim"
	else
		install -m 0755 "$root/krew/kubectl_complete-etcdbackup" "$stage/$shim"
	fi
	archive=kubectl-etcdbackup_${version}_${os}_${arch}.tar.gz
	# Reproducible archives: fixed order, owner and time.
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime='2000-01-01 00:00Z' \
		-C "$stage" -cf - "$bin" "$shim" LICENSE | gzip -n >"$dist/$archive"
	sum=$(sha256sum "$dist/$archive" | cut -d' ' -f1)
	echo "$sum  $archive" >>"$dist/SHA256SUMS"
	entries+="  - selector:
      matchLabels:
        os: $os
        arch: $arch
    uri: $url/$archive
    sha256: $sum
    bin: $bin
    files:
      - from: $bin
        to: .
      - from: $shim
        to: .
      - from: LICENSE
        to: .
"
done
rm -rf "$dist/stage"
manifest=$(<"$root/krew/etcdbackup.yaml.tmpl")
manifest=${manifest//'${VERSION}'/$version}
manifest=${manifest//'${PLATFORMS}'/${entries%$'\n'}}
printf '%s\n' "$manifest" >"$dist/etcdbackup.yaml"
echo "dist: $(ls "$dist" | tr '\n' ' ')" >&2
