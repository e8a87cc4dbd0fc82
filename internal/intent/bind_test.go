package intent

import (
	"slices"
	"testing"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
)

func TestRulesInBindingOrderSkippingMissing(t *testing.T) {
	si := func(id string) *intentv1alpha1.SecurityIntent {
		return &intentv1alpha1.SecurityIntent{Spec: intentv1alpha1.SecurityIntentSpec{Intent: intentv1alpha1.Intent{
			ID: id, Action: "Block", Description: "d", Severity: "High", Tags: []string{"t"},
			Params: map[string]intentv1alpha1.ParamValues{"psaLevel": {"restricted"}},
		}}}
	}
	intents := map[string]*intentv1alpha1.SecurityIntent{"b": si(EscapeToHost), "a": si(DNSManipulation)}
	rules, bound, missing := Rules([]intentv1alpha1.MatchIntent{{Name: "b"}, {Name: "gone"}, {Name: "a"}}, intents)
	if !slices.Equal(bound, []string{"b", "a"}) || !slices.Equal(missing, []string{"gone"}) {
		t.Errorf("bound %v, missing %v", bound, missing)
	}
	if len(rules) != 2 || rules[0].ID != EscapeToHost || rules[1].ID != DNSManipulation ||
		rules[0].Description != "d" || rules[0].Rule.RuleAction != "Block" || rules[0].Rule.Params["psaLevel"][0] != "restricted" || rules[0].Type != "" {
		t.Errorf("rules %+v", rules)
	}
	rules[0].Rule.Params["psaLevel"][0] = "changed"
	if intents["b"].Spec.Intent.Params["psaLevel"][0] != "restricted" {
		t.Error("the rules share the intent's params")
	}
}

func TestSelectNamespaces(t *testing.T) {
	all := []Namespace{{Name: "kube-system"}, {Name: "b"}, {Name: "a"}, {Name: "going", Terminating: true}, {Name: "spire"}}
	for _, tc := range []struct {
		name string
		sel  intentv1alpha1.NamespaceSelector
		want []string
	}{
		{"every one", intentv1alpha1.NamespaceSelector{MatchNames: []string{"*"}}, []string{"a", "b", "spire"}},
		{"named, missing ones skipped", intentv1alpha1.NamespaceSelector{MatchNames: []string{"spire", "nope", "kube-system"}}, []string{"spire"}},
		{"all but excluded", intentv1alpha1.NamespaceSelector{ExcludeNames: []string{"spire"}}, []string{"a", "b"}},
		{"* but excluded", intentv1alpha1.NamespaceSelector{MatchNames: []string{"*"}, ExcludeNames: []string{"a"}}, []string{"b", "spire"}},
		{"nothing selected", intentv1alpha1.NamespaceSelector{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := SelectNamespaces(tc.sel, all); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
