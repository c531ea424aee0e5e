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

// imagesResult is what systemImages produced.
type imagesResult struct {
	archives []string
	err      error
}

// systemImages finds the images the cluster itself runs — the pause image
// (tests/cmd/pause) and CoreDNS — as archives in the node dir's images/
// (hack/node.mk's node-images), or packs them there from the binaries in
// bin/ (an archive newer than its binary is reused). It sets s.pauseImage
// and s.coreDNSImage to the references the archives name.
func (s *Sandbox) systemImages(ctx context.Context) imagesResult {
	dir := filepath.Join(s.nodeDir, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return imagesResult{err: err}
	}
	var archives []string
	for _, img := range []struct {
		ref, binary, archive string
		name                 *string
	}{
		{"etcdbackup.test/pause:v1", filepath.Join(s.nodeDir, "bin", "pause"), "pause.tar", &s.pauseImage},
		{"etcdbackup.test/coredns:v1.15.0", filepath.Join(s.nodeDir, "bin", "coredns"), "coredns.tar", &s.coreDNSImage},
	} {
		archive := filepath.Join(dir, img.archive)
		if _, err := os.Stat(archive); err != nil || !fresh(archive, img.binary) {
			if _, err := os.Stat(img.binary); err != nil && img.archive == "pause.tar" {
				if img.binary, err = BuildBinary(ctx, "./tests/cmd/pause", filepath.Join(s.dir, "bin")); err != nil {
					return imagesResult{err: err}
				}
			}
			if _, err := PackBinary(archive, img.ref, img.binary); err != nil {
				return imagesResult{err: err}
			}
		}
		refs, err := ociimage.ReadDigests(archive)
		if err != nil {
			return imagesResult{err: err}
		}
		if len(refs) != 1 {
			return imagesResult{err: fmt.Errorf("image archive %s holds %d images, want 1", archive, len(refs))}
		}
		for ref := range refs {
			*img.name = ref
		}
		archives = append(archives, archive)
	}
	return imagesResult{archives: archives}
}

// fresh tells whether archive exists and is not older than binary (or
// binary is absent: the archive is all there is).
func fresh(archive, binary string) bool {
	a, err := os.Stat(archive)
	if err != nil {
		return false
	}
	b, err := os.Stat(binary)
	return err != nil || !a.ModTime().Before(b.ModTime())
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
// the nodes, for test images (podtool, etcd).
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

// TagImage gives an imported image another name in every node's
// containerd (and in a node AddNode starts later), as `ctr images tag` (or
// `docker tag`) does: say, the name the manifests use by default.
func (s *Sandbox) TagImage(ctx context.Context, ref, alias string) error {
	s.nodesMu.Lock()
	s.tags = append(s.tags, [2]string{ref, alias})
	nodes := s.nodes()
	s.nodesMu.Unlock()
	for _, n := range nodes {
		if err := n.tag(ctx, ref, alias); err != nil {
			return err
		}
	}
	return nil
}

func (n *node) tag(ctx context.Context, ref, alias string) error {
	if err := n.ctr(ctx, "images", "tag", "--force", normalizeRef(ref), normalizeRef(alias)); err != nil {
		return fmt.Errorf("sandbox: tag image %s as %s on %s: %w", ref, alias, n.spec.name, err)
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

// PauseImage is the node's pause image, which any pod may run to just
// exist.
func (s *Sandbox) PauseImage() string { return s.pauseImage }
