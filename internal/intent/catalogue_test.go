package intent

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
)

const npOwner = `
  ownerReferences:
  - {apiVersion: intent.security.nimbus.com/v1alpha1, kind: NimbusPolicy, name: web, uid: np-uid, controller: true, blockOwnerDeletion: true}`

func nimbusPolicy(rules ...intentv1alpha1.NimbusRules) *intentv1alpha1.NimbusPolicy {
	return &intentv1alpha1.NimbusPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", UID: "np-uid"},
		Spec:       intentv1alpha1.NimbusPolicySpec{Selector: intentv1alpha1.LabelSelector{MatchLabels: map[string]string{"app": "nginx"}}, NimbusRules: rules},
	}
}

func rule(id, action string, params map[string]intentv1alpha1.ParamValues) intentv1alpha1.NimbusRules {
	return intentv1alpha1.NimbusRules{ID: id, Description: "desc of " + id, Rule: intentv1alpha1.Rule{RuleAction: action, Params: params}}
}

// ksp is a KubeArmorPolicy of the web NimbusPolicy with the given name and rule sections.
func ksp(name, id, sections string) string {
	return `
apiVersion: security.kubearmor.com/v1
kind: KubeArmorPolicy
metadata:
  name: ` + name + `
  namespace: shop
  annotations: {app.kubernetes.io/managed-by: nimbus-kubearmor}` + npOwner + `
spec:
  selector: {matchLabels: {app: nginx}}
  action: Block
  message: desc of ` + id + `
  network: {}
  syscalls: {}
` + sections
}

func TestKubeArmorPolicies(t *testing.T) {
	sw := "  process:\n    matchPaths:\n"
	for _, p := range softwareDeploymentTools {
		sw += "    - path: " + p + "\n"
	}
	escape := map[string]string{
		"web-escapetohost-disallowchroot":       "  process:\n    matchPaths: [{path: /usr/sbin/chroot}, {path: /sbin/chroot}]\n  file: {}\n  capabilities: {}\n",
		"web-escapetohost-disallowcapabilities": "  process: {}\n  file: {}\n  capabilities:\n    matchCapabilities: [{capability: sys_admin}, {capability: sys_ptrace}, {capability: sys_module}, {capability: dac_read_search}, {capability: dac_override}]\n",
		"web-escapetohost-swdeploymenttools":    sw + "  file: {}\n  capabilities: {}\n",
	}
	for _, tc := range []struct {
		id   string
		want map[string]string // name → rule sections
	}{
		{DNSManipulation, map[string]string{"web-dnsmanipulation": "  process: {}\n  capabilities: {}\n  file:\n    matchPaths: [{path: /etc/resolv.conf, readOnly: true}]\n"}},
		{UnAuthorizedSaTokenAccess, map[string]string{"web-unauthorizedsatokenaccess": "  process: {}\n  capabilities: {}\n  file:\n    matchDirectories: [{dir: /run/secrets/kubernetes.io/serviceaccount/, recursive: true}]\n"}},
		{SwDeploymentTools, map[string]string{"web-swdeploymenttools": sw + "  file: {}\n  capabilities: {}\n"}},
		{PreventExecFromTempOrLogs, map[string]string{"web-preventexecutionfromtemporlogsfolders": `  file: {}
  capabilities: {}
  process:
    action: Block
    matchDirectories:
    - {dir: /var/tmp/, recursive: true}
    - {dir: /tmp/, recursive: true}
    - {dir: /var/log/, recursive: true}
    - {dir: /app/logs/, recursive: true}
    - {dir: /logs/, recursive: true}
    - {dir: /etc/, recursive: true}
`}},
		{EscapeToHost, escape},
	} {
		t.Run(tc.id, func(t *testing.T) {
			got := map[string]Policy{}
			var order []string
			for _, p := range ForNimbusPolicy(nimbusPolicy(rule(tc.id, "Block", nil)), Inputs{}) {
				if p.Engine == KubeArmor {
					got[p.Object.GetName()] = p
					order = append(order, p.Object.GetName())
				}
			}
			if len(got) != len(tc.want) {
				t.Fatalf("KubeArmorPolicies %v, want %d", order, len(tc.want))
			}
			for name, sections := range tc.want {
				p, ok := got[name]
				if !ok {
					t.Fatalf("no KubeArmorPolicy %s among %v", name, order)
				}
				assertObject(t, p.Object.Object, ksp(name, tc.id, sections))
				if p.Entry != "KubeArmorPolicy/"+name {
					t.Errorf("status entry %q", p.Entry)
				}
			}
		})
	}
	t.Run("escapeToHost's three in Nimbus's order", func(t *testing.T) {
		var names []string
		for _, p := range ForNimbusPolicy(nimbusPolicy(rule(EscapeToHost, "Block", nil)), Inputs{}) {
			names = append(names, p.Entry)
		}
		want := "KubeArmorPolicy/web-escapetohost-disallowchroot,KubeArmorPolicy/web-escapetohost-disallowcapabilities,KubeArmorPolicy/web-escapetohost-swdeploymenttools,KyvernoPolicy/web-escapetohost"
		if strings.Join(names, ",") != want {
			t.Errorf("entries %v, want %s", names, want)
		}
	})
	t.Run("an Audit intent audits, and no labels select every pod", func(t *testing.T) {
		np := nimbusPolicy(rule(DNSManipulation, "Audit", nil))
		np.Spec.Selector.MatchLabels = nil
		obj := ForNimbusPolicy(np, Inputs{})[0].Object.Object
		spec := obj["spec"].(map[string]any)
		if spec["action"] != "Audit" || len(spec["selector"].(map[string]any)) != 0 {
			t.Errorf("spec %v", spec)
		}
	})
}

