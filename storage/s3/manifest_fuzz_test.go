package s3

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// endless is a body that never ends, counting what was read of it.
type endless struct {
	fill byte
	read int64
}

func (e *endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = e.fill
	}
	e.read += int64(len(p))
	return len(p), nil
}

// A manifest object is read to at most 1 MiB and one byte: a larger (or
// endless) body is refused as not a manifest, whatever follows; one of
// exactly the bound decodes; a failed read is not taken for a bad
// manifest (List skips those).
func TestReadManifestIsBounded(t *testing.T) {
	body := &endless{fill: ' '}
	_, err := readManifest(body, "b")
	if !errors.Is(err, errBadManifest) || !strings.Contains(err.Error(), "larger than 1048576 bytes") {
		t.Fatalf("an endless body: %v", err)
	}
	if body.read > maxManifestBytes+64<<10 {
		t.Fatalf("read %d bytes of an endless body", body.read)
	}
	m, err := json.Marshal(&storage.Manifest{Name: "b", Size: 3, SHA256: strings.Repeat("0", 64), CreateTime: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	padded := append(bytes.Repeat([]byte(" "), maxManifestBytes-len(m)), m...)
	if got, err := readManifest(bytes.NewReader(padded), "b"); err != nil || got.Name != "b" {
		t.Fatalf("a manifest of exactly the bound: %v, %v", got, err)
	}
	if _, err := readManifest(bytes.NewReader(append([]byte(" "), padded...)), "b"); !errors.Is(err, errBadManifest) {
		t.Fatalf("a manifest one byte over the bound: %v", err)
	}
	if _, err := readManifest(bytes.NewReader(m), "other"); !errors.Is(err, errBadManifest) || !strings.Contains(err.Error(), `names backup "b"`) {
		t.Fatalf("another name's manifest: %v", err)
	}
	broken := io.MultiReader(bytes.NewReader(m[:5]), iotestErr{})
	if _, err := readManifest(broken, "b"); err == nil || errors.Is(err, errBadManifest) {
		t.Fatalf("a failed read: %v, want an error that is not errBadManifest", err)
	}
}

type iotestErr struct{}

func (iotestErr) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

// FuzzManifest decodes arbitrary bytes as a manifest object of backup
// "fuzz" — someone else's object under the prefix, a hand edit, a
// hostile writer of the bucket: it never panics; what it refuses is an
// errBadManifest (so List skips it rather than failing); what it accepts
// is that backup's, within the bound, and round-trips through JSON
// unchanged, so what List shows is what is stored.
func FuzzManifest(f *testing.F) {
	for _, m := range []*storage.Manifest{
		{Name: "fuzz", Size: 19, SHA256: strings.Repeat("ab", 32), CreateTime: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), Source: storage.Source{Kind: "upload"}},
		{Name: "fuzz", Size: 19, SHA256: strings.Repeat("ab", 32), CreateTime: time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600)),
			Labels: map[string]string{"app": "etcd"}, Compression: "zstd", RawSize: 28704, Encryption: "age",
			AgeRecipients: []string{"age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"},
			Source:        storage.Source{Kind: "delta", Target: "control-plane"},
			Etcd:          &storage.EtcdInfo{ClusterID: 1<<64 - 1, Revision: 1 << 40, Version: "3.6.0"},
			Delta: &storage.Delta{Chain: "full", Epoch: 3, FirstRevision: 10, LastRevision: 20, Events: 11,
				LastEvent: &storage.DeltaEvent{Key: []byte("/k"), ValueSHA256: strings.Repeat("cd", 32)}}},
	} {
		b, err := json.MarshalIndent(m, "", "  ")
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{`{}`, `null`, `[]`, `{"name":"fuzz","size":-1}`, `{"name":"fuzz","rawSize":-1}`, `{"name":"fuzz","size":1e300}`,
		`{"name":"fuzz","createTime":"10000-01-01T00:00:00Z"}`, `{"name":"fuzz","labels":{"a":1}}`, `{"name":"fuzz","delta":{"firstRevision":-9223372036854775808}}`,
		`{"name":"\ud800"}`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := readManifest(bytes.NewReader(b), "fuzz")
		if err != nil {
			if !errors.Is(err, errBadManifest) {
				t.Fatalf("refused, but not as a bad manifest: %v", err)
			}
			return
		}
		if len(b) > maxManifestBytes || m.Name != "fuzz" || m.Size < 0 || m.RawSize < 0 {
			t.Fatalf("accepted %d bytes as %+v", len(b), m)
		}
		once, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("an accepted manifest does not encode: %v", err)
		}
		again, err := readManifest(bytes.NewReader(once), "fuzz")
		if err != nil {
			t.Fatalf("an accepted manifest, encoded, is refused: %v\n%s", err, once)
		}
		twice, err := json.Marshal(again)
		if err != nil || !bytes.Equal(once, twice) {
			t.Fatalf("the manifest changes in a round trip (%v):\n%s\n%s", err, once, twice)
		}
	})
}
