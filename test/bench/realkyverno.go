package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/testing/kyverno"
	"github.com/quartermaster-dev/quartermaster/internal/testing/realcluster"
)

// admissionSamples is how many dry-run Pod creations each admission latency is the median of.
const admissionSamples = 40

// realNodeKyverno measures Kyverno as Pods on the real cluster the chart runs on (intents.engines
// kyverno): the time from making its image and loading it into the node to its webhooks called
// through their Service, a Block intent's time from creation to Ready (Kyverno's policy in force, the apiserver
// refusing what it blocks), and what Kyverno's resource webhook adds to the admission of a Pod it
// admits (median dry-run create, against the same before Kyverno ran).
func realNodeKyverno(ctx context.Context, c *realcluster.Cluster, admin client.Client) ([]result, error) {
	const ns = "bench-intents"
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return nil, err
	}
	before, err := admissionLatency(ctx, admin, ns)
	if err != nil {
		return nil, err
	}

	var started time.Duration
	dir, err := os.MkdirTemp(binDir, "kyverno") // removed with binDir
	if err != nil {
		return nil, err
	}
	t := &kyverno.Program{Dir: dir}
	defer t.Close()
	if err := t.Run(func() {
		start := time.Now()
		kyverno.StartPods(t, c.Config, func(archive string) error { return c.Load("", archive) })
		started = time.Since(start)
	}); err != nil {
		return nil, fmt.Errorf("starting Kyverno's Pods: %w", err)
	}

	si := &intentv1alpha1.SecurityIntent{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-escape-block"},
		Spec:       intentv1alpha1.SecurityIntentSpec{Intent: intentv1alpha1.Intent{ID: "escapeToHost", Action: "Block"}},
	}
	sib := &intentv1alpha1.SecurityIntentBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-block"},
		Spec: intentv1alpha1.SecurityIntentBindingSpec{
			Intents:  []intentv1alpha1.MatchIntent{{Name: si.Name}},
			Selector: intentv1alpha1.MatchWorkloads{WorkloadSelector: intentv1alpha1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}},
		},
	}
	created := time.Now()
	if err := admin.Create(ctx, si); err != nil {
		return nil, err
	}
	defer func() { _ = admin.Delete(context.Background(), si) }()
	if err := admin.Create(ctx, sib); err != nil {
		return nil, err
	}
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := admin.Get(ctx, client.ObjectKeyFromObject(si), si); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		// Ready from the start says "not bound"; in force, it names the engine and the binding.
		c := meta.FindStatusCondition(si.Status.Conditions, "Ready")
		return c != nil && c.Status == metav1.ConditionTrue && strings.HasPrefix(c.Message, "enforced by Kyverno in 1 bindings"), nil
	}); err != nil {
		return nil, fmt.Errorf("the Block intent to be Ready: %w", err)
	}
	ready := time.Since(created)
	// Ready means in force: the apiserver refuses a privileged app=web Pod with Kyverno's message.
	// (Kyverno's webhook configuration reaches the apiserver a moment after Kyverno writes it.)
	var refusal error
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		refusal = admin.Create(ctx, benchPod(ns, "web", "web"), client.DryRunAll)
		return refusal != nil && strings.Contains(refusal.Error(), "blocked due to the following policies"), nil
	}); err != nil {
		if refusal == nil {
			refusal = errors.New("admitted")
		}
		return nil, fmt.Errorf("no refusal by Kyverno of a privileged app=web Pod (%w): %w", err, refusal)
	}
	after, err := admissionLatency(ctx, admin, ns)
	if err != nil {
		return nil, err
	}
	return []result{
		{metric: "Kyverno as Pods: image made and loaded, to webhooks called through its Service", value: started.Seconds(), unit: "s",
			note: "admission and background controllers, the chart's securityContext"},
		{metric: "Block intent (escapeToHost): created to Ready, Kyverno's policy in force", value: ready.Seconds(), unit: "s"},
		{metric: "Pod admission (dry run), Kyverno's Pods admitting it", value: after.Seconds() * 1000, unit: "ms",
			note: fmt.Sprintf("%.2fx the same without Kyverno (%.1f ms); median of %d", after.Seconds()/before.Seconds(), before.Seconds()*1000, admissionSamples)},
	}, nil
}

// admissionLatency is the median time of a dry-run create of a privileged Pod labelled app=other
// (no intent selects it: whatever runs admits it).
func admissionLatency(ctx context.Context, c client.Client, ns string) (time.Duration, error) {
	took := make([]time.Duration, 0, admissionSamples)
	for i := range admissionSamples {
		start := time.Now()
		if err := c.Create(ctx, benchPod(ns, fmt.Sprintf("other-%d", i), "other"), client.DryRunAll); err != nil {
			return 0, fmt.Errorf("a Pod no intent selects was refused: %w", err)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	return took[len(took)/2], nil
}

func benchPod(ns, name, app string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": app}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "c", Image: "docker.io/local/pause:1", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
		}}},
	}
}
