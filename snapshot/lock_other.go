//go:build !unix

package snapshot

// lockDir does nothing where flock(2) does not exist: a restore there
// (the plugin's --local on Windows) relies on the checks alone.
func lockDir(string) (func(), error) { return func() {}, nil }

// flockHeld cannot tell without flock(2); etcd's WAL locks, checked with
// etcd's own code, still can.
func flockHeld(string) (bool, error) { return false, nil }
