package rpc_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
)

func TestUploadListDownloadRoundTrip(t *testing.T) {
	ts := servertest.Start(t, "")
	data := trailed(t, 5<<20+123) // several chunks and a partial one: 5 MiB + 544
	b := ts.Upload(t, "etcd-1", data)
	if b.GetSize() != int64(len(data)) || b.GetSha256() != sha(data) {
		t.Fatalf("stored %d bytes sha %s; want %d bytes sha %s", b.GetSize(), b.GetSha256(), len(data), sha(data))
	}
	if b.GetPhase() != ebv1.BackupPhase_BACKUP_PHASE_COMPLETED || b.GetSource().GetKind() != "upload" || b.GetCreateTime() == nil {
		t.Fatalf("unexpected metadata: %v", b)
	}
	if got := ts.Names(t, ""); len(got) != 1 || got[0] != "etcd-1" {
		t.Fatalf("list = %v, want [etcd-1]", got)
	}
	var out bytes.Buffer
	got, err := ts.Client.Download(context.Background(), &out, client.DownloadRequest{Name: "etcd-1"})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("downloaded %d bytes differ from the %d uploaded", out.Len(), len(data))
	}
	if got.GetSha256() != sha(out.Bytes()) {
		t.Fatalf("header sha %s, data sha %s", got.GetSha256(), sha(out.Bytes()))
	}
	// Survives a restart of the server on the same directory.
	ts.Stop()
	ts2 := servertest.Start(t, ts.Dir)
	out.Reset()
	if _, err := ts2.Client.Download(context.Background(), &out, client.DownloadRequest{Name: "etcd-1"}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), data) {
		t.Fatal("data changed across restart")
	}
}

func TestDownloadFromOffset(t *testing.T) {
	ts := servertest.Start(t, "")
	data := trailed(t, 3<<20) // 3 MiB + 32
	ts.Upload(t, "b", data)
	for _, off := range []int64{0, 1, 1 << 20, int64(len(data)) - 1, int64(len(data))} {
		prefix := sha256.New()
		prefix.Write(data[:off])
		var out bytes.Buffer
		if _, err := ts.Client.Download(context.Background(), &out, client.DownloadRequest{Name: "b", Offset: off, Prefix: prefix}); err != nil {
			t.Fatalf("offset %d: %v", off, err)
		}
		if !bytes.Equal(out.Bytes(), data[off:]) {
			t.Fatalf("offset %d: wrong bytes", off)
		}
	}
	stream, err := ts.Client.Backups.DownloadBackup(context.Background(), &ebv1.DownloadBackupRequest{Name: "b", Offset: int64(len(data)) + 1})
	if err == nil {
		_, err = stream.Recv()
	}
	servertest.WantCode(t, err, codes.OutOfRange)
	if !strings.Contains(status.Convert(err).Message(), "past the end") {
		t.Fatalf("message does not explain: %v", err)
	}
}

// A length asks for a range: the stream carries exactly those bytes (cut
// at the end of the backup) and its header says how many.
func TestDownloadRange(t *testing.T) {
	ts := servertest.Start(t, "")
	data := trailed(t, 3<<20+5) // 3 MiB + 32: not a whole number of chunks
	ts.Upload(t, "b", data)
	size := int64(len(data))
	for _, r := range [][2]int64{{0, 1}, {0, 1 << 20}, {7, 2<<20 + 3}, {size - 5, 5}, {size - 5, 1 << 30}, {1 << 20, 0}} {
		stream, err := ts.Client.Backups.DownloadBackup(context.Background(), &ebv1.DownloadBackupRequest{Name: "b", Offset: r[0], Length: r[1]})
		if err != nil {
			t.Fatal(err)
		}
		end := size
		if r[1] > 0 {
			end = min(size, r[0]+r[1])
		}
		var got []byte
		for {
			m, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("range %v: %v", r, err)
			}
			if h := m.GetHeader(); h != nil && (h.GetOffset() != r[0] || h.GetLength() != end-r[0]) {
				t.Fatalf("range %v: header says offset %d, length %d; want %d, %d", r, h.GetOffset(), h.GetLength(), r[0], end-r[0])
			}
			got = append(got, m.GetChunk()...)
		}
		if !bytes.Equal(got, data[r[0]:end]) {
			t.Fatalf("range %v: got %d bytes, want bytes %d-%d", r, len(got), r[0], end)
		}
	}
	stream, err := ts.Client.Backups.DownloadBackup(context.Background(), &ebv1.DownloadBackupRequest{Name: "b", Length: -1})
	if err == nil {
		_, err = stream.Recv()
	}
	servertest.WantCode(t, err, codes.InvalidArgument)
	if !strings.Contains(status.Convert(err).Message(), "length -1 is negative") {
		t.Fatalf("message does not name the length: %v", err)
	}
}

func TestConcurrentDownloads(t *testing.T) {
	ts := servertest.Start(t, "")
	data := trailed(t, 8<<20)
	ts.Upload(t, "shared", data)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := sha256.New()
			n := &countingWriter{w: h}
			b, err := ts.Client.Download(context.Background(), n, client.DownloadRequest{Name: "shared"})
			if err == nil && (n.n != int64(len(data)) || hex.EncodeToString(h.Sum(nil)) != sha(data) || b.GetSha256() != sha(data)) {
				err = errors.New("wrong bytes")
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.w.Write(p)
}
