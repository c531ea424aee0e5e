package fetch

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"filippo.io/age"
	"go.etcd.io/etcd/api/v3/mvccpb"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/delta"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/agetest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
)

// A segment stored compressed and encrypted, as the delta agent stores
// it, unpacks to the segment written.
func TestUnpackSegment(t *testing.T) {
	var seg bytes.Buffer
	w, err := delta.NewWriter(&seg, delta.Header{Chain: "b", Epoch: 1, FirstRevision: 11})
	if err != nil {
		t.Fatal(err)
	}
	ev := &mvccpb.Event{Kv: &mvccpb.KeyValue{Key: []byte("k"), Value: []byte("v"), ModRevision: 11, CreateRevision: 11, Version: 1}}
	if err := w.AddRevision(delta.Revision{Revision: 11, Events: []*mvccpb.Event{ev}}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Close(""); err != nil {
		t.Fatal(err)
	}
	key := agetest.NewKey(t)
	ctx := context.Background()
	for _, f := range []snapshot.Form{{}, {Compression: ebv1.CompressionZstd}, {Compression: ebv1.CompressionZstd, Encryption: ebv1.EncryptionAge}} {
		t.Run(f.Compression+"+"+f.Encryption, func(t *testing.T) {
			dir := t.TempDir()
			var r io.Reader = bytes.NewReader(seg.Bytes())
			z, err := snapshot.Compress(ctx, r, f.Compression)
			if err != nil {
				t.Fatal(err)
			}
			defer z.Close()
			r = z
			if f.Encryption != "" {
				if r, err = crypt.Encrypt(ctx, r, []age.Recipient{key.Identity.Recipient()}); err != nil {
					t.Fatal(err)
				}
			}
			stored, err := io.ReadAll(r)
			if err != nil {
				t.Fatal(err)
			}
			in, out := filepath.Join(dir, "stored"), filepath.Join(dir, "plain")
			if err := os.WriteFile(in, stored, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := unpackSegment(ctx, in, out, f, Request{Identities: []age.Identity{key.Identity}}); err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(out)
			if !bytes.Equal(got, seg.Bytes()) {
				t.Fatal("the unpacked segment differs from the one written")
			}
			if f.Encryption != "" {
				err := unpackSegment(ctx, in, out, f, Request{})
				if !errors.Is(err, crypt.ErrIdentityRequired) && !errors.Is(err, crypt.ErrNoMatchingIdentity) {
					t.Fatalf("without an identity: %v", err)
				}
			}
		})
	}
}
