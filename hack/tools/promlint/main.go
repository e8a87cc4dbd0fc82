// Command promlint checks Quartermaster's monitoring files with Prometheus's own parsers: the
// PrometheusRule's rule groups (rulefmt: names, PromQL, label and annotation templates) and the
// Grafana dashboard (JSON, unique panel ids, every query valid PromQL over metrics the manager
// exports). `make lint` runs it; it is a module of its own so that Prometheus's dependency tree
// stays out of the operator's go.mod.
//
//	go run . PROMETHEUSRULE.yaml DASHBOARD.json
package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
)

// exported are the prefixes of the metric families the manager serves (docs/metrics.md).
var exported = []string{"quartermaster_", "controller_runtime_", "workqueue_", "leader_election_", "process_", "go_", "rest_client_"}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: promlint PROMETHEUSRULE.yaml DASHBOARD.json")
		os.Exit(2)
	}
	errs := append(checkRules(os.Args[1]), checkDashboard(os.Args[2])...)
	for _, err := range errs {
		fmt.Fprintln(os.Stderr, err)
	}
	if len(errs) > 0 {
		os.Exit(1)
	}
}

// checkRules parses the spec of a PrometheusRule as a Prometheus rule file.
func checkRules(path string) []error {
	b, err := os.ReadFile(path)
	if err != nil {
		return []error{err}
	}
	var cr struct {
		Kind string    `yaml:"kind"`
		Spec yaml.Node `yaml:"spec"`
	}
	if err := yaml.Unmarshal(b, &cr); err != nil {
		return []error{fmt.Errorf("%s: %w", path, err)}
	}
	if cr.Kind != "PrometheusRule" {
		return []error{fmt.Errorf("%s: kind %q, want PrometheusRule", path, cr.Kind)}
	}
	spec, err := yaml.Marshal(&cr.Spec)
	if err != nil {
		return []error{err}
	}
	groups, errs := rulefmt.Parse(spec, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	var out []error
	for _, err := range errs {
		out = append(out, fmt.Errorf("%s: %w", path, err))
	}
	if groups == nil {
		return out
	}
	n := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			n++
			out = append(out, checkMetrics(fmt.Sprintf("%s: rule %s%s", path, r.Alert, r.Record), r.Expr)...)
			if r.Alert != "" && (r.Annotations["summary"] == "" || r.Annotations["description"] == "" || r.Labels["severity"] == "") {
				out = append(out, fmt.Errorf("%s: alert %s needs a summary, a description and a severity", path, r.Alert))
			}
		}
	}
	if n == 0 {
		out = append(out, fmt.Errorf("%s: no rules", path))
	}
	return out
}

type panel struct {
	ID      int      `json:"id"`
	Title   string   `json:"title"`
	Type    string   `json:"type"`
	Panels  []panel  `json:"panels"`
	Targets []target `json:"targets"`
}

type target struct {
	RefID string `json:"refId"`
	Expr  string `json:"expr"`
}

// checkDashboard reads a Grafana dashboard and parses every query.
func checkDashboard(path string) []error {
	b, err := os.ReadFile(path)
	if err != nil {
		return []error{err}
	}
	var d struct {
		Title  string  `json:"title"`
		UID    string  `json:"uid"`
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return []error{fmt.Errorf("%s: %w", path, err)}
	}
	var out []error
	if d.Title == "" || d.UID == "" || len(d.Panels) == 0 {
		out = append(out, fmt.Errorf("%s: a dashboard needs a title, a uid and panels", path))
	}
	ids := map[int]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			where := fmt.Sprintf("%s: panel %d %q", path, p.ID, p.Title)
			if other, ok := ids[p.ID]; ok {
				out = append(out, fmt.Errorf("%s: id taken by %q", where, other))
			}
			ids[p.ID] = p.Title
			if p.Type != "row" && len(p.Targets) == 0 {
				out = append(out, fmt.Errorf("%s: no query", where))
			}
			for _, t := range p.Targets {
				out = append(out, checkMetrics(where+" query "+t.RefID, grafanaToPromQL(t.Expr))...)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// grafanaToPromQL replaces Grafana's variables with values Prometheus would see.
func grafanaToPromQL(expr string) string {
	return strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h", `"$job"`, `".*"`).Replace(expr)
}

// checkMetrics parses expr and checks it reads only metrics the manager exports.
func checkMetrics(where, expr string) []error {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return []error{fmt.Errorf("%s: %w", where, err)}
	}
	var out []error
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == "__name__" {
				name = m.Value
			}
		}
		known := false
		for _, p := range exported {
			known = known || strings.HasPrefix(name, p)
		}
		if !known {
			out = append(out, fmt.Errorf("%s: %s is not a metric the manager exports", where, name))
		}
		return nil
	})
	return out
}
