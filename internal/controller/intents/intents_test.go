package intents

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// TestIntents runs its steps in order on an API server of its own: they install Kyverno and
// nimbus-k8tls late, bind intents in every namespace, and stop and reconfigure the manager.
func TestIntents(t *testing.T) {
	t.Parallel()
	f := start(t)
	for _, s := range []struct {
		name string
		run  func(*testing.T, *fixture)
	}{
		{"a binding generates its engine policies", testBinding},
		{"cluster bindings", testClusterBinding},
		{"a reconcile of what is right writes nothing", testNoOpWritesNothing},
		{"the samples", testSamples},
		{"Kyverno mutate and generate intents", testMutateAndGenerate},
		{"assessTLS once nimbus-k8tls is installed", testAssessTLS},
		{"one Event per new binding", testEvents},
		{"a policy's cache behind its writes repeats nothing", testEngineCacheBehind},
		{"a reconcile on a stale cache repeats nothing", testStaleCache},
		{"engines chosen by the platform team", testEnginesChosen},
	} {
		if !t.Run(s.name, func(t *testing.T) { s.run(t, f) }) {
			return
		}
	}
}

// TestSharedManager runs its tests in parallel on the package's API server and one manager: each
// keeps to its own namespaces and names, and none changes what the others rely on (the engines
// installed, the manager and its flags). One manager: a second would reconcile every test's
// objects too, as a second leader would, and hold their reports apart from the first's
// (deferredReports).
func TestSharedManager(t *testing.T) {
	t.Parallel()
	f := newFixture(t, env)
	for _, s := range []struct {
		name string
		run  func(*testing.T, *fixture)
	}{
		{"validation at admission", testValidation},
		{"edge cases", testEdgeCases},
		{"spec.cel selects workloads", testCEL},
		{"a cluster binding's failing namespaces", testClusterBindingFailingNamespace},
		{"a cluster binding enforced first", testClusterBindingEnforcesFirst},
	} {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			s.run(t, f)
		})
	}
}

func testValidation(t *testing.T, f *fixture) {
	ctx := context.Background()
	ns := f.env.Namespace(t)
	intentWith := func(in intentv1alpha1.Intent) client.Object {
		return &intentv1alpha1.SecurityIntent{ObjectMeta: metav1.ObjectMeta{GenerateName: "si-"}, Spec: intentv1alpha1.SecurityIntentSpec{Intent: in}}
	}
	csib := func(sel intentv1alpha1.NamespaceSelector) client.Object {
		return &intentv1alpha1.ClusterSecurityIntentBinding{ObjectMeta: metav1.ObjectMeta{GenerateName: "csib-"},
			Spec: intentv1alpha1.ClusterSecurityIntentBindingSpec{Intents: []intentv1alpha1.MatchIntent{{Name: "x"}},
				Selector: intentv1alpha1.ClusterMatchWorkloads{NsSelector: sel}}}
	}
	for _, tc := range []struct {
		name, want string
		obj        client.Object
	}{
		{"unknown action", "Unsupported value", intentWith(intentv1alpha1.Intent{ID: "dnsManipulation", Action: "Deny"})},
		{"id with a dash", "spec.intent.id", intentWith(intentv1alpha1.Intent{ID: "dns-manipulation", Action: "Block"})},
		{"unknown psaLevel", "params.psaLevel must be baseline or restricted",
			intentWith(intentv1alpha1.Intent{ID: "escapeToHost", Action: "Block", Params: map[string]intentv1alpha1.ParamValues{"psaLevel": {"strict"}}})},
		{"malformed CVE id", "params.cveList entries must be CVE ids",
			intentWith(intentv1alpha1.Intent{ID: "virtualPatch", Action: "Block", Params: map[string]intentv1alpha1.ParamValues{"cveList": {"CVE-24-1"}}})},
		{"no namespaces selected", "set nsSelector.matchNames", csib(intentv1alpha1.NamespaceSelector{})},
		{"* not alone", `"*" in nsSelector.matchNames must be its only entry`, csib(intentv1alpha1.NamespaceSelector{MatchNames: []string{"a", "*"}})},
		{"names and exclusions", "nsSelector.excludeNames can only be combined with matchNames", csib(intentv1alpha1.NamespaceSelector{MatchNames: []string{"a"}, ExcludeNames: []string{"b"}})},
		{"binding without workloads", "select the workloads with selector.workloadSelector.matchLabels or cel",
			&intentv1alpha1.SecurityIntentBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "sib-"},
				Spec: intentv1alpha1.SecurityIntentBindingSpec{Intents: []intentv1alpha1.MatchIntent{{Name: "x"}}}}},
		{"binding without intents", "spec.intents",
			&intentv1alpha1.SecurityIntentBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "sib-"},
				Spec: intentv1alpha1.SecurityIntentBindingSpec{Selector: intentv1alpha1.MatchWorkloads{WorkloadSelector: intentv1alpha1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := f.c.Create(ctx, tc.obj)
			if err == nil || !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Create = %v, want Invalid naming %q", err, tc.want)
			}
		})
	}
	t.Run("accepted: * with exclusions, exclusions alone, an id no engine implements", func(t *testing.T) {
		for _, obj := range []client.Object{
			csib(intentv1alpha1.NamespaceSelector{MatchNames: []string{"*"}, ExcludeNames: []string{"b"}}),
			csib(intentv1alpha1.NamespaceSelector{ExcludeNames: []string{"b"}}),
			intentWith(intentv1alpha1.Intent{ID: "netSegment", Action: "Audit", Params: map[string]intentv1alpha1.ParamValues{"psa_level": {"restricted"}}}),
		} {
			must(t, f.c.Create(ctx, obj))
			must(t, f.c.Delete(ctx, obj))
		}
	})
}

