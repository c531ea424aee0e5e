#!/usr/bin/env bash
# install-node-deps.sh — install what the sandbox's real node runs and the
# distribution does not build from Go: containerd and runc (the container
# runtime the kubelet talks to), nftables (`nft`, which kube-proxy in
# nftables mode and the CNI plugins' nftables backends call), and jq, which
# the end-to-end test of docs/scripting.md runs as a user's scripts do.
#
# Debian packages, installed only when a binary is missing, so a machine
# that has them (or a second run) costs nothing. The first install takes
# about a minute (containerd 1.6, runc 1.1, criu, nftables).
set -euo pipefail

missing=()
for bin in containerd containerd-shim-runc-v2 ctr runc nft jq; do
	command -v "$bin" >/dev/null 2>&1 || missing+=("$bin")
done
if ((${#missing[@]} == 0)); then
	exit 0
fi
if ((EUID != 0)); then
	echo "install-node-deps: missing ${missing[*]}; run as root (or apt-get install containerd runc nftables)" >&2
	exit 1
fi
echo "install-node-deps: missing ${missing[*]}; installing Debian's containerd, runc, nftables and jq (about a minute)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends containerd runc nftables jq >/dev/null
for bin in containerd containerd-shim-runc-v2 ctr runc nft jq; do
	command -v "$bin" >/dev/null 2>&1 || {
		echo "install-node-deps: $bin still missing after apt-get install" >&2
		exit 1
	}
done
