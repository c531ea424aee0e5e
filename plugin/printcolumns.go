package plugin

import (
	"fmt"
	"io"
	"reflect"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/printers"
	"k8s.io/client-go/util/jsonpath"
)

// toUnstructured turns a printed object into maps, integers kept as int64.
func toUnstructured(obj runtime.Object) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, fmt.Errorf("convert %T for printing: %w", obj, err)
	}
	return &unstructured.Unstructured{Object: m}, nil
}

// items returns a list's items, or the object itself, as maps.
func items(obj runtime.Object) ([]map[string]any, error) {
	u, err := toUnstructured(obj)
	if err != nil {
		return nil, err
	}
	list, ok := u.Object["items"].([]any)
	if !ok {
		return []map[string]any{u.Object}, nil
	}
	out := make([]map[string]any, 0, len(list))
	for _, it := range list {
		if m, ok := it.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out, nil
}

// printNames writes kind/name per object, as kubectl's -o name does
// (without the group: "backup/NAME", which the plugin's own commands take
// back as NAME after the slash).
func printNames(w io.Writer, obj runtime.Object) error {
	its, err := items(obj)
	if err != nil {
		return err
	}
	for _, it := range its {
		kind, _ := it["kind"].(string)
		if kind == "" {
			kind = strings.TrimSuffix(obj.GetObjectKind().GroupVersionKind().Kind, "List")
		}
		meta, _ := it["metadata"].(map[string]any)
		name, _ := meta["name"].(string)
		if name == "" {
			name = "<unknown>"
		}
		if _, err := fmt.Fprintf(w, "%s/%s\n", strings.ToLower(kind), name); err != nil {
			return err
		}
	}
	return nil
}

type column struct {
	header string
	path   *jsonpath.JSONPath
}

// parseColumns reads kubectl's custom-columns spec,
// HEADER:.json.path[,HEADER:.path…]; a path may be given in braces.
func parseColumns(spec string) ([]column, error) {
	if spec == "" {
		return nil, fmt.Errorf("give the columns, e.g. -o custom-columns=NAME:.metadata.name,SIZE:.status.sizeBytes")
	}
	var cols []column
	for _, part := range strings.Split(spec, ",") {
		header, expr, ok := strings.Cut(part, ":")
		if !ok || header == "" || expr == "" {
			return nil, fmt.Errorf("%q is not HEADER:.json.path", part)
		}
		if !strings.HasPrefix(expr, "{") {
			if !strings.HasPrefix(expr, ".") {
				expr = "." + expr
			}
			expr = "{" + expr + "}"
		}
		p := jsonpath.New(header).AllowMissingKeys(true)
		if err := p.Parse(expr); err != nil {
			return nil, fmt.Errorf("column %s: %w", header, err)
		}
		cols = append(cols, column{header: header, path: p})
	}
	return cols, nil
}

// printColumns writes one row per object with the values the columns'
// paths find, "<none>" where they find nothing.
func printColumns(w io.Writer, obj runtime.Object, cols []column, noHeaders bool) error {
	its, err := items(obj)
	if err != nil {
		return err
	}
	tw := printers.GetNewTabWriter(w)
	if !noHeaders {
		hs := make([]string, len(cols))
		for i, c := range cols {
			hs[i] = c.header
		}
		fmt.Fprintln(tw, strings.Join(hs, "\t"))
	}
	for _, it := range its {
		cells := make([]string, len(cols))
		for i, c := range cols {
			results, err := c.path.FindResults(it)
			if err != nil {
				return fmt.Errorf("column %s: %w", c.header, err)
			}
			var vals []string
			for _, r := range results {
				for _, v := range r {
					if v.IsValid() && !(v.Kind() == reflect.Interface && v.IsNil()) {
						vals = append(vals, fmt.Sprint(v.Interface()))
					}
				}
			}
			cells[i] = strings.Join(vals, ",")
			if cells[i] == "" {
				cells[i] = "<none>"
			}
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}
