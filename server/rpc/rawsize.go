package rpc

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
)

// An upload's raw size is its plain etcd snapshot's: the stored bytes
// themselves when stored as is, else what the sender says in the header
// or the trailer (raw_size). Every later decompression — verify here, a
// download's or a restore's unpacking — stops at it, so a compressed or
// encrypted upload must say it, and no upload may pass
// limits.maxRawSize.

// transformed says whether an upload's stored bytes are not the snapshot
// itself: the server cannot then see its size.
func transformed(h *ebv1.UploadHeader) bool {
	return h.GetCompression() != ebv1.CompressionNone || h.GetEncryption() != ebv1.EncryptionNone
}

// admitRawSize refuses, before any data, an upload that declares more
// than limits.maxRawSize: its raw size, or, stored as is, its size.
func (s *Service) admitRawSize(h *ebv1.UploadHeader) error {
	most := s.limits.MaxRawSize
	if h.GetRawSize() > most {
		return status.Errorf(codes.InvalidArgument,
			"upload of %q: its snapshot is declared %d bytes; the most this server stores is %d (limits.maxRawSize); nothing was stored", h.GetName(), h.GetRawSize(), most)
	}
	if !transformed(h) && h.ExpectedSize != nil && h.GetExpectedSize() > most {
		return status.Errorf(codes.InvalidArgument,
			"upload of %q: its snapshot is declared %d bytes; the most this server stores is %d (limits.maxRawSize); nothing was stored", h.GetName(), h.GetExpectedSize(), most)
	}
	return nil
}

// checkStoredSize refuses an upload as soon as more has arrived than a
// snapshot of limits.maxRawSize can be: the size itself when stored as
// is; with zstd's and age's overhead (well under 1/1024 and 1 MiB) when
// compressed or encrypted.
func (s *Service) checkStoredSize(h *ebv1.UploadHeader, size int64) error {
	most := s.limits.MaxRawSize
	if transformed(h) {
		most += most/1024 + 1<<20
	}
	if size <= most {
		return nil
	}
	return status.Errorf(codes.InvalidArgument,
		"upload of %q: more than %d bytes arrived, more than a snapshot of %d bytes can be stored as (limits.maxRawSize); the upload was aborted and nothing was stored",
		h.GetName(), most, s.limits.MaxRawSize)
}

// recordRaw sets m's raw size and SHA-256 from what the sender said of a
// compressed or encrypted upload: its trailer's, else its header's. One
// that says no raw size, or more than limits.maxRawSize, is refused.
func (s *Service) recordRaw(u *upload, r *received, m *storage.Manifest) error {
	h := u.header
	if !transformed(h) {
		return checkf(m.RawSize <= s.limits.MaxRawSize, "upload of %q: its snapshot is %d bytes; the most this server stores is %d (limits.maxRawSize); nothing was stored",
			u.name(), m.RawSize, s.limits.MaxRawSize)
	}
	size, sum := h.GetRawSize(), h.GetRawSha256()
	if t := r.trailer; t != nil {
		if t.GetRawSize() != 0 && size != 0 && t.GetRawSize() != size {
			return status.Errorf(codes.InvalidArgument,
				"upload of %q: the header declares a raw size of %d bytes but the trailer %d; nothing was stored", u.name(), size, t.GetRawSize())
		}
		if t.GetRawSize() != 0 {
			size = t.GetRawSize()
		}
		if t.GetRawSha256() != "" {
			sum = t.GetRawSha256()
		}
	}
	if size <= 0 {
		return status.Errorf(codes.InvalidArgument,
			"upload of %q: the data is %s, but no raw size was sent; send the plain snapshot's size in the trailer's raw_size (or the header's) and its SHA-256 in raw_sha256, "+
				"so that unpacking it can stop there; nothing was stored", u.name(), transformedWhat(h))
	}
	if size > s.limits.MaxRawSize {
		return status.Errorf(codes.InvalidArgument,
			"upload of %q: its snapshot is %d bytes; the most this server stores is %d (limits.maxRawSize); nothing was stored", u.name(), size, s.limits.MaxRawSize)
	}
	m.RawSize, m.RawSHA256 = size, sum
	return nil
}

func transformedWhat(h *ebv1.UploadHeader) string {
	switch {
	case h.GetCompression() != ebv1.CompressionNone && h.GetEncryption() != ebv1.EncryptionNone:
		return h.GetCompression() + "-compressed and " + h.GetEncryption() + "-encrypted"
	case h.GetCompression() != ebv1.CompressionNone:
		return h.GetCompression() + "-compressed"
	}
	return h.GetEncryption() + "-encrypted"
}
