package member_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"filippo.io/age"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/backup"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/agetest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/member"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

const marker = "s3cr3t-marker-6f1c2e"

// backUpEncrypted writes the marker into a real etcd and backs it up with
// the agent, compressed with compression and encrypted to recipients.
func backUpEncrypted(t *testing.T, compression string, recipients ...string) *servertest.Server {
	t.Helper()
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	if _, err := c.Put(context.Background(), "marker", marker); err != nil {
		t.Fatal(err)
	}
	srv := servertest.Start(t, "")
	b, err := backup.Run(context.Background(), c, srv.Client, backup.Options{
		Endpoint: te.Endpoint, Name: "enc", Compression: compression, AgeRecipients: recipients,
	})
	if err != nil {
		t.Fatal(err)
	}
	if b.GetEncryption() != "age" || len(b.GetAgeRecipients()) != len(recipients) || b.GetRawSha256() == "" || b.GetRawSha256() == b.GetSha256() {
		t.Fatalf("backup record %v", b)
	}
	return srv
}

func storedObject(t *testing.T, srv *servertest.Server) string {
	return filepath.Join(srv.Dir, "backups", "enc.db")
}

// The stored object hides the marker; the independent age CLI decrypts
// it into a snapshot etcd accepts; the restore flow with the identity
// brings the marker back.
func TestEncryptedBackupIsOpaqueAndRestorable(t *testing.T) {
	for _, compression := range []string{"", "zstd"} {
		t.Run("compression="+compression, func(t *testing.T) {
			key := agetest.NewKey(t)
			breakGlass := agetest.NewKey(t)
			srv := backUpEncrypted(t, compression, key.Recipient, breakGlass.Recipient)
			stored, err := os.ReadFile(storedObject(t, srv))
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(stored, []byte(marker)) || !bytes.HasPrefix(stored, crypt.Magic) {
				t.Fatal("the stored object is not an age file hiding the marker")
			}

			// age -d, without this project's code; then undo zstd and
			// check with etcd's own code.
			ageBin := agetest.Binary(t, "age")
			dir := t.TempDir()
			out := filepath.Join(dir, "decrypted")
			cmd := exec.Command(ageBin, "-d", "-i", breakGlass.File, "-o", out, storedObject(t, srv))
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("age -d: %v: %s", err, b)
			}
			db, err := snapshot.Unpack(context.Background(), out, dir)
			if err != nil {
				t.Fatal(err)
			}
			if st, err := snapshot.Check(db); err != nil || st.TotalKey == 0 {
				t.Fatalf("etcd refuses what age decrypted: %+v %v", st, err)
			}

			dataDir := filepath.Join(t.TempDir(), "data")
			m, peer := memberAt(t, dataDir)
			ids, err := crypt.ReadIdentityFiles(key.File)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := member.Restore(context.Background(), srv.Client, member.Options{Name: "enc", Member: m, Identities: ids}, member.Events{}); err != nil {
				t.Fatal(err)
			}
			if got := readMarker(t, m, peer); got != marker {
				t.Fatalf("marker = %q", got)
			}
		})
	}
}

// Without an identity, or with the wrong one, nothing is restored and the
// data directory is not created; a flipped ciphertext byte is refused.
func TestEncryptedBackupRefusals(t *testing.T) {
	key := agetest.NewKey(t)
	wrong := agetest.NewKey(t)
	srv := backUpEncrypted(t, "zstd", key.Recipient)
	ctx := context.Background()

	try := func(ids []age.Identity, fromFile string) error {
		dataDir := filepath.Join(t.TempDir(), "data")
		m, _ := memberAt(t, dataDir)
		_, err := member.Restore(ctx, srv.Client, member.Options{Name: "enc", Member: m, Identities: ids, FromFile: fromFile}, member.Events{})
		if _, serr := os.Stat(dataDir); !errors.Is(serr, os.ErrNotExist) {
			t.Errorf("data dir created after %v", err)
		}
		return err
	}
	if err := try(nil, ""); !errors.Is(err, crypt.ErrIdentityRequired) {
		t.Errorf("no identity: %v", err)
	}
	if err := try([]age.Identity{wrong.Identity}, ""); !errors.Is(err, crypt.ErrNoMatchingIdentity) {
		t.Errorf("wrong identity: %v", err)
	}
	stored, _ := os.ReadFile(storedObject(t, srv))
	stored[len(stored)-100] ^= 1
	flipped := filepath.Join(t.TempDir(), "enc.backup")
	os.WriteFile(flipped, stored, 0o600)
	if err := try([]age.Identity{key.Identity}, flipped); !errors.Is(err, snapshot.ErrCorrupt) || !errors.Is(err, crypt.ErrTampered) {
		t.Errorf("flipped byte: %v", err)
	}
}
