package filesystem_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

// FuzzManifest puts arbitrary bytes where a backup's NAME.json lives — a
// damaged disk, a hand edit, a hostile volume — and reads them back
// through the location: Stat, List and Open never panic; a manifest they
// accept encodes again, and decodes to the same encoding (a stable
// round trip), so what List shows is what is on disk.
func FuzzManifest(f *testing.F) {
	ctx := context.Background()
	dir := f.TempDir()
	loc, err := filesystem.New(dir)
	if err != nil {
		f.Fatal(err)
	}
	// Seeds: manifests as Commit writes them, plain and with every field.
	data := []byte("stored backup bytes")
	sum := sha256.Sum256(data)
	digest := hex.EncodeToString(sum[:])
	for _, m := range []*storage.Manifest{
		{Name: "plain", Size: int64(len(data)), SHA256: digest,
			CreateTime: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), Source: storage.Source{Kind: "upload"}},
		{Name: "full", Size: int64(len(data)), SHA256: digest,
			CreateTime: time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600)), Labels: map[string]string{"app": "etcd", "tier": ""},
			Compression: "zstd", RawSize: 28704, RawSHA256: "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
			Encryption: "age", AgeRecipients: []string{"age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"},
			Source: storage.Source{Kind: "agent", Description: "scheduled", Target: "control-plane",
				StartTime: time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC), EndTime: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)},
			Etcd: &storage.EtcdInfo{ClusterID: 1<<64 - 1, MemberID: 42, MemberName: "etcd-0", Revision: 1 << 40, Version: "3.6.0", DBSize: 28672}},
	} {
		up, err := loc.Create(ctx, m.Name)
		if err != nil {
			f.Fatal(err)
		}
		if _, err := up.Write(data); err != nil {
			f.Fatal(err)
		}
		if err := up.Commit(ctx, m); err != nil {
			f.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, "backups", m.Name+".json"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{`{}`, `null`, `[]`, `{"name":"fuzz","size":-1}`, `{"name":"fuzz","size":1e300}`,
		`{"name":"fuzz","createTime":"10000-01-01T00:00:00Z"}`, `{"labels":{"a":1}}`, `{"etcd":null,"source":{}}`, `{"name":"\ud800"}`, ``} {
		f.Add([]byte(s))
	}
	// The fuzzed manifest lives beside real data, as a backup would.
	path := filepath.Join(dir, "backups", "fuzz.json")
	if err := os.WriteFile(filepath.Join(dir, "backups", "fuzz.db"), data, 0o600); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, manifest []byte) {
		if err := os.WriteFile(path, manifest, 0o600); err != nil {
			t.Fatal(err)
		}
		m, err := loc.Stat(ctx, "fuzz")
		if _, lerr := loc.List(ctx); (lerr == nil) != (err == nil) {
			t.Fatalf("Stat says %v but List says %v", err, lerr)
		}
		if r, om, oerr := loc.Open(ctx, "fuzz", 0, 0); oerr == nil {
			got, rerr := io.ReadAll(r)
			r.Close()
			if rerr != nil || !bytes.Equal(got, data[:min(len(data), len(got))]) || om.Size != m.Size {
				t.Fatalf("Open read %q (%v), manifest size %d", got, rerr, om.Size)
			}
		} else if err == nil && m.Size >= 0 {
			t.Fatalf("Stat accepts the manifest but Open(0) fails: %v", oerr)
		}
		if err != nil {
			return
		}
		once, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("an accepted manifest does not encode: %v", err)
		}
		var again storage.Manifest
		if err := json.Unmarshal(once, &again); err != nil {
			t.Fatalf("an accepted manifest, encoded, does not decode: %v\n%s", err, once)
		}
		twice, err := json.Marshal(&again)
		if err != nil || !bytes.Equal(once, twice) {
			t.Fatalf("the manifest changes in a round trip (%v):\n%s\n%s", err, once, twice)
		}
	})
}
