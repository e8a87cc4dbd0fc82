package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/intents"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/testing/enginecrds"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

const (
	intentBindings   = 1000
	intentNamespaces = 10
	// Each binding names dnsManipulation and escapeToHost: 4 KubeArmorPolicies, 1 NetworkPolicy,
	// 1 Kyverno Policy.
	intentPoliciesPerBinding = 6
	intentIdle               = 30 * time.Second
)

// intentsBench runs the intents controller in-process: 1000 SecurityIntentBindings (two intents
// each) that exist when it starts, until every engine policy exists, with the API writes it took,
// then an idle period that must write nothing. (Nimbus's core makes 200 bindings' NimbusPolicies
// in about 20 s, its client capped at 20 QPS, before its adapters start.)
func intentsBench(ctx context.Context, e *env) ([]result, error) {
	scheme := manager.Scheme(intentv1alpha1.AddToScheme)
	c, err := client.New(e.cluster.Config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	if err := installIntentCRDs(ctx, e); err != nil {
		return nil, err
	}
	for _, si := range []*intentv1alpha1.SecurityIntent{
		{ObjectMeta: metav1.ObjectMeta{Name: "bench-dns"}, Spec: intentv1alpha1.SecurityIntentSpec{Intent: intentv1alpha1.Intent{ID: "dnsManipulation", Action: "Block"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "bench-escape"}, Spec: intentv1alpha1.SecurityIntentSpec{Intent: intentv1alpha1.Intent{ID: "escapeToHost", Action: "Block"}}},
	} {
		if err := c.Create(ctx, si); err != nil {
			return nil, err
		}
	}
	var objs []client.Object
	for i := range intentNamespaces {
		objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("intents-bench-%d", i)}})
	}
	if err := createAll(ctx, c, objs); err != nil {
		return nil, err
	}
	objs = nil
	for i := range intentBindings {
		objs = append(objs, &intentv1alpha1.SecurityIntentBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("intents-bench-%d", i%intentNamespaces), Name: fmt.Sprintf("b-%d", i)},
			Spec: intentv1alpha1.SecurityIntentBindingSpec{
				Intents:  []intentv1alpha1.MatchIntent{{Name: "bench-dns"}, {Name: "bench-escape"}},
				Selector: intentv1alpha1.MatchWorkloads{WorkloadSelector: intentv1alpha1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app-%d", i)}}},
			},
		})
	}
	if err := createAll(ctx, c, objs); err != nil {
		return nil, err
	}

	cfg, counter := testenv.Counting(e.cluster.Config)
	mgr, err := newManager(cfg, ctrl.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	if err := intents.Setup(mgr, intents.Options{Concurrency: 8}); err != nil {
		return nil, err
	}
	began := time.Now()
	stop, err := startManager(ctx, mgr, "intents")
	if err != nil {
		return nil, err
	}
	if err := waitAllGenerated(ctx, c); err != nil {
		stop()
		return nil, err
	}
	took := time.Since(began)
	writes := counter.Writes()

	counter.Reset()
	time.Sleep(intentIdle)
	idleWrites := counter.Writes()
	stop()
	// The floor last, with the manager stopped: its objects are not the controller's to reconcile.
	floor, err := intentsFloor(ctx, c)
	if err != nil {
		return nil, err
	}

	return []result{
		{metric: fmt.Sprintf("bare client, the same %d creates per binding (NimbusPolicy + engine policies), 16 writers", 1+intentPoliciesPerBinding),
			value: intentBindings / floor.Seconds(), unit: "bindings/s", note: fmt.Sprintf("%.1f s for %d bindings' objects", floor.Seconds(), intentBindings)},
		{metric: fmt.Sprintf("%d SecurityIntentBindings (2 intents each) existing at start: seconds until every engine policy exists", intentBindings),
			value: took.Seconds(), unit: "s",
			note: fmt.Sprintf("%.0f bindings/s = %.2fx the bare client; %.0f engine policies/s (Nimbus's core: ~10 bindings/s, NimbusPolicies only)",
				intentBindings/took.Seconds(), floor.Seconds()/took.Seconds(), intentBindings*intentPoliciesPerBinding/took.Seconds())},
		{metric: "API writes per binding", value: float64(writes) / intentBindings, unit: "requests",
			note: fmt.Sprintf("minimum 1 NimbusPolicy + %d engine policies + 2 status writes", intentPoliciesPerBinding)},
		{metric: fmt.Sprintf("API writes during %s at steady state", intentIdle), value: float64(idleWrites), unit: "requests", note: "must be 0"},
	}, nil
}

