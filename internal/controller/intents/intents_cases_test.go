package intents

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// testSamples applies config/samples/intents as kubectl would and checks what each generates.
func testSamples(t *testing.T, f *fixture) {
	ctx := context.Background()
	f.namespace(t, "samples")
	f.namespace(t, "prod")
	dir := filepath.Join(testenv.RepoRoot(), "config", "samples", "intents")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	must(t, err)
	for _, file := range files {
		if filepath.Base(file) == "kustomization.yaml" {
			continue
		}
		b, err := os.ReadFile(file)
		must(t, err)
		for _, doc := range strings.Split(string(b), "\n---\n") {
			obj := &unstructured.Unstructured{}
			must(t, yaml.Unmarshal([]byte(doc), &obj.Object))
			if obj.GetKind() == "SecurityIntentBinding" {
				obj.SetNamespace("samples")
			}
			if err := f.c.Create(ctx, obj); err != nil {
				t.Fatalf("%s: %s %s: %v", filepath.Base(file), obj.GetKind(), obj.GetName(), err)
			}
		}
	}
	np := func(ns, name string) *intentv1alpha1.NimbusPolicy {
		return &intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	}
	f.waitPolicyStatus(t, np("samples", "dns-manipulation-binding"), "Generated",
		"KubeArmorPolicy/dns-manipulation-binding-dnsmanipulation", "NetworkPolicy/dns-manipulation-binding-dnsmanipulation")
	f.waitPolicyStatus(t, np("samples", "multiple-sis-binding"), "Generated",
		"KubeArmorPolicy/multiple-sis-binding-swdeploymenttools", "KubeArmorPolicy/multiple-sis-binding-unauthorizedsatokenaccess",
		"KubeArmorPolicy/multiple-sis-binding-dnsmanipulation", "NetworkPolicy/multiple-sis-binding-dnsmanipulation")
	f.waitPolicyStatus(t, np("samples", "escape-to-host-binding"), "Generated",
		"KubeArmorPolicy/escape-to-host-binding-escapetohost-disallowchroot", "KubeArmorPolicy/escape-to-host-binding-escapetohost-disallowcapabilities",
		"KubeArmorPolicy/escape-to-host-binding-escapetohost-swdeploymenttools", "KyvernoPolicy/escape-to-host-binding-escapetohost")
	f.waitPolicyStatus(t, np("samples", "pkg-mgr-exec-cel-binding"), "Generated", "KubeArmorPolicy/pkg-mgr-exec-cel-binding-swdeploymenttools")
	celPolicy := np("samples", "pkg-mgr-exec-cel-binding")
	if f.get(t, celPolicy); len(celPolicy.Spec.Selector.MatchLabels) != 2 {
		t.Errorf("cel-selector.yaml's selector: %v", celPolicy.Spec.Selector.MatchLabels)
	}
	const gen = "nimbus-ctlr-gen-"
	f.waitPolicyStatus(t, np("prod", gen+"deny-ext-nw-access-foo-binding"), "Generated",
		"NetworkPolicy/"+gen+"deny-ext-nw-access-foo-binding-denyexternalnetworkaccess")
	f.waitPolicyStatus(t, np("samples", gen+"escape-to-host-cluster-binding"), "Generated",
		"KubeArmorPolicy/"+gen+"escape-to-host-cluster-binding-escapetohost-disallowchroot",
		"KubeArmorPolicy/"+gen+"escape-to-host-cluster-binding-escapetohost-disallowcapabilities",
		"KubeArmorPolicy/"+gen+"escape-to-host-cluster-binding-escapetohost-swdeploymenttools")
	if _, err := f.engineObject("ClusterPolicy", "", "escape-to-host-cluster-binding-escapetohost"); err != nil {
		t.Errorf("the cluster binding's Kyverno ClusterPolicy: %v", err)
	}
	// nimbus-k8tls is not installed yet (testAssessTLS installs it): the scan waits for it.
	eventually(t, "assess-tls.yaml's ClusterNimbusPolicy waiting for K8TLS", func() (bool, string) {
		cnp := &intentv1alpha1.ClusterNimbusPolicy{}
		if err := f.c.Get(ctx, client.ObjectKey{Name: "tls-assessment-binding"}, cnp); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(cnp.Status.Conditions, "Ready")
		return c != nil && c.Reason == "EngineNotInstalled" && strings.Contains(c.Message, "K8TLS"), fmt.Sprint(c)
	})
}

