package pipelineid

import (
	"strings"
	"testing"
)

func TestGlob(t *testing.T) {
	for _, c := range []struct {
		pattern, s string
		want       bool
	}{
		{"acme/*", "acme/web", true}, {"acme/*", "acme/web/x", true}, {"acme/*", "acmex/web", false},
		{"refs/heads/*", "refs/heads/main", true}, {"refs/pull/*/merge", "refs/pull/42/merge", true},
		{"refs/pull/*/merge", "refs/pull/42/head", false}, {"main", "main", true}, {"main", "main2", false},
		{"*", "", true}, {"a*b*c", "aXbYc", true}, {"a*b*c", "aXcYb", false}, {"*-prod", "eu-prod", true},
	} {
		if got := Glob(c.pattern, c.s); got != c.want {
			t.Errorf("Glob(%q, %q) = %v", c.pattern, c.s, got)
		}
	}
}

func TestMatchTakesTheFirstRuleThatAdmits(t *testing.T) {
	rules := []Rule{
		{Claims: map[string][]string{"repository": {"acme/*"}, "event_name": {"pull_request"}}, Namespace: "ci-{repository|last}-pr-{ref|pull}"},
		{Claims: map[string][]string{"repository": {"acme/*"}, "ref": {"refs/heads/main"}}, Namespace: "ci-{repository|last}-main"},
	}
	pr := map[string]any{"repository": "acme/web", "event_name": "pull_request", "ref": "refs/pull/42/merge"}
	if i, err := Match(pr, rules); i != 0 || err != nil {
		t.Errorf("pull request: rule %d, %v", i, err)
	}
	main := map[string]any{"repository": "acme/web", "event_name": "push", "ref": "refs/heads/main"}
	if i, err := Match(main, rules); i != 1 || err != nil {
		t.Errorf("main: rule %d, %v", i, err)
	}
	other := map[string]any{"repository": "evil/web", "event_name": "push", "ref": "refs/heads/main", "secret": "s3cr3t"}
	_, err := Match(other, rules)
	r := refusedBy(t, err, CheckClaims, "")
	if !strings.Contains(r.Message, `repository="evil/web"`) || !strings.Contains(r.Message, `event_name="push"`) || strings.Contains(r.Message, "s3cr3t") {
		t.Errorf("refusal = %q, want the claims the rules look at, and only those", r.Message)
	}
	if _, err := Match(map[string]any{"event_name": "pull_request"}, rules); err == nil || !strings.Contains(err.Error(), "repository missing") {
		t.Errorf("a missing claim: %v", err)
	}
	// A non-string claim never matches a pattern, except booleans read as "true"/"false".
	if _, err := Match(map[string]any{"repository": []any{"acme/web"}, "event_name": "pull_request"}, rules); err == nil {
		t.Error("a list claim matched")
	}
	if i, _ := Match(map[string]any{"ref_protected": true}, []Rule{{Claims: map[string][]string{"ref_protected": {"true"}}}}); i != 0 {
		t.Error("a boolean claim did not match its string form")
	}
}

func TestNamespaceName(t *testing.T) {
	claims := map[string]any{
		"repository": "Acme/Web_App", "ref": "refs/pull/42/merge", "branch_ref": "refs/heads/feature/Login.v2",
		"project_path": "group/sub/api", "long": strings.Repeat("x", 61), "ref_protected": true,
	}
	for _, c := range []struct {
		tmpl, want, refusal string
	}{
		{tmpl: "ci-{repository|last}-pr-{ref|pull}", want: "ci-web-app-pr-42"},
		{tmpl: "ci-{repository}-pr-{ref|pull}", want: "ci-acme-web-app-pr-42"},
		{tmpl: "ci-{branch_ref|last}", want: "ci-login-v2"},
		{tmpl: "gl-{project_path}", want: "gl-group-sub-api"},
		{tmpl: "p-{ref_protected}", want: "p-true"},
		{tmpl: "ci-{branch_ref|pull}", refusal: "has no pull part"},
		{tmpl: "ci-{missing}", refusal: "needs claim missing"},
		{tmpl: "ci-{long}", refusal: "names are never cut"},
		{tmpl: "{ref}", refusal: "no namespace name"}, // "refs-pull-42-merge" is fine…
	} {
		got, err := NamespaceName(c.tmpl, claims)
		if c.refusal != "" {
			if c.tmpl == "{ref}" { // …so make one that ends in a dash
				got, err = NamespaceName("{ref}", map[string]any{"ref": "main/"})
			}
			if err == nil || !strings.Contains(err.Error(), c.refusal) {
				t.Errorf("%s: %q, %v; want a refusal with %q", c.tmpl, got, err, c.refusal)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: %q, %v; want %q", c.tmpl, got, err, c.want)
		}
	}
}

func TestValidateTemplate(t *testing.T) {
	for tmpl, ok := range map[string]bool{
		"ci-{repository|last}-pr-{ref|pull}": true, "ci-{project_path}": true, "fixed": true,
		"": false, "ci-{ref|upper}": false, "CI-{ref}": false, "ci_{ref}": false, "ci-{ref": false, "ci-{}": false,
	} {
		if err := ValidateTemplate(tmpl); (err == nil) != ok {
			t.Errorf("ValidateTemplate(%q) = %v", tmpl, err)
		}
	}
}
