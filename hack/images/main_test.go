package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"io"
	"log"
	"maps"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/ociimage"
)

// `make images` for real: the three commands cross-built for both
// platforms, packed, rebuilt to the same digests, and mirrored through a
// registry.
func TestProductImages(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-builds the server, agent and CLI for two platforms")
	}
	if raceEnabled {
		t.Skip("too slow under -race; make e2e runs it without the race detector")
	}
	// The test runs in hack/images; the builds need the module root.
	t.Chdir("../..")
	t.Setenv("SOURCE_DATE_EPOCH", "1764547200") // 2025-12-01T00:00:00Z
	ctx := t.Context()
	const version = "v0.0.0-test"

	out1, out2 := t.TempDir(), t.TempDir()
	if err := run(ctx, []string{"product", "-version", version, "-out", out1}); err != nil {
		t.Fatal(err)
	}
	if err := run(ctx, []string{"product", "-version", version, "-out", out2}); err != nil {
		t.Fatal(err)
	}

	mirror := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer mirror.Close()
	mirrorHost := strings.TrimPrefix(mirror.URL, "http://")

	for _, im := range productImages {
		t.Run(im.name, func(t *testing.T) {
			ref := "ghcr.io/kubectl-etcdbackup/" + im.name + ":" + version
			d1, err := ociimage.ReadDigests(filepath.Join(out1, im.name+".tar"))
			if err != nil {
				t.Fatal(err)
			}
			d2, err := ociimage.ReadDigests(filepath.Join(out2, im.name+".tar"))
			if err != nil {
				t.Fatal(err)
			}
			if len(d1) != 1 || d1[ref] == "" {
				t.Fatalf("archive names %v, want %s", d1, ref)
			}
			if !maps.Equal(d1, d2) {
				t.Errorf("rebuild of the same commit changed the digest: %v then %v", d1, d2)
			}

			p, err := ociimage.Extract(filepath.Join(out1, im.name+".tar"), t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			h, err := v1.NewHash(d1[ref])
			if err != nil {
				t.Fatal(err)
			}
			idx, err := p.ImageIndex()
			if err == nil {
				idx, err = idx.ImageIndex(h)
			}
			if err != nil {
				t.Fatal(err)
			}
			checkIndex(t, idx, im, version)

			// An air-gapped mirror: push, then pull by digest.
			tag, err := name.ParseReference(mirrorHost + "/kubectl-etcdbackup/" + im.name + ":" + version)
			if err != nil {
				t.Fatal(err)
			}
			if err := remote.WriteIndex(tag, idx, remote.WithContext(ctx)); err != nil {
				t.Fatalf("push to mirror: %v", err)
			}
			pulled, err := remote.Index(tag.Context().Digest(d1[ref]), remote.WithContext(ctx))
			if err != nil {
				t.Fatalf("pull by digest: %v", err)
			}
			if pd, _ := pulled.Digest(); pd.String() != d1[ref] {
				t.Errorf("mirror serves %s for %s", pd, d1[ref])
			}
			checkIndex(t, pulled, im, version)
		})
	}
}

var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// checkIndex checks what a user of the image sees: both platforms, each
// running its own architecture's static binary as a numeric non-root user,
// with the OCI labels.
func checkIndex(t *testing.T, idx v1.ImageIndex, im productImage, version string) {
	t.Helper()
	manifest, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, m := range manifest.Manifests {
		platforms = append(platforms, m.Platform.String())
		img, err := idx.Image(m.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Config.User != "65532:65532" {
			t.Errorf("%s: user %q, want numeric non-root 65532:65532", m.Platform, cf.Config.User)
		}
		if want := []string{"/" + im.binary}; !slices.Equal(cf.Config.Entrypoint, want) {
			t.Errorf("%s: entrypoint %q, want %q", m.Platform, cf.Config.Entrypoint, want)
		}
		for k, v := range map[string]string{
			"org.opencontainers.image.title":    im.name,
			"org.opencontainers.image.version":  version,
			"org.opencontainers.image.source":   "https://github.com/kubectl-etcdbackup/kubectl-etcdbackup",
			"org.opencontainers.image.licenses": "Apache-2.0",
			"org.opencontainers.image.created":  "2025-12-01T00:00:00Z",
		} {
			if got := cf.Config.Labels[k]; got != v {
				t.Errorf("%s: label %s = %q, want %q", m.Platform, k, got, v)
			}
		}
		bin := binaryFromImage(t, img, im.binary)
		f, err := elf.NewFile(bytes.NewReader(bin))
		if err != nil {
			t.Fatalf("%s: /%s is not an ELF binary: %v", m.Platform, im.binary, err)
		}
		if f.Machine != elfMachine[m.Platform.Architecture] {
			t.Errorf("%s: /%s is built for %s", m.Platform, im.binary, f.Machine)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s: /%s is dynamically linked; the empty base has no libc", m.Platform, im.binary)
			}
		}
	}
	if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("platforms %v, want linux/amd64 and linux/arm64", platforms)
	}
}

func binaryFromImage(t *testing.T, img v1.Image, binary string) []byte {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v; want one", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if err != nil {
			t.Fatalf("layer has no %s: %v", binary, err)
		}
		if hdr.Name == binary {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}

func TestPackRejectsBadFlags(t *testing.T) {
	ctx := context.Background()
	bin := filepath.Join(t.TempDir(), "x")
	if err := os.WriteFile(bin, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "x.tar")
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"pack", "-ref", "a.test/x:v1", "-entrypoint", "/x", "-out", out}, "at least one -bin"},
		{[]string{"pack", "-ref", "a.test/x:v1", "-entrypoint", "/x", "-out", out, "-bin", bin}, "want PLATFORM=PATH"},
		{[]string{"pack", "-ref", "a.test/x:v1", "-entrypoint", "/x", "-out", out, "-bin", "linux/amd64=" + bin, "-label", "x"}, "want KEY=VALUE"},
		{[]string{"pack", "-ref", "a.test/x:v1", "-entrypoint", "/x", "-out", out, "-bin", "linux/amd64=" + bin, "-user", "root"}, `user "root"`},
		{[]string{"product", "-out", out}, "-version is required"},
		{[]string{"product", "-version", "v1", "-platforms", "darwin/arm64"}, "not a linux/ARCH platform"},
		{[]string{"bogus"}, `unknown command "bogus"`},
	} {
		err := run(ctx, tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("images %q: err = %v, want one mentioning %q", tc.args, err, tc.wantErr)
		}
	}
	if err := run(ctx, []string{"pack", "-ref", "a.test/x:v1", "-entrypoint", "/x", "-out", out, "-bin", "linux/amd64=" + bin}); err != nil {
		t.Fatal(err)
	}
	if d, err := ociimage.ReadDigests(out); err != nil || d["a.test/x:v1"] == "" {
		t.Errorf("pack wrote %v, %v", d, err)
	}
}
