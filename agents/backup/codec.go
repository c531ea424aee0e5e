package backup

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"
)

// relayCodec is gRPC's proto codec, except that it decodes a
// *snapshotMessage without copying the blob (relay).
type relayCodec struct{ encoding.CodecV2 }

func (c relayCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*snapshotMessage)
	if !ok {
		return c.CodecV2.Unmarshal(data, v)
	}
	var err error
	if m.blob, m.version, err = parseSnapshotResponse(data); err != nil {
		return err
	}
	data.Ref() // gRPC frees data when Unmarshal returns
	m.held = &heldMessage{data: data}
	m.held.refs.Store(1)
	return nil
}

// etcdDialOptions take the agent's etcd connections' frame buffers from
// snapshotBuffers.
func etcdDialOptions() []grpc.DialOption {
	return []grpc.DialOption{experimental.WithBufferPool(snapshotBuffers)}
}
