#!/usr/bin/env bash
# krew-check.sh TOOLS_BIN DIST — validate dist/etcdbackup.yaml with krew's own
# validator, then install it with the real krew from this machine's archive
# (no network) into a throwaway KREW_ROOT and run the installed plugin
# through kubectl, as a user would after `kubectl krew install etcdbackup`.
set -euo pipefail
tools=$(cd "$1" && pwd)
dist=$(cd "$2" && pwd)
manifest=$dist/etcdbackup.yaml
"$tools/validate-krew-manifest" -manifest "$manifest" -skip-install
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/bin"
ln -s "$tools/krew" "$root/bin/kubectl-krew"
os=$(go env GOOS) arch=$(go env GOARCH)
archive=$(ls "$dist"/kubectl-etcdbackup_*_"${os}_${arch}".tar.gz)
# Every archive holds exactly the binary, the completion shim and LICENSE,
# and the manifest copies all three into the install.
for a in "$dist"/kubectl-etcdbackup_*.tar.gz; do
	want="LICENSE kubectl-etcdbackup kubectl_complete-etcdbackup"
	[[ $a == *_windows_* ]] && want="LICENSE kubectl-etcdbackup.exe kubectl_complete-etcdbackup.exe"
	got=$(tar -tzf "$a" | sort | tr '\n' ' ')
	[[ $got == "$want " ]] || { echo "krew-check: $(basename "$a") holds: $got; want: $want" >&2; exit 1; }
done
# Each archive's SHA-256 is the one the manifest gives for its platform (krew
# refuses an archive that differs) and the one SHA256SUMS lists.
(cd "$dist" && sha256sum --quiet -c SHA256SUMS) || { echo "krew-check: an archive does not match SHA256SUMS" >&2; exit 1; }
for a in "$dist"/kubectl-etcdbackup_*.tar.gz; do
	sum=$(sha256sum "$a" | cut -d' ' -f1)
	grep -A1 -F -- "/$(basename "$a")" "$manifest" | grep -q -- "sha256: $sum" ||
		{ echo "krew-check: $manifest does not give $(basename "$a")'s SHA-256 $sum" >&2; exit 1; }
done
grep -q -- '- from: kubectl_complete-etcdbackup' "$manifest" || { echo "krew-check: $manifest does not list the completion shim in files:" >&2; exit 1; }
version=$(sed -n 's/^  version: //p' "$manifest")
export KREW_ROOT=$root/krew PATH=$root/bin:$root/krew/bin:$PATH
kubectl krew install --manifest="$manifest" --archive="$archive" >/dev/null
out=$(kubectl etcdbackup version --client)
echo "krew-check: installed with krew; kubectl etcdbackup says: $out" >&2
# The binary carries the manifest's version (the tag on HEAD, or DIST_VERSION).
[[ $out == *"Client Version: $version"* ]] || { echo "krew-check: unexpected output, want Client Version: $version" >&2; exit 1; }
[[ -f $root/krew/store/etcdbackup/*/LICENSE || -n $(find "$root/krew/store" -name LICENSE) ]]
# The completion shim is installed beside the binary and, once on PATH as the
# caveats say, completes the plugin's commands for kubectl.
shim=$(find "$root/krew/store/etcdbackup" -name kubectl_complete-etcdbackup -perm -u+x | head -1)
[[ -n $shim ]] || { echo "krew-check: kubectl_complete-etcdbackup was not installed" >&2; exit 1; }
ln -s "$shim" "$root/bin/kubectl_complete-etcdbackup"
completions=$(kubectl_complete-etcdbackup "")
[[ $completions == *download* && $completions == *restore* ]] || { echo "krew-check: the completion shim did not complete commands: $completions" >&2; exit 1; }
echo "krew-check: kubectl_complete-etcdbackup completes the plugin's commands" >&2
