// Package ociimage builds reproducible OCI image archives from static
// binaries, without a container engine.
//
// Each image is one layer on an empty base: the binary at the path its
// entrypoint names, plus a world-writable /tmp. Every timestamp comes from
// Spec.Created, tar headers carry no owner names and every list is sorted, so
// the same binaries and Spec give the same digests on any machine (built with
// the same Go release: its compress/gzip writes the layers).
// WriteArchive writes an OCI image layout as a tar file, the format
// `ctr images import`, skopeo (oci-archive:) and go-containerregistry read.
package ociimage

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// DefaultUser is the user images run as when Spec.User is empty: the
// "nonroot" user of distroless images, which the manifests' securityContext
// also names.
const DefaultUser = "65532:65532"

// Annotation keys on the entries of an archive's index.json. containerd
// names an imported image after AnnotationContainerdName, other tools after
// AnnotationRefName; both carry the full reference.
const (
	AnnotationRefName        = "org.opencontainers.image.ref.name"
	AnnotationContainerdName = "io.containerd.image.name"
	// LabelCreated is set on every image config from Spec.Created.
	LabelCreated = "org.opencontainers.image.created"
)

// Spec describes one image. Ref, Binaries and Entrypoint are required.
type Spec struct {
	// Ref is the full image reference the archive names the image with,
	// e.g. "ghcr.io/kubectl-etcdbackup/etcdbackup-server:v0.1.0".
	Ref string
	// Binaries maps a platform ("linux/amd64", "linux/arm64",
	// "linux/arm/v7") to the static binary built for it. One platform gives
	// a single-platform image; the image is always an index.
	Binaries map[string]string
	// Entrypoint is the command the image runs. Entrypoint[0] is the
	// absolute path the binary is placed at inside the image.
	Entrypoint []string
	// User is "UID" or "UID:GID", numeric so the kubelet can check
	// runAsNonRoot without a passwd file. Default DefaultUser.
	User string
	// Labels are set on every platform's image config, e.g. the
	// org.opencontainers.image.{title,version,source,licenses} labels.
	Labels map[string]string
	// Created is the time recorded in the config, history and layer. Zero
	// means the Unix epoch; pass SOURCE_DATE_EPOCH or the commit time to
	// keep a rebuild of the same sources at the same digest.
	Created time.Time
}

// HostPlatform is this machine's platform in Spec.Binaries' form, for a
// single-platform archive that a local containerd imports fastest.
func HostPlatform() string {
	return "linux/" + runtime.GOARCH
}

