//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
)

// testManagerKyvernoPolicies proves, as the manager's ServiceAccount and with dry runs, that
// quartermaster-manager-kyverno lets through every Kyverno policy the catalogue generates and
// refuses the ones that would make Kyverno act beyond it. Needs Kyverno's CRDs.
func testManagerKyvernoPolicies(t *testing.T, ns string) {
	ctx := context.Background()
	cfg, err := restConfigAs(ctx, managerNamespace, "quartermaster-manager")
	must(t, err)
	asManager, err := client.New(cfg, client.Options{})
	must(t, err)
	dryRun := func(obj *unstructured.Unstructured) error {
		return asManager.Create(ctx, obj.DeepCopy(), client.DryRunAll)
	}

	rules := []intentv1alpha1.NimbusRules{
		{ID: intent.EscapeToHost, Rule: intentv1alpha1.Rule{RuleAction: "Block", Params: map[string]intentv1alpha1.ParamValues{"psaLevel": {"restricted"}}}},
		{ID: intent.CocoWorkload, Rule: intentv1alpha1.Rule{RuleAction: "Block", Params: map[string]intentv1alpha1.ParamValues{"runtimeClass": {"kata-clh"}}}},
		{ID: intent.VirtualPatch, Rule: intentv1alpha1.Rule{RuleAction: "Block", Params: map[string]intentv1alpha1.ParamValues{"cveList": {"CVE-2024-4439"}}}},
	}
	np := &intentv1alpha1.NimbusPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "kyverno-probe", Namespace: ns, UID: "e2e-probe"},
		Spec:       intentv1alpha1.NimbusPolicySpec{Selector: intentv1alpha1.LabelSelector{MatchLabels: map[string]string{"app": "nginx"}}, NimbusRules: rules},
	}
	cnp := &intentv1alpha1.ClusterNimbusPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "kyverno-probe", UID: "e2e-probe"},
		Spec: intentv1alpha1.ClusterNimbusPolicySpec{NsSelector: intentv1alpha1.NamespaceSelector{MatchNames: []string{"*"}},
			NimbusRules: rules[:2]},
	}
	generated := map[string]*unstructured.Unstructured{}
	for _, p := range append(intent.ForNimbusPolicy(np, intent.Inputs{Deployments: []intent.Workload{{Name: "web", Labels: map[string]string{"app": "nginx"}}}}),
		intent.ForClusterNimbusPolicy(cnp)...) {
		if p.Engine == intent.Kyverno {
			generated[p.Object.GetKind()+"/"+p.Object.GetName()] = p.Object
		}
	}
	var kinds []string
	for k := range generated {
		kinds = append(kinds, k)
	}
	policy := func(name string) *unstructured.Unstructured {
		obj, ok := generated[name]
		if !ok {
			t.Fatalf("no generated %s among %v", name, kinds)
		}
		return obj.DeepCopy()
	}
	const refusedBy = "quartermaster-manager-kyverno"

	// The API server enforces a policy some time after it is created, and Kyverno's CRDs are new.
	escape := func() *unstructured.Unstructured { return policy("Policy/kyverno-probe-escapetohost") }
	denyAll := escape()
	denyAll.Object["spec"].(map[string]any)["rules"] = []any{map[string]any{"name": "deny", "match": map[string]any{"any": []any{map[string]any{"resources": map[string]any{"kinds": []any{"*"}}}}},
		"validate": map[string]any{"deny": map[string]any{}}}}
	eventually(t, "a deny-everything rule, as the manager, refused by "+refusedBy, func() bool {
		err := dryRun(denyAll)
		return err != nil && strings.Contains(err.Error(), refusedBy)
	})

	t.Run("every Kyverno policy the catalogue generates is accepted", func(t *testing.T) {
		for name, obj := range generated {
			if err := dryRun(obj); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	})

	rule0 := func(obj *unstructured.Unstructured) map[string]any {
		return obj.Object["spec"].(map[string]any)["rules"].([]any)[0].(map[string]any)
	}
	refused := map[string]func() *unstructured.Unstructured{
		"a mutate rule adding a privileged container": func() *unstructured.Unstructured {
			obj := policy("Policy/kyverno-probe-mutateoncreate")
			rule0(obj)["mutate"] = map[string]any{"patchStrategicMerge": map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
				"containers": []any{map[string]any{"name": "x", "image": "evil", "securityContext": map[string]any{"privileged": true}}}}}}}}
			return obj
		},
		"a mutate rule matching Pods": func() *unstructured.Unstructured {
			obj := policy("Policy/kyverno-probe-mutateoncreate")
			rule0(obj)["match"] = map[string]any{"any": []any{map[string]any{"resources": map[string]any{"kinds": []any{"Pod"}}}}}
			return obj
		},
		"a mutate target that is a RoleBinding": func() *unstructured.Unstructured {
			obj := policy("Policy/kyverno-probe-mutateexisting")
			rule0(obj)["mutate"].(map[string]any)["targets"] = []any{map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "name": "admin"}}
			return obj
		},
		"a JSON patch": func() *unstructured.Unstructured {
			obj := policy("Policy/kyverno-probe-mutateoncreate")
			rule0(obj)["mutate"] = map[string]any{"patchesJson6902": "- op: add\n  path: /metadata/labels/x\n  value: y\n"}
			return obj
		},
		"generating a RoleBinding": func() *unstructured.Unstructured {
			obj := policy("Policy/kyverno-probe-cve-2024-4439-netpol-1")
			g := rule0(obj)["generate"].(map[string]any)
			g["apiVersion"], g["kind"] = "rbac.authorization.k8s.io/v1", "RoleBinding"
			g["data"] = map[string]any{"roleRef": map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
				"subjects": []any{map[string]any{"kind": "User", "name": "mallory"}}}
			return obj
		},
		"cloning a Secret": func() *unstructured.Unstructured {
			obj := policy("Policy/kyverno-probe-cve-2024-4439-netpol-1")
			g := rule0(obj)["generate"].(map[string]any)
			delete(g, "data")
			g["apiVersion"], g["kind"] = "v1", "Secret"
			g["clone"] = map[string]any{"namespace": "kube-system", "name": "bootstrap-token"}
			return obj
		},
		// The catalogue writes rules as Kyverno's Go types do, with empty mutate, validate, clone
		// and cloneList: only empty ones pass.
		"a clone beside a validate": func() *unstructured.Unstructured {
			obj := escape()
			rule0(obj)["generate"] = map[string]any{"clone": map[string]any{"namespace": "kube-system", "name": "bootstrap-token"}, "cloneList": map[string]any{}}
			return obj
		},
		"a cloneList": func() *unstructured.Unstructured {
			obj := escape()
			r := rule0(obj)
			r["validate"] = map[string]any{}
			r["generate"] = map[string]any{"clone": map[string]any{}, "cloneList": map[string]any{"namespace": "kube-system", "kinds": []any{"v1/Secret"}}}
			return obj
		},
		"a mutate beside a validate": func() *unstructured.Unstructured {
			obj := escape()
			rule0(obj)["mutate"] = map[string]any{"patchStrategicMerge": map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"runtimeClassName": "x"}}}}}
			return obj
		},
		"generating into another namespace": func() *unstructured.Unstructured {
			obj := policy("Policy/kyverno-probe-cve-2024-4439-netpol-1")
			rule0(obj)["generate"].(map[string]any)["namespace"] = "kube-system"
			return obj
		},
		"generating a Policy that mutates": func() *unstructured.Unstructured {
			obj := policy("Policy/kyverno-probe-cve-2024-4439-kyverno-1")
			data := rule0(obj)["generate"].(map[string]any)["data"].(map[string]any)
			inner := data["spec"].(map[string]any)["rules"].([]any)[0].(map[string]any)
			delete(inner, "validate")
			inner["mutate"] = map[string]any{"patchStrategicMerge": map[string]any{"metadata": map[string]any{"labels": map[string]any{"x": "y"}}}}
			return obj
		},
		"a generate rule in a ClusterPolicy": func() *unstructured.Unstructured {
			obj := policy("ClusterPolicy/kyverno-probe-escapetohost")
			gen := rule0(policy("Policy/kyverno-probe-cve-2024-4439-netpol-1"))
			gen["generate"].(map[string]any)["namespace"] = ""
			obj.Object["spec"].(map[string]any)["rules"] = []any{gen}
			return obj
		},
		"a context entry calling the API": func() *unstructured.Unstructured {
			obj := policy("Policy/kyverno-probe-cve-2024-4439-karmor-1")
			rule0(obj)["context"] = []any{map[string]any{"name": "secrets", "apiCall": map[string]any{"urlPath": "/api/v1/namespaces/kube-system/secrets"}}}
			return obj
		},
		"a validate rule other than pod security": func() *unstructured.Unstructured { return denyAll.DeepCopy() },
		"image verification": func() *unstructured.Unstructured {
			obj := escape()
			r := rule0(obj)
			delete(r, "validate")
			r["verifyImages"] = []any{map[string]any{"imageReferences": []any{"*"}, "mutateDigest": false, "verifyDigest": false, "required": false}}
			return obj
		},
	}
	// PolicyExceptions (SecurityIntentExceptions): only from the escapeToHost policies it generates.
	exception := func(policyName string) *unstructured.Unstructured {
		pe := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{
			"background": true,
			"exceptions": []any{map[string]any{"policyName": policyName, "ruleNames": []any{"*"}}},
			"match": map[string]any{"any": []any{map[string]any{"resources": map[string]any{
				"namespaces": []any{ns}, "selector": map[string]any{"matchLabels": map[string]any{"legacy": "true"}}}}}},
		}}}
		pe.SetAPIVersion("kyverno.io/v2")
		pe.SetKind("PolicyException")
		pe.SetNamespace(ns)
		pe.SetName("probe")
		return pe
	}
	t.Run("the PolicyExceptions the controller writes are accepted", func(t *testing.T) {
		pe := exception(ns + "/kyverno-probe-escapetohost")
		if err := dryRun(pe); err != nil {
			t.Error(err)
		}
		// Every namespace by label (an admin namespace's exception), and a namespace without a selector.
		every := pe.DeepCopy()
		every.Object["spec"].(map[string]any)["exceptions"] = []any{map[string]any{"policyName": "kyverno-probe-escapetohost", "ruleNames": []any{"*"}},
			map[string]any{"policyName": ns + "/kyverno-probe-escapetohost", "ruleNames": []any{"*"}}}
		every.Object["spec"].(map[string]any)["match"].(map[string]any)["any"].([]any)[0].(map[string]any)["resources"].(map[string]any)["namespaces"] = []any{"*"}
		whole := pe.DeepCopy()
		delete(whole.Object["spec"].(map[string]any)["match"].(map[string]any)["any"].([]any)[0].(map[string]any)["resources"].(map[string]any), "selector")
		for _, obj := range []*unstructured.Unstructured{every, whole} {
			if err := dryRun(obj); err != nil {
				t.Error(err)
			}
		}
	})
	refused["a PolicyException from a policy it did not generate"] = func() *unstructured.Unstructured {
		return exception("require-signed-images")
	}
	refused["a PolicyException with conditions"] = func() *unstructured.Unstructured {
		pe := exception(ns + "/kyverno-probe-escapetohost")
		pe.Object["spec"].(map[string]any)["conditions"] = map[string]any{"any": []any{map[string]any{"key": "x", "operator": "Equals", "value": "x"}}}
		return pe
	}
	refused["a PolicyException matching by user"] = func() *unstructured.Unstructured {
		pe := exception(ns + "/kyverno-probe-escapetohost")
		pe.Object["spec"].(map[string]any)["match"] = map[string]any{"any": []any{map[string]any{"subjects": []any{map[string]any{"kind": "User", "name": "mallory"}}}}}
		pe.Object["spec"].(map[string]any)["background"] = false
		return pe
	}
	for name, build := range refused {
		t.Run("refused: "+name, func(t *testing.T) {
			err := dryRun(build())
			if err == nil || !strings.Contains(err.Error(), refusedBy) {
				t.Errorf("dry run as the manager = %v, want refused by %s", err, refusedBy)
			}
		})
	}
}
