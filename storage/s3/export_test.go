package s3

// SetHookBeforeManifest makes f run between the data and manifest writes of
// every commit, until the returned function is called.
func SetHookBeforeManifest(f func(name string)) (reset func()) {
	testHookBeforeManifest = f
	return func() { testHookBeforeManifest = nil }
}
