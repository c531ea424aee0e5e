//go:build linux

package nodeagent

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/logs"
)

// ServeContainerLogs answers the kubelet's
// GET /containerLogs/{namespace}/{pod}/{container}, which `kubectl logs`
// reaches through the API server. The query is PodLogOptions (follow,
// previous, timestamps, tailLines — or the old "tail" —, limitBytes,
// sinceSeconds, sinceTime); the log files are read by the kubelet's own
// CRI log reader.
func (a *Agent) ServeContainerLogs(w http.ResponseWriter, r *http.Request, ns, podName, container string) {
	wk := a.workerByName(ns, podName)
	if wk == nil {
		http.Error(w, fmt.Sprintf("pod %q does not exist", podName), http.StatusNotFound)
		return
	}
	opts, previous, err := parseLogOptions(r.URL.Query())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	v, ok := wk.view(container)
	if !ok {
		http.Error(w, fmt.Sprintf("container %q not found in pod %q", container, podName), http.StatusNotFound)
		return
	}
	path, id := v.logPath, v.runID
	if previous {
		if v.prevLogPath == "" {
			http.Error(w, fmt.Sprintf("previous terminated container %q in pod %q not found", container, podName), http.StatusBadRequest)
			return
		}
		path, id = v.prevLogPath, ""
	}
	if path == "" {
		http.Error(w, fmt.Sprintf("container %q in pod %q is waiting to start: %s", container, podName, v.waitingReason), http.StatusBadRequest)
		return
	}
	if !opts.Follow {
		id = ""
	}
	w.Header().Set("Content-Type", "text/plain")
	fw := &flushWriter{w: w}
	if f, ok := w.(http.Flusher); ok {
		fw.flush = f.Flush
	}
	if err := logs.ReadLogs(r.Context(), path, id, opts, runtimeStatus{a: a}, fw, fw); err != nil && !fw.wrote && r.Context().Err() == nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
	}
}

// parseLogOptions decodes the query of /containerLogs the way the kubelet
// does (into PodLogOptions, then into the CRI reader's options).
func parseLogOptions(q url.Values) (*logs.LogOptions, bool, error) {
	opts := &logs.LogOptions{}
	b := func(name string) (bool, error) {
		v := q.Get(name)
		if v == "" {
			return false, nil
		}
		return strconv.ParseBool(v)
	}
	i := func(name string) (*int64, error) {
		v := q.Get(name)
		if v == "" {
			return nil, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("invalid %s %q", name, v)
		}
		return &n, nil
	}
	var err error
	var previous bool
	if opts.Follow, err = b("follow"); err != nil {
		return nil, false, err
	}
	if opts.Timestamp, err = b("timestamps"); err != nil {
		return nil, false, err
	}
	if previous, err = b("previous"); err != nil {
		return nil, false, err
	}
	if tail := q.Get("tail"); tail != "" && tail != "all" {
		q.Set("tailLines", tail)
	}
	if opts.TailLines, err = i("tailLines"); err != nil {
		return nil, false, err
	}
	if opts.LimitBytes, err = i("limitBytes"); err != nil {
		return nil, false, err
	}
	since, err := i("sinceSeconds")
	if err != nil {
		return nil, false, err
	}
	now := time.Now()
	if since != nil {
		opts.Since = now.Add(-time.Duration(*since) * time.Second)
	}
	if v := q.Get("sinceTime"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return nil, false, fmt.Errorf("invalid sinceTime %q", v)
		}
		if t.After(opts.Since) {
			opts.Since = t
		}
	}
	return opts, previous, nil
}

// flushWriter flushes after every write, so followed logs stream.
type flushWriter struct {
	w     http.ResponseWriter
	flush func()
	wrote bool
}

func (f *flushWriter) Write(p []byte) (int, error) {
	f.wrote = true
	n, err := f.w.Write(p)
	if f.flush != nil {
		f.flush()
	}
	return n, err
}

// runtimeStatus is the one CRI call the log reader makes while following:
// is the container still running?
type runtimeStatus struct {
	internalapi.RuntimeService // nil: no other method is ever called
	a                          *Agent
}

func (s runtimeStatus) ContainerStatus(_ context.Context, id string, _ bool) (*runtimeapi.ContainerStatusResponse, error) {
	state := runtimeapi.ContainerState_CONTAINER_EXITED
	if r := s.a.runByID(id); r != nil && r.running() {
		state = runtimeapi.ContainerState_CONTAINER_RUNNING
	}
	return &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{Id: id, State: state}}, nil
}

// lastLogLines returns up to n lines (at most max bytes) of a CRI log's
// content, for terminationMessagePolicy FallbackToLogsOnError.
func lastLogLines(path string, n, max int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var out []string
	for _, line := range bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n")) {
		// TIMESTAMP STREAM TAG CONTENT
		parts := bytes.SplitN(line, []byte(" "), 4)
		if len(parts) == 4 {
			out = append(out, string(parts[3]))
		}
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	s := strings.Join(out, "\n")
	if len(s) > max {
		s = s[len(s)-max:]
	}
	return s
}
