//go:build !linux

package sandbox

import "errors"

// Capture is Linux only.
type Capture struct{}

// PortTraffic is what a Capture saw to or from one TCP port.
type PortTraffic struct {
	Packets, PayloadBytes int64
	Marker                bool
}

// CapturePodNetwork needs Linux's AF_PACKET.
func (s *Sandbox) CapturePodNetwork([]byte) (*Capture, error) {
	return nil, errors.New("capture: Linux only")
}

// Stop returns nothing.
func (c *Capture) Stop() (map[uint16]PortTraffic, error) { return nil, nil }
