package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

// connector opens a new gRPC connection to addr per range and counts them.
func connector(t *testing.T, addr string, opened *atomic.Int32) client.Connector {
	return func(context.Context) (*client.Client, func(), error) {
		conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, nil, err
		}
		opened.Add(1)
		return client.New(conn), func() { conn.Close() }, nil
	}
}

// uploadRandomBytes uploads random bytes of about size (rounded up to
// what ends in etcd's trailer, as the server requires) and returns them.
func uploadRandomBytes(t *testing.T, c *client.Client, name string, size int) []byte {
	t.Helper()
	data := etcdtest.TrailedBytes(t, etcdtest.TrailedSize(size))
	if _, err := c.Upload(context.Background(), bytes.NewReader(data), &ebv1.UploadHeader{Name: name}, nil); err != nil {
		t.Fatal(err)
	}
	return data
}

func assertGone(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s exists (%v), want it gone", p, err)
		}
	}
}

func TestParallelDownloadIsByteIdenticalAcrossBrokenConnections(t *testing.T) {
	addr := startServer(t)
	data := uploadRandomBytes(t, dial(t, addr), "p", 12<<20+12345)
	// Every connection, the first one's and the ranges' own, goes through
	// a proxy that cuts the first three after 2 MiB.
	proxy := newCuttingProxy(t, addr, 2<<20, 3)
	var opened atomic.Int32
	path := t.TempDir() + "/p.db"
	b, err := dial(t, proxy.lis.Addr().String()).DownloadFile(context.Background(), client.FileDownload{
		Path: path, DownloadRequest: client.DownloadRequest{Name: "p"},
		Parallel: 4, PieceBytes: 1 << 20, Connect: connector(t, proxy.lis.Addr().String(), &opened),
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("downloaded %d bytes, equal=%v, err %v", len(got), bytes.Equal(got, data), err)
	}
	if b.GetSize() != int64(len(data)) {
		t.Fatalf("backup size %d, want %d", b.GetSize(), len(data))
	}
	if opened.Load() != 3 {
		t.Fatalf("opened %d connections for ranges, want 3 (the first range uses the client's)", opened.Load())
	}
	if proxy.cutDone.Load() != 3 {
		t.Fatalf("the proxy cut %d connections, want 3: the test did not exercise resuming ranges", proxy.cutDone.Load())
	}
	assertGone(t, path+".part", path+".part"+client.RangesSuffix)
}

func TestParallelDownloadResumesFromItsRanges(t *testing.T) {
	addr := startServer(t)
	c := dial(t, addr)
	data := uploadRandomBytes(t, c, "r", 16<<20)
	path := t.TempDir() + "/r.db"
	part, side := path+".part", path+".part"+client.RangesSuffix

	// Interrupt the first run once 6 MiB arrived.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var opened atomic.Int32
	_, err := c.DownloadFile(ctx, client.FileDownload{
		Path: path, Parallel: 4, PieceBytes: 1 << 20, Connect: connector(t, addr, &opened),
		DownloadRequest: client.DownloadRequest{Name: "r", Progress: func(n int64) {
			if n >= 6<<20 {
				cancel()
			}
		}},
	})
	if err == nil {
		t.Fatal("the interrupted download succeeded")
	}
	buf, rerr := os.ReadFile(side)
	if rerr != nil {
		t.Fatalf("no record of the ranges after an interruption: %v (download error %v)", rerr, err)
	}
	var rec struct {
		Ranges []struct{ Start, Reached, End int64 }
	}
	if err := json.Unmarshal(buf, &rec); err != nil {
		t.Fatal(err)
	}
	var have int64
	for _, r := range rec.Ranges {
		have += r.Reached - r.Start
	}
	if have < 6<<20 || have == int64(len(data)) {
		t.Fatalf("the record says %d bytes are in the .part, want at least 6 MiB and not all", have)
	}

	// A second run, single-stream as asked, continues the ranges.
	var resumedAt int64
	if _, err := c.DownloadFile(context.Background(), client.FileDownload{
		Path: path, DownloadRequest: client.DownloadRequest{Name: "r"},
		OnResume: func(_ string, n int64) { resumedAt = n },
	}); err != nil {
		t.Fatal(err)
	}
	if resumedAt != have {
		t.Fatalf("resumed with %d bytes, the record said %d", resumedAt, have)
	}
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("resumed download: %d bytes, equal=%v, err %v", len(got), bytes.Equal(got, data), err)
	}
	assertGone(t, part, side)
}

