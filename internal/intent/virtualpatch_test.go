package intent

import (
	"slices"
	"testing"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
)

// npRef is the owner of what Kyverno generates: not its controller (see generatorRule).
const npRef = `{apiVersion: intent.security.nimbus.com/v1alpha1, kind: NimbusPolicy, name: web, uid: np-uid, controller: false, blockOwnerDeletion: false}`

const runsNginx = `{all: [{key: 'nginx:latest', operator: AnyIn, value: '{{ request.object.spec.containers[].image }}'}]}`

func cves(key string, list ...string) map[string]intentv1alpha1.ParamValues {
	return map[string]intentv1alpha1.ParamValues{key: list}
}

func TestVirtualPatchPolicies(t *testing.T) {
	generator := func(name, rule string) string {
		return kyvernoPolicyYAML(name, VirtualPatch, `  background: true
  rules:
`+rule)
	}
	want := map[string]string{
		"web-cve-2024-4439-karmor-1": generator("web-cve-2024-4439-karmor-1", `  - name: cve-2024-4439virtual-patch-karmor
    match: {any: [{resources: {kinds: [v1/Pod], selector: {matchLabels: {app: nginx}}}}]}
    preconditions: `+runsNginx+`
    context:
    - {name: containerName, variable: {jmesPath: "request.object.spec.containers[?(@.image=='nginx:latest')].name | [0]"}}
    - {name: podName, variable: {jmesPath: request.object.metadata.name}}
    generate:
      generateExisting: true
      apiVersion: security.kubearmor.com/v1
      kind: KubeArmorPolicy
      name: 'block-pkg-mgmt-tools-exec-{{ podName }}'
      namespace: shop
      data:
        metadata: {name: block-pkg-mgmt-tools-exec, ownerReferences: [`+npRef+`]}
        spec:
          selector: {matchLabels: {app: nginx, kubearmor.io/container.name: '{{ containerName }}'}}
          process: {matchPaths: [{path: /usr/bin/apt}, {path: /usr/bin/apt-get}]}
          action: Block
`),
		"web-cve-2024-4439-kyverno-1": generator("web-cve-2024-4439-kyverno-1", `  - name: cve-2024-4439-virtual-patch-kyverno
    match: {any: [{resources: {kinds: [v1/Pod], selector: {matchLabels: {app: nginx}}}}]}
    generate:
      generateExisting: true
      apiVersion: kyverno.io/v1
      kind: Policy
      name: disallow-latest-tag
      namespace: shop
      data:
        metadata: {name: disallow-latest-tag, ownerReferences: [`+npRef+`]}
        spec:
          background: true
          rules:
          - name: validate-image-tag
            match: {any: [{resources: {kinds: [Pod], selector: {matchLabels: {app: nginx}}}}]}
            preconditions: `+runsNginx+`
            validate:
              failureAction: Enforce
              message: Using a mutable image tag e.g. 'latest' is not allowed.
              pattern: {spec: {containers: [{image: '!*:latest'}]}}
`),
		"web-cve-2024-4439-netpol-1": generator("web-cve-2024-4439-netpol-1", `  - name: cve-2024-4439virtual-patch-netpol
    match: {any: [{resources: {kinds: [v1/Pod], selector: {matchLabels: {app: nginx}}}}]}
    preconditions: `+runsNginx+`
    context:
    - {name: podName, variable: {jmesPath: request.object.metadata.name}}
    generate:
      generateExisting: true
      apiVersion: networking.k8s.io/v1
      kind: NetworkPolicy
      name: test-network-policy
      namespace: shop
      data:
        metadata: {name: test-network-policy, ownerReferences: [`+npRef+`]}
        spec:
          podSelector: {matchLabels: {app: nginx}}
          policyTypes: [Ingress, Egress]
          ingress:
          - from:
            - ipBlock: {cidr: 172.17.0.0/16, except: [172.17.1.0/24]}
            - namespaceSelector: {matchLabels: {project: myproject}}
            - podSelector: {matchLabels: {role: frontend}}
            ports: [{protocol: TCP, port: 6379}]
          egress:
          - to: [{ipBlock: {cidr: 10.0.0.0/24}}]
            ports: [{protocol: TCP, port: 5978}]
`),
	}
	order := []string{"KyvernoPolicy/web-cve-2024-4439-karmor-1", "KyvernoPolicy/web-cve-2024-4439-kyverno-1", "KyvernoPolicy/web-cve-2024-4439-netpol-1"}

	t.Run("a generator per virtual patch of the listed CVEs, from the rule's own params", func(t *testing.T) {
		// The first rule's cveList is not the virtualPatch rule's (Nimbus would read it).
		np := nimbusPolicy(rule(DNSManipulation, "Block", cves("cveList", "CVE-2099-0001")),
			rule(VirtualPatch, "Block", cves("cveList", "CVE-2024-4439", "CVE-2099-0002")))
		var got []Policy
		for _, p := range ForNimbusPolicy(np, Inputs{}) {
			if p.Engine == Kyverno {
				got = append(got, p)
			}
		}
		if !slices.Equal(entries(got), order) {
			t.Fatalf("entries %v, want %v", entries(got), order)
		}
		for _, p := range got {
			assertObject(t, p.Object.Object, want[p.Object.GetName()])
		}
	})
	t.Run("Nimbus docs' cve_list", func(t *testing.T) {
		got := ForNimbusPolicy(nimbusPolicy(rule(VirtualPatch, "Block", cves("cve_list", "CVE-2024-4439"))), Inputs{})
		if !slices.Equal(entries(got), order) {
			t.Errorf("entries %v, want %v", entries(got), order)
		}
	})
	t.Run("Audit, and no labels select every pod", func(t *testing.T) {
		np := nimbusPolicy(rule(VirtualPatch, "Audit", cves("cveList", "CVE-2024-4439")))
		np.Spec.Selector.MatchLabels = nil
		got := ForNimbusPolicy(np, Inputs{})
		if len(got) != 3 {
			t.Fatalf("entries %v", entries(got))
		}
		for _, p := range got {
			spec := p.Object.Object["spec"].(map[string]any)
			r := spec["rules"].([]any)[0].(map[string]any)
			assertObject(t, r["match"].(map[string]any), `{any: [{resources: {kinds: [v1/Pod]}}]}`)
		}
		data := func(i int) map[string]any {
			r := got[i].Object.Object["spec"].(map[string]any)["rules"].([]any)[0].(map[string]any)
			return r["generate"].(map[string]any)["data"].(map[string]any)["spec"].(map[string]any)
		}
		assertObject(t, data(0)["selector"].(map[string]any), `{matchLabels: {kubearmor.io/container.name: '{{ containerName }}'}}`)
		assertObject(t, data(1)["rules"].([]any)[0].(map[string]any)["match"].(map[string]any), `{any: [{resources: {kinds: [Pod]}}]}`)
		// An Audit intent's generated Policy audits, whatever the data says.
		if action := data(1)["rules"].([]any)[0].(map[string]any)["validate"].(map[string]any)["failureAction"]; action != "Audit" {
			t.Errorf("the generated Policy's failureAction is %v, want Audit", action)
		}
		assertObject(t, data(2)["podSelector"].(map[string]any), `{}`)
	})
	t.Run("unpatched CVEs generate nothing and are reported", func(t *testing.T) {
		r := rule(VirtualPatch, "Block", cves("cveList", "CVE-2099-0001", "cve-2024-4439", "CVE-2099-0001"))
		if got := ForNimbusPolicy(nimbusPolicy(r), Inputs{}); len(got) != 0 {
			t.Errorf("entries %v", entries(got))
		}
		if got := UnpatchedCVEs(r); !slices.Equal(got, []string{"CVE-2099-0001", "cve-2024-4439"}) {
			t.Errorf("UnpatchedCVEs = %v", got)
		}
		if got := UnpatchedCVEs(rule(VirtualPatch, "Block", cves("cve_list", "CVE-2024-4439"))); len(got) != 0 {
			t.Errorf("UnpatchedCVEs = %v", got)
		}
		if got := ForNimbusPolicy(nimbusPolicy(rule(VirtualPatch, "Block", nil)), Inputs{}); len(got) != 0 {
			t.Errorf("no cveList: entries %v", entries(got))
		}
	})
	t.Run("nothing on a ClusterNimbusPolicy", func(t *testing.T) {
		cnp := clusterNimbusPolicy(intentv1alpha1.NamespaceSelector{MatchNames: []string{"*"}}, nil, rule(VirtualPatch, "Block", cves("cveList", "CVE-2024-4439")))
		if got := ForClusterNimbusPolicy(cnp); len(got) != 0 {
			t.Errorf("entries %v", entries(got))
		}
	})
	t.Run("every virtual patch of the data generates", func(t *testing.T) {
		for _, img := range vulnerableImages {
			for _, c := range img.CVEs {
				got := ForNimbusPolicy(nimbusPolicy(rule(VirtualPatch, "Block", cves("cveList", c.CVE))), Inputs{})
				if len(got) != len(c.VirtualPatch) {
					t.Errorf("%s: %d generators for %d virtual patches", c.CVE, len(got), len(c.VirtualPatch))
				}
			}
		}
	})
}

