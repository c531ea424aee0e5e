// Package tunnel connects to the etcdbackup data server through the
// Kubernetes API server, as `kubectl port-forward` would, but without a
// local port: its one job is to turn "the server's Service in namespace N"
// into a net.Conn for gRPC.
//
// The pieces follow client-go's tools/portforward, one file each:
// resolve.go finds a Ready pod behind the Service and the container port
// its "grpc" port leads to; dial.go opens the port-forward with kubectl's
// dialers (WebSocket first, SPDY as fallback) and sets up its streams;
// conn.go is the forwarded stream as a net.Conn; errors.go holds the typed
// errors that tell the user what to do. No local port is ever listened on,
// so nothing else on the machine can reach the tunnel.
package tunnel
