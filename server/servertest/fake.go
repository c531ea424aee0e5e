package servertest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// WriteBackups stores a tiny backup for each name straight into the
// filesystem location's directory — the layout of package
// server/storage/filesystem —, without an upload each: for tests that
// need thousands. Backup i is created at created + i seconds.
func (s *Server) WriteBackups(t testing.TB, location string, created time.Time, names ...string) {
	t.Helper()
	dir, ok := s.Dirs[location]
	if !ok {
		t.Fatalf("no location %q", location)
	}
	backups := filepath.Join(dir, "backups")
	if err := os.MkdirAll(backups, 0o700); err != nil {
		t.Fatal(err)
	}
	for i, name := range names {
		data := []byte(name)
		sum := sha256.Sum256(data)
		m := storage.Manifest{Name: name, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:]),
			CreateTime: created.Add(time.Duration(i) * time.Second).UTC(), Source: storage.Source{Kind: ebv1.SourceUpload}}
		m.RawSize, m.RawSHA256 = m.Size, m.SHA256
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(backups, name+".db"), data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(backups, name+".json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
