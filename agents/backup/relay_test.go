package backup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/etcdtest"
)

// split cuts msg into buffers of at most size bytes, as gRPC hands a
// message over in the frames it arrived in.
func split(msg []byte, size int) mem.BufferSlice {
	var out mem.BufferSlice
	for len(msg) > 0 {
		n := min(size, len(msg))
		out = append(out, mem.SliceBuffer(msg[:n]))
		msg = msg[n:]
	}
	return out
}

func TestParseSnapshotResponse(t *testing.T) {
	blob := make([]byte, 40000)
	_, _ = rand.NewChaCha8([32]byte{1}).Read(blob)
	etcdOrder, err := proto.Marshal(&pb.SnapshotResponse{
		Header: &pb.ResponseHeader{ClusterId: 1, MemberId: 2, Revision: 3, RaftTerm: 4}, RemainingBytes: 12345, Blob: blob, Version: "3.7.3",
	})
	if err != nil {
		t.Fatal(err)
	}
	// Any order, fields this build does not know, and a blob sent twice
	// (the last wins), all valid protobuf.
	var odd []byte
	odd = protowire.AppendTag(odd, snapshotVersionField, protowire.BytesType)
	odd = protowire.AppendString(odd, "3.7.3")
	odd = protowire.AppendTag(odd, snapshotBlobField, protowire.BytesType)
	odd = protowire.AppendBytes(odd, []byte("an earlier blob"))
	odd = protowire.AppendTag(odd, 99, protowire.Fixed32Type)
	odd = protowire.AppendFixed32(odd, 7)
	odd = protowire.AppendTag(odd, 98, protowire.Fixed64Type)
	odd = protowire.AppendFixed64(odd, 7)
	odd = protowire.AppendTag(odd, 97, protowire.VarintType)
	odd = protowire.AppendVarint(odd, 1<<40)
	odd = protowire.AppendTag(odd, snapshotBlobField, protowire.BytesType)
	odd = protowire.AppendBytes(odd, blob)
	odd = protowire.AppendTag(odd, 2, protowire.VarintType)
	odd = protowire.AppendVarint(odd, 1)

	for name, msg := range map[string][]byte{"etcd's order": etcdOrder, "odd": odd} {
		for _, size := range []int{1, 3, 7, 1000, 16384, len(msg)} {
			got, version, err := parseSnapshotResponse(split(msg, size))
			if err != nil {
				t.Fatalf("%s in buffers of %d: %v", name, size, err)
			}
			if !bytes.Equal(bytes.Join(got, nil), blob) || version != "3.7.3" {
				t.Fatalf("%s in buffers of %d: blob of %d bytes (equal: %v), version %q", name, size,
					len(bytes.Join(got, nil)), bytes.Equal(bytes.Join(got, nil), blob), version)
			}
		}
		// The blob is windows of the buffers, not a copy: what changes in
		// them changes in it.
		own := bytes.Clone(msg)
		got, _, _ := parseSnapshotResponse(split(own, 1000))
		for i := range own {
			own[i] ^= 0xff
		}
		if joined := bytes.Join(got, nil); len(joined) == 0 || joined[0] != blob[0]^0xff {
			t.Fatalf("%s: the blob was copied out of the buffers", name)
		}
	}

	group := protowire.AppendTag(nil, 5, protowire.StartGroupType)
	badNumber := protowire.AppendVarint(nil, 0<<3|2)
	for name, msg := range map[string][]byte{
		"truncated":     etcdOrder[:len(etcdOrder)-1],
		"long length":   append(protowire.AppendTag(nil, snapshotBlobField, protowire.BytesType), protowire.AppendVarint(nil, 1<<40)...),
		"cut varint":    protowire.AppendTag(nil, 1<<20, protowire.VarintType)[:2],
		"group":         group,
		"field 0":       badNumber,
		"cut fixed64":   protowire.AppendTag(nil, 9, protowire.Fixed64Type),
		"no length end": append(protowire.AppendTag(nil, snapshotVersionField, protowire.BytesType), 0x80),
	} {
		if _, _, err := parseSnapshotResponse(split(msg, 2)); err == nil || !strings.Contains(err.Error(), "snapshot message") {
			t.Errorf("%s: got %v, want a snapshot message error", name, err)
		}
	}
}

// The relay cuts etcd's messages into chunks of its size, whatever their
// boundaries, and passes every byte of the snapshot in order.
func TestRelayCutsTheSnapshotIntoChunks(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	etcdtest.Fill(t, c, 500, 4096) // ≈ 2 MiB: dozens of etcd's messages
	const chunk = 10000            // not a multiple of etcd's 32 KiB
	var progress []int64
	r, err := startRelay(context.Background(), c, chunk, func(n int64) { progress = append(progress, n) })
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Version == "" {
		t.Error("no etcd version from the first message")
	}
	var snap []byte
	for {
		b, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if b.Len() > chunk || b.Len() == 0 {
			t.Fatalf("chunk of %d bytes, want 1 to %d", b.Len(), chunk)
		}
		snap = append(snap, b.Materialize()...)
		b.Free()
	}
	if _, err := r.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("Next after the end: %v, want io.EOF", err)
	}
	if len(snap) < 2<<20 {
		t.Fatalf("snapshot of %d bytes from ≈ 2 MiB of values", len(snap))
	}
	if sum := sha256.Sum256(snap[:len(snap)-32]); !bytes.Equal(sum[:], snap[len(snap)-32:]) {
		t.Fatal("the relayed snapshot fails etcd's SHA-256 trailer")
	}
	if len(progress) == 0 || progress[len(progress)-1] != int64(len(snap)) {
		t.Fatalf("progress ended at %v, want %d", progress[len(progress)-1:], len(snap))
	}
}

// A broken stream is the relay's error, remembered for the agent's message.
func TestRelayReportsABrokenStream(t *testing.T) {
	te := etcdtest.Start(t, false)
	c := te.Client(t)
	etcdtest.Fill(t, c, 2000, 4096)
	ctx, cancel := context.WithCancel(context.Background())
	r, err := startRelay(ctx, c, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b, err := r.Next()
	if err != nil {
		t.Fatal(err)
	}
	b.Free()
	cancel()
	for err == nil {
		if b, err = r.Next(); err == nil {
			b.Free()
		}
	}
	if errors.Is(err, io.EOF) || r.err == nil {
		t.Fatalf("Next after the stream was cancelled: %v (relay error %v), want the stream's error", err, r.err)
	}
}