func testMutateAndGenerate(t *testing.T, f *fixture) {
	ctx := context.Background()
	f.namespace(t, "coco")
	deployment := func(name string, labels map[string]string) *appsv1.Deployment {
		return &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: "coco", Name: name, Labels: labels},
			Spec: appsv1.DeploymentSpec{
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"pod": name}},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"pod": name}},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "nginx:latest"}}},
				},
			},
		}
	}
	f.intent(t, "coco", "cocoWorkload", map[string]intentv1alpha1.ParamValues{"runtimeClass": {"kata-qemu"}})
	f.binding(t, "coco", "coco-binding", map[string]string{"app": "coco"}, "coco")
	np := &intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "coco", Name: "coco-binding"}}
	t.Run("cocoWorkload: new Deployments now, existing ones once there are", func(t *testing.T) {
		f.waitPolicyStatus(t, np, "Generated", "KyvernoPolicy/coco-binding-mutateoncreate")
		must(t, f.c.Create(ctx, deployment("web", map[string]string{"app": "coco"})))
		must(t, f.c.Create(ctx, deployment("other", map[string]string{"app": "else"})))
		f.waitPolicyStatus(t, np, "Generated", "KyvernoPolicy/coco-binding-mutateexisting", "KyvernoPolicy/coco-binding-mutateoncreate")
		p, err := f.engineObject("Policy", "coco", "coco-binding-mutateexisting")
		must(t, err)
		rules, _, _ := unstructured.NestedSlice(p.Object, "spec", "rules")
		mutate := fmt.Sprint(rules[0].(map[string]any)["mutate"])
		if !strings.Contains(mutate, "name:web") || strings.Contains(mutate, "other") || !strings.Contains(mutate, "kata-qemu") {
			t.Errorf("mutateexisting's mutate = %s, want Deployment web alone to kata-qemu", mutate)
		}
	})
	t.Run("virtualPatch: generate policies for the known CVE, the unknown one reported", func(t *testing.T) {
		f.intent(t, "vp", "virtualPatch", map[string]intentv1alpha1.ParamValues{"cveList": {"CVE-2024-4439", "CVE-2099-0001"}})
		f.binding(t, "coco", "vp-binding", map[string]string{"app": "prod"}, "vp")
		vp := &intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "coco", Name: "vp-binding"}}
		f.waitPolicyStatus(t, vp, "Generated", "KyvernoPolicy/vp-binding-cve-2024-4439-karmor-1",
			"KyvernoPolicy/vp-binding-cve-2024-4439-kyverno-1", "KyvernoPolicy/vp-binding-cve-2024-4439-netpol-1")
		if c := meta.FindStatusCondition(vp.Status.Conditions, "Ready"); !strings.Contains(c.Message, "CVE-2099-0001") {
			t.Errorf("Ready message %q does not name the CVE nothing patches", c.Message)
		}
	})
}

