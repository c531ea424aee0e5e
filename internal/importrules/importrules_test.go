package importrules

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/kubectl-etcdbackup/kubectl-etcdbackup"

// row is one line of design.md's layout table.
type row struct {
	// imports are the module's packages the row's packages may import;
	// nil with checked false when the row leaves the column empty (test
	// support, which may import what it tests).
	imports []string
	checked bool
}

// allows reports whether a package of r may import pkg (a path relative
// to the module). "api" in the table names the api tree.
func (r row) allows(pkg string) bool {
	for _, imp := range r.imports {
		if pkg == imp || (imp == "api" && strings.HasPrefix(pkg, "api/")) {
			return true
		}
	}
	return false
}

// layout reads design.md's "Repository layout" table: package path →
// row. A path ending in "…" stands for every package below it.
func layout(t *testing.T, path string) (exact map[string]row, prefixes map[string]row) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	exact, prefixes = map[string]row{}, map[string]row{}
	in := false
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "| path |"):
			in = true
			continue
		case in && !strings.HasPrefix(line, "|"):
			return exact, prefixes
		case !in || strings.HasPrefix(line, "|---"):
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if len(cells) < 3 {
			t.Fatalf("%s: a layout row without its three cells: %q", path, line)
		}
		r := parseImports(cells[len(cells)-1])
		for _, p := range codeSpans.FindAllStringSubmatch(cells[0], -1) {
			name := strings.TrimSuffix(p[1], "/")
			if strings.HasSuffix(name, "…") {
				prefixes[strings.TrimSuffix(name, "…")] = r
			} else {
				exact[name] = r
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if !in {
		t.Fatalf("%s has no layout table (a header starting %q)", path, "| path |")
	}
	return exact, prefixes
}

var (
	codeSpans   = regexp.MustCompile("`([^`]+)`")
	parentheses = regexp.MustCompile(`\([^()]*\)`)
)

// parseImports reads an imports cell: names separated by commas, each
// maybe followed by a remark in parentheses; "—" is none.
func parseImports(cell string) row {
	cell = strings.TrimSpace(parentheses.ReplaceAllString(cell, ""))
	if cell == "" {
		return row{}
	}
	r := row{checked: true, imports: []string{}}
	for _, name := range strings.Split(cell, ",") {
		name = strings.TrimSuffix(strings.Trim(strings.TrimSpace(name), "`"), "/")
		if name != "" && name != "—" {
			r.imports = append(r.imports, name)
		}
	}
	return r
}

// pkg is what `go list -json` says of a package.
type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

// goList lists the module's packages with their imports (not their
// tests').
func goList(t *testing.T, root string, args ...string) []pkg {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json"}, args...)...)
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return pkgs
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// inModule returns path relative to the module, and whether it is one of
// the module's packages.
func inModule(path string) (string, bool) {
	if path == module {
		return "", true
	}
	return strings.CutPrefix(path, module+"/")
}

func TestEveryPackageImportsWhatTheDesignSays(t *testing.T) {
	root := repoRoot(t)
	exact, prefixes := layout(t, filepath.Join(root, "docs", "design.md"))
	for _, p := range goList(t, root, "./...") {
		rel, _ := inModule(p.ImportPath)
		r, ok := exact[rel]
		if !ok {
			for prefix, pr := range prefixes {
				if strings.HasPrefix(rel, prefix) {
					r, ok = pr, true
				}
			}
		}
		if !ok {
			t.Errorf("package %s has no row in docs/design.md's layout table: add one that says its one job and what of the module it imports", rel)
			continue
		}
		if !r.checked {
			continue
		}
		for _, imp := range p.Imports {
			if irel, ok := inModule(imp); ok && !r.allows(irel) {
				t.Errorf("%s imports %s, which its row in docs/design.md's layout table does not list (it lists %s): import along the design, or change the design and its row", rel, irel, strings.Join(r.imports, ", "))
			}
		}
	}
}

// serverRunning are the packages that run the data server: the plugin's
// break-glass path serves the read calls over storage without them.
var serverRunning = []string{
	"server", "server/controller", "server/leader", "server/jobs", "server/agenttls",
	"server/auth", "server/coord", "server/retention", "server/liveness", "server/rpc", "server/work",
}

func TestThePluginLinksNoServerNorAgent(t *testing.T) {
	for _, p := range goList(t, repoRoot(t), "-deps", "./cmd/kubectl-etcdbackup") {
		rel, ok := inModule(p.ImportPath)
		if !ok {
			continue
		}
		if slices.Contains(serverRunning, rel) || strings.HasPrefix(rel, "agents/") {
			t.Errorf("the plugin links %s: a laptop command must not carry the server's or an agent's code (break-glass reads storage; restores use the shared library)", rel)
		}
	}
}
