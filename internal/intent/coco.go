package intent

import (
	"slices"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
)

// DefaultRuntimeClass is the RuntimeClass cocoWorkload moves workloads to when its rule names none.
const DefaultRuntimeClass = "kata-clh"

// runtimeClass is the rule's own runtimeClass param. (Nimbus reads the first rule's params for
// every rule, and its ClusterPolicy ignores the param.)
func runtimeClass(r intentv1alpha1.NimbusRules) string {
	if v := r.Rule.Params["runtimeClass"]; len(v) > 0 && v[0] != "" {
		return v[0]
	}
	return DefaultRuntimeClass
}

func runtimeClassPatch(r intentv1alpha1.NimbusRules) map[string]any {
	return map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"runtimeClassName": runtimeClass(r)}}}}
}

// selectedWorkloads returns, sorted, the names of the workloads carrying every one of labels
// (all of them when there are no labels). Nimbus collects the Deployments carrying any one of
// them, once per label they carry.
func selectedWorkloads(workloads []Workload, labels map[string]string) []string {
	var out []string
	for _, w := range workloads {
		if carries(w.Labels, labels) {
			out = append(out, w.Name)
		}
	}
	slices.Sort(out)
	return out
}

func carries(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// cocoWorkloadPolicies are cocoWorkload's Kyverno Policies on a NimbusPolicy: <np>-mutateexisting
// moves the Deployments that exist now to the RuntimeClass (triggered by the NimbusPolicy itself,
// so only when one is selected), <np>-mutateoncreate those created later. (Nimbus also creates a
// trigger ConfigMap, left over from an older design: not here.)
func cocoWorkloadPolicies(p parent, r intentv1alpha1.NimbusRules, deployments []Workload) []Policy {
	var out []Policy
	if selected := selectedWorkloads(deployments, p.labels); len(selected) > 0 {
		// Kyverno looks for a namespaced Policy's targets in the Policy's namespace only.
		var targets []any
		if len(p.labels) == 0 {
			targets = []any{map[string]any{"apiVersion": "apps/v1", "kind": "Deployment"}}
		} else {
			for _, name := range selected {
				targets = append(targets, map[string]any{"apiVersion": "apps/v1", "kind": "Deployment", "name": name})
			}
		}
		trigger := map[string]any{"resources": map[string]any{
			"kinds": []any{intentv1alpha1.GroupVersion.String() + "/NimbusPolicy"},
			"name":  p.name,
		}}
		out = append(out, cocoWorkloadPolicy(p, r, p.name+"-mutateexisting", map[string]any{
			"name":  "add runtime",
			"match": map[string]any{"any": []any{trigger}},
			"mutate": map[string]any{
				"targets": targets, "patchStrategicMerge": runtimeClassPatch(r), "mutateExistingOnPolicyUpdate": true,
			},
		}))
	}
	return append(out, cocoWorkloadPolicy(p, r, p.name+"-mutateoncreate", map[string]any{
		"name":   "add runtime",
		"match":  map[string]any{"any": []any{kindResources(deploymentKind, nil, p.labels)}},
		"mutate": map[string]any{"patchStrategicMerge": runtimeClassPatch(r)},
	}))
}

// cocoWorkloadPolicy is one of cocoWorkload's Policies. A mutate rule has no failure action: the
// intent's action (Block or Audit) does not change what it does.
func cocoWorkloadPolicy(p parent, r intentv1alpha1.NimbusRules, name string, rule map[string]any) Policy {
	spec := map[string]any{"background": true, "rules": []any{rule}}
	obj := object(KyvernoPolicyKind, name, p.namespace, kyvernoAnnotations(r), p.owner, spec)
	return Policy{Engine: Kyverno, Object: obj, Entry: "KyvernoPolicy/" + name}
}

// clusterSelection is the match and exclude of a ClusterNimbusPolicy's Kyverno rule for a kind:
// its namespaces (never kube-system) and workloads, as escapeToHost's ClusterPolicy has them.
func clusterSelection(cnp *intentv1alpha1.ClusterNimbusPolicy, kind string) (match, exclude map[string]any) {
	sel := cnp.Spec.NsSelector
	excluded := []any{map[string]any{"resources": map[string]any{"namespaces": []any{NeverSelected}}}}
	var namespaces []string
	if len(sel.MatchNames) > 0 && !slices.Equal(sel.MatchNames, []string{"*"}) {
		namespaces = sel.MatchNames
	} else if len(sel.ExcludeNames) > 0 {
		excluded = append(excluded, map[string]any{"resources": map[string]any{"namespaces": AnyList(sel.ExcludeNames)}})
	}
	match = map[string]any{"any": []any{kindResources(kind, namespaces, cnp.Spec.WorkloadSelector.MatchLabels)}}
	return match, map[string]any{"any": excluded}
}

// cocoWorkloadClusterPolicy is cocoWorkload's ClusterPolicy <cnp>-cocoworkload: each selected
// Deployment, existing or new, is moved to the rule's RuntimeClass. background is left to
// Kyverno's default, as Nimbus leaves it. The target is the Deployment that matched: Nimbus names
// no target, which makes Kyverno patch every Deployment of the cluster (kube-system's included)
// whenever one matches.
func cocoWorkloadClusterPolicy(cnp *intentv1alpha1.ClusterNimbusPolicy, owner map[string]any, r intentv1alpha1.NimbusRules) Policy {
	name := PolicyName(cnp.Name, r.ID)
	match, exclude := clusterSelection(cnp, deploymentKind)
	target := map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment",
		"namespace": "{{ request.object.metadata.namespace }}", "name": "{{ request.object.metadata.name }}",
	}
	spec := map[string]any{
		"rules": []any{map[string]any{
			"name":    "add-runtime-class-to-pods",
			"match":   match,
			"exclude": exclude,
			"mutate": map[string]any{
				"targets": []any{target}, "patchStrategicMerge": runtimeClassPatch(r), "mutateExistingOnPolicyUpdate": true,
			},
		}},
	}
	obj := object(KyvernoClusterPolicyKind, name, "", kyvernoAnnotations(r), owner, spec)
	return Policy{Engine: Kyverno, Object: obj, Entry: "KyvernoClusterPolicy/" + name}
}
