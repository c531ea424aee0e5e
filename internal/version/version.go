// Package version holds the build's version, set by the linker
// (-X github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/version.Version=...).
package version

import "runtime/debug"

// Version is the release this binary was built as, "dev" for local builds.
var Version = "dev"

// GitCommit is the commit this binary was built from, if the linker was told.
var GitCommit = ""

// Commit returns GitCommit, or the VCS revision Go recorded, or "".
func Commit() string {
	if GitCommit != "" {
		return GitCommit
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return ""
}
