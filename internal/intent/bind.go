// Package intent is the intents controller's pure logic, without a client: what a binding
// resolves to (rules, namespaces), the catalogue of engine policies each intent generates, object
// for object as Nimbus (github.com/5GSEC/nimbus) generates them, how a NimbusPolicy's Ready reads
// after its policies are applied (applied.go), what an engine's report says of a resource
// (report.go) and what the reports make of an impact (impact.go), and the platform's checks of a
// SecurityIntentException and the PolicyException it becomes (exception.go). The controller reads
// and writes the objects; every decision about them is made here, with table tests, and fuzz
// targets where what is parsed was written by someone else (reports).
package intent

import (
	"slices"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
)

// Rules resolves a binding's intent names to rules, in binding order, skipping the names no
// SecurityIntent has. bound are the names that resolved, missing the ones that did not.
func Rules(names []intentv1alpha1.MatchIntent, intents map[string]*intentv1alpha1.SecurityIntent) (rules []intentv1alpha1.NimbusRules, bound, missing []string) {
	for _, m := range names {
		si, ok := intents[m.Name]
		if !ok {
			missing = append(missing, m.Name)
			continue
		}
		in := si.Spec.Intent
		rules = append(rules, intentv1alpha1.NimbusRules{
			ID: in.ID, Description: in.Description,
			Rule: intentv1alpha1.Rule{RuleAction: in.Action, Params: cloneParams(in.Params)},
		})
		bound = append(bound, m.Name)
	}
	return rules, bound, missing
}

func cloneParams(p map[string]intentv1alpha1.ParamValues) map[string]intentv1alpha1.ParamValues {
	if p == nil {
		return nil
	}
	out := make(map[string]intentv1alpha1.ParamValues, len(p))
	for k, v := range p {
		out[k] = slices.Clone(v)
	}
	return out
}

// ClusterPolicyNamePrefix prefixes the NimbusPolicy a cluster binding generates in each namespace.
const ClusterPolicyNamePrefix = "nimbus-ctlr-gen-"

// NeverSelected is the namespace a cluster binding never reaches, as in Nimbus.
const NeverSelected = "kube-system"

// Namespace is what namespace selection needs of a Namespace.
type Namespace struct {
	Name        string
	Terminating bool
}

// SelectNamespaces returns, sorted, the namespaces a cluster binding's selector picks:
// matchNames (["*"] for every one) or every one but excludeNames; never kube-system, never one
// being deleted.
func SelectNamespaces(sel intentv1alpha1.NamespaceSelector, namespaces []Namespace) []string {
	all := slices.Equal(sel.MatchNames, []string{"*"}) || len(sel.MatchNames) == 0 && len(sel.ExcludeNames) > 0
	var out []string
	for _, ns := range namespaces {
		switch {
		case ns.Terminating || ns.Name == NeverSelected:
		case slices.Contains(sel.ExcludeNames, ns.Name):
		case all || slices.Contains(sel.MatchNames, ns.Name):
			out = append(out, ns.Name)
		}
	}
	slices.Sort(out)
	return out
}

// Selects reports whether a cluster binding's selector picks the named namespace (when it exists
// and is not being deleted).
func Selects(sel intentv1alpha1.NamespaceSelector, name string) bool {
	return len(SelectNamespaces(sel, []Namespace{{Name: name}})) == 1
}
