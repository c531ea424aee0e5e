// Package agetest finds the independent age command-line tool (filippo.io/age
// v1.3.2, pinned by tools/age and built by `make age-bins`) for tests that
// check this project's encrypted backups against it, and makes age keys.
package agetest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"filippo.io/age"
)

const (
	// BinDirEnv names the directory holding age and age-keygen.
	BinDirEnv = "ETCDBACKUP_AGE_BIN_DIR"
	// RequireEnv set to 1 turns a missing binary into a failure.
	RequireEnv = "ETCDBACKUP_REQUIRE_SANDBOX"
)

// Binary returns the path of the age CLI: in $ETCDBACKUP_AGE_BIN_DIR, else
// in <repo root>/.cache/age/bin. It skips t when the binary is missing,
// unless ETCDBACKUP_REQUIRE_SANDBOX=1.
func Binary(t testing.TB, name string) string {
	t.Helper()
	dir := os.Getenv(BinDirEnv)
	if dir == "" {
		root, err := repoRoot()
		if err != nil {
			missing(t, fmt.Sprintf("%v (set %s)", err, BinDirEnv))
		}
		dir = filepath.Join(root, ".cache", "age", "bin")
	}
	bin := filepath.Join(dir, name)
	fi, err := os.Stat(bin)
	if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		missing(t, fmt.Sprintf("no executable %s; build it with `make age-bins`", bin))
	}
	return bin
}

func missing(t testing.TB, why string) {
	t.Helper()
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("agetest: %s", why)
	}
	t.Skipf("agetest: %s; set %s=1 to fail instead of skipping", why, RequireEnv)
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "tools")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("repository root not found")
		}
		dir = parent
	}
}

// Key is an age key pair written as age-keygen writes it.
type Key struct {
	Identity  *age.X25519Identity
	Recipient string
	// File holds the identity, mode 0600.
	File string
}

// NewKey makes a key pair and its identity file in a temporary directory.
func NewKey(t testing.TB) Key {
	t.Helper()
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "key.txt")
	body := "# public key: " + id.Recipient().String() + "\n" + id.String() + "\n"
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return Key{Identity: id, Recipient: id.Recipient().String(), File: file}
}
