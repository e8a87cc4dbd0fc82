package intent

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
)

const clusterOwner = `
  ownerReferences:
  - {apiVersion: intent.security.nimbus.com/v1alpha1, kind: ClusterNimbusPolicy, name: all, uid: cnp-uid, controller: true, blockOwnerDeletion: true}`

func clusterNimbusPolicy(sel intentv1alpha1.NamespaceSelector, labels map[string]string, rules ...intentv1alpha1.NimbusRules) *intentv1alpha1.ClusterNimbusPolicy {
	return &intentv1alpha1.ClusterNimbusPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "all", UID: "cnp-uid"},
		Spec:       intentv1alpha1.ClusterNimbusPolicySpec{NsSelector: sel, WorkloadSelector: intentv1alpha1.LabelSelector{MatchLabels: labels}, NimbusRules: rules},
	}
}

// entries are the status entries of policies, in order.
func entries(ps []Policy) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Entry)
	}
	return out
}

func kyvernoPolicyYAML(name, id, spec string) string {
	return `
apiVersion: kyverno.io/v1
kind: Policy
metadata:
  name: ` + name + `
  namespace: shop
  annotations: {app.kubernetes.io/managed-by: nimbus-kyverno, policies.kyverno.io/description: desc of ` + id + `}` + npOwner + `
spec:
` + spec
}

