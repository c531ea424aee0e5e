package servertest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Tree lists every file under dir (its path, mode and size), to show
// that a request changed nothing on disk: the same before and after.
// Times are left out, so a temporary file made and removed again, as an
// upload that failed leaves things, does not count as a change.
func Tree(t testing.TB, dir string) string {
	t.Helper()
	return tree(t, dir, false)
}

// TreeDigest is Tree with each file's modification time and each regular
// file's SHA-256 too, to show that nothing under dir was touched at all,
// as by a reader that must not write.
func TreeDigest(t testing.TB, dir string) string {
	t.Helper()
	return tree(t, dir, true)
}

// TreeDigestBesidesLedger is TreeDigest of everything in dir but its
// ledger (ledger/), which a break-glass read appends to.
func TreeDigestBesidesLedger(t testing.TB, dir string) string {
	t.Helper()
	var kept []string
	for line := range strings.SplitSeq(tree(t, dir, true), "\n") {
		if !strings.HasPrefix(line, "ledger ") && !strings.HasPrefix(line, "ledger/") && !strings.HasPrefix(line, ". ") {
			kept = append(kept, line)
		}
	}
	return strings.Join(kept, "\n")
}

func tree(t testing.TB, dir string, digest bool) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		line := fmt.Sprintf("%s %s %d", rel, info.Mode(), info.Size())
		if digest {
			line += fmt.Sprintf(" %d", info.ModTime().UnixNano())
			if info.Mode().IsRegular() {
				b, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				sum := sha256.Sum256(b)
				line += " " + hex.EncodeToString(sum[:])
			}
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}
