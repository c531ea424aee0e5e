// Package rawcodec is the floor program's wire: a gRPC codec whose
// message is its bytes, with no protobuf around them, and the names of the
// floor's two streams, so that the floor program and BenchmarkFloors (its
// download client) speak it alike.
package rawcodec

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
)

// The floor's service and its streams: an upload is the backup's name,
// then its bytes, answered with "SIZE SHA256"; a download is asked with a
// name and answered with the bytes.
const (
	Service        = "floor.Floor"
	UploadMethod   = "/" + Service + "/Upload"
	DownloadMethod = "/" + Service + "/Download"
)

// Streams are the descriptions of UploadMethod and DownloadMethod, in that
// order, for a client's NewStream and a server's ServiceDesc.
var Streams = []grpc.StreamDesc{
	{StreamName: "Upload", ClientStreams: true},
	{StreamName: "Download", ServerStreams: true},
}

// Codec is the codec both ends force (grpc.ForceCodecV2,
// grpc.ForceServerCodecV2). It is a CodecV2 rather than an
// encoding.Codec: through gRPC's bridge for the older interface every
// received message would be gathered into a newly allocated slice, work
// a floor must not carry.
type Codec struct{}

// Marshal sends a []byte or a mem.BufferSlice as it is: gRPC's framing is
// the only cost left. A []byte must not change until gRPC has written it,
// which the caller cannot know: a slice it will reuse goes as a
// mem.BufferSlice from a pool instead, which gRPC frees once written.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case []byte:
		return mem.BufferSlice{mem.SliceBuffer(m)}, nil
	case mem.BufferSlice:
		m.Ref()
		return m, nil
	default:
		return nil, fmt.Errorf("rawcodec: cannot send a %T", v)
	}
}

// Unmarshal gathers the frames of a message into *v, a *[]byte reused
// from message to message: the one copy a receiver makes.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	p, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rawcodec: cannot receive into a %T", v)
	}
	n := data.Len()
	if cap(*p) < n {
		*p = make([]byte, n)
	}
	*p = (*p)[:n]
	data.CopyTo(*p)
	return nil
}

// Name implements encoding.CodecV2.
func (Codec) Name() string { return "raw" }
