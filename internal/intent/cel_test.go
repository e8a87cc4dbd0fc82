package intent

import (
	"maps"
	"strings"
	"testing"
)

func TestCELSelector(t *testing.T) {
	ok := []struct {
		name  string
		exprs []string
		match map[string]string
		want  map[string]string
	}{
		{"Nimbus's example", []string{`labels["app"] == "nginx"`}, nil, map[string]string{"app": "nginx"}},
		{"value first, single quotes", []string{`'nginx' == labels['app']`}, nil, map[string]string{"app": "nginx"}},
		{"field selection", []string{`labels.app == "nginx"`}, nil, map[string]string{"app": "nginx"}},
		{"in a list of one", []string{`labels["app"] in ["nginx"]`}, nil, map[string]string{"app": "nginx"}},
		{"&& and several expressions add up",
			[]string{`labels["app"] == "nginx" && labels["tier"] == "web"`, `labels["group"] == "group-1"`}, nil,
			map[string]string{"app": "nginx", "tier": "web", "group": "group-1"}},
		{"with matchLabels", []string{`labels["app"] == "nginx"`}, map[string]string{"env": "prod"},
			map[string]string{"app": "nginx", "env": "prod"}},
		{"repeating matchLabels", []string{`labels["app"] == "nginx"`}, map[string]string{"app": "nginx"},
			map[string]string{"app": "nginx"}},
		{"none: matchLabels as they are", nil, map[string]string{"app": "nginx"}, map[string]string{"app": "nginx"}},
	}
	for _, tc := range ok {
		t.Run(tc.name, func(t *testing.T) {
			before := maps.Clone(tc.match)
			got, err := CELSelector(tc.exprs, tc.match)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			if !maps.Equal(tc.match, before) {
				t.Fatalf("matchLabels changed: %v", tc.match)
			}
		})
	}

	bad := []struct {
		name  string
		exprs []string
		match map[string]string
		want  string // in the message
	}{
		{"syntax", []string{`labels["app"] ==`}, nil, `cel[0] "labels[\"app\"] ==": ERROR`},
		{"unknown variable", []string{`pod.labels["app"] == "nginx"`}, nil, "undeclared reference to 'pod'"},
		{"not a condition", []string{`labels["app"]`}, nil, "is a string, not a condition"},
		{"a number", []string{`labels["app"] == 1`}, nil, "no matching overload"},
		{"!= (no label selector says not)", []string{`labels["app"] != "nginx"`}, nil, "!= cannot be written as required labels"},
		{"||", []string{`labels["app"] == "a" || labels["app"] == "b"`}, nil, "|| cannot be written"},
		{"contains", []string{`labels["app"].contains("ngi")`}, nil, "contains cannot be written"},
		{"startsWith", []string{`labels["app"].startsWith("ngi")`}, nil, "startsWith cannot be written"},
		{"in a list of two", []string{`labels["app"] in ["a", "b"]`}, nil, "a list of one string"},
		{"a label compared with a label", []string{`labels["a"] == labels["b"]`}, nil, "compare labels[\"key\"] with a string"},
		{"a presence test", []string{`has(labels.app)`}, nil, "not a comparison"},
		{"the second expression is named", []string{`labels["app"] == "nginx"`, `true`}, nil, `cel[1] "true": not a comparison`},
		{"contradiction between expressions", []string{`labels["app"] == "a"`, `labels["app"] == "b"`}, nil,
			`cel[1] "labels[\"app\"] == \"b\"" requires label app=b, but cel[0] requires app=a`},
		{"contradiction with matchLabels", []string{`labels["app"] == "a"`}, map[string]string{"app": "b"},
			"but selector.workloadSelector.matchLabels requires app=b"},
	}
	for _, tc := range bad {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			got, err := CELSelector(tc.exprs, tc.match)
			if err == nil {
				t.Fatalf("accepted: %v", got)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("message %q does not say %q", err, tc.want)
			}
		})
	}
}