func TestParallelDownloadDetectsACorruptRange(t *testing.T) {
	addr := startServer(t)
	c := dial(t, addr)
	data := uploadRandomBytes(t, c, "x", 8<<20)
	path := t.TempDir() + "/x.db"
	part, side := path+".part", path+".part"+client.RangesSuffix
	// A .part whose record says its second range is complete, but one
	// byte of that range is wrong: only the whole SHA-256 can tell.
	bad := append([]byte(nil), data...)
	bad[5<<20] ^= 1
	if err := os.WriteFile(part, bad[:6<<20], 0o600); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Backups.GetBackup(context.Background(), &ebv1.GetBackupRequest{Name: "x"})
	if err != nil {
		t.Fatal(err)
	}
	b := resp.GetBackup()
	rec, _ := json.Marshal(map[string]any{"size": b.GetSize(), "sha256": b.GetSha256(), "ranges": []map[string]int64{
		{"Start": 0, "Reached": 1 << 20, "End": 4 << 20},
		{"Start": 4 << 20, "Reached": 6 << 20, "End": 6 << 20},
		{"Start": 6 << 20, "Reached": 6 << 20, "End": b.GetSize()}, // 8 MiB and etcd's 32-byte trailer
	}})
	if err := os.WriteFile(side, rec, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = c.DownloadFile(context.Background(), client.FileDownload{Path: path, Parallel: 2, DownloadRequest: client.DownloadRequest{Name: "x"}})
	if !errors.Is(err, client.ErrCorrupt) {
		t.Fatalf("got %v, want ErrCorrupt", err)
	}
	assertGone(t, path, part, side)
}

func TestAutoParallel(t *testing.T) {
	for _, tc := range []struct {
		size int64
		want int
	}{{0, 1}, {client.ParallelAbove, 1}, {client.ParallelAbove + 1, 4}, {1 << 30, 4}} {
		if got := client.AutoParallel(tc.size); got != tc.want {
			t.Errorf("AutoParallel(%d) = %d, want %d", tc.size, got, tc.want)
		}
	}
}

// A parallel download from a server that takes lengths fetches pieces of
// PieceBytes, which the streams take in turn: an interrupted one records
// them, each no longer than a piece, and the next run completes them.
func TestParallelDownloadFetchesPieces(t *testing.T) {
	addr := startServer(t)
	c := dial(t, addr)
	const size = 10<<20 + 4321
	data := uploadRandomBytes(t, c, "pieces", size)
	path := t.TempDir() + "/pieces.db"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var opened atomic.Int32
	download := client.FileDownload{
		Path: path, Parallel: 3, PieceBytes: 1 << 20, Connect: connector(t, addr, &opened),
		DownloadRequest: client.DownloadRequest{Name: "pieces", Progress: func(n int64) {
			if n >= 4<<20 {
				cancel()
			}
		}},
	}
	if _, err := c.DownloadFile(ctx, download); err == nil {
		t.Fatal("the interrupted download succeeded")
	}
	buf, err := os.ReadFile(path + ".part" + client.RangesSuffix)
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Ranges []struct{ Start, Reached, End int64 }
	}
	if err := json.Unmarshal(buf, &rec); err != nil {
		t.Fatal(err)
	}
	if len(rec.Ranges) != 11 {
		t.Fatalf("the record has %d ranges, want 11 pieces of 1 MiB: %s", len(rec.Ranges), buf)
	}
	for _, r := range rec.Ranges {
		if r.End-r.Start > 1<<20 {
			t.Fatalf("range %d-%d is longer than a piece", r.Start, r.End)
		}
	}
	download.DownloadRequest.Progress = nil
	if _, err := c.DownloadFile(context.Background(), download); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("downloaded %d bytes, equal=%v, err %v", len(got), bytes.Equal(got, data), err)
	}
	if opened.Load() != 4 {
		t.Fatalf("opened %d connections, want 2 per run: each stream keeps its connection for its pieces", opened.Load())
	}
}

// lengthless is a server from before DownloadBackupRequest.length: it
// sends every stream to the end and says nothing of a length.
type lengthless struct{ *server.Server }

func (s lengthless) DownloadBackup(req *ebv1.DownloadBackupRequest, stream ebv1.BackupService_DownloadBackupServer) error {
	req = proto.CloneOf(req)
	req.Length = 0
	return s.Server.DownloadBackup(req, headerWithoutLength{stream})
}

type headerWithoutLength struct {
	ebv1.BackupService_DownloadBackupServer
}

func (h headerWithoutLength) Send(m *ebv1.DownloadBackupResponse) error {
	if hd := m.GetHeader(); hd != nil {
		hd.Length = 0
	}
	return h.BackupService_DownloadBackupServer.Send(m)
}

// Against such a server a parallel download falls back to one range per
// stream, each cancelled at its end, and is still byte for byte right.
func TestParallelDownloadFromAServerWithoutLengths(t *testing.T) {
	loc, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Locations: []server.NamedLocation{{Name: "default", Location: loc}}})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(server.GRPCServerOptions()...)
	ebv1.RegisterBackupServiceServer(gs, lengthless{srv})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	addr := lis.Addr().String()
	c := dial(t, addr)
	data := uploadRandomBytes(t, c, "old", 9<<20+77)
	var opened atomic.Int32
	path := t.TempDir() + "/old.db"
	if _, err := c.DownloadFile(context.Background(), client.FileDownload{
		Path: path, Parallel: 3, PieceBytes: 1 << 20, Connect: connector(t, addr, &opened),
		DownloadRequest: client.DownloadRequest{Name: "old"},
	}); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("downloaded %d bytes, equal=%v, err %v", len(got), bytes.Equal(got, data), err)
	}
	if opened.Load() != 2 {
		t.Fatalf("opened %d connections, want 2 (three ranges, the first on the client's)", opened.Load())
	}
}
