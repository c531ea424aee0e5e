#!/bin/sh
# build-netpol.sh OUT_DIR — builds kube-network-policies v0.8.0 (pinned by
# tools/netpol) into OUT_DIR with tools/netpol/xt-nfqueue.patch applied,
# unless its stamp (go.mod, go.sum, the patch, the Go version) is current.
#
# Why patched: upstream sends a connection's first packet to NFQUEUE with
# the nftables queue expression, which needs CONFIG_NFT_QUEUE; the kernels
# this project is developed on lack it (and load no modules) but have
# nft_compat and x_tables' NFQUEUE target, which queue the same packets.
# The patch swaps that one expression; nothing else changes. The upstream
# module stays untouched in the module cache: a copy is patched and built
# through a go.mod of its own (-modfile) with a replace to the copy.
set -eu
out=$1
root=$(cd "$(dirname "$0")/.." && pwd)
mod=$root/tools/netpol
GO=${GO:-go}
mkdir -p "$out"
inputs=$(cd "$mod" && { sha256sum go.mod go.sum xt-nfqueue.patch; $GO env GOVERSION GOOS GOARCH; } | sha256sum | cut -d' ' -f1)
stamp=$out/.kube-network-policies.stamp
if [ -x "$out/kube-network-policies" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$inputs" ]; then
	echo "kube-network-policies: up to date in $out" >&2
	exit 0
fi
echo "kube-network-policies: building into $out (v0.8.0 + xt-nfqueue.patch)" >&2
start=$(date +%s)
rm -f "$stamp"
tmp=$(mktemp -d "$out/.build.XXXXXX")
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
src=$(cd "$mod" && $GO mod download -json sigs.k8s.io/kube-network-policies | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$src" ] || { echo "build-netpol.sh: no module source for sigs.k8s.io/kube-network-policies" >&2; exit 1; }
cp -R "$src" "$tmp/src"
chmod -R u+w "$tmp/src"
patch -s -d "$tmp/src" -p1 <"$mod/xt-nfqueue.patch"
cp "$mod/go.mod" "$mod/go.sum" "$tmp/"
echo "replace sigs.k8s.io/kube-network-policies => $tmp/src" >>"$tmp/go.mod"
(cd "$mod" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
	$GO build -modfile="$tmp/go.mod" -ldflags "-s -w" -o "$tmp/kube-network-policies" sigs.k8s.io/kube-network-policies/cmd)
mv -f "$tmp/kube-network-policies" "$out/"
echo "$inputs" >"$stamp"
echo "kube-network-policies: done in $(( $(date +%s) - start ))s" >&2
