//go:build !linux

package nodeagent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"

	"k8s.io/apimachinery/pkg/types"
)

// errUnsupported: Pods need Linux network and mount namespaces.
var errUnsupported = errors.New("nodeagent: the sandbox node agent needs Linux (network and mount namespaces per Pod)")

// Agent is unavailable outside Linux; New says so.
type Agent struct{}

// New fails outside Linux.
func New(Config) (*Agent, error) { return nil, errUnsupported }

// Start fails outside Linux.
func (a *Agent) Start(context.Context) error { return errUnsupported }

// Stop does nothing outside Linux.
func (a *Agent) Stop() {}

// SetImage does nothing outside Linux.
func (a *Agent) SetImage(string, string) {}

// Images is empty outside Linux.
func (a *Agent) Images() map[string]string { return nil }

// AllocateIP fails outside Linux.
func (a *Agent) AllocateIP() (netip.Addr, error) { return netip.Addr{}, errUnsupported }

// ReleaseIP does nothing outside Linux.
func (a *Agent) ReleaseIP(netip.Addr) {}

// HasPod knows no Pod outside Linux.
func (a *Agent) HasPod(string, string) (types.UID, bool) { return "", false }

// DialPod fails outside Linux.
func (a *Agent) DialPod(context.Context, string, string, types.UID, int32) (net.Conn, error) {
	return nil, errUnsupported
}

// ContainerPIDs is empty outside Linux.
func (a *Agent) ContainerPIDs() []int { return nil }

// ServeContainerLogs fails outside Linux.
func (a *Agent) ServeContainerLogs(w http.ResponseWriter, _ *http.Request, _, _, _ string) {
	http.Error(w, errUnsupported.Error(), http.StatusNotImplemented)
}

// NodePath is path outside Linux.
func (a *Agent) NodePath(path string) string { return path }
