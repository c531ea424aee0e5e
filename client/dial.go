package client

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Dial connects to the data server at addr (HOST:PORT) directly — how the
// agents reach it through its Service — without resolving addr through
// gRPC's name resolvers.
func Dial(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, *Client, error) {
	opts = append(append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), Reconnect}, DialOptions...), opts...)
	conn, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("server address %q: %w", addr, err)
	}
	return conn, New(conn), nil
}