// WriteArchive builds every spec and writes them as one OCI image layout tar
// file at path (replaced atomically). It returns each spec's Ref mapped to
// the digest of its image index ("sha256:…"), the digest a registry and
// containerd report for the image.
func WriteArchive(path string, specs ...Spec) (digests map[string]string, err error) {
	if len(specs) == 0 {
		return nil, errors.New("no image specs given")
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create output directory: %w", err)
	}
	// Layers are compressed once into temp files next to the output, not
	// held in memory: a binary may be 100 MB.
	tmpDir, err := os.MkdirTemp(dir, ".ociimage-")
	if err != nil {
		return nil, fmt.Errorf("create temp directory: %w", err)
	}
	defer os.RemoveAll(tmpDir)

	digests = make(map[string]string, len(specs))
	indexes := make([]v1.ImageIndex, 0, len(specs))
	descs := make([]v1.Descriptor, 0, len(specs))
	for i, s := range specs {
		idx, err := buildIndex(s, filepath.Join(tmpDir, strconv.Itoa(i)))
		if err != nil {
			return nil, fmt.Errorf("image %q: %w", s.Ref, err)
		}
		desc, err := partial.Descriptor(idx)
		if err != nil {
			return nil, fmt.Errorf("image %q: describe index: %w", s.Ref, err)
		}
		desc.Annotations = map[string]string{AnnotationRefName: s.Ref, AnnotationContainerdName: s.Ref}
		if _, dup := digests[s.Ref]; dup {
			return nil, fmt.Errorf("image %q given twice", s.Ref)
		}
		digests[s.Ref] = desc.Digest.String()
		indexes = append(indexes, idx)
		descs = append(descs, *desc)
	}

	tmp, err := os.CreateTemp(dir, ".ociimage-*.tar")
	if err != nil {
		return nil, fmt.Errorf("create archive: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if err := writeLayout(tmp, indexes, descs); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("write archive %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("write archive %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return nil, fmt.Errorf("write archive %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return nil, fmt.Errorf("write archive %s: %w", path, err)
	}
	return digests, nil
}

func buildIndex(s Spec, tmpDir string) (v1.ImageIndex, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(tmpDir, 0o755); err != nil {
		return nil, fmt.Errorf("create temp directory: %w", err)
	}
	created := s.Created.UTC().Truncate(time.Second)
	if s.Created.IsZero() {
		created = time.Unix(0, 0).UTC()
	}
	user := s.User
	if user == "" {
		user = DefaultUser
	}
	labels := make(map[string]string, len(s.Labels)+1)
	for k, v := range s.Labels {
		labels[k] = v
	}
	labels[LabelCreated] = created.Format(time.RFC3339)

	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	// Sorted, so the index lists platforms in the same order every time.
	platforms := make([]string, 0, len(s.Binaries))
	for p := range s.Binaries {
		platforms = append(platforms, p)
	}
	slices.Sort(platforms)
	for i, p := range platforms {
		plat, err := v1.ParsePlatform(p)
		if err != nil {
			return nil, fmt.Errorf("binaries: platform %q: %w", p, err)
		}
		layerPath := filepath.Join(tmpDir, strconv.Itoa(i)+".tar.gz")
		if err := writeLayer(layerPath, s.Binaries[p], s.Entrypoint[0], created); err != nil {
			return nil, fmt.Errorf("binaries: %s: %w", p, err)
		}
		layer, err := tarball.LayerFromFile(layerPath, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return nil, fmt.Errorf("binaries: %s: read layer: %w", p, err)
		}
		img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:     layer,
			MediaType: types.OCILayer,
			History: v1.History{
				Created:   v1.Time{Time: created},
				CreatedBy: "ociimage: the " + p + " binary at " + s.Entrypoint[0],
				Comment:   "built by github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/ociimage",
			},
		})
		if err != nil {
			return nil, fmt.Errorf("binaries: %s: add layer: %w", p, err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, fmt.Errorf("binaries: %s: config: %w", p, err)
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture, cf.Variant, cf.OSVersion = plat.OS, plat.Architecture, plat.Variant, plat.OSVersion
		cf.Created = v1.Time{Time: created}
		cf.Config = v1.Config{
			Entrypoint: slices.Clone(s.Entrypoint),
			User:       user,
			WorkingDir: "/",
			Labels:     labels,
		}
		img, err = mutate.ConfigFile(img, cf)
		if err != nil {
			return nil, fmt.Errorf("binaries: %s: config: %w", p, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{MediaType: types.OCIManifestSchema1, Platform: plat},
		})
	}
	return idx, nil
}

func (s Spec) validate() error {
	if s.Ref == "" {
		return errors.New("ref is empty")
	}
	if _, err := name.ParseReference(s.Ref, name.StrictValidation); err != nil {
		return fmt.Errorf("ref %q must be a full reference like registry/repository:tag: %w", s.Ref, err)
	}
	if len(s.Binaries) == 0 {
		return errors.New("binaries: no platform given")
	}
	for p := range s.Binaries {
		if plat, err := v1.ParsePlatform(p); err != nil || plat.OS == "" || plat.Architecture == "" {
			return fmt.Errorf("binaries: platform %q: want OS/ARCH[/VARIANT], e.g. linux/amd64", p)
		}
	}
	if len(s.Entrypoint) == 0 || !path.IsAbs(s.Entrypoint[0]) || path.Clean(s.Entrypoint[0]) != s.Entrypoint[0] || s.Entrypoint[0] == "/" {
		return fmt.Errorf("entrypoint %q: the first element must be the binary's clean absolute path in the image", s.Entrypoint)
	}
	if s.Entrypoint[0] == "/tmp" || strings.HasPrefix(s.Entrypoint[0], "/tmp/") {
		return fmt.Errorf("entrypoint %q: /tmp is the image's scratch directory", s.Entrypoint[0])
	}
	if s.User != "" {
		uid, gid, hasGID := strings.Cut(s.User, ":")
		if _, err := strconv.ParseUint(uid, 10, 32); err != nil {
			return fmt.Errorf("user %q: must be numeric UID or UID:GID", s.User)
		}
		if _, err := strconv.ParseUint(gid, 10, 32); hasGID && err != nil {
			return fmt.Errorf("user %q: must be numeric UID or UID:GID", s.User)
		}
	}
	return nil
}

// writeLayer writes the gzipped tar of one image's filesystem: the parent
// directories of dest, /tmp, and the binary at dest, all owned by root (the
// image's user only reads and runs the binary).
func writeLayer(layerPath, binary, dest string, created time.Time) (err error) {
	bin, err := os.Open(binary)
	if err != nil {
		return fmt.Errorf("open binary: %w", err)
	}
	defer bin.Close()
	st, err := bin.Stat()
	if err != nil {
		return fmt.Errorf("open binary: %w", err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("binary %s is not a regular file", binary)
	}

	f, err := os.Create(layerPath)
	if err != nil {
		return fmt.Errorf("create layer: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("write layer: %w", cerr)
		}
	}()
	// The gzip header gets no name and no mtime: a fixed byte stream.
	zw, err := gzip.NewWriterLevel(f, gzip.DefaultCompression)
	if err != nil {
		return fmt.Errorf("write layer: %w", err)
	}
	tw := tar.NewWriter(zw)

	type entry struct {
		name string
		mode int64
		dir  bool
	}
	var entries []entry
	rel := strings.TrimPrefix(dest, "/")
	for d := path.Dir(rel); d != "."; d = path.Dir(d) {
		entries = append(entries, entry{name: d + "/", mode: 0o755, dir: true})
	}
	// Go's os.TempDir is /tmp, which an empty base lacks and a non-root
	// user could not create.
	entries = append(entries, entry{name: "tmp/", mode: 0o1777, dir: true})
	entries = append(entries, entry{name: rel, mode: 0o755})
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.name, b.name) })
	for _, e := range entries {
		hdr := &tar.Header{
			Name:    e.name,
			Mode:    e.mode,
			ModTime: created,
			Format:  tar.FormatPAX,
		}
		if e.dir {
			hdr.Typeflag = tar.TypeDir
		} else {
			hdr.Typeflag = tar.TypeReg
			hdr.Size = st.Size()
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("write layer: %w", err)
		}
		if !e.dir {
			n, err := io.Copy(tw, bin)
			if err != nil {
				return fmt.Errorf("write layer: copy %s: %w", binary, err)
			}
			if n != st.Size() {
				return fmt.Errorf("write layer: %s changed while being read", binary)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("write layer: %w", err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("write layer: %w", err)
	}
	return nil
}

// writeLayout writes an OCI image layout as a tar stream: oci-layout,
// index.json naming each image, then every blob once, sorted by digest.
func writeLayout(w io.Writer, indexes []v1.ImageIndex, descs []v1.Descriptor) error {
	type blob struct {
		raw  []byte                        // manifests and configs
		open func() (io.ReadCloser, error) // layers
		size int64
	}
	blobs := map[v1.Hash]blob{}
	addRaw := func(h v1.Hash, raw []byte) { blobs[h] = blob{raw: raw, size: int64(len(raw))} }
	for _, idx := range indexes {
		if err := collectIndex(idx, addRaw, func(h v1.Hash, l v1.Layer) error {
			size, err := l.Size()
			if err != nil {
				return err
			}
			blobs[h] = blob{open: l.Compressed, size: size}
			return nil
		}); err != nil {
			return err
		}
	}

	top, err := json.Marshal(v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex, Manifests: descs})
	if err != nil {
		return fmt.Errorf("encode index.json: %w", err)
	}
	tw := tar.NewWriter(w)
	epoch := time.Unix(0, 0).UTC()
	writeFile := func(name string, size int64, body func(io.Writer) error) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		return body(tw)
	}
	writeBytes := func(name string, b []byte) error {
		return writeFile(name, int64(len(b)), func(w io.Writer) error { _, err := w.Write(b); return err })
	}
	if err := writeBytes("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := writeBytes("index.json", top); err != nil {
		return err
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	hashes := make([]v1.Hash, 0, len(blobs))
	for h := range blobs {
		hashes = append(hashes, h)
	}
	slices.SortFunc(hashes, func(a, b v1.Hash) int { return strings.Compare(a.String(), b.String()) })
	for _, h := range hashes {
		b := blobs[h]
		name := "blobs/" + h.Algorithm + "/" + h.Hex
		if b.open == nil {
			if err := writeBytes(name, b.raw); err != nil {
				return err
			}
			continue
		}
		if err := writeFile(name, b.size, func(w io.Writer) error {
			rc, err := b.open()
			if err != nil {
				return err
			}
			defer rc.Close()
			n, err := io.Copy(w, rc)
			if err != nil {
				return err
			}
			if n != b.size {
				return fmt.Errorf("layer %s: wrote %d bytes, want %d", h, n, b.size)
			}
			return nil
		}); err != nil {
			return fmt.Errorf("layer %s: %w", h, err)
		}
	}
	return tw.Close()
}

// collectIndex hands every blob reachable from idx (itself included) to
// addRaw or addLayer.
func collectIndex(idx v1.ImageIndex, addRaw func(v1.Hash, []byte), addLayer func(v1.Hash, v1.Layer) error) error {
	raw, err := idx.RawManifest()
	if err != nil {
		return fmt.Errorf("index manifest: %w", err)
	}
	h, err := idx.Digest()
	if err != nil {
		return fmt.Errorf("index digest: %w", err)
	}
	addRaw(h, raw)
	im, err := idx.IndexManifest()
	if err != nil {
		return fmt.Errorf("index manifest: %w", err)
	}
	for _, d := range im.Manifests {
		img, err := idx.Image(d.Digest)
		if err != nil {
			return fmt.Errorf("image %s: %w", d.Digest, err)
		}
		raw, err := img.RawManifest()
		if err != nil {
			return fmt.Errorf("image %s: manifest: %w", d.Digest, err)
		}
		addRaw(d.Digest, raw)
		cfgName, err := img.ConfigName()
		if err != nil {
			return fmt.Errorf("image %s: config: %w", d.Digest, err)
		}
		cfg, err := img.RawConfigFile()
		if err != nil {
			return fmt.Errorf("image %s: config: %w", d.Digest, err)
		}
		addRaw(cfgName, cfg)
		layers, err := img.Layers()
		if err != nil {
			return fmt.Errorf("image %s: layers: %w", d.Digest, err)
		}
		for _, l := range layers {
			lh, err := l.Digest()
			if err != nil {
				return fmt.Errorf("image %s: layer digest: %w", d.Digest, err)
			}
			if err := addLayer(lh, l); err != nil {
				return fmt.Errorf("image %s: layer %s: %w", d.Digest, lh, err)
			}
		}
	}
	return nil
}

// ReadDigests returns the images an archive written by WriteArchive names,
// each reference mapped to its index digest, reading only its index.json.
func ReadDigests(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open archive: %w", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil, fmt.Errorf("archive %s: no index.json: not an OCI image layout", path)
		}
		if err != nil {
			return nil, fmt.Errorf("archive %s: %w", path, err)
		}
		if hdr.Name != "index.json" {
			continue
		}
		var im v1.IndexManifest
		if err := json.NewDecoder(tr).Decode(&im); err != nil {
			return nil, fmt.Errorf("archive %s: index.json: %w", path, err)
		}
		digests := make(map[string]string, len(im.Manifests))
		for _, d := range im.Manifests {
			if ref := d.Annotations[AnnotationRefName]; ref != "" {
				digests[ref] = d.Digest.String()
			}
		}
		return digests, nil
	}
}

