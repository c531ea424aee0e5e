package rpc_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/klauspost/compress/zstd"
	"google.golang.org/grpc/codes"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/agentjob"
	ebv1 "github.com/kubectl-etcdbackup/kubectl-etcdbackup/api/etcdbackup/v1"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/client"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/config"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/servertest/backuptest"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/snapshot"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

// zstdOf is data compressed as agents compress it.
func zstdOf(t *testing.T, data []byte) []byte {
	t.Helper()
	r, err := snapshot.Compress(context.Background(), bytes.NewReader(data), ebv1.CompressionZstd)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// zstdBomb is n zero bytes in a few kilobytes of zstd.
func zstdBomb(t *testing.T, n int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc, err := zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := enc.Write(make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// A compressed upload that says no raw size is refused once its data has
// arrived (the trailer is where senders say it), saying what to send, and
// nothing is stored; with the raw size in the trailer, as the agent and
// the client send it, it is stored with it.
func TestCompressedUploadWithoutRawSizeIsRefused(t *testing.T) {
	ctx := context.Background()
	srv := servertest.Start(t, "")
	plain := trailed(t, 4096)
	stored := zstdOf(t, plain)
	before := servertest.Tree(t, srv.Dir)
	_, err := srv.Client.Upload(ctx, bytes.NewReader(stored), &ebv1.UploadHeader{Name: "no-raw", Compression: ebv1.CompressionZstd}, nil)
	servertest.WantRefusal(t, err, codes.InvalidArgument, `upload of "no-raw"`, "zstd-compressed", "no raw size was sent", "raw_size", "nothing was stored")
	if after := servertest.Tree(t, srv.Dir); after != before {
		t.Fatalf("the refused upload changed storage:\n%s\nvs\n%s", before, after)
	}
	b, err := srv.Client.UploadWith(ctx, bytes.NewReader(stored), client.UploadRequest{
		Header: &ebv1.UploadHeader{Name: "raw", Compression: ebv1.CompressionZstd},
		Raw:    func() (int64, string) { return int64(len(plain)), sha(plain) },
	})
	if err != nil || b.GetRawSize() != int64(len(plain)) || b.GetRawSha256() != sha(plain) {
		t.Fatalf("compressed upload with its raw size: %v, %v", b, err)
	}
	// The header may say it instead.
	if _, err := srv.Client.Upload(ctx, bytes.NewReader(stored), &ebv1.UploadHeader{Name: "raw-in-header", Compression: ebv1.CompressionZstd, RawSize: int64(len(plain))}, nil); err != nil {
		t.Fatalf("compressed upload with its raw size in the header: %v", err)
	}
}

// limits.maxRawSize refuses a plain upload past it as soon as it arrives,
// one that declares more in its header before any data, and a
// compressed one whose trailer says more; nothing is stored.
func TestRawSizeOverTheLimitIsRefused(t *testing.T) {
	ctx := context.Background()
	const most = 64<<10 + 32 // a snapshot's size: pages and etcd's trailer
	srv := servertest.StartWith(t, servertest.Options{Limits: config.Limits{MaxRawSize: most}})
	before := servertest.Tree(t, srv.Dir)
	big := trailed(t, 2*most)
	declared := fmt.Sprintf("declared %d bytes", len(big))

	_, err := srv.Client.Upload(ctx, bytes.NewReader(big), &ebv1.UploadHeader{Name: "plain"}, nil)
	servertest.WantRefusal(t, err, codes.InvalidArgument, `upload of "plain"`, "65568", "limits.maxRawSize", "nothing was stored")
	size := int64(len(big))
	_, err = srv.Client.Upload(ctx, bytes.NewReader(big), &ebv1.UploadHeader{Name: "declared", ExpectedSize: &size}, nil)
	servertest.WantRefusal(t, err, codes.InvalidArgument, `upload of "declared"`, declared, "limits.maxRawSize")
	_, err = srv.Client.Upload(ctx, bytes.NewReader(zstdOf(t, big)), &ebv1.UploadHeader{Name: "header", Compression: ebv1.CompressionZstd, RawSize: size}, nil)
	servertest.WantRefusal(t, err, codes.InvalidArgument, `upload of "header"`, declared, "limits.maxRawSize")
	_, err = srv.Client.UploadWith(ctx, bytes.NewReader(zstdOf(t, big)), client.UploadRequest{
		Header: &ebv1.UploadHeader{Name: "trailer", Compression: ebv1.CompressionZstd},
		Raw:    func() (int64, string) { return size, sha(big) },
	})
	servertest.WantRefusal(t, err, codes.InvalidArgument, `upload of "trailer"`, fmt.Sprint(len(big)), "limits.maxRawSize", "nothing was stored")
	if after := servertest.Tree(t, srv.Dir); after != before {
		t.Fatalf("refused uploads changed storage:\n%s\nvs\n%s", before, after)
	}
	if _, err := srv.Client.Upload(ctx, bytes.NewReader(trailed(t, most)), &ebv1.UploadHeader{Name: "at-the-limit"}, nil); err != nil {
		t.Fatalf("an upload of exactly limits.maxRawSize: %v", err)
	}
}

// A zstd bomb stored without a raw size (before uploads had to say it,
// or put there by hand) is unpacked by verify to at most
// limits.maxRawSize, and reported corrupt with a clear error; one that
// records a smaller raw size stops there.
func TestVerifyBoundsAZstdBomb(t *testing.T) {
	ctx := context.Background()
	const most = 1 << 20
	srv := servertest.StartWith(t, servertest.Options{Limits: config.Limits{MaxRawSize: most}})
	loc, err := filesystem.New(srv.Dir)
	if err != nil {
		t.Fatal(err)
	}
	bomb := zstdBomb(t, 64<<20)
	backuptest.Put(t, loc, &storage.Manifest{Name: "bomb", Compression: ebv1.CompressionZstd}, bomb)
	backuptest.Put(t, loc, &storage.Manifest{Name: "recorded", Compression: ebv1.CompressionZstd, RawSize: 4096}, bomb)

	_, err = srv.Client.Backups.VerifyBackup(ctx, &ebv1.VerifyBackupRequest{Name: "bomb"})
	servertest.WantRefusal(t, err, codes.DataLoss, `backup "bomb"`, "records no raw size and expands past 1048576 bytes", "do not restore it")
	_, err = srv.Client.Backups.VerifyBackup(ctx, &ebv1.VerifyBackupRequest{Name: "recorded"})
	servertest.WantRefusal(t, err, codes.DataLoss, `backup "recorded"`, "expands past its recorded size of 4096 bytes")
}

// Four users' uploads that send nothing more hold every user slot of the
// location (limits.uploadsPerLocation, 4): a fifth user's is refused,
// and a backup agent's upload, from a pool of its own
// (limits.agentUploadsPerLocation), is stored all the same.
func TestSlowUserUploadsLeaveAgentsTheirSlots(t *testing.T) {
	ctx := context.Background()
	agent := servertest.AsAgent{Kind: agentjob.Backup, JobNamespace: "etcdbackup", JobName: "backup-x", Backup: "scheduled", Location: "default"}
	srv := servertest.StartWith(t, servertest.Options{AgentGuard: agent})
	for _, name := range []string{"slow-1", "slow-2", "slow-3", "slow-4"} {
		srv.OpenUpload(t, "default", name)
	}
	srv.WaitInProgress(t, "default", 4)

	_, err := srv.Client.Upload(ctx, bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: "fifth"}, nil)
	servertest.WantRefusal(t, err, codes.ResourceExhausted, `4 uploads to location "default" are in progress`, "limits.uploadsPerLocation")

	b, err := srv.AgentClient.Upload(ctx, bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: "scheduled"}, nil)
	if err != nil {
		t.Fatalf("the agent's upload beside four held user uploads: %v", err)
	}
	if b.GetSource().GetKind() != ebv1.SourceAgent {
		t.Errorf("stored as %q, want an agent's", b.GetSource().GetKind())
	}
}

// Nor does an agent's upload take a user's slot.
func TestAgentUploadDoesNotTakeAUserSlot(t *testing.T) {
	agent := servertest.AsAgent{Kind: agentjob.Backup, JobNamespace: "etcdbackup", JobName: "backup-x", Backup: "scheduled", Location: "default"}
	srv := servertest.StartWith(t, servertest.Options{AgentGuard: agent, Limits: config.Limits{UploadsPerLocation: 1, AgentUploadsPerLocation: 1}})
	stream, err := srv.AgentClient.Backups.UploadBackup(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&ebv1.UploadBackupRequest{Msg: &ebv1.UploadBackupRequest_Header{Header: &ebv1.UploadHeader{Name: "scheduled"}}}); err != nil {
		t.Fatal(err)
	}
	srv.WaitInProgress(t, "default", 1)
	if _, err := srv.Client.Upload(context.Background(), bytes.NewReader(trailed(t, 1)), &ebv1.UploadHeader{Name: "user"}, nil); err != nil {
		t.Fatalf("a user's upload beside an agent's holding the agents' only slot: %v", err)
	}
}
