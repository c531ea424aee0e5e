package backup

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// snapshotCodec is gRPC's proto codec, but it gathers a message spread
// over several frames into a buffer of a grpcbuf.Pool: the standard codec
// takes that buffer from gRPC's default pool, which clears it first.
type snapshotCodec struct {
	encoding.CodecV2 // gRPC's own "proto" codec, for Marshal and Name
	pool             mem.BufferPool
}

// Unmarshal implements encoding.CodecV2.
func (c snapshotCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("failed to unmarshal, message is %T, want proto.Message", v)
	}
	buf := data.MaterializeToBuffer(c.pool)
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

// etcdDialOptions take the agent's etcd connections' buffers from
// snapshotBuffers.
func etcdDialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		experimental.WithBufferPool(snapshotBuffers),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(snapshotCodec{CodecV2: encoding.GetCodecV2(grpcproto.Name), pool: snapshotBuffers})),
	}
}
