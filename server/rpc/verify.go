package rpc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/crypt"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/ctxio"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// VerifyBackup implements ebv1.BackupServiceServer. bolt needs random
// access, so the snapshot is unpacked into a scratch file (disk, not
// memory) that is removed afterwards.
func (s *Service) VerifyBackup(ctx context.Context, req *ebv1.VerifyBackupRequest) (*ebv1.VerifyBackupResponse, error) {
	if err := validateName("backup", req.GetName()); err != nil {
		return nil, err
	}
	locName, loc, err := s.location(req.GetLocation())
	if err != nil {
		return nil, err
	}
	r, m, err := loc.Open(ctx, req.GetName(), 0, 0)
	if err != nil {
		return nil, s.metrics.StorageError("verify", locName, req.GetName(), err)
	}
	defer r.Close()
	if m.Encryption != "" {
		return s.verifyStored(ctx, locName, m, r)
	}
	dir, err := os.MkdirTemp(s.scratchDir, "verify-")
	if err != nil {
		return nil, ebv1.ServerErrorf(codes.Internal, "verify %q: scratch space: %v", req.GetName(), err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "snapshot.db")
	f, err := os.Create(path)
	if err != nil {
		return nil, ebv1.ServerErrorf(codes.Internal, "verify %q: %v", req.GetName(), err)
	}
	defer f.Close()

	stored := sha256.New()
	// Bounded by the recorded raw size, or limits.maxRawSize for a backup
	// stored without one: a crafted backup must not fill the scratch
	// volume.
	n, err := snapshot.DecompressBounded(ctx, f, io.TeeReader(r, stored), m.Compression, m.RawSize, s.limits.MaxRawSize)
	corrupt := func(format string, args ...any) error {
		msg := fmt.Sprintf(format, args...)
		s.log.Warn("backup failed verification", "location", locName, "backup", req.GetName(), "reason", msg)
		return status.Errorf(codes.DataLoss, "backup %q in location %q is corrupt: %s; do not restore it", req.GetName(), locName, msg)
	}
	if errors.Is(err, snapshot.ErrCorrupt) {
		return nil, corrupt("%v", err)
	}
	if err != nil {
		return nil, s.metrics.StorageError("verify", locName, req.GetName(), err)
	}
	// Drain what decompression did not need, so the stored hash covers it.
	if _, err := io.Copy(stored, r); err != nil {
		return nil, s.metrics.StorageError("verify", locName, req.GetName(), err)
	}
	if got := hex.EncodeToString(stored.Sum(nil)); got != m.SHA256 {
		return nil, corrupt("its data has SHA-256 %s, but %s was recorded when it was stored", got, m.SHA256)
	}
	if m.RawSize != 0 && n != m.RawSize {
		return nil, corrupt("it unpacks to %d bytes, but %d were recorded", n, m.RawSize)
	}
	if err := f.Close(); err != nil {
		return nil, ebv1.ServerErrorf(codes.Internal, "verify %q: %v", req.GetName(), err)
	}
	st, err := snapshot.Check(path)
	if err != nil {
		return nil, corrupt("%v", err)
	}
	return &ebv1.VerifyBackupResponse{
		Backup:   backupFromManifest(locName, m),
		Revision: st.Revision, TotalKeys: int64(st.TotalKey), TotalSize: st.TotalSize, Hash: st.Hash, StorageVersion: st.Version,
	}, nil
}

// verifyStored checks what the server can of an encrypted backup, whose
// key it never holds: the SHA-256 of the stored bytes and the syntax of
// the age header. The rest — age's authentication, etcd's trailer, the
// database — needs an identity, on the client.
func (s *Service) verifyStored(ctx context.Context, locName string, m *storage.Manifest, r io.Reader) (*ebv1.VerifyBackupResponse, error) {
	corrupt := func(format string, args ...any) error {
		msg := fmt.Sprintf(format, args...)
		s.log.Warn("backup failed verification", "location", locName, "backup", m.Name, "reason", msg)
		return status.Errorf(codes.DataLoss, "backup %q in location %q is corrupt: %s; do not restore it", m.Name, locName, msg)
	}
	stored := sha256.New()
	tee := io.TeeReader(ctxio.NewReader(ctx, r), stored)
	h, err := crypt.ReadHeader(tee)
	if errors.Is(err, crypt.ErrNotAge) {
		return nil, corrupt("it is recorded as age-encrypted, but %v", err)
	}
	if err != nil {
		return nil, s.metrics.StorageError("verify", locName, m.Name, err)
	}
	if _, err := io.Copy(stored, ctxio.NewReader(ctx, r)); err != nil {
		return nil, s.metrics.StorageError("verify", locName, m.Name, err)
	}
	if got := hex.EncodeToString(stored.Sum(nil)); got != m.SHA256 {
		return nil, corrupt("its data has SHA-256 %s, but %s was recorded when it was stored", got, m.SHA256)
	}
	return &ebv1.VerifyBackupResponse{
		Backup:     backupFromManifest(locName, m),
		StoredOnly: true,
		Message: fmt.Sprintf("the stored bytes match their SHA-256 and start with an age header for %d recipient(s); the content is encrypted and the server holds no key: "+
			"run `kubectl etcdbackup verify %s --identity KEYFILE` to check etcd's trailer and database on your machine", len(h.StanzaTypes), m.Name),
	}, nil
}
