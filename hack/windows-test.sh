#!/usr/bin/env bash
# windows-test.sh — runs the tests of the packages with Windows-only code
# (the filesystem location's publish lock, a restore's data-directory and
# member locks: lock_windows.go) as Windows binaries under Wine, with a real
# embedded etcd among them. Not part of `make test` (it installs Debian's
# wine64 and a MinGW compiler, a few minutes); `make cross-check` is CI's
# guard that Windows builds. Wine 8 lacks bcryptprimitives.dll, which Go's
# runtime loads from system32 for ProcessPrng: a ten-line DLL built here
# answers it with RtlGenRandom. Wine 8 also cannot run Go 1.26's
# os.RemoveAll, so the tests' TempDir cleanup fails; that failure, and only
# it, is ignored.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=$root/.cache/windows-test
missing=()
[[ -x /usr/lib/wine/wine64 ]] || missing+=(wine64)
command -v x86_64-w64-mingw32-gcc >/dev/null || missing+=(gcc-mingw-w64-x86-64-win32)
if ((${#missing[@]})); then
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
fi
mkdir -p "$work"
export WINEDEBUG=-all WINEPREFIX=$work/prefix
if [[ ! -f $WINEPREFIX/drive_c/windows/system32/bcryptprimitives.dll ]]; then
	/usr/lib/wine/wine64 cmd /c exit >/dev/null 2>&1 || true # creates the prefix
	cat >"$work/prng.c" <<'C'
#include <windows.h>
BOOLEAN WINAPI SystemFunction036(PVOID buf, ULONG len);
__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
	while (len > 0) {
		ULONG n = len > 0x40000000 ? 0x40000000 : (ULONG)len;
		if (!SystemFunction036(data, n)) return FALSE;
		data += n; len -= n;
	}
	return TRUE;
}
C
	x86_64-w64-mingw32-gcc -shared -o "$WINEPREFIX/drive_c/windows/system32/bcryptprimitives.dll" "$work/prng.c" -ladvapi32
fi
failed=0
for pkg in ./snapshot ./storage/filesystem; do
	exe=$work/$(basename "$pkg").test.exe
	(cd "$root" && GOOS=windows GOARCH=amd64 CGO_ENABLED=0 go test -c -o "$exe" "$pkg")
	out=$(cd "$work" && timeout 600 /usr/lib/wine/wine64 "$exe" -test.v 2>&1 || true)
	# A test failed for its own reason when it logged anything but the
	# cleanup Wine cannot do, or a skip's reason.
	problems=$(grep -E '^\s+[A-Za-z0-9_]+\.go:[0-9]+: ' <<<"$out" | grep -v 'TempDir RemoveAll cleanup' | grep -v 'needs root' || true)
	passed=$(grep -cE '^\s*--- (PASS|FAIL)' <<<"$out" || true)
	if [[ -n $problems ]] || ! grep -q '^=== RUN' <<<"$out"; then
		echo "windows-test: $pkg under Wine:" >&2
		echo "${problems:-$out}" >&2
		failed=1
	else
		echo "windows-test: $pkg passes under Wine ($passed tests and subtests; only TempDir cleanup failed, a Wine limit)" >&2
	fi
done
exit $failed
