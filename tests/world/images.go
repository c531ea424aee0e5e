package world

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/ociimage"
	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/tests/sandbox"
)

// ImagesDirEnv names the directory of product image archives built by
// `make images` (etcdbackup-{server,agent,cli}.tar). Unset, BuildImages
// builds them itself the same way, for this machine's platform only.
const ImagesDirEnv = "ETCDBACKUP_IMAGES_DIR"

// Images are the product's OCI image archives and the references and
// digests of the images in them.
type Images struct {
	Archives           []string
	Server, Agent, CLI string            // image references
	Digests            map[string]string // reference → digest
}

// imageNames are the product's images by the name of their repository.
var imageNames = []string{"etcdbackup-server", "etcdbackup-agent", "etcdbackup-cli"}

// BuildImages returns the product's images: the archives in
// $ETCDBACKUP_IMAGES_DIR if set, else archives it builds into dir with
// hack/images (static binaries on an empty base, as `make images` does).
func BuildImages(ctx context.Context, dir string) (*Images, error) {
	src := os.Getenv(ImagesDirEnv)
	if src == "" {
		root, err := RepoRoot()
		if err != nil {
			return nil, err
		}
		src = dir
		cmd := exec.CommandContext(ctx, "go", "run", "./hack/images", "product",
			"-version", "v0.0.0-e2e", "-out", src, "-platforms", "linux/"+runtime.GOARCH)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build images: %v\n%s", err, out)
		}
	}
	im := &Images{Digests: map[string]string{}}
	for _, name := range imageNames {
		archive := filepath.Join(src, name+".tar")
		refs, err := ociimage.ReadDigests(archive)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", name, err)
		}
		for ref, digest := range refs {
			repo := ref
			if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
				repo = ref[:i]
			}
			if path.Base(repo) != name {
				continue
			}
			im.Digests[ref] = digest
			switch name {
			case "etcdbackup-server":
				im.Server = ref
			case "etcdbackup-agent":
				im.Agent = ref
			case "etcdbackup-cli":
				im.CLI = ref
			}
		}
		im.Archives = append(im.Archives, archive)
	}
	if im.Server == "" || im.Agent == "" || im.CLI == "" {
		return nil, fmt.Errorf("images in %s: server %q, agent %q, cli %q: want all three", src, im.Server, im.Agent, im.CLI)
	}
	return im, nil
}

// TagAsManifestDefaults names the imported server and agent images as
// manifests/ does by default (etcdbackup-server:dev, etcdbackup-agent:dev),
// for installs that apply manifests/ without an overlay.
func (im *Images) TagAsManifestDefaults(ctx context.Context, sb *sandbox.Sandbox) error {
	if err := sb.TagImage(ctx, im.Server, "etcdbackup-server:dev"); err != nil {
		return err
	}
	return sb.TagImage(ctx, im.Agent, "etcdbackup-agent:dev")
}

// nameAndTag splits an image reference into the name and the tag a
// kustomize `images:` entry takes.
func nameAndTag(ref string) (string, string) {
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[:i], ref[i+1:]
	}
	return ref, "latest"
}