func TestNetworkPolicies(t *testing.T) {
	netpol := func(name, spec string) string {
		return `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: ` + name + `
  namespace: shop
  annotations: {app.kubernetes.io/managed-by: nimbus-netpol}` + npOwner + `
spec:
  podSelector: {matchLabels: {app: nginx}}
` + spec
	}
	const dns = `{podSelector: {matchLabels: {k8s-app: kube-dns}}, namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}}`
	const ports = `[{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]`
	in := Inputs{PodCIDRs: []string{"10.244.0.0/24", "", "10.244.1.0/24"}}
	for _, tc := range []struct{ id, want string }{
		{DNSManipulation, netpol("web-dnsmanipulation", `  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 10.244.0.0/24}}, {ipBlock: {cidr: 10.244.1.0/24}}, `+dns+`]
    ports: `+ports+"\n")},
		{DenyExternalNetworkAccess, netpol("web-denyexternalnetworkaccess", `  policyTypes: [Egress, Ingress]
  ingress:
  - from: [{ipBlock: {cidr: 10.244.0.0/24}}, {ipBlock: {cidr: 10.244.1.0/24}}, {ipBlock: {cidr: 10.0.0.0/8}}, {ipBlock: {cidr: 172.16.0.0/12}}, {ipBlock: {cidr: 192.168.0.0/16}}]
  egress:
  - to: [`+dns+`]
    ports: `+ports+`
  - to: [{ipBlock: {cidr: 10.244.0.0/24}}, {ipBlock: {cidr: 10.244.1.0/24}}, {ipBlock: {cidr: 10.0.0.0/8}}, {ipBlock: {cidr: 172.16.0.0/12}}, {ipBlock: {cidr: 192.168.0.0/16}}]
`)},
	} {
		t.Run(tc.id, func(t *testing.T) {
			for _, p := range ForNimbusPolicy(nimbusPolicy(rule(tc.id, "Block", nil)), in) {
				if p.Engine == NetworkPolicy {
					assertObject(t, p.Object.Object, tc.want)
					return
				}
			}
			t.Fatal("no NetworkPolicy")
		})
	}
}