// intentsFloor creates, with a bare client and 16 writers, exactly the objects the controller makes
// for the bench's bindings (each binding's NimbusPolicy and its engine policies, as the catalogue
// builds them), in namespaces of their own, and returns how long that took.
func intentsFloor(ctx context.Context, c client.Client) (time.Duration, error) {
	var objs []client.Object
	for i := range intentNamespaces {
		objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("intents-floor-%d", i)}})
	}
	if err := createAll(ctx, c, objs); err != nil {
		return 0, err
	}
	rules := []intentv1alpha1.NimbusRules{
		{ID: intent.DNSManipulation, Rule: intentv1alpha1.Rule{RuleAction: "Block"}},
		{ID: intent.EscapeToHost, Rule: intentv1alpha1.Rule{RuleAction: "Block"}},
	}
	nodes, err := podCIDRs(ctx, c)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	err = parallel(16, intentBindings, func(i int) error {
		np := &intentv1alpha1.NimbusPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("intents-floor-%d", i%intentNamespaces), Name: fmt.Sprintf("b-%d", i)},
			Spec: intentv1alpha1.NimbusPolicySpec{Selector: intentv1alpha1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app-%d", i)}},
				NimbusRules: rules},
		}
		if err := c.Create(ctx, np); err != nil {
			return err
		}
		for _, p := range intent.ForNimbusPolicy(np, intent.Inputs{PodCIDRs: nodes}) {
			if err := c.Create(ctx, p.Object); err != nil {
				return err
			}
		}
		return nil
	})
	return time.Since(start), err
}

func podCIDRs(ctx context.Context, c client.Client) ([]string, error) {
	nodes := &corev1.NodeList{}
	if err := c.List(ctx, nodes); err != nil {
		return nil, err
	}
	var out []string
	for _, n := range nodes.Items {
		out = append(out, n.Spec.PodCIDR)
	}
	return out, nil
}

func installIntentCRDs(ctx context.Context, e *env) error {
	dir, err := os.MkdirTemp("", "qm-bench-crds")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := enginecrds.Copy(enginecrds.KubeArmorModule, enginecrds.KubeArmor, dir); err != nil {
		return err
	}
	if err := enginecrds.Copy(enginecrds.KyvernoModule, enginecrds.Kyverno, dir); err != nil {
		return err
	}
	for _, kind := range []string{"securityintents", "securityintentbindings", "clustersecurityintentbindings", "nimbuspolicies", "clusternimbuspolicies"} {
		src := filepath.Join(testenv.RepoRoot(), "config", "crd", "bases", "intent.security.nimbus.com_"+kind+".yaml")
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(src)), b, 0o600); err != nil {
			return err
		}
	}
	if _, err := e.cluster.Kubectl(ctx, "apply", "--server-side", "-f", dir); err != nil {
		return err
	}
	return waitEstablished(ctx, e)
}

// createAll creates objs with 16 writers.
func createAll(ctx context.Context, c client.Client, objs []client.Object) error {
	return parallel(16, len(objs), func(i int) error { return c.Create(ctx, objs[i]) })
}

// waitAllGenerated waits until every bench NimbusPolicy lists its engine policies as Generated.
func waitAllGenerated(ctx context.Context, c client.Client) error {
	return wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		list := &intentv1alpha1.NimbusPolicyList{}
		if err := c.List(ctx, list); err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		done := 0
		for _, np := range list.Items {
			ready := meta.FindStatusCondition(np.Status.Conditions, "Ready")
			if ready != nil && ready.Reason == "Generated" && len(np.Status.Policies) == intentPoliciesPerBinding {
				done++
			}
		}
		return done == intentBindings, nil
	})
}
