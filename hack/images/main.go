// Command images writes OCI image archives with internal/ociimage, no
// container engine needed.
//
//	images product -version V -out dist/images       # `make images`: server, agent and CLI
//	images pack -ref R -entrypoint /x -bin linux/amd64=PATH... -out F.tar  # any static binary
//
// product builds the static binaries itself (CGO off, -trimpath, fixed
// ldflags) for every platform of -platforms and writes one archive per image,
// etcdbackup-{server,agent,cli}.tar. Both commands print "REF@DIGEST FILE"
// per image. Image times come from SOURCE_DATE_EPOCH, else the HEAD commit's
// time, so a rebuild of the same commit gives the same digests.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kubectl-etcdbackup/kubectl-etcdbackup/internal/ociimage"
)

const (
	module = "github.com/kubectl-etcdbackup/kubectl-etcdbackup"
	source = "https://" + module
	// license is the SPDX identifier of LICENSE.
	license = "Apache-2.0"
)

// productImage is one image `make images` builds: its name (the repository
// under -repo and the archive's file name), the command it is built from and
// the binary's name, which is also its entrypoint.
type productImage struct {
	name, pkg, binary, description string
}

var productImages = []productImage{
	{"etcdbackup-server", "./cmd/etcdbackup-server", "etcdbackup-server", "kubectl-etcdbackup's data server: stores and serves etcd snapshots"},
	{"etcdbackup-agent", "./cmd/etcdbackup-agent", "etcdbackup-agent", "kubectl-etcdbackup's agent: snapshot and restore jobs next to etcd"},
	{"etcdbackup-cli", "./cmd/kubectl-etcdbackup", "kubectl-etcdbackup", "the kubectl etcdbackup plugin, for running it in a pod or CI job"},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: images product|pack [flags]")
	}
	switch args[0] {
	case "product":
		return runProduct(ctx, args[1:])
	case "pack":
		return runPack(args[1:])
	default:
		return fmt.Errorf("unknown command %q: want product or pack", args[0])
	}
}

func runProduct(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("product", flag.ContinueOnError)
	version := fs.String("version", "", "version: the image tag, the binaries' version and the org.opencontainers.image.version label (required)")
	repo := fs.String("repo", "ghcr.io/kubectl-etcdbackup", "registry and path the image names go under")
	out := fs.String("out", "dist/images", "directory for the archives")
	platforms := fs.String("platforms", "linux/amd64,linux/arm64", "comma-separated platforms; the host's alone is quickest")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version == "" {
		return errors.New("-version is required")
	}
	plats := strings.Split(*platforms, ",")
	for _, p := range plats {
		if goos, _, ok := strings.Cut(p, "/"); !ok || goos != "linux" {
			return fmt.Errorf("-platforms: %q is not a linux/ARCH platform", p)
		}
	}
	created, err := sourceDate(ctx)
	if err != nil {
		return err
	}
	revision := gitOutput(ctx, "rev-parse", "HEAD")

	binDir, err := os.MkdirTemp("", "etcdbackup-images-")
	if err != nil {
		return fmt.Errorf("create temp directory: %w", err)
	}
	defer os.RemoveAll(binDir)
	start := time.Now()
	for _, p := range plats {
		if err := buildProduct(ctx, filepath.Join(binDir, strings.ReplaceAll(p, "/", "-")), p, *version); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "images: built %d binaries for %s in %s\n", len(productImages), strings.Join(plats, ", "), time.Since(start).Round(time.Second))

	for _, im := range productImages {
		bins := make(map[string]string, len(plats))
		for _, p := range plats {
			bins[p] = filepath.Join(binDir, strings.ReplaceAll(p, "/", "-"), im.binary)
		}
		labels := map[string]string{
			"org.opencontainers.image.title":       im.name,
			"org.opencontainers.image.description": im.description,
			"org.opencontainers.image.version":     *version,
			"org.opencontainers.image.source":      source,
			"org.opencontainers.image.url":         source,
			"org.opencontainers.image.licenses":    license,
		}
		if revision != "" {
			labels["org.opencontainers.image.revision"] = revision
		}
		spec := ociimage.Spec{
			Ref:        *repo + "/" + im.name + ":" + *version,
			Binaries:   bins,
			Entrypoint: []string{"/" + im.binary},
			Labels:     labels,
			Created:    created,
		}
		if err := write(filepath.Join(*out, im.name+".tar"), spec); err != nil {
			return err
		}
	}
	return nil
}