func TestKyvernoPolicies(t *testing.T) {
	kyverno := func(kind, name, namespace, owner, spec string) string {
		ns := ""
		if namespace != "" {
			ns = "\n  namespace: " + namespace
		}
		return `
apiVersion: kyverno.io/v1
kind: ` + kind + `
metadata:
  name: ` + name + ns + `
  annotations: {app.kubernetes.io/managed-by: nimbus-kyverno, policies.kyverno.io/description: desc of escapeToHost}` + owner + `
spec:
  background: true
` + spec
	}
	t.Run("Policy at the rule's own psaLevel", func(t *testing.T) {
		np := nimbusPolicy(rule(DNSManipulation, "Block", nil), rule(EscapeToHost, "Block", map[string]intentv1alpha1.ParamValues{"psaLevel": {"restricted"}}))
		var got *Policy
		for _, p := range ForNimbusPolicy(np, Inputs{}) {
			if p.Engine == Kyverno {
				got = &p
			}
		}
		if got == nil {
			t.Fatal("no Kyverno Policy")
		}
		assertObject(t, got.Object.Object, kyverno("Policy", "web-escapetohost", "shop", npOwner, `
  rules:
  - name: pod-security-standard
    match: {any: [{resources: {kinds: [v1/Pod], selector: {matchLabels: {app: nginx}}}}]}
    validate: {failureAction: Enforce, podSecurity: {level: restricted, version: latest}}
`))
	})
	for _, tc := range []struct {
		name, action string
		params       map[string]intentv1alpha1.ParamValues
		wantLevel    string
		wantAction   string
	}{
		{"default baseline, Audit", "Audit", nil, "baseline", "Audit"},
		{"Nimbus docs' psa_level", "Block", map[string]intentv1alpha1.ParamValues{"psa_level": {"restricted"}}, "restricted", "Enforce"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := ForNimbusPolicy(nimbusPolicy(rule(EscapeToHost, tc.action, tc.params)), Inputs{})[3]
			spec := p.Object.Object["spec"].(map[string]any)
			validate := spec["rules"].([]any)[0].(map[string]any)["validate"].(map[string]any)
			level := validate["podSecurity"].(map[string]any)["level"]
			if level != tc.wantLevel || validate["failureAction"] != tc.wantAction {
				t.Errorf("level %v, action %v", level, validate["failureAction"])
			}
		})
	}

	cnp := func(sel intentv1alpha1.NamespaceSelector, labels map[string]string) *intentv1alpha1.ClusterNimbusPolicy {
		return &intentv1alpha1.ClusterNimbusPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "all", UID: "cnp-uid"},
			Spec: intentv1alpha1.ClusterNimbusPolicySpec{NsSelector: sel, WorkloadSelector: intentv1alpha1.LabelSelector{MatchLabels: labels},
				NimbusRules: []intentv1alpha1.NimbusRules{rule(DNSManipulation, "Block", nil), rule(EscapeToHost, "Block", nil)}},
		}
	}
	const cnpOwner = `
  ownerReferences:
  - {apiVersion: intent.security.nimbus.com/v1alpha1, kind: ClusterNimbusPolicy, name: all, uid: cnp-uid, controller: true, blockOwnerDeletion: true}`
	for _, tc := range []struct {
		name           string
		sel            intentv1alpha1.NamespaceSelector
		labels         map[string]string
		match, exclude string
	}{
		{"matchNames", intentv1alpha1.NamespaceSelector{MatchNames: []string{"a", "b"}}, map[string]string{"app": "nginx"},
			`{any: [{resources: {kinds: [v1/Pod], namespaces: [a, b], selector: {matchLabels: {app: nginx}}}}]}`,
			`{any: [{resources: {namespaces: [kube-system]}}]}`},
		{"every namespace but some", intentv1alpha1.NamespaceSelector{MatchNames: []string{"*"}, ExcludeNames: []string{"spire"}}, nil,
			`{any: [{resources: {kinds: [v1/Pod]}}]}`,
			`{any: [{resources: {namespaces: [kube-system]}}, {resources: {namespaces: [spire]}}]}`},
		{"excludeNames alone", intentv1alpha1.NamespaceSelector{ExcludeNames: []string{"spire"}}, nil,
			`{any: [{resources: {kinds: [v1/Pod]}}]}`,
			`{any: [{resources: {namespaces: [kube-system]}}, {resources: {namespaces: [spire]}}]}`},
	} {
		t.Run("ClusterPolicy, "+tc.name, func(t *testing.T) {
			ps := ForClusterNimbusPolicy(cnp(tc.sel, tc.labels))
			if len(ps) != 1 || ps[0].Entry != "KyvernoClusterPolicy/all-escapetohost" {
				t.Fatalf("policies %+v, want the escapeToHost ClusterPolicy alone", ps)
			}
			assertObject(t, ps[0].Object.Object, kyverno("ClusterPolicy", "all-escapetohost", "", cnpOwner, `
  rules:
  - name: pod-security-standard
    match: `+tc.match+`
    exclude: `+tc.exclude+`
    validate: {failureAction: Enforce, podSecurity: {level: baseline, version: latest}}
`))
		})
	}
}