func testEdgeCases(t *testing.T, f *fixture) {
	ctx := context.Background()
	ns := f.env.Namespace(t)
	block := unique("dns-block")
	t.Run("two intents of one id: the first rule's policies, no tug of war", func(t *testing.T) {
		f.intent(t, block, "dnsManipulation", nil)
		audit := &intentv1alpha1.SecurityIntent{ObjectMeta: metav1.ObjectMeta{Name: unique("dns-audit")},
			Spec: intentv1alpha1.SecurityIntentSpec{Intent: intentv1alpha1.Intent{ID: "dnsManipulation", Action: "Audit"}}}
		must(t, f.c.Create(ctx, audit))
		f.binding(t, ns, "twice", map[string]string{"app": "x"}, block, audit.Name)
		np := &intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "twice"}}
		f.waitPolicyStatus(t, np, "Generated", "KubeArmorPolicy/twice-dnsmanipulation", "NetworkPolicy/twice-dnsmanipulation")
		ksp, err := f.engineObject("KubeArmorPolicy", ns, "twice-dnsmanipulation")
		must(t, err)
		rv := ksp.GetResourceVersion()
		if action, _, _ := unstructured.NestedString(ksp.Object, "spec", "action"); action != "Block" {
			t.Errorf("action %s, want the first rule's Block", action)
		}
		// Settled: a reconcile now (woken by a label change) rewrites nothing.
		sib := &intentv1alpha1.SecurityIntentBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "twice"}}
		f.get(t, sib)
		base := sib.DeepCopy()
		sib.Labels["touched"] = "yes"
		must(t, f.c.Patch(ctx, sib, client.MergeFrom(base))) // the controller writes its status meanwhile
		eventually(t, "the label on the NimbusPolicy", func() (bool, string) {
			f.get(t, np)
			return np.Labels["touched"] == "yes", fmt.Sprint(np.Labels)
		})
		f.waitPolicyStatus(t, np, "Generated", "KubeArmorPolicy/twice-dnsmanipulation", "NetworkPolicy/twice-dnsmanipulation")
		ksp, err = f.engineObject("KubeArmorPolicy", ns, "twice-dnsmanipulation")
		must(t, err)
		if ksp.GetResourceVersion() != rv {
			t.Errorf("the KubeArmorPolicy was rewritten (%s → %s)", rv, ksp.GetResourceVersion())
		}
	})
	t.Run("a policy the API server refuses stalls, naming it, without holding back the others", func(t *testing.T) {
		long := strings.Repeat("a", 245) // a valid binding name, but <name>-dnsmanipulation is over 253
		f.binding(t, ns, long, map[string]string{"app": "x"}, block)
		np := &intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: long}}
		f.waitPolicyStatus(t, np, "Rejected")
		if c := meta.FindStatusCondition(np.Status.Conditions, "Stalled"); c == nil || c.Status != "True" || !strings.Contains(c.Message, "KubeArmorPolicy/"+long) {
			t.Errorf("Stalled = %+v", c)
		}
	})
	t.Run("a hand-made NimbusPolicy generates nothing", func(t *testing.T) {
		np := &intentv1alpha1.NimbusPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "handmade"},
			Spec: intentv1alpha1.NimbusPolicySpec{Selector: intentv1alpha1.LabelSelector{MatchLabels: map[string]string{"app": "y"}},
				NimbusRules: []intentv1alpha1.NimbusRules{{ID: "dnsManipulation", Rule: intentv1alpha1.Rule{RuleAction: "Block"}}}},
		}
		must(t, f.c.Create(ctx, np))
		// A binding's policy made after it is generated, so the hand-made one had its turn.
		f.binding(t, ns, "after", map[string]string{"app": "z"}, block)
		f.waitPolicyStatus(t, &intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "after"}}, "Generated",
			"KubeArmorPolicy/after-dnsmanipulation", "NetworkPolicy/after-dnsmanipulation")
		if _, err := f.engineObject("KubeArmorPolicy", ns, "handmade-dnsmanipulation"); !apierrors.IsNotFound(err) {
			t.Errorf("a policy was generated for a hand-made NimbusPolicy: %v", err)
		}
	})
}

// testEnginesChosen: with --intents-engines leaving NetworkPolicy out, a policy gets its other
// engines' policies and says NetworkPolicy is disabled (not missing, not waited for), and the
// NetworkPolicies made before are left alone; with none, only NimbusPolicies are made, their status
// as Nimbus's core alone reports it.
func testEnginesChosen(t *testing.T, f *fixture) {
	ctx := context.Background()
	netpol := &unstructured.Unstructured{}
	netpol.SetGroupVersionKind(intent.NetworkPolicyKind)
	must(t, f.c.Get(ctx, client.ObjectKey{Namespace: "shop", Name: "web-dnsmanipulation"}, netpol))
	defer func() {
		f.stop(t)
		f.engines = ""
		f.run(t)
	}()

	f.stop(t)
	f.engines = "kubearmor,kyverno"
	f.run(t)
	f.intent(t, "engines-dns", "dnsManipulation", nil)
	f.namespace(t, "engines-some")
	f.binding(t, "engines-some", "dns", map[string]string{"app": "dns"}, "engines-dns")
	np := &intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "engines-some", Name: "dns"}}
	f.waitPolicyStatus(t, np, "Generated", "KubeArmorPolicy/dns-dnsmanipulation")
	if c := meta.FindStatusCondition(np.Status.Conditions, "Ready"); !strings.Contains(c.Message, "disabled by --intents-engines: NetworkPolicy") {
		t.Errorf("Ready message %q does not say NetworkPolicy is disabled", c.Message)
	}
	kept := netpol.DeepCopy()
	must(t, f.c.Get(ctx, client.ObjectKeyFromObject(netpol), kept))
	if kept.GetUID() != netpol.GetUID() {
		t.Error("a NetworkPolicy made before NetworkPolicy was left out was not left alone")
	}

	f.stop(t)
	f.engines = "none"
	f.run(t)
	f.namespace(t, "engines-none")
	f.binding(t, "engines-none", "dns", map[string]string{"app": "dns"}, "engines-dns")
	np = &intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "engines-none", Name: "dns"}}
	f.waitPolicyStatus(t, np, "Generated")
	if np.Status.Status != intentv1alpha1.StatusCreated || np.Status.NumberOfAdapterPolicies != 0 || len(np.Status.Policies) != 0 {
		t.Errorf("status %+v, want Created with no adapter policies, as Nimbus's core alone", np.Status)
	}
}
