package ociimage_test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"log"
	"maps"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/ociimage"
)

var created = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// fakeBinaries writes one small file per platform; images do not run them,
// so their bytes only need to differ per platform.
func fakeBinaries(t *testing.T, name string, platforms ...string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	bins := map[string]string{}
	for _, p := range platforms {
		path := filepath.Join(dir, strings.ReplaceAll(p, "/", "-")+"-"+name)
		if err := os.WriteFile(path, []byte("binary "+name+" for "+p), 0o755); err != nil {
			t.Fatal(err)
		}
		bins[p] = path
	}
	return bins
}

func serverSpec(t *testing.T) ociimage.Spec {
	return ociimage.Spec{
		Ref:        "ghcr.io/kubectl-etcdbackup/etcdbackup-server:v0.1.0",
		Binaries:   fakeBinaries(t, "etcdbackup-server", "linux/amd64", "linux/arm64"),
		Entrypoint: []string{"/etcdbackup-server"},
		Labels: map[string]string{
			"org.opencontainers.image.title":    "etcdbackup-server",
			"org.opencontainers.image.version":  "v0.1.0",
			"org.opencontainers.image.source":   "https://github.com/kubectl-etcdbackup/kubectl-etcdbackup",
			"org.opencontainers.image.licenses": "Apache-2.0",
		},
		Created: created,
	}
}

