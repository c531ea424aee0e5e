package plugin

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tunnel"
)

// The pod a command reached is remembered in kubectl's cache directory
// (--cache-dir, ~/.kube/cache), beside kubectl's discovery cache, per API
// server, namespace and Service. The next command starts its
// port-forward to that pod while it looks the server up, and uses it only
// if the lookup finds the same pod behind the Service (tunnel.Hint): a
// stale or altered file costs that command the time it saves, never its
// correctness.

// podHint is what the file holds.
type podHint struct {
	Pod  string `json:"pod"`
	Port int32  `json:"port"`
}

// unsafeHostChars are the characters of an API server URL that do not go
// into a directory name, as kubectl's discovery cache has them.
var unsafeHostChars = regexp.MustCompile(`[^\w.-]`)

// podHintPath is where the hint for host and the server's Service
// is kept, or "" when there is no cache directory.
func (g *GlobalOptions) podHintPath(host string) string {
	if g.ConfigFlags.CacheDir == nil || *g.ConfigFlags.CacheDir == "" {
		return ""
	}
	host = strings.TrimPrefix(strings.TrimPrefix(host, "https://"), "http://")
	return filepath.Join(*g.ConfigFlags.CacheDir, "etcdbackup",
		unsafeHostChars.ReplaceAllString(host, "_"),
		unsafeHostChars.ReplaceAllString(g.namespace()+"_"+g.ServerService, "_")+".json")
}

// usePodHint gives d the hint kept at path, if any, and has d keep
// the endpoint it resolves there for the next command. Failing to read
// or write the file only costs the time a hint saves.
func usePodHint(d *tunnel.Dialer, path string) {
	if path == "" {
		return
	}
	var h podHint
	if data, err := os.ReadFile(path); err == nil && json.Unmarshal(data, &h) == nil {
		d.SetHint(tunnel.Hint{Pod: h.Pod, Port: h.Port})
	}
	// gRPC's re-dials (after the pod was replaced) may resolve on
	// several connections at once.
	var mu sync.Mutex
	d.Resolved = func(ep *tunnel.Endpoint) {
		mu.Lock()
		defer mu.Unlock()
		next := podHint{Pod: ep.Pod.Name, Port: ep.Port}
		if next == h {
			return
		}
		h = next
		_ = writeFileAtomic(path, next)
	}
}

// writeFileAtomic writes v as JSON to path by renaming a temporary file
// over it, so a concurrent command reads the old hint or the new one.
func writeFileAtomic(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}
