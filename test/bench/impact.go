package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	securityv1alpha1 "github.com/quartermaster-dev/quartermaster/api/security/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/intents"
	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/testing/kyverno"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

const (
	impactNamespaces = 500
	impactViolating  = 50 // one namespace in ten holds a privileged Pod
	impactIdle       = 30 * time.Second
)

// impactBench measures an Audit intent's impact against the real Kyverno 1.19.1 (admission,
// background and reports controllers as processes): 500 namespaces with one Pod each, 50 of them
// privileged; an Audit escapeToHost bound cluster-wide to all of them. Measured from the binding's
// creation: until Kyverno's reports controller has written PolicyReports failing all 50 Pods for
// the generated ClusterPolicy (Kyverno's own work, the floor), and until the intent's
// status.impact counts all 50 (ours: read from those reports); then the manager's writes during
// an idle period, which must be none.
func impactBench(ctx context.Context, e *env) ([]result, error) {
	scheme := manager.Scheme(intentv1alpha1.AddToScheme, securityv1alpha1.AddToScheme)
	c, err := intentsCluster(ctx, e, scheme)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(binDir, "kyverno") // removed with binDir
	if err != nil {
		return nil, err
	}
	t := &kyverno.Program{Dir: dir}
	defer t.Close()
	if err := t.Run(func() { kyverno.Start(t, e.cluster.Config) }); err != nil {
		return nil, fmt.Errorf("starting Kyverno: %w", err)
	}

	names := make([]string, 0, impactNamespaces)
	var objs []client.Object
	for i := range impactNamespaces {
		ns := fmt.Sprintf("impact-bench-%03d", i)
		names = append(names, ns)
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web", Labels: map[string]string{"app": "web"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
		if i%(impactNamespaces/impactViolating) == 0 {
			pod.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		}
		objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, pod)
	}
	// Namespaces first (a Pod's namespace must exist), then the Pods.
	var namespaces, pods []client.Object
	for i, o := range objs {
		if i%2 == 0 {
			namespaces = append(namespaces, o)
		} else {
			pods = append(pods, o)
		}
	}
	if err := createAll(ctx, c, namespaces); err != nil {
		return nil, err
	}
	// A Pod is admitted once its namespace's default ServiceAccount exists (the controller manager
	// makes it just after the namespace).
	if err := parallel(16, len(pods), func(i int) error {
		return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			err := c.Create(ctx, pods[i])
			if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "serviceaccount") {
				return false, nil
			}
			return err == nil, err
		})
	}); err != nil {
		return nil, err
	}

	asManager, err := managerIdentity(ctx, e, scheme)
	if err != nil {
		return nil, err
	}
	cfg, counter := testenv.Counting(asManager.cfg)
	mgr, err := newManager(cfg, ctrl.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	opts := intents.Options{}
	opts.AddFlags(flag.NewFlagSet("intents", flag.ContinueOnError))
	kinds, err := controllers.NewKinds(mgr, 0)
	if err != nil {
		return nil, err
	}
	if err := intents.Setup(mgr, kinds, opts); err != nil {
		return nil, err
	}
	stopManager, err := startManager(ctx, mgr, "intents")
	if err != nil {
		return nil, err
	}
	stop := sync.OnceFunc(stopManager)
	defer stop()

	const siName, csibName = "impact-bench-escape", "impact-bench"
	if err := c.Create(ctx, &intentv1alpha1.SecurityIntent{ObjectMeta: metav1.ObjectMeta{Name: siName},
		Spec: intentv1alpha1.SecurityIntentSpec{Intent: intentv1alpha1.Intent{ID: intent.EscapeToHost, Action: intentv1alpha1.ActionAudit}}}); err != nil {
		return nil, err
	}
	policy := intent.PolicyName(csibName, intent.EscapeToHost) // the ClusterPolicy: its reports' results name it so
	began := time.Now()
	if err := c.Create(ctx, &intentv1alpha1.ClusterSecurityIntentBinding{
		ObjectMeta: metav1.ObjectMeta{Name: csibName},
		Spec: intentv1alpha1.ClusterSecurityIntentBindingSpec{
			Intents:  []intentv1alpha1.MatchIntent{{Name: siName}},
			Selector: intentv1alpha1.ClusterMatchWorkloads{NsSelector: intentv1alpha1.NamespaceSelector{MatchNames: names}},
		},
	}); err != nil {
		return nil, err
	}
	var kyvernoDone, oursDone time.Time
	reportLists := 0
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		now := time.Now()
		if kyvernoDone.IsZero() {
			list := &unstructured.UnstructuredList{}
			list.SetAPIVersion("wgpolicyk8s.io/v1alpha2")
			list.SetKind("PolicyReportList")
			if err := c.List(ctx, list); err != nil {
				return false, err
			}
			reportLists++
			failing := 0
			for _, r := range list.Items {
				results, _, _ := unstructured.NestedSlice(r.Object, "results")
				for _, res := range results {
					if m, _ := res.(map[string]any); m["policy"] == policy && m["result"] == "fail" {
						failing++
						break
					}
				}
			}
			if failing >= impactViolating {
				kyvernoDone = now
			}
		}
		if oursDone.IsZero() {
			si := &intentv1alpha1.SecurityIntent{}
			if err := c.Get(ctx, client.ObjectKey{Name: siName}, si); err != nil {
				return false, err
			}
			if imp := si.Status.Impact; imp != nil && imp.State == intentv1alpha1.ImpactCurrent && imp.Violations != nil && *imp.Violations == impactViolating {
				oursDone = now
			}
		}
		return !kyvernoDone.IsZero() && !oursDone.IsZero(), nil
	}); err != nil {
		return nil, fmt.Errorf("waiting for Kyverno's reports (done: %v) and the intent's impact (done: %v): %w", !kyvernoDone.IsZero(), !oursDone.IsZero(), err)
	}
	si := &intentv1alpha1.SecurityIntent{}
	if err := c.Get(ctx, client.ObjectKey{Name: siName}, si); err != nil {
		return nil, err
	}
	if n := len(si.Status.Impact.Violating); n != intentv1alpha1.MaxImpactedWorkloads {
		return nil, fmt.Errorf("the impact names %d workloads, want the first %d", n, intentv1alpha1.MaxImpactedWorkloads)
	}
	if err := waitIntentsSettled(ctx, c); err != nil {
		return nil, err
	}
	writes := counter.Writes()
	counter.Reset()
	time.Sleep(impactIdle)
	idle := counter.Writes()
	stop()

	theirs, ours := kyvernoDone.Sub(began), oursDone.Sub(began)
	return []result{
		{metric: fmt.Sprintf("Kyverno 1.19.1's reports controller: seconds from the cluster-wide Audit binding until its PolicyReports fail all %d privileged Pods of %d namespaces", impactViolating, impactNamespaces),
			value: theirs.Seconds(), unit: "s", note: fmt.Sprintf("the floor: Kyverno's own scan and reports (polled every 250 ms, %d lists)", reportLists)},
		{metric: fmt.Sprintf("… until the SecurityIntent's status.impact counts all %d (names the first %d)", impactViolating, intentv1alpha1.MaxImpactedWorkloads),
			value: ours.Seconds(), unit: "s", note: fmt.Sprintf("%.2fx Kyverno's own reports (%+.1f s)", ours.Seconds()/theirs.Seconds(), (ours - theirs).Seconds())},
		{metric: "API writes of the manager from the binding to rest (both bindings' objects, statuses and impacts)", value: float64(writes), unit: "requests",
			note: fmt.Sprintf("%.1f per namespace", float64(writes)/impactNamespaces)},
		{metric: fmt.Sprintf("API writes during %s at rest, per violation", impactIdle), value: float64(idle) / impactViolating, unit: "requests", note: "must be 0"},
	}, nil
}