// Extract unpacks an archive into the directory dir (created if needed) and
// returns it as an OCI image layout, for go-containerregistry's layout
// package: to read an image back or push it to a registry mirror.
func Extract(archive, dir string) (layout.Path, error) {
	f, err := os.Open(archive)
	if err != nil {
		return "", fmt.Errorf("open archive: %w", err)
	}
	defer f.Close()
	root, err := os.OpenRoot(dir)
	if errors.Is(err, os.ErrNotExist) {
		if err = os.MkdirAll(dir, 0o755); err == nil {
			root, err = os.OpenRoot(dir)
		}
	}
	if err != nil {
		return "", fmt.Errorf("extract %s: %w", archive, err)
	}
	defer root.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", fmt.Errorf("extract %s: %w", archive, err)
		}
		// os.Root refuses names that escape dir.
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(strings.TrimSuffix(hdr.Name, "/"), 0o755); err != nil {
				return "", fmt.Errorf("extract %s: %w", archive, err)
			}
		case tar.TypeReg:
			if err := extractFile(root, hdr.Name, tr); err != nil {
				return "", fmt.Errorf("extract %s: %w", archive, err)
			}
		default:
			return "", fmt.Errorf("extract %s: %s: unexpected entry type %q", archive, hdr.Name, hdr.Typeflag)
		}
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return "", fmt.Errorf("extract %s: %w", archive, err)
	}
	return p, nil
}

func extractFile(root *os.Root, name string, r io.Reader) error {
	if d := path.Dir(name); d != "." {
		if err := root.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