func testBinding(t *testing.T, f *fixture) {
	ctx := context.Background()
	f.namespace(t, "shop")
	dns := f.intent(t, "dns", "dnsManipulation", nil)
	escape := f.intent(t, "escape", "escapeToHost", map[string]intentv1alpha1.ParamValues{"psaLevel": {"restricted"}})
	sib := f.binding(t, "shop", "web", map[string]string{"app": "nginx"}, "dns", "escape")
	np := &intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"}}
	ksps := []string{"KubeArmorPolicy/web-dnsmanipulation", "NetworkPolicy/web-dnsmanipulation",
		"KubeArmorPolicy/web-escapetohost-disallowchroot", "KubeArmorPolicy/web-escapetohost-disallowcapabilities", "KubeArmorPolicy/web-escapetohost-swdeploymenttools"}

	t.Run("the NimbusPolicy: binding's name, labels, owner and rules", func(t *testing.T) {
		f.waitPolicyStatus(t, np, "EngineNotInstalled", ksps...)
		if np.Labels["team"] != "web" || !metav1.IsControlledBy(np, sib) || len(np.Spec.NimbusRules) != 2 ||
			np.Spec.NimbusRules[0].ID != "dnsManipulation" || np.Spec.NimbusRules[1].Rule.Params["psaLevel"][0] != "restricted" ||
			np.Spec.Selector.MatchLabels["app"] != "nginx" || np.Status.Status != "Created" {
			t.Errorf("NimbusPolicy = %+v", np)
		}
		if c := meta.FindStatusCondition(np.Status.Conditions, "Ready"); !strings.Contains(c.Message, "Kyverno") {
			t.Errorf("Ready message %q does not name the missing engine", c.Message)
		}
		// The policy's report wakes the binding, whose status follows.
		eventually(t, "the binding's status", func() (bool, string) {
			f.get(t, sib)
			st := sib.Status
			return st.Status == "Created" && st.NumberOfBoundIntents == 2 && slices.Equal(st.BoundIntents, []string{"dns", "escape"}) && st.NimbusPolicy == "web",
				fmt.Sprintf("%+v", st)
		})
	})

	t.Run("engine policies owned by the NimbusPolicy, annotated as Nimbus does", func(t *testing.T) {
		for _, e := range ksps {
			kind, name, _ := strings.Cut(e, "/")
			obj, err := f.engineObject(kind, "shop", name)
			must(t, err)
			ref := metav1.GetControllerOf(obj)
			if ref == nil || ref.UID != np.UID || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
				t.Errorf("%s owner = %+v", e, obj.GetOwnerReferences())
			}
			if !strings.HasPrefix(obj.GetAnnotations()["app.kubernetes.io/managed-by"], "nimbus-") {
				t.Errorf("%s annotations = %v", e, obj.GetAnnotations())
			}
		}
	})

	t.Run("an engine installed late gets its policies", func(t *testing.T) {
		f.installKyverno(t)
		f.waitPolicyStatus(t, np, "Generated", append(slices.Clone(ksps), "KyvernoPolicy/web-escapetohost")...)
		kp, err := f.engineObject("Policy", "shop", "web-escapetohost")
		must(t, err)
		rules, _, _ := unstructured.NestedSlice(kp.Object, "spec", "rules")
		validate := rules[0].(map[string]any)["validate"].(map[string]any)
		if validate["podSecurity"].(map[string]any)["level"] != "restricted" || validate["failureAction"] != "Enforce" {
			t.Errorf("Kyverno Policy spec = %v", kp.Object["spec"])
		}
	})

	t.Run("hand edits and deletions are reverted", func(t *testing.T) {
		ksp, err := f.engineObject("KubeArmorPolicy", "shop", "web-dnsmanipulation")
		must(t, err)
		must(t, unstructured.SetNestedField(ksp.Object, "Audit", "spec", "action"))
		must(t, f.c.Update(ctx, ksp))
		netpol, err := f.engineObject("NetworkPolicy", "shop", "web-dnsmanipulation")
		must(t, err)
		must(t, f.c.Delete(ctx, netpol))
		eventually(t, "the edit reverted and the deletion undone", func() (bool, string) {
			ksp, err := f.engineObject("KubeArmorPolicy", "shop", "web-dnsmanipulation")
			if err != nil {
				return false, err.Error()
			}
			action, _, _ := unstructured.NestedString(ksp.Object, "spec", "action")
			got, err := f.engineObject("NetworkPolicy", "shop", "web-dnsmanipulation")
			return action == "Block" && err == nil && got.GetUID() != netpol.GetUID(), fmt.Sprintf("action %s, netpol %v", action, err)
		})
	})

	t.Run("an intent's new action reaches its policies", func(t *testing.T) {
		f.get(t, dns)
		before := dns.DeepCopy()
		dns.Spec.Intent.Action = "Audit"
		must(t, f.c.Patch(ctx, dns, client.MergeFrom(before)))
		// The intent is Ready at its new generation only once the binding has put that generation in
		// force: by then its engine policies say Audit (never Ready on the binding's earlier state).
		eventually(t, "the intent Ready at its new generation", func() (bool, string) {
			f.get(t, dns)
			c := meta.FindStatusCondition(dns.Status.Conditions, "Ready")
			return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == dns.Generation, fmt.Sprintf("%+v", c)
		})
		ksp, err := f.engineObject("KubeArmorPolicy", "shop", "web-dnsmanipulation")
		must(t, err)
		if action, _, _ := unstructured.NestedString(ksp.Object, "spec", "action"); action != "Audit" {
			t.Errorf("the intent is Ready at generation %d while its KubeArmorPolicy says %s", dns.Generation, action)
		}
		f.get(t, sib)
		if enforcedGeneration(sib.Status.EnforcedIntents, dns.Name) != dns.Generation {
			t.Errorf("the binding enforces %+v, want %s at generation %d", sib.Status.EnforcedIntents, dns.Name, dns.Generation)
		}
	})

	t.Run("a deleted intent's rule and policies go; with no intent left the NimbusPolicy goes", func(t *testing.T) {
		must(t, f.c.Delete(ctx, escape))
		f.waitPolicyStatus(t, np, "Generated", ksps[:2]...)
		for _, name := range []string{"web-escapetohost-disallowchroot", "web-escapetohost"} {
			kind := map[bool]string{true: "Policy", false: "KubeArmorPolicy"}[name == "web-escapetohost"]
			eventually(t, kind+" "+name+" deleted", func() (bool, string) {
				_, err := f.engineObject(kind, "shop", name)
				return apierrors.IsNotFound(err), fmt.Sprint(err)
			})
		}
		must(t, f.c.Delete(ctx, dns))
		eventually(t, "the NimbusPolicy deleted and the binding bound to nothing", func() (bool, string) {
			err := f.c.Get(ctx, client.ObjectKeyFromObject(np), &intentv1alpha1.NimbusPolicy{})
			f.get(t, sib)
			return apierrors.IsNotFound(err) && sib.Status.NimbusPolicy == "" && sib.Status.NumberOfBoundIntents == 0 &&
				meta.FindStatusCondition(sib.Status.Conditions, "Ready").Reason == "IntentNotFound", fmt.Sprintf("%v %+v", err, sib.Status)
		})
	})

	t.Run("a binding created before its intent", func(t *testing.T) {
		late := f.binding(t, "shop", "late", map[string]string{"app": "api"}, "later")
		eventually(t, "the binding says which intent is missing", func() (bool, string) {
			f.get(t, late)
			c := meta.FindStatusCondition(late.Status.Conditions, "Ready")
			return c != nil && c.Reason == "IntentNotFound" && strings.Contains(c.Message, "later"), fmt.Sprint(c)
		})
		f.intent(t, "later", "unAuthorizedSaTokenAccess", nil)
		f.waitPolicyStatus(t, &intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "late"}},
			"Generated", "KubeArmorPolicy/late-unauthorizedsatokenaccess")
	})
}

