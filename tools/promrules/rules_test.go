// Package promrules checks the monitoring component's PrometheusRule with
// Prometheus's own rule parser (model/rulefmt, the code `promtool check
// rules` runs), and that every series its alerts read is one the data
// server exports. A module of its own, so Prometheus's dependencies stay
// out of the product's go.mod.
package promrules

import (
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

const (
	ruleFile    = "../../manifests/components/monitoring/prometheusrule.yaml"
	metricsFile = "../../server/metrics/metrics.go"
)

// prometheusRule is the part of the Prometheus Operator's PrometheusRule
// that holds a rule file's content: spec is a rule file's top level.
type prometheusRule struct {
	Kind string         `json:"kind"`
	Spec map[string]any `json:"spec"`
}

func ruleGroups(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	b, err := os.ReadFile(ruleFile)
	if err != nil {
		t.Fatal(err)
	}
	var pr prometheusRule
	if err := yaml.Unmarshal(b, &pr); err != nil {
		t.Fatal(err)
	}
	if pr.Kind != "PrometheusRule" {
		t.Fatalf("%s: kind %q, want PrometheusRule", ruleFile, pr.Kind)
	}
	spec, err := yaml.Marshal(pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	groups, errs := rulefmt.Parse(spec, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("%s: %v", ruleFile, err)
	}
	if len(errs) > 0 {
		t.FailNow()
	}
	return groups
}

func TestRulesParse(t *testing.T) {
	groups := ruleGroups(t)
	var alerts []string
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
		}
	}
	for _, want := range []string{"EtcdBackupMissing", "EtcdBackupRunFailed"} {
		found := false
		for _, a := range alerts {
			found = found || a == want
		}
		if !found {
			t.Errorf("alert %s is missing; the rules have %v", want, alerts)
		}
	}
}

// TestRulesReadExportedSeries fails when an alert reads a series the
// server does not export (a renamed metric would silence it for good).
func TestRulesReadExportedSeries(t *testing.T) {
	// Every file of the metrics package: its series, and the gauges it
	// computes when scraped (prometheus.NewDesc).
	files, err := filepath.Glob(filepath.Join(filepath.Dir(metricsFile), "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("metrics sources beside %s: %v", metricsFile, err)
	}
	var src []byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src = append(src, b...)
	}
	exported := map[string]bool{}
	for _, m := range regexp.MustCompile(`NewDesc\("etcdbackup_(\w+)"`).FindAllStringSubmatch(string(src), -1) {
		exported["etcdbackup_"+m[1]] = true
	}
	// Series made with the package's constructors (counter, gaugeVec, …,
	// all under the etcdbackup namespace) or spelled out.
	for _, m := range regexp.MustCompile(`(?:\b(?:counter|counterVec|gauge|gaugeVec|histogramVec)\(|Namespace: "etcdbackup", Name: )"(\w+)"`).FindAllStringSubmatch(string(src), -1) {
		name := "etcdbackup_" + m[1]
		exported[name] = true
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			exported[name+suffix] = true
		}
	}
	if len(exported) == 0 {
		t.Fatalf("found no metric names in %s", metricsFile)
	}
	p := parser.NewParser(parser.Options{})
	for _, g := range ruleGroups(t).Groups {
		for _, r := range g.Rules {
			expr, err := p.ParseExpr(r.Expr)
			if err != nil {
				t.Fatalf("%s: %v", r.Alert, err)
			}
			parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
				if vs, ok := n.(*parser.VectorSelector); ok && strings.HasPrefix(vs.Name, "etcdbackup_") && !exported[vs.Name] {
					t.Errorf("alert %s reads %s, which the server does not export (%s)", r.Alert, vs.Name, metricsFile)
				}
				return nil
			})
		}
	}
}
