package server

import (
	"errors"
	"io"
	"maps"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/server/auth"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/storage/filesystem"
)

// The agent port registers the services itself (registerGuardFirst):
// it must serve every method the user port does, each as a stream.
func TestAgentPortServesWhatTheUserPortServes(t *testing.T) {
	loc, err := filesystem.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Locations: []NamedLocation{{Name: "default", Location: loc}}})
	if err != nil {
		t.Fatal(err)
	}
	methods := func(g *grpc.Server) map[string][]string {
		m := map[string][]string{}
		for name, info := range g.GetServiceInfo() {
			for _, mi := range info.Methods {
				m[name] = append(m[name], mi.Name)
			}
			slices.Sort(m[name])
		}
		return m
	}
	user, agent := s.NewGRPCServer(auth.AllowAll{}), s.newAgentServer()
	if u, a := methods(user), methods(agent); !maps.EqualFunc(u, a, slices.Equal) {
		t.Fatalf("the agent port serves %v; the user port %v", a, u)
	}
	for name, info := range agent.GetServiceInfo() {
		for _, mi := range info.Methods {
			if !mi.IsServerStream && !mi.IsClientStream {
				t.Errorf("%s/%s is unary on the agent port: its request is read before the guard", name, mi.Name)
			}
		}
	}
}

func TestPlausibleBearer(t *testing.T) {
	jwt := "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"
	for _, tc := range []struct {
		name string
		vals []string
		want string // "" admits
	}{
		{"a JWT", []string{"Bearer " + jwt}, ""},
		{"scheme in any case, padding", []string{"bearer  " + jwt + "=="}, ""},
		{"the longest", []string{"Bearer " + jwt[:len(jwt)-4] + strings.Repeat("A", maxBearerTokenBytes-len(jwt)+4)}, ""},
		{"none", nil, "header"},
		{"two", []string{"Bearer " + jwt, "Bearer " + jwt}, "header"},
		{"empty", []string{"Bearer "}, "header"},
		{"no scheme", []string{jwt}, "header"},
		{"basic", []string{"Basic " + jwt}, "header"},
		{"one segment", []string{"Bearer abc"}, "three base64url segments"},
		{"four segments", []string{"Bearer " + jwt + ".x"}, "three base64url segments"},
		{"an empty segment", []string{"Bearer a..c"}, "three base64url segments"},
		{"trailing dot", []string{"Bearer a.b."}, "three base64url segments"},
		{"standard base64", []string{"Bearer a+/.b.c"}, "three base64url segments"},
		{"too long", []string{"Bearer " + jwt + strings.Repeat("A", maxBearerTokenBytes)}, "over 8192 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			md := metadata.MD{}
			if tc.vals != nil {
				md[auth.AuthorizationHeader] = tc.vals
			}
			err := plausibleBearer(md)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("%v; want Unauthenticated saying %q", err, tc.want)
			case err != nil && strings.Contains(err.Error(), jwt):
				t.Fatalf("the refusal shows the token: %v", err)
			}
		})
	}
}

// Past its cap, a source's connections are closed as soon as they are
// accepted; a closed one gives its slot back; other sources are not
// counted with it.
func TestLimitPerSource(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusals := make(chan string, 4)
	l := limitPerSource(inner, 2, func(src string) { refusals <- src })
	defer l.Close()
	accepted := make(chan net.Conn)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial := func(source string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}
		c, err := d.Dial("tcp", inner.Addr().String())
		if errors.Is(err, syscall.EADDRNOTAVAIL) {
			t.Skip(err)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	served := func() net.Conn {
		t.Helper()
		select {
		case c := <-accepted:
			return c
		case <-time.After(5 * time.Second):
			t.Fatal("no connection accepted")
			return nil
		}
	}
	closedByServer := func(c net.Conn) {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("read from a connection past the cap: %v; want it closed", err)
		}
	}
	dial("127.0.0.2")
	a := served()
	dial("127.0.0.2")
	served()
	closedByServer(dial("127.0.0.2"))
	dial("127.0.0.1")
	served()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	_ = a.Close() // a second Close gives nothing more back
	dial("127.0.0.2")
	served()
	closedByServer(dial("127.0.0.2"))
	// Each refusal is reported with its source (the server counts and
	// logs them).
	for range 2 {
		if src := <-refusals; src != "127.0.0.2" {
			t.Errorf("refusal reported for %q, want 127.0.0.2", src)
		}
	}
}
