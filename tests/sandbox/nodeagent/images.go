package nodeagent

import "strings"

// ImageName reduces an image reference to the name the image table is keyed
// by: registry, repository path, tag and digest are dropped, so
// "ghcr.io/org/etcdbackup-server:v1.2.3", "etcdbackup-server:dev" and
// "etcdbackup-server@sha256:…" all name "etcdbackup-server".
func ImageName(ref string) string {
	if i := strings.IndexByte(ref, '@'); i >= 0 {
		ref = ref[:i]
	}
	if i := strings.LastIndexByte(ref, '/'); i >= 0 {
		ref = ref[i+1:]
	}
	if i := strings.IndexByte(ref, ':'); i >= 0 {
		ref = ref[:i]
	}
	return ref
}

// imageUser is the user and group every project image runs as unless the
// Pod says otherwise: the images are built FROM distroless "nonroot" with
// USER 65532:65532 (see the Dockerfile), so runAsNonRoot holds for them.
const imageUser = 65532

// imagePath is the image's default PATH (distroless' ENV).
const imagePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
