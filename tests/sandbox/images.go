package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/ociimage"
)

// CoreDNSImage is the cluster DNS image: CoreDNS built from its Go module
// (tools/coredns), packed by the sandbox.
const CoreDNSImage = "sandbox.local/coredns:v1.15.0"

// imagesResult is what systemImages produced.
type imagesResult struct {
	archives []string
	err      error
}

// systemImages packs the images the cluster itself runs — the pause image
// (tests/cmd/pause, built here) and CoreDNS — into OCI archives under the
// node bin dir, once: an archive newer than its binary is reused.
func (s *Sandbox) systemImages(ctx context.Context) imagesResult {
	dir := filepath.Join(s.nodeBinDir, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return imagesResult{err: err}
	}
	pause := filepath.Join(s.nodeBinDir, "pause")
	if _, err := os.Stat(pause); err != nil {
		if pause, err = BuildBinary(ctx, "./tests/cmd/pause", filepath.Join(s.dir, "bin")); err != nil {
			return imagesResult{err: err}
		}
	}
	var archives []string
	for _, img := range []struct{ ref, binary, archive string }{
		{PauseImage, pause, "pause.tar"},
		{CoreDNSImage, filepath.Join(s.nodeBinDir, "coredns"), "coredns.tar"},
	} {
		archive := filepath.Join(dir, img.archive)
		if fresh(archive, img.binary) {
			archives = append(archives, archive)
			continue
		}
		if _, err := PackBinary(archive, img.ref, img.binary); err != nil {
			return imagesResult{err: err}
		}
		archives = append(archives, archive)
	}
	return imagesResult{archives: archives}
}

// fresh tells whether archive exists and is newer than binary.
func fresh(archive, binary string) bool {
	a, err := os.Stat(archive)
	if err != nil {
		return false
	}
	b, err := os.Stat(binary)
	return err == nil && a.ModTime().After(b.ModTime())
}

// PackBinary writes a single-platform OCI image archive of a static binary
// as image ref: the binary is the entrypoint (/NAME), the user non-root. It
// returns the image's digest, which containerd reports for it.
func PackBinary(archive, ref, binary string) (string, error) {
	digests, err := ociimage.WriteArchive(archive, ociimage.Spec{
		Ref:        ref,
		Binaries:   map[string]string{ociimage.HostPlatform(): binary},
		Entrypoint: []string{"/" + filepath.Base(binary)},
		Created:    time.Unix(0, 0).UTC(),
	})
	if err != nil {
		return "", fmt.Errorf("sandbox: pack %s as %s: %w", binary, ref, err)
	}
	return digests[ref], nil
}

// LoadBinaryImage packs a static binary as image ref and imports it into
// the node, for test images (podtool, etcd).
func (s *Sandbox) LoadBinaryImage(ctx context.Context, ref, binary string) error {
	archive := filepath.Join(s.dir, "images", filepath.Base(binary)+".tar")
	if _, err := PackBinary(archive, ref, binary); err != nil {
		return err
	}
	return s.ImportImages(ctx, archive)
}

// BuildBinary builds a static binary of a package of this repository
// (CGO off, so it runs on an empty image) into dir and returns its path.
func BuildBinary(ctx context.Context, pkg, dir string) (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", fmt.Errorf("sandbox: %w", err)
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("sandbox: go build %s: %w\n%s", pkg, err, b)
	}
	return out, nil
}

// TagImage gives an imported image another name in the node's containerd,
// as `ctr images tag` (or `docker tag`) does: say, the name the manifests
// use by default.
func (s *Sandbox) TagImage(ctx context.Context, ref, alias string) error {
	if err := s.node.ctr(ctx, "images", "tag", "--force", normalizeRef(ref), normalizeRef(alias)); err != nil {
		return fmt.Errorf("sandbox: tag image %s as %s: %w", ref, alias, err)
	}
	return nil
}

// normalizeRef spells a short image reference ("etcdbackup-server:dev") the
// way the kubelet asks containerd for it (docker.io/library/…).
func normalizeRef(ref string) string {
	first, _, found := strings.Cut(ref, "/")
	if !found {
		return "docker.io/library/" + ref
	}
	if !strings.ContainsAny(first, ".:") && first != "localhost" {
		return "docker.io/" + ref
	}
	return ref
}

// ArchiveRefs lists the images in an OCI image archive: reference →
// digest.
func ArchiveRefs(archive string) (map[string]string, error) { return archiveRefs(archive) }