// readIndex extracts an archive and returns its image index for ref.
func readIndex(t *testing.T, archive, ref string) v1.ImageIndex {
	t.Helper()
	p, err := ociimage.Extract(archive, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range im.Manifests {
		if d.Annotations[ociimage.AnnotationRefName] == ref {
			if d.Annotations[ociimage.AnnotationContainerdName] != ref {
				t.Errorf("%s: %s annotation = %q, want the full ref (containerd names the image after it)", ref, ociimage.AnnotationContainerdName, d.Annotations[ociimage.AnnotationContainerdName])
			}
			idx, err := top.ImageIndex(d.Digest)
			if err != nil {
				t.Fatal(err)
			}
			return idx
		}
	}
	t.Fatalf("archive %s names no image %s", archive, ref)
	return nil
}

func TestWriteArchive(t *testing.T) {
	spec := serverSpec(t)
	archive := filepath.Join(t.TempDir(), "etcdbackup-server.tar")
	digests, err := ociimage.WriteArchive(archive, spec)
	if err != nil {
		t.Fatal(err)
	}
	idx := readIndex(t, archive, spec.Ref)
	d, _ := idx.Digest()
	if digests[spec.Ref] != d.String() {
		t.Errorf("WriteArchive returned digest %s, the archive holds %s", digests[spec.Ref], d)
	}
	if got, err := ociimage.ReadDigests(archive); err != nil || !maps.Equal(got, digests) {
		t.Errorf("ReadDigests = %v, %v; want %v", got, err, digests)
	}

	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, m := range im.Manifests {
		platforms = append(platforms, m.Platform.String())
		img, err := idx.Image(m.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if got := cf.OS + "/" + cf.Architecture; got != m.Platform.String() {
			t.Errorf("config platform %s, index says %s", got, m.Platform)
		}
		if cf.Config.User != "65532:65532" {
			t.Errorf("%s: user %q, want 65532:65532", m.Platform, cf.Config.User)
		}
		if !slices.Equal(cf.Config.Entrypoint, []string{"/etcdbackup-server"}) {
			t.Errorf("%s: entrypoint %q", m.Platform, cf.Config.Entrypoint)
		}
		for k, v := range spec.Labels {
			if cf.Config.Labels[k] != v {
				t.Errorf("%s: label %s = %q, want %q", m.Platform, k, cf.Config.Labels[k], v)
			}
		}
		if cf.Config.Labels[ociimage.LabelCreated] != "2026-11-30T12:00:00Z" || !cf.Created.Time.Equal(created) {
			t.Errorf("%s: created %s / label %q, want %s", m.Platform, cf.Created, cf.Config.Labels[ociimage.LabelCreated], created)
		}

		files := layerFiles(t, img)
		bin := files["etcdbackup-server"]
		want, _ := os.ReadFile(spec.Binaries[m.Platform.String()])
		if bin == nil || !bytes.Equal(bin.data, want) || bin.hdr.Mode != 0o755 || bin.hdr.Uid != 0 {
			t.Errorf("%s: layer's /etcdbackup-server = %+v, want the %s binary, mode 0755, owned by root", m.Platform, bin, m.Platform)
		}
		if tmp := files["tmp/"]; tmp == nil || tmp.hdr.Mode != 0o1777 {
			t.Errorf("%s: layer has no world-writable /tmp: %+v", m.Platform, tmp)
		}
		for n, f := range files {
			if !f.hdr.ModTime.Equal(created) {
				t.Errorf("%s: layer entry %s has mtime %s, want %s", m.Platform, n, f.hdr.ModTime, created)
			}
		}
	}
	if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("index platforms %v, want linux/amd64 and linux/arm64", platforms)
	}
}

type layerFile struct {
	hdr  *tar.Header
	data []byte
}

func layerFiles(t *testing.T, img v1.Image) map[string]*layerFile {
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
	files := map[string]*layerFile{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[hdr.Name] = &layerFile{hdr: hdr, data: data}
	}
}

// Same inputs, same digest and even the same archive bytes; a changed
// binary or time gives another digest.
func TestWriteArchiveReproducible(t *testing.T) {
	spec := serverSpec(t)
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")
	da, err := ociimage.WriteArchive(a, spec)
	if err != nil {
		t.Fatal(err)
	}
	// Copy the binaries elsewhere with fresh mtimes: only content counts.
	moved := map[string]string{}
	for p, path := range spec.Binaries {
		data, _ := os.ReadFile(path)
		moved[p] = filepath.Join(t.TempDir(), "bin")
		if err := os.WriteFile(moved[p], data, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	spec2 := spec
	spec2.Binaries = moved
	db, err := ociimage.WriteArchive(b, spec2)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(da, db) {
		t.Errorf("rebuild changed the digest: %v then %v", da, db)
	}
	ba, _ := os.ReadFile(a)
	bb, _ := os.ReadFile(b)
	if !bytes.Equal(ba, bb) {
		t.Error("rebuild changed the archive's bytes")
	}

	spec3 := spec
	spec3.Created = created.Add(time.Second)
	dc, err := ociimage.WriteArchive(filepath.Join(dir, "c.tar"), spec3)
	if err != nil {
		t.Fatal(err)
	}
	if dc[spec.Ref] == da[spec.Ref] {
		t.Error("a different Created kept the digest: the time is not in the image")
	}
}

// Several images in one archive, one of them for a single platform.
func TestWriteArchiveSeveralImages(t *testing.T) {
	server := serverSpec(t)
	pause := ociimage.Spec{
		Ref:        "etcdbackup.test/pause:v1",
		Binaries:   fakeBinaries(t, "pause", ociimage.HostPlatform()),
		Entrypoint: []string{"/usr/local/bin/pause", "-x"},
		User:       "1000",
	}
	archive := filepath.Join(t.TempDir(), "all.tar")
	digests, err := ociimage.WriteArchive(archive, server, pause)
	if err != nil {
		t.Fatal(err)
	}
	if len(digests) != 2 {
		t.Fatalf("digests %v, want two", digests)
	}
	readIndex(t, archive, server.Ref)
	idx := readIndex(t, archive, pause.Ref)
	im, _ := idx.IndexManifest()
	if len(im.Manifests) != 1 || im.Manifests[0].Platform.String() != ociimage.HostPlatform() {
		t.Fatalf("pause index %+v, want only %s", im.Manifests, ociimage.HostPlatform())
	}
	img, _ := idx.Image(im.Manifests[0].Digest)
	cf, _ := img.ConfigFile()
	if cf.Config.User != "1000" || !slices.Equal(cf.Config.Entrypoint, pause.Entrypoint) || !cf.Created.Time.Equal(time.Unix(0, 0)) {
		t.Errorf("pause config: user %q, entrypoint %q, created %s", cf.Config.User, cf.Config.Entrypoint, cf.Created)
	}
	files := layerFiles(t, img)
	for _, n := range []string{"usr/", "usr/local/", "usr/local/bin/", "usr/local/bin/pause", "tmp/"} {
		if files[n] == nil {
			t.Errorf("pause layer lacks %s", n)
		}
	}
}

// An air-gapped mirror: push the archive's index to a registry and pull it
// back by digest, unchanged.
func TestPushToMirror(t *testing.T) {
	spec := serverSpec(t)
	archive := filepath.Join(t.TempDir(), "etcdbackup-server.tar")
	digests, err := ociimage.WriteArchive(archive, spec)
	if err != nil {
		t.Fatal(err)
	}
	mirror := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer mirror.Close()
	host := strings.TrimPrefix(mirror.URL, "http://")

	idx := readIndex(t, archive, spec.Ref)
	tag, err := name.ParseReference(host + "/kubectl-etcdbackup/etcdbackup-server:v0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(tag, idx); err != nil {
		t.Fatalf("push to mirror: %v", err)
	}

	byDigest, err := name.NewDigest(host + "/kubectl-etcdbackup/etcdbackup-server@" + digests[spec.Ref])
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := remote.Index(byDigest)
	if err != nil {
		t.Fatalf("pull by digest: %v", err)
	}
	wantRaw, _ := idx.RawManifest()
	gotRaw, err := pulled.RawManifest()
	if err != nil || !bytes.Equal(gotRaw, wantRaw) {
		t.Fatalf("pulled index differs: %s, %v", gotRaw, err)
	}
	// Every platform's image resolves and carries the same layer.
	for _, p := range []string{"linux/amd64", "linux/arm64"} {
		plat, _ := v1.ParsePlatform(p)
		img, err := remote.Image(tag, remote.WithPlatform(*plat))
		if err != nil {
			t.Fatalf("pull %s: %v", p, err)
		}
		files := layerFiles(t, img)
		want, _ := os.ReadFile(spec.Binaries[p])
		if f := files["etcdbackup-server"]; f == nil || !bytes.Equal(f.data, want) {
			t.Errorf("pulled %s image does not hold the %s binary", p, p)
		}
	}
}

func TestWriteArchiveRejectsBadSpecs(t *testing.T) {
	good := serverSpec(t)
	for _, tc := range []struct {
		name    string
		mutate  func(*ociimage.Spec)
		wantErr string
	}{
		{"no ref", func(s *ociimage.Spec) { s.Ref = "" }, "ref is empty"},
		{"bad ref", func(s *ociimage.Spec) { s.Ref = "Not A Ref" }, `ref "Not A Ref"`},
		{"no binaries", func(s *ociimage.Spec) { s.Binaries = nil }, "binaries: no platform"},
		{"bad platform", func(s *ociimage.Spec) { s.Binaries = map[string]string{"": "x"} }, "platform"},
		{"missing binary", func(s *ociimage.Spec) { s.Binaries = map[string]string{"linux/amd64": "/nonexistent"} }, "open binary"},
		{"relative entrypoint", func(s *ociimage.Spec) { s.Entrypoint = []string{"server"} }, "entrypoint"},
		{"no entrypoint", func(s *ociimage.Spec) { s.Entrypoint = nil }, "entrypoint"},
		{"entrypoint in tmp", func(s *ociimage.Spec) { s.Entrypoint = []string{"/tmp/x"} }, "/tmp"},
		{"user name", func(s *ociimage.Spec) { s.User = "nonroot" }, `user "nonroot"`},
		{"group name", func(s *ociimage.Spec) { s.User = "65532:nonroot" }, `user "65532:nonroot"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := good
			tc.mutate(&s)
			out := filepath.Join(t.TempDir(), "x.tar")
			_, err := ociimage.WriteArchive(out, s)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want one mentioning %q", err, tc.wantErr)
			}
			if _, serr := os.Stat(out); serr == nil {
				t.Error("a failed WriteArchive left an archive behind")
			}
			if left, _ := filepath.Glob(filepath.Join(filepath.Dir(out), ".ociimage-*")); len(left) > 0 {
				t.Errorf("temp files left: %v", left)
			}
		})
	}
}

// The layout's own files, as containerd's importer reads them.
func TestArchiveLayout(t *testing.T) {
	archive := filepath.Join(t.TempDir(), "x.tar")
	if _, err := ociimage.WriteArchive(archive, serverSpec(t)); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var names []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
		if hdr.Name == "oci-layout" {
			var l struct{ ImageLayoutVersion string }
			if err := json.NewDecoder(tr).Decode(&l); err != nil || l.ImageLayoutVersion != "1.0.0" {
				t.Errorf("oci-layout: %+v, %v", l, err)
			}
		}
	}
	if len(names) < 4 || names[0] != "oci-layout" || names[1] != "index.json" {
		t.Errorf("archive entries %v, want oci-layout and index.json first", names)
	}
	// index + 2 manifests + 2 configs + 2 layers
	if blobs := len(names) - 4; blobs != 7 {
		t.Errorf("%d blobs, want 7: %v", blobs, names)
	}
}
