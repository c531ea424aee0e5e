// Command crosscheck type-checks packages for other platforms than the one
// it runs on, from source and without compiling them, and fails naming the
// platform and the error: the check that a change still builds for every
// platform the plugin is released for and the images are built for, at a
// fraction of a cross-compile's cost (no code is generated, nothing linked).
//
//	crosscheck [-C DIR] OS/ARCH:PACKAGE[,PACKAGE…] …
//
// Each argument names a platform and what must build for it; a platform
// named twice is checked once for all its packages.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/tools/go/packages"
)

func main() {
	dir := flag.String("C", ".", "the module to check")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: crosscheck [-C DIR] OS/ARCH:PACKAGE[,PACKAGE…] …")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	want := map[string][]string{}
	var platforms []string
	for _, arg := range flag.Args() {
		platform, pkgs, ok := strings.Cut(arg, ":")
		if _, _, isPair := strings.Cut(platform, "/"); !ok || !isPair || pkgs == "" {
			fmt.Fprintf(os.Stderr, "crosscheck: %q is not OS/ARCH:PACKAGE[,PACKAGE…]\n", arg)
			os.Exit(2)
		}
		if _, seen := want[platform]; !seen {
			platforms = append(platforms, platform)
		}
		for _, p := range strings.Split(pkgs, ",") {
			if !slices.Contains(want[platform], p) {
				want[platform] = append(want[platform], p)
			}
		}
	}

	// Platforms are checked side by side, as many at once as there are
	// CPUs: one check is mostly one core's parsing and type-checking.
	reports := make([]string, len(platforms))
	failed := make([]bool, len(platforms))
	slots := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for i, platform := range platforms {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			reports[i], failed[i] = check(*dir, platform, want[platform])
		})
	}
	wg.Wait()
	for _, r := range reports {
		fmt.Fprint(os.Stderr, r)
	}
	if slices.Contains(failed, true) {
		os.Exit(1)
	}
}

// check loads pkgs and every package they import for platform and
// type-checks them all from source (NeedDeps with NeedSyntax: no export
// data, so nothing is compiled). It returns what to print, every error
// named with the platform, and whether there was any.
func check(dir, platform string, pkgs []string) (report string, failed bool) {
	goos, goarch, _ := strings.Cut(platform, "/")
	start := time.Now()
	cfg := &packages.Config{
		Mode: packages.NeedName | packages.NeedFiles | packages.NeedImports | packages.NeedDeps |
			packages.NeedTypes | packages.NeedSyntax,
		Dir: dir,
		// As the release and the images are built: static, so no cgo
		// file is ever part of what is checked.
		Env: append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=0"),
	}
	what := strings.Join(pkgs, " ")
	loaded, err := packages.Load(cfg, pkgs...)
	if err != nil {
		return fmt.Sprintf("crosscheck %s: load %s: %v\n", platform, what, err), true
	}
	var b strings.Builder
	n := 0
	packages.Visit(loaded, nil, func(p *packages.Package) {
		for _, e := range p.Errors {
			fmt.Fprintf(&b, "crosscheck %s: %s\n", platform, e)
			n++
		}
	})
	if n > 0 {
		fmt.Fprintf(&b, "crosscheck: %s does not build for %s (%d errors above)\n", what, platform, n)
		return b.String(), true
	}
	return fmt.Sprintf("crosscheck: %s type-checks for %s (%.0f s)\n", what, platform, time.Since(start).Seconds()), false
}