func TestCocoWorkloadPolicies(t *testing.T) {
	deployments := []Workload{
		{Name: "web", Labels: map[string]string{"app": "nginx", "tier": "front"}},
		{Name: "api", Labels: map[string]string{"app": "api"}},
		{Name: "cache", Labels: map[string]string{"app": "nginx"}},
	}
	runtimeClass := func(rc string) map[string]intentv1alpha1.ParamValues {
		return map[string]intentv1alpha1.ParamValues{"runtimeClass": {rc}}
	}
	t.Run("mutateexisting for the selected Deployments, mutateoncreate, at the rule's own runtimeClass", func(t *testing.T) {
		np := nimbusPolicy(rule(EscapeToHost, "Block", runtimeClass("first-rule")), rule(CocoWorkload, "Block", runtimeClass("kata-qemu")))
		var got []Policy
		for _, p := range ForNimbusPolicy(np, Inputs{Deployments: deployments}) {
			if p.Engine == Kyverno && p.Object.GetName() != "web-escapetohost" {
				got = append(got, p)
			}
		}
		if want := []string{"KyvernoPolicy/web-mutateexisting", "KyvernoPolicy/web-mutateoncreate"}; !slices.Equal(entries(got), want) {
			t.Fatalf("entries %v, want %v", entries(got), want)
		}
		assertObject(t, got[0].Object.Object, kyvernoPolicyYAML("web-mutateexisting", CocoWorkload, `  background: true
  rules:
  - name: add runtime
    match: {any: [{resources: {kinds: [intent.security.nimbus.com/v1alpha1/NimbusPolicy], name: web}}]}
    mutate:
      targets:
      - {apiVersion: apps/v1, kind: Deployment, name: cache}
      - {apiVersion: apps/v1, kind: Deployment, name: web}
      patchStrategicMerge: {spec: {template: {spec: {runtimeClassName: kata-qemu}}}}
      mutateExistingOnPolicyUpdate: true
`))
		assertObject(t, got[1].Object.Object, kyvernoPolicyYAML("web-mutateoncreate", CocoWorkload, `  background: true
  rules:
  - name: add runtime
    match: {any: [{resources: {kinds: [apps/v1/Deployment], selector: {matchLabels: {app: nginx}}}}]}
    mutate:
      patchStrategicMerge: {spec: {template: {spec: {runtimeClassName: kata-qemu}}}}
`))
	})
	t.Run("no labels: every Deployment, by one target; Audit; default runtimeClass", func(t *testing.T) {
		np := nimbusPolicy(rule(CocoWorkload, "Audit", nil))
		np.Spec.Selector.MatchLabels = nil
		got := ForNimbusPolicy(np, Inputs{Deployments: deployments})
		if len(got) != 2 {
			t.Fatalf("entries %v", entries(got))
		}
		assertObject(t, got[0].Object.Object, kyvernoPolicyYAML("web-mutateexisting", CocoWorkload, `  background: true
  rules:
  - name: add runtime
    match: {any: [{resources: {kinds: [intent.security.nimbus.com/v1alpha1/NimbusPolicy], name: web}}]}
    mutate:
      targets: [{apiVersion: apps/v1, kind: Deployment}]
      patchStrategicMerge: {spec: {template: {spec: {runtimeClassName: kata-clh}}}}
      mutateExistingOnPolicyUpdate: true
`))
		assertObject(t, got[1].Object.Object, kyvernoPolicyYAML("web-mutateoncreate", CocoWorkload, `  background: true
  rules:
  - name: add runtime
    match: {any: [{resources: {kinds: [apps/v1/Deployment]}}]}
    mutate:
      patchStrategicMerge: {spec: {template: {spec: {runtimeClassName: kata-clh}}}}
`))
	})
	for _, tc := range []struct {
		name        string
		labels      map[string]string
		deployments []Workload
	}{
		{"a Deployment carrying some of the labels is not selected", map[string]string{"app": "nginx", "tier": "back"}, deployments},
		{"no Deployment selected", map[string]string{"app": "db"}, deployments},
		{"no labels and no Deployment", nil, nil},
	} {
		t.Run(tc.name+": mutateoncreate alone", func(t *testing.T) {
			np := nimbusPolicy(rule(CocoWorkload, "Block", nil))
			np.Spec.Selector.MatchLabels = tc.labels
			if got := entries(ForNimbusPolicy(np, Inputs{Deployments: tc.deployments})); !slices.Equal(got, []string{"KyvernoPolicy/web-mutateoncreate"}) {
				t.Errorf("entries %v", got)
			}
		})
	}
	t.Run("all the labels select", func(t *testing.T) {
		np := nimbusPolicy(rule(CocoWorkload, "Block", nil))
		np.Spec.Selector.MatchLabels = map[string]string{"app": "nginx", "tier": "front"}
		got := ForNimbusPolicy(np, Inputs{Deployments: deployments})
		targets := got[0].Object.Object["spec"].(map[string]any)["rules"].([]any)[0].(map[string]any)["mutate"].(map[string]any)["targets"].([]any)
		if len(targets) != 1 || targets[0].(map[string]any)["name"] != "web" {
			t.Errorf("targets %v", targets)
		}
	})

	for _, tc := range []struct {
		name           string
		sel            intentv1alpha1.NamespaceSelector
		labels         map[string]string
		match, exclude string
	}{
		{"matchNames", intentv1alpha1.NamespaceSelector{MatchNames: []string{"a", "b"}}, map[string]string{"app": "nginx", "tier": "front"},
			`{any: [{resources: {kinds: [apps/v1/Deployment], namespaces: [a, b], selector: {matchLabels: {app: nginx, tier: front}}}}]}`,
			`{any: [{resources: {namespaces: [kube-system]}}]}`},
		{"every namespace but some", intentv1alpha1.NamespaceSelector{MatchNames: []string{"*"}, ExcludeNames: []string{"spire"}}, nil,
			`{any: [{resources: {kinds: [apps/v1/Deployment]}}]}`,
			`{any: [{resources: {namespaces: [kube-system]}}, {resources: {namespaces: [spire]}}]}`},
	} {
		t.Run("ClusterPolicy, "+tc.name, func(t *testing.T) {
			cnp := clusterNimbusPolicy(tc.sel, tc.labels, rule(EscapeToHost, "Audit", runtimeClass("first-rule")), rule(CocoWorkload, "Block", runtimeClass("kata-qemu")))
			ps := ForClusterNimbusPolicy(cnp)
			if want := []string{"KyvernoClusterPolicy/all-escapetohost", "KyvernoClusterPolicy/all-cocoworkload"}; !slices.Equal(entries(ps), want) {
				t.Fatalf("entries %v, want %v", entries(ps), want)
			}
			assertObject(t, ps[1].Object.Object, `
apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata:
  name: all-cocoworkload
  annotations: {app.kubernetes.io/managed-by: nimbus-kyverno, policies.kyverno.io/description: desc of cocoWorkload}`+clusterOwner+`
spec:
  rules:
  - name: add-runtime-class-to-pods
    match: `+tc.match+`
    exclude: `+tc.exclude+`
    mutate:
      targets:
      - {apiVersion: apps/v1, kind: Deployment, namespace: '{{ request.object.metadata.namespace }}', name: '{{ request.object.metadata.name }}'}
      patchStrategicMerge: {spec: {template: {spec: {runtimeClassName: kata-qemu}}}}
      mutateExistingOnPolicyUpdate: true
`)
		})
	}
}
