package rpc_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"filippo.io/age"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

func ageKey(t *testing.T) (*age.X25519Identity, string) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	return id, id.Recipient().String()
}

func sealed(t *testing.T, plain []byte, rcp string) []byte {
	recs, err := crypt.ParseRecipients([]string{rcp})
	if err != nil {
		t.Fatal(err)
	}
	r, err := crypt.Encrypt(context.Background(), bytes.NewReader(plain), recs)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r)
	return b
}

// The server records encryption and recipients, takes the plain
// snapshot's size and hash from the trailer, and refuses what it can tell
// is wrong: recipients that are no public keys, data declared encrypted
// that is no age file.
func TestUploadOfEncryptedData(t *testing.T) {
	ts := servertest.Start(t, "")
	ctx := context.Background()
	id, rcp := ageKey(t)
	plain := randomBytes(t, 100000)
	data := sealed(t, plain, rcp)
	b, err := ts.Client.UploadWith(ctx, bytes.NewReader(data), client.UploadRequest{
		Header: &ebv1.UploadHeader{Name: "enc", Encryption: "age", AgeRecipients: []string{rcp}},
		Raw:    func() (int64, string) { return int64(len(plain)), sha(plain) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if b.GetEncryption() != "age" || len(b.GetAgeRecipients()) != 1 || b.GetAgeRecipients()[0] != rcp ||
		b.GetRawSize() != int64(len(plain)) || b.GetRawSha256() != sha(plain) || b.GetSha256() != sha(data) {
		t.Fatalf("backup %v", b)
	}
	// The record survives a restart: the manifest holds it.
	got, err := ts.Client.Backups.GetBackup(ctx, &ebv1.GetBackupRequest{Name: "enc"})
	if err != nil || got.GetBackup().GetEncryption() != "age" || got.GetBackup().GetAgeRecipients()[0] != rcp {
		t.Fatalf("get: %v %v", got, err)
	}

	before := servertest.Tree(t, ts.Dir)
	for name, h := range map[string]*ebv1.UploadHeader{
		"secret key":      {Name: "x1", Encryption: "age", AgeRecipients: []string{id.String()}},
		"no recipients":   {Name: "x2", Encryption: "age"},
		"recipients only": {Name: "x3", AgeRecipients: []string{rcp}},
		"unknown":         {Name: "x4", Encryption: "rot13"},
		"not age data":    {Name: "x5", Encryption: "age", AgeRecipients: []string{rcp}},
	} {
		body := data
		if name == "not age data" {
			body = plain
		}
		_, err := ts.Client.Upload(ctx, bytes.NewReader(body), h, nil)
		servertest.WantCode(t, err, codes.InvalidArgument)
		if strings.Contains(status.Convert(err).Message(), id.String()) {
			t.Errorf("%s: the error repeats the secret key", name)
		}
	}
	if after := servertest.Tree(t, ts.Dir); after != before {
		t.Fatalf("refused uploads changed storage:\n%s\nvs\n%s", before, after)
	}
}

// VerifyBackup of an encrypted backup checks the stored SHA-256 and the
// age header, and says the rest needs the key.
func TestVerifyEncryptedBackup(t *testing.T) {
	ts := servertest.Start(t, "")
	ctx := context.Background()
	_, rcp := ageKey(t)
	_, rcp2 := ageKey(t)
	recs, _ := crypt.ParseRecipients([]string{rcp, rcp2})
	r, _ := crypt.Encrypt(ctx, bytes.NewReader(randomBytes(t, 5000)), recs)
	data, _ := io.ReadAll(r)
	if _, err := ts.Client.Upload(ctx, bytes.NewReader(data), &ebv1.UploadHeader{Name: "enc", Encryption: "age", AgeRecipients: []string{rcp, rcp2}, RawSize: 5000}, nil); err != nil {
		t.Fatal(err)
	}
	resp, err := ts.Client.Backups.VerifyBackup(ctx, &ebv1.VerifyBackupRequest{Name: "enc"})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetStoredOnly() || !strings.Contains(resp.GetMessage(), "2 recipient(s)") || !strings.Contains(resp.GetMessage(), "--identity") || resp.GetTotalKeys() != 0 {
		t.Fatalf("verify %v", resp)
	}

	// Stored bytes that are no longer what was recorded: DataLoss.
	// A second handle on the same directory, as after a restart.
	loc, err := filesystem.New(ts.Dir)
	if err != nil {
		t.Fatal(err)
	}
	backuptest.Put(t, loc, &storage.Manifest{Name: "fake", Encryption: "age", AgeRecipients: []string{rcp}}, []byte("age-encryption.org/v1\n-> X25519 garbage\n"))
	_, err = ts.Client.Backups.VerifyBackup(ctx, &ebv1.VerifyBackupRequest{Name: "fake"})
	servertest.WantCode(t, err, codes.DataLoss)
}
