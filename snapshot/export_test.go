package snapshot

// LockDir is lockDir, for tests that hold a data directory as a concurrent
// restore would.
var LockDir = lockDir