// TestKyvernoRulesDoOneThing: every Kyverno rule has exactly one operation block and no empty one
// (Kyverno refuses a rule with two, and its CRD defaults fields into an empty one), and no policy
// carries the spec-level actions Kyverno has deprecated for the rule-level ones.
func TestKyvernoRulesDoOneThing(t *testing.T) {
	np := nimbusPolicy(rule(EscapeToHost, "Block", nil), rule(CocoWorkload, "Block", nil),
		rule(VirtualPatch, "Block", map[string]intentv1alpha1.ParamValues{"cveList": {"CVE-2024-4439"}}))
	cnp := &intentv1alpha1.ClusterNimbusPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "all", UID: "cnp-uid"},
		Spec: intentv1alpha1.ClusterNimbusPolicySpec{NsSelector: intentv1alpha1.NamespaceSelector{MatchNames: []string{"*"}},
			NimbusRules: []intentv1alpha1.NimbusRules{rule(EscapeToHost, "Block", nil), rule(CocoWorkload, "Block", nil)}},
	}
	policies := append(ForNimbusPolicy(np, Inputs{Deployments: []Workload{{Name: "web", Labels: map[string]string{"app": "nginx"}}}}),
		ForClusterNimbusPolicy(cnp)...)
	var n int
	for _, p := range policies {
		if p.Engine != Kyverno {
			continue
		}
		spec := p.Object.Object["spec"].(map[string]any)
		for _, deprecated := range []string{"validationFailureAction", "mutateExistingOnPolicyUpdate", "generateExisting"} {
			if _, ok := spec[deprecated]; ok {
				t.Errorf("%s sets spec.%s", p.Entry, deprecated)
			}
		}
		for _, r := range spec["rules"].([]any) {
			n++
			rule := r.(map[string]any)
			var ops []string
			for _, k := range []string{"validate", "mutate", "generate", "verifyImages"} {
				if v, ok := rule[k]; ok {
					ops = append(ops, k)
					if m, ok := v.(map[string]any); !ok || len(m) == 0 {
						t.Errorf("%s rule %v: %s is empty", p.Entry, rule["name"], k)
					}
				}
			}
			if len(ops) != 1 {
				t.Errorf("%s rule %v does %v, want one operation", p.Entry, rule["name"], ops)
			}
		}
	}
	// escapeToHost, mutateexisting, mutateoncreate, three virtual patches, two ClusterPolicies.
	if n != 8 {
		t.Errorf("%d rules checked, want 8", n)
	}
}

func TestUnenforced(t *testing.T) {
	rules := []intentv1alpha1.NimbusRules{rule(DNSManipulation, "Block", nil), rule("netSegment", "Block", nil),
		rule(CocoWorkload, "Block", nil), rule(VirtualPatch, "Block", nil), rule(AssessTLS, "Audit", nil)}
	if got := Unenforced(rules, false); !reflect.DeepEqual(got, []string{"netSegment", AssessTLS}) {
		t.Errorf("Unenforced = %v", got)
	}
	if got := Unenforced(rules, true); !reflect.DeepEqual(got, []string{"netSegment"}) {
		t.Errorf("Unenforced(cluster) = %v", got)
	}
	if got := ForNimbusPolicy(nimbusPolicy(rule("netSegment", "Block", nil)), Inputs{}); len(got) != 0 {
		t.Errorf("policies for an id nothing implements: %v", got)
	}
}

// TestObjectsAreJSONValues generates every intent and checks each object holds only JSON values,
// integers as int64 (what DeepCopy, the client and the comparison expect).
func TestObjectsAreJSONValues(t *testing.T) {
	var all []intentv1alpha1.NimbusRules
	for id := range Implementations {
		all = append(all, rule(id, "Block", map[string]intentv1alpha1.ParamValues{"cveList": {"CVE-2024-4439"}}))
	}
	for id := range ClusterImplementations {
		all = append(all, rule(id, "Block", map[string]intentv1alpha1.ParamValues{"external_addresses": {"google.com:443"}}))
	}
	cnp := &intentv1alpha1.ClusterNimbusPolicy{ObjectMeta: metav1.ObjectMeta{Name: "all", Labels: map[string]string{"a": "b"}},
		Spec: intentv1alpha1.ClusterNimbusPolicySpec{NimbusRules: all}}
	policies := append(ForNimbusPolicy(nimbusPolicy(all...), Inputs{PodCIDRs: []string{"10.0.0.0/24"}, Deployments: []Workload{{Name: "d", Labels: map[string]string{"app": "nginx"}}}}),
		ForClusterNimbusPolicy(cnp)...)
	for _, p := range policies {
		var check func(path string, v any)
		check = func(path string, v any) {
			switch x := v.(type) {
			case map[string]any:
				for k, e := range x {
					check(path+"."+k, e)
				}
			case []any:
				for _, e := range x {
					check(path+"[]", e)
				}
			case string, bool, int64, nil:
			default:
				t.Errorf("%s: %s is a %T", p.Object.GetName(), path, v)
			}
		}
		check("", p.Object.Object)
		_ = p.Object.DeepCopy()
	}
}

// assertObject compares an object with the YAML of what it must be, field for field.
func assertObject(t *testing.T, got map[string]any, wantYAML string) {
	t.Helper()
	var want map[string]any
	if err := yaml.Unmarshal([]byte(wantYAML), &want); err != nil {
		t.Fatalf("bad expectation: %v\n%s", err, wantYAML)
	}
	gotJSON, _ := json.Marshal(got) // one number type on both sides
	var norm map[string]any
	_ = json.Unmarshal(gotJSON, &norm)
	if !reflect.DeepEqual(norm, want) {
		g, _ := yaml.Marshal(norm)
		w, _ := yaml.Marshal(want)
		t.Errorf("object differs\n--- got\n%s--- want\n%s", g, w)
	}
}
