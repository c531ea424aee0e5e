package liveness

import "time"

// SetProbeTimeout shortens the member probe for a test; the returned func
// puts it back.
func SetProbeTimeout(d time.Duration) (restore func()) {
	old := probeTimeout
	probeTimeout = d
	return func() { probeTimeout = old }
}