// buildProduct builds the three commands for one platform into dir. The
// flags never vary but for the version, so the Go build cache makes a
// rebuild cheap and the same commit gives the same binaries.
func buildProduct(ctx context.Context, dir, platform, version string) error {
	goos, goarch, _ := strings.Cut(platform, "/")
	args := []string{"build", "-trimpath", "-ldflags", "-s -w -X " + module + "/internal/version.Version=" + version, "-o", dir + "/"}
	for _, im := range productImages {
		args = append(args, im.pkg)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build for %s: %w", platform, err)
	}
	return nil
}

// multiFlag collects a repeated flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, " ") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func runPack(args []string) error {
	fs := flag.NewFlagSet("pack", flag.ContinueOnError)
	ref := fs.String("ref", "", "full image reference, e.g. etcdbackup.test/pause:v1 (required)")
	entrypoint := fs.String("entrypoint", "", "absolute path of the binary in the image, its entrypoint (required)")
	user := fs.String("user", ociimage.DefaultUser, "numeric UID[:GID] the image runs as")
	out := fs.String("out", "", "archive to write (required)")
	epoch := fs.Int64("created", 0, "image time in Unix seconds (default: SOURCE_DATE_EPOCH, else 0)")
	var bins, labels, args2 multiFlag
	fs.Var(&bins, "bin", "PLATFORM=PATH of the binary for one platform, e.g. linux/amd64=.cache/pause (repeatable, at least one)")
	fs.Var(&labels, "label", "KEY=VALUE image label (repeatable)")
	fs.Var(&args2, "arg", "an argument appended to the entrypoint (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *ref == "" || *entrypoint == "" || *out == "" || len(bins) == 0 {
		return errors.New("pack: -ref, -entrypoint, -out and at least one -bin are required")
	}
	spec := ociimage.Spec{
		Ref:        *ref,
		Binaries:   map[string]string{},
		Entrypoint: append([]string{*entrypoint}, args2...),
		User:       *user,
		Labels:     map[string]string{},
		Created:    time.Unix(*epoch, 0),
	}
	if *epoch == 0 {
		if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return fmt.Errorf("SOURCE_DATE_EPOCH %q is not Unix seconds", s)
			}
			spec.Created = time.Unix(n, 0)
		}
	}
	for _, b := range bins {
		p, path, ok := strings.Cut(b, "=")
		if !ok || path == "" {
			return fmt.Errorf("-bin %q: want PLATFORM=PATH", b)
		}
		spec.Binaries[p] = path
	}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return fmt.Errorf("-label %q: want KEY=VALUE", l)
		}
		spec.Labels[k] = v
	}
	return write(*out, spec)
}

func write(path string, spec ociimage.Spec) error {
	start := time.Now()
	digests, err := ociimage.WriteArchive(path, spec)
	if err != nil {
		return err
	}
	platforms := make([]string, 0, len(spec.Binaries))
	for p := range spec.Binaries {
		platforms = append(platforms, p)
	}
	slices.Sort(platforms)
	fmt.Printf("%s@%s %s\n", spec.Ref, digests[spec.Ref], path)
	fmt.Fprintf(os.Stderr, "images: %s (%s) in %s\n", path, strings.Join(platforms, ", "), time.Since(start).Round(100*time.Millisecond))
	return nil
}

// sourceDate is the time images record: SOURCE_DATE_EPOCH when set (the
// reproducible-builds convention), else the HEAD commit's time, else the
// Unix epoch.
func sourceDate(ctx context.Context) (time.Time, error) {
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q is not Unix seconds", s)
		}
		return time.Unix(n, 0), nil
	}
	if s := gitOutput(ctx, "log", "-1", "--format=%ct"); s != "" {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return time.Unix(n, 0), nil
		}
	}
	return time.Unix(0, 0), nil
}

// gitOutput is git's trimmed output, "" outside a git checkout.
func gitOutput(ctx context.Context, args ...string) string {
	out, err := exec.CommandContext(ctx, "git", args...).Output()
	if err != nil {
		return ""
	}
	return string(bytes.TrimSpace(out))
}