// TestVirtualPatchOnlyForEnginesAvailable: a generator of an engine's kind is written only when
// that engine is installed and enabled (Kyverno refuses a generate rule of a kind not served).
func TestVirtualPatchOnlyForEnginesAvailable(t *testing.T) {
	np := nimbusPolicy(rule(VirtualPatch, "Block", cves("cveList", "CVE-2024-4439")))
	only := func(es ...Engine) func(Engine) bool { return func(e Engine) bool { return slices.Contains(es, e) } }
	for _, tc := range []struct {
		engines func(Engine) bool
		want    []string
	}{
		{only(Kyverno, NetworkPolicy), []string{"KyvernoPolicy/web-cve-2024-4439-kyverno-1", "KyvernoPolicy/web-cve-2024-4439-netpol-1"}},
		{only(Kyverno), []string{"KyvernoPolicy/web-cve-2024-4439-kyverno-1"}},
		{only(Kyverno, KubeArmor, NetworkPolicy), []string{"KyvernoPolicy/web-cve-2024-4439-karmor-1", "KyvernoPolicy/web-cve-2024-4439-kyverno-1", "KyvernoPolicy/web-cve-2024-4439-netpol-1"}},
	} {
		if got := entries(ForNimbusPolicy(np, Inputs{Engines: tc.engines})); !slices.Equal(got, tc.want) {
			t.Errorf("entries %v, want %v", got, tc.want)
		}
	}
}
