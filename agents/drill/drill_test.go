package drill_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"filippo.io/age"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/backup"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/agents/drill"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/agetest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

// backUp writes keys into a real etcd, deletes one (so the keyspace has
// history) and stores a backup of it through a real data server with the
// backup agent, which records what the member answered for HashKV.
func backUp(t *testing.T, name string, recipients ...string) (*servertest.Server, string) {
	t.Helper()
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	ctx := context.Background()
	for i := range 50 {
		if _, err := c.Put(ctx, fmt.Sprintf("/registry/k%02d", i), fmt.Sprint("v", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Delete(ctx, "/registry/k07"); err != nil {
		t.Fatal(err)
	}
	srv := servertest.Start(t, "")
	b, err := backup.Run(ctx, c, srv.Client, backup.Options{Endpoint: te.Endpoint, Name: name, ScratchDir: t.TempDir(), Compression: "zstd", AgeRecipients: recipients})
	if err != nil {
		t.Fatal(err)
	}
	if !b.GetEtcd().GetKeyspace() || b.GetEtcd().GetKeyspaceKeys() != 49 {
		t.Fatalf("the backup recorded keyspace %+v, want 49 keys recorded", b.GetEtcd())
	}
	return srv, b.GetSha256()
}

func TestDrillOfAGoodBackupMatchesTheCluster(t *testing.T) {
	srv, sum := backUp(t, "b1")
	scratch := t.TempDir()
	res, err := drill.Run(context.Background(), srv.Client, drill.Options{Name: "b1", SHA256: sum, ScratchDir: scratch})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Succeeded || res.Keys != 49 || res.Revision == 0 || res.HashKV == 0 || res.Duration <= 0 {
		t.Fatalf("drill of a good backup: %+v", res)
	}
	if entries, _ := os.ReadDir(scratch); len(entries) != 0 {
		t.Fatalf("scratch space not emptied: %v", entries)
	}
}

// A manifest whose fingerprint is not the snapshot's (a restored keyspace
// that differs from the cluster's) fails the drill with numbers and what
// to do.
func TestDrillOfABackupWhoseKeyspaceDiffersFails(t *testing.T) {
	srv, sum := backUp(t, "b1")
	path := filepath.Join(srv.Dir, "backups", "b1.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	etcd := m["etcd"].(map[string]any)
	etcd["hashKV"] = float64(12345)
	raw, _ = json.Marshal(m)
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := drill.Run(context.Background(), srv.Client, drill.Options{Name: "b1", SHA256: sum, ScratchDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if res.Succeeded || res.Keys != 49 {
		t.Fatalf("drill of a backup whose keyspace differs: %+v", res)
	}
	servertest.MustSay(t, res.Message, "differs from the cluster's", "HashKV 12345", "do not restore it")
}

// A drill is pinned to the backup the server asked about: other bytes
// under the same name are not drilled in its place.
func TestDrillOfAReplacedBackupFails(t *testing.T) {
	srv, _ := backUp(t, "b1")
	res, err := drill.Run(context.Background(), srv.Client, drill.Options{Name: "b1", SHA256: fmt.Sprintf("%064x", 1), ScratchDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if res.Succeeded {
		t.Fatalf("drill of a replaced backup: %+v", res)
	}
	servertest.MustSay(t, res.Message, "does not restore", "not the one")
}

// An encrypted backup is drilled with the target's identity; without one
// the drill says it learned nothing and what to configure, rather than
// calling the backup bad.
func TestDrillOfAnEncryptedBackup(t *testing.T) {
	key := agetest.NewKey(t)
	srv, sum := backUp(t, "enc", key.Recipient)
	res, err := drill.Run(context.Background(), srv.Client, drill.Options{Name: "enc", SHA256: sum, ScratchDir: t.TempDir(), Identities: []age.Identity{key.Identity}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Succeeded || res.Keys != 49 {
		t.Fatalf("drill with the identity: %+v", res)
	}
	res, err = drill.Run(context.Background(), srv.Client, drill.Options{Name: "enc", SHA256: sum, ScratchDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if res.Succeeded || !res.NoVerdict {
		t.Fatalf("drill without the identity: %+v", res)
	}
	servertest.MustSay(t, res.Message, "encrypted", "identitySecret")

	// The identity Secret's volume was empty (the Secret is missing): no
	// verdict, and the message says what the agent could not read.
	res, err = drill.Run(context.Background(), srv.Client, drill.Options{Name: "enc", SHA256: sum, ScratchDir: t.TempDir(),
		IdentityProblem: "age identities: /identity holds no file"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Succeeded || !res.NoVerdict {
		t.Fatalf("drill with an empty identity volume: %+v", res)
	}
	servertest.MustSay(t, res.Message, "encrypted", "/identity holds no file", "identitySecret", "nothing was learned")

	// A wrong key says nothing about the backup: no verdict, not a
	// failed drill.
	other := agetest.NewKey(t)
	res, err = drill.Run(context.Background(), srv.Client, drill.Options{Name: "enc", SHA256: sum, ScratchDir: t.TempDir(), Identities: []age.Identity{other.Identity}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Succeeded || !res.NoVerdict {
		t.Fatalf("drill with the wrong identity: %+v", res)
	}
	servertest.MustSay(t, res.Message, "does not decrypt", "other age recipients", "identitySecret", "nothing was learned")
}

// A backup whose stored bytes were altered after the upload cannot be
// read back as it was stored: that is a verdict, Failed, naming the
// check — not a drill that learned nothing.
func TestDrillOfABackupAlteredInStorageFails(t *testing.T) {
	t.Run("bytes-altered", func(t *testing.T) {
		srv, sum := backUp(t, "b1")
		data := filepath.Join(srv.Dir, "backups", "b1.db")
		raw, err := os.ReadFile(data)
		if err != nil {
			t.Fatal(err)
		}
		raw[len(raw)/2] ^= 0xff
		if err := os.WriteFile(data, raw, 0o600); err != nil {
			t.Fatal(err)
		}
		res, err := drill.Run(context.Background(), srv.Client, drill.Options{Name: "b1", SHA256: sum, ScratchDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		if res.Succeeded || res.NoVerdict {
			t.Fatalf("drill of a backup altered in storage: %+v", res)
		}
		servertest.MustSay(t, res.Message, "stored SHA-256 check failed", "not the ones recorded", "do not restore it")
	})
	t.Run("bytes-cut-short", func(t *testing.T) {
		srv, sum := backUp(t, "b1")
		data := filepath.Join(srv.Dir, "backups", "b1.db")
		fi, err := os.Stat(data)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(data, fi.Size()/2); err != nil {
			t.Fatal(err)
		}
		res, err := drill.Run(context.Background(), srv.Client, drill.Options{Name: "b1", SHA256: sum, ScratchDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		if res.Succeeded || res.NoVerdict {
			t.Fatalf("drill of a backup cut short in storage: %+v", res)
		}
		servertest.MustSay(t, res.Message, "stored-size check failed", "do not restore it")
	})
	// A drill that cannot reach the server learns nothing about the
	// backup, and says what to check.
	t.Run("server-unreachable", func(t *testing.T) {
		srv, sum := backUp(t, "b1")
		srv.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res, err := drill.Run(ctx, srv.Client, drill.Options{Name: "b1", SHA256: sum, ScratchDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		if res.Succeeded || !res.NoVerdict {
			t.Fatalf("drill without a server: %+v", res)
		}
		servertest.MustSay(t, res.Message, "nothing was learned", "server")
	})
}
