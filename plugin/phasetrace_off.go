//go:build !etcdbackup_trace

package plugin

import (
	"context"
	"net"
	"time"
)

// The product's build has no phase trace: these are phasetrace.go's
// hooks doing nothing (build with -tags etcdbackup_trace to measure).

var traceInit time.Time

func trace(string) {}

func traceAt(time.Time, string) {}

func traceFunc() func(string) { return nil }

func traceHTTP(ctx context.Context) context.Context { return ctx }

func traceNetConn(c net.Conn) net.Conn { return c }