func testClusterBinding(t *testing.T, f *fixture) {
	ctx := context.Background()
	for _, ns := range []string{"c-a", "c-b"} {
		f.namespace(t, ns)
	}
	f.intent(t, "escape-all", "escapeToHost", nil)
	csib := &intentv1alpha1.ClusterSecurityIntentBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "all", Labels: map[string]string{"team": "sec"}},
		Spec: intentv1alpha1.ClusterSecurityIntentBindingSpec{
			Intents: []intentv1alpha1.MatchIntent{{Name: "escape-all"}},
			Selector: intentv1alpha1.ClusterMatchWorkloads{
				NsSelector:       intentv1alpha1.NamespaceSelector{MatchNames: []string{"*"}, ExcludeNames: []string{"c-b"}},
				WorkloadSelector: intentv1alpha1.LabelSelector{MatchLabels: map[string]string{"app": "nginx"}},
			},
		},
	}
	must(t, f.c.Create(ctx, csib))
	const generated = "nimbus-ctlr-gen-all"
	waitNamespaces := func(t *testing.T, want func([]string) bool) {
		t.Helper()
		eventually(t, "the cluster binding's namespaces", func() (bool, string) {
			f.get(t, csib)
			return want(csib.Status.NimbusPolicyNamespaces) && int(csib.Status.NumberOfNimbusPolicies) == len(csib.Status.NimbusPolicyNamespaces),
				fmt.Sprintf("%+v", csib.Status)
		})
	}
	t.Run("every namespace but the excluded ones and kube-system", func(t *testing.T) {
		waitNamespaces(t, func(ns []string) bool {
			return slices.Contains(ns, "c-a") && slices.Contains(ns, "default") && !slices.Contains(ns, "c-b") && !slices.Contains(ns, "kube-system")
		})
		if csib.Status.ClusterNimbusPolicy != "all" || csib.Status.NumberOfBoundIntents != 1 || csib.Status.Status != "Created" {
			t.Errorf("status = %+v", csib.Status)
		}
		np := &intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "c-a", Name: generated}}
		f.waitPolicyStatus(t, np, "Generated",
			"KubeArmorPolicy/"+generated+"-escapetohost-disallowchroot", "KubeArmorPolicy/"+generated+"-escapetohost-disallowcapabilities",
			"KubeArmorPolicy/"+generated+"-escapetohost-swdeploymenttools") // Kyverno: the ClusterPolicy, below
		if !metav1.IsControlledBy(np, csib) || np.Labels["team"] != "sec" {
			t.Errorf("NimbusPolicy %+v", np.ObjectMeta)
		}
		cnp := &intentv1alpha1.ClusterNimbusPolicy{ObjectMeta: metav1.ObjectMeta{Name: "all"}}
		eventually(t, "the ClusterNimbusPolicy's Kyverno ClusterPolicy", func() (bool, string) {
			if err := f.c.Get(ctx, client.ObjectKeyFromObject(cnp), cnp); err != nil {
				return false, err.Error()
			}
			return slices.Equal(cnp.Status.Policies, []string{"KyvernoClusterPolicy/all-escapetohost"}), fmt.Sprint(cnp.Status)
		})
		cp, err := f.engineObject("ClusterPolicy", "", "all-escapetohost")
		must(t, err)
		rules, _, _ := unstructured.NestedSlice(cp.Object, "spec", "rules")
		if excl := fmt.Sprint(rules[0].(map[string]any)["exclude"]); !strings.Contains(excl, "kube-system") || !strings.Contains(excl, "c-b") {
			t.Errorf("ClusterPolicy exclude = %s", excl)
		}
	})
	t.Run("a new namespace gets one, a terminating one loses it", func(t *testing.T) {
		f.namespace(t, "c-new")
		waitNamespaces(t, func(ns []string) bool { return slices.Contains(ns, "c-new") })
		// envtest has no namespace controller: the namespace stays terminating, its objects stay.
		must(t, f.c.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "c-a"}}))
		waitNamespaces(t, func(ns []string) bool { return !slices.Contains(ns, "c-a") })
	})
	t.Run("matchNames", func(t *testing.T) {
		f.get(t, csib)
		// A patch, not an update: the controller writes the binding (its status) while the test runs.
		before := csib.DeepCopy()
		csib.Spec.Selector.NsSelector = intentv1alpha1.NamespaceSelector{MatchNames: []string{"c-b", "missing"}}
		must(t, f.c.Patch(ctx, csib, client.MergeFrom(before)))
		waitNamespaces(t, func(ns []string) bool { return slices.Equal(ns, []string{"c-b"}) })
		eventually(t, "the NimbusPolicy of a namespace no longer selected deleted", func() (bool, string) {
			err := f.c.Get(ctx, client.ObjectKey{Namespace: "c-new", Name: generated}, &intentv1alpha1.NimbusPolicy{})
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
	})
}

func testNoOpWritesNothing(t *testing.T, f *fixture) {
	ctx := context.Background()
	const generated = "nimbus-ctlr-gen-all"
	f.waitPolicyStatus(t, &intentv1alpha1.NimbusPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "c-b", Name: generated}}, "Generated",
		"KubeArmorPolicy/"+generated+"-escapetohost-disallowchroot", "KubeArmorPolicy/"+generated+"-escapetohost-disallowcapabilities",
		"KubeArmorPolicy/"+generated+"-escapetohost-swdeploymenttools")
	// Settled: the bindings and the intent report the policies in force (the running manager
	// writes nothing more).
	for _, obj := range []client.Object{
		&intentv1alpha1.ClusterSecurityIntentBinding{ObjectMeta: metav1.ObjectMeta{Name: "all"}},
		&intentv1alpha1.SecurityIntentBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "late"}},
		&intentv1alpha1.SecurityIntent{ObjectMeta: metav1.ObjectMeta{Name: "later"}},
	} {
		// Ready as stored, and the manager's cache caught up with it: the reconciles below read
		// that cache, and a copy older than the manager's last status write would make them write
		// that status again (on a busy machine the cache lags by more than the wait for Ready).
		cached := obj.DeepCopyObject().(client.Object)
		eventually(t, client.ObjectKeyFromObject(obj).String()+" Ready, and the manager's cache as stored", func() (bool, string) {
			f.get(t, obj)
			if err := f.mgr.GetCache().Get(ctx, client.ObjectKeyFromObject(obj), cached); err != nil {
				return false, err.Error()
			}
			ready := readyReason(obj) == "Bound" || readyReason(obj) == "Accepted"
			return ready && cached.GetResourceVersion() == obj.GetResourceVersion(),
				fmt.Sprintf("%s, stored at %s, cached at %s", readyReason(obj), obj.GetResourceVersion(), cached.GetResourceVersion())
		})
	}
	cfg, counter := testenv.Counting(f.env.Config)
	// Reads from the running manager's cache, writes counted.
	c, err := client.New(cfg, client.Options{Scheme: f.scheme, Cache: &client.CacheOptions{Reader: f.mgr.GetCache()}})
	must(t, err)
	b := *f.base
	b.client = c
	reconcilers := map[string]func(context.Context, reconcile.Request) (reconcile.Result, error){
		"shop/late":                  (&bindingReconciler{base: &b}).Reconcile,
		"/all":                       (&clusterBindingReconciler{base: &b}).Reconcile,
		"np shop/late":               (&policyReconciler{base: &b}).Reconcile,
		"np c-b/nimbus-ctlr-gen-all": (&policyReconciler{base: &b}).Reconcile,
		"cwnp /all":                  (&clusterPolicyReconciler{base: &b}).Reconcile,
		"si /later":                  (&intentReconciler{base: &b}).Reconcile,
	}
	for key, r := range reconcilers {
		name := key[strings.LastIndex(key, " ")+1:]
		ns, n, _ := strings.Cut(name, "/")
		counter.Reset()
		if _, err := r(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: n}}); err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if w := counter.Writes(); w != 0 {
			t.Errorf("%s: a reconcile of what is right wrote %d times: %v", key, w, counter.Log())
		}
	}
}
