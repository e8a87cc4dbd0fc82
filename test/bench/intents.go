package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	securityv1alpha1 "github.com/quartermaster-dev/quartermaster/api/security/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/controller/intents"
	"github.com/quartermaster-dev/quartermaster/internal/controller/status"
	"github.com/quartermaster-dev/quartermaster/internal/controllers"
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

// intentsBench runs the intents controller in-process, with its flags' defaults: 1000
// SecurityIntentBindings (two intents each) that exist when it starts, until every NimbusPolicy
// exists and until every engine policy does, with what that took (API requests by verb and
// resource, reconciles and their time in the work queues, CPU of the manager, API server, etcd and
// garbage collector), then an idle period that must write nothing. (Nimbus's core makes 200
// bindings' NimbusPolicies in about 20 s, its client capped at 20 QPS, before its adapters start.)
func intentsBench(ctx context.Context, e *env) ([]result, error) {
	scheme := manager.Scheme(intentv1alpha1.AddToScheme, securityv1alpha1.AddToScheme)
	c, err := intentsCluster(ctx, e, scheme)
	if err != nil {
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

	// The bench watches the NimbusPolicies (a watch, not a poll: listing 1000 policies 4 times a
	// second would load the API server the controller is measured on).
	progress, err := watchNimbusPolicies(ctx, e, scheme)
	if err != nil {
		return nil, err
	}
	defer progress.stop()
	cfg, counter := testenv.Counting(e.cluster.Config)
	mgr, err := newManager(cfg, ctrl.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	opts := intents.Options{} // the flags' defaults, as the operator runs
	opts.AddFlags(flag.NewFlagSet("intents", flag.ContinueOnError))
	kinds, err := controllers.NewKinds(mgr, 0)
	if err != nil {
		return nil, err
	}
	if err := intents.Setup(mgr, kinds, opts); err != nil {
		return nil, err
	}
	queues := gatherQueues()
	cpu := startCPU(e)
	began := time.Now()
	stop, err := startManager(ctx, mgr, "intents")
	if err != nil {
		return nil, err
	}
	if err := progress.wait(ctx); err != nil {
		stop()
		return nil, err
	}
	took := time.Since(began)
	used := cpu.since()
	work := gatherQueues().since(queues)
	writes := counter.Writes()
	requests := requestSummary(counter.Log())
	// Every binding and intent has reported on its NimbusPolicies' final state (waiting for
	// Kyverno here): part of the work, not of the steady state.
	if err := waitIntentsSettled(ctx, c); err != nil {
		stop()
		return nil, err
	}

	counter.Reset()
	time.Sleep(intentIdle)
	idleWrites := counter.Writes()
	stop()
	// The floor last, with the manager stopped: its objects are not the controller's to reconcile.
	floorCPU := startCPU(e)
	floor, err := intentsFloor(ctx, c)
	if err != nil {
		return nil, err
	}
	floorUsed := floorCPU.since()

	made := progress.made.Sub(began)
	return []result{
		{metric: fmt.Sprintf("bare client, the same %d creates per binding (NimbusPolicy + engine policies), 16 writers", 1+intentPoliciesPerBinding),
			value: intentBindings / floor.Seconds(), unit: "bindings/s",
			note: fmt.Sprintf("%.1f s for %d bindings' objects; CPU %s", floor.Seconds(), intentBindings, floorUsed.per(intentBindings))},
		{metric: fmt.Sprintf("%d SecurityIntentBindings (2 intents each) existing at start: seconds until every NimbusPolicy exists", intentBindings),
			value: made.Seconds(), unit: "s",
			note: fmt.Sprintf("%.0f NimbusPolicies/s = %.0fx Nimbus's core (~10/s, its client capped at 20 QPS)",
				intentBindings/made.Seconds(), intentBindings/made.Seconds()/nimbusCorePerSecond)},
		{metric: "… seconds until every engine policy exists (each NimbusPolicy lists its 6; no Kyverno runs, so they wait for it)",
			value: took.Seconds(), unit: "s",
			note: fmt.Sprintf("%.0f bindings/s = %.2fx the bare client; %.0f engine policies/s; CPU %s",
				intentBindings/took.Seconds(), floor.Seconds()/took.Seconds(), intentBindings*intentPoliciesPerBinding/took.Seconds(), used.per(intentBindings))},
		{metric: "reconciles per binding, by controller", value: float64(work.reconciles()) / intentBindings, unit: "reconciles",
			note: work.String()},
		{metric: "API writes per binding", value: float64(writes) / intentBindings, unit: "requests",
			note: fmt.Sprintf("the NimbusPolicy, %d engine policies, 2 status writes, 1 Event; all requests: %s", intentPoliciesPerBinding, requests)},
		{metric: fmt.Sprintf("API writes during %s at steady state", intentIdle), value: float64(idleWrites), unit: "requests", note: "must be 0"},
	}, nil
}

// nimbusCorePerSecond is Nimbus's core's rate of NimbusPolicies on this kind of machine (issue 10:
// 200 bindings in about 20 s, its client capped at 20 QPS), before its adapters write anything.
const nimbusCorePerSecond = 10

// npProgress follows the bench's NimbusPolicies through a watch: when the last one appeared, and
// when the last one became Generated with all its engine policies.
type npProgress struct {
	cancel context.CancelFunc
	done   chan error

	mu        sync.Mutex
	exist     map[string]bool
	generated map[string]bool
	made      time.Time // every NimbusPolicy exists
	all       time.Time // every one Generated
	finished  chan struct{}
}

func watchNimbusPolicies(ctx context.Context, e *env, scheme *runtime.Scheme) (*npProgress, error) {
	ca, err := cache.New(e.cluster.Config, cache.Options{Scheme: scheme, DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		return nil, err
	}
	inf, err := ca.GetInformer(ctx, &intentv1alpha1.NimbusPolicy{})
	if err != nil {
		return nil, err
	}
	p := &npProgress{exist: map[string]bool{}, generated: map[string]bool{}, finished: make(chan struct{})}
	see := func(obj any) {
		if np, ok := obj.(*intentv1alpha1.NimbusPolicy); ok {
			p.see(np)
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: see, UpdateFunc: func(_, obj any) { see(obj) },
	}); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(ctx)
	p.cancel, p.done = cancel, make(chan error, 1)
	go func() { p.done <- ca.Start(cctx) }()
	if !ca.WaitForCacheSync(cctx) {
		p.stop()
		return nil, errors.New("the bench's NimbusPolicy watch did not sync")
	}
	return p, nil
}

func (p *npProgress) see(np *intentv1alpha1.NimbusPolicy) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.exist[np.Namespace+"/"+np.Name] = true
	ready := meta.FindStatusCondition(np.Status.Conditions, "Ready")
	// Every engine policy written: Generated, or waiting for Kyverno to take its Policy in (no
	// Kyverno runs in the bench; what is measured is the controller's writing).
	if ready != nil && (ready.Reason == "Generated" || ready.Reason == "WaitingForEngine") && len(np.Status.Policies) == intentPoliciesPerBinding {
		p.generated[np.Namespace+"/"+np.Name] = true
	}
	if p.made.IsZero() && len(p.exist) == intentBindings {
		p.made = now
	}
	if p.all.IsZero() && len(p.generated) == intentBindings {
		p.all = now
		close(p.finished)
	}
}

// wait returns once every NimbusPolicy is Generated.
func (p *npProgress) wait(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	select {
	case <-p.finished:
		return nil
	case <-ctx.Done():
		p.mu.Lock()
		defer p.mu.Unlock()
		return fmt.Errorf("%d NimbusPolicies exist, %d Generated: %w", len(p.exist), len(p.generated), ctx.Err())
	}
}

func (p *npProgress) stop() {
	p.cancel()
	if err := <-p.done; err != nil {
		fmt.Fprintln(os.Stderr, "bench: NimbusPolicy watch:", err)
	}
}

// requestSummary counts API requests by method and resource (a GET of one object as "GET",
// a list or watch as "LIST"), most frequent first.
func requestSummary(log []string) string {
	out := map[string]int{}
	for _, entry := range log {
		method, path, _ := strings.Cut(entry, " ")
		segs := strings.Split(strings.Trim(path, "/"), "/")
		// /api/v1/... or /apis/group/version/...; then [namespaces/NS/]resource[/name[/sub]]
		if len(segs) > 0 && segs[0] == "apis" {
			segs = segs[min(3, len(segs)):]
		} else {
			segs = segs[min(2, len(segs)):]
		}
		if len(segs) >= 3 && segs[0] == "namespaces" {
			segs = segs[2:]
		}
		if len(segs) == 0 {
			out[method+" discovery"]++
			continue
		}
		resource := segs[0]
		if len(segs) > 2 {
			resource += "/" + segs[2]
		}
		if method == "GET" && len(segs) == 1 {
			method = "LIST"
		}
		out[method+" "+resource]++
	}
	return actionSummary(out)
}

// queueStats are the intents controllers' work queues, from controller-runtime's metrics (the
// manager runs in this process): reconciles, and the seconds items waited and were worked on.
type queueStats map[string]*queueStat

type queueStat struct {
	reconciles       float64
	waited, worked   float64 // seconds, summed over items
	queued, finished float64 // items counted by the two histograms
}

// intentControllers are the controllers' names (their queues' and metrics' label).
var intentControllers = []string{"securityintent", "securityintentbinding", "nimbuspolicy", "clustersecurityintentbinding", "clusternimbuspolicy"}

// eachControllerMetric calls f with every sample of the intents controllers in the metrics
// registry: the family's name, the controller's (its "controller" or workqueue "name" label).
func eachControllerMetric(f func(family, controller string, m *dto.Metric)) {
	// A second manager in this process registers some collectors again: Gather then reports the
	// duplicates as an error but still returns every family, which is what is read here.
	families, _ := ctrlmetrics.Registry.Gather()
	for _, fam := range families {
		for _, m := range fam.GetMetric() {
			for _, l := range m.GetLabel() {
				if (l.GetName() == "controller" || l.GetName() == "name") && slices.Contains(intentControllers, l.GetValue()) {
					f(fam.GetName(), l.GetValue(), m)
				}
			}
		}
	}
}

func gatherQueues() queueStats {
	out := queueStats{}
	for _, name := range intentControllers {
		out[name] = &queueStat{}
	}
	eachControllerMetric(func(family, controller string, m *dto.Metric) {
		st := out[controller]
		switch family {
		case "controller_runtime_reconcile_total":
			st.reconciles += m.GetCounter().GetValue()
		case "workqueue_queue_duration_seconds":
			st.waited, st.queued = m.GetHistogram().GetSampleSum(), float64(m.GetHistogram().GetSampleCount())
		case "workqueue_work_duration_seconds":
			st.worked, st.finished = m.GetHistogram().GetSampleSum(), float64(m.GetHistogram().GetSampleCount())
		}
	})
	return out
}

// waitControllersIdle waits until no intents controller has work queued or under way for a
// second: a manager started beside existing bindings reconciles each of them first (and writes
// nothing), which is not the work a case measures.
func waitControllersIdle(ctx context.Context) error {
	quietSince := time.Now()
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
		eachControllerMetric(func(family, _ string, m *dto.Metric) {
			if (family == "workqueue_depth" || family == "controller_runtime_active_workers") && m.GetGauge().GetValue() > 0 {
				quietSince = time.Now()
			}
		})
		return time.Since(quietSince) >= time.Second, nil
	})
}

// since is what happened after before.
func (q queueStats) since(before queueStats) queueStats {
	out := queueStats{}
	for name, st := range q {
		b := before[name]
		out[name] = &queueStat{reconciles: st.reconciles - b.reconciles, waited: st.waited - b.waited, worked: st.worked - b.worked,
			queued: st.queued - b.queued, finished: st.finished - b.finished}
	}
	return out
}

func (q queueStats) reconciles() float64 {
	n := 0.0
	for _, st := range q {
		n += st.reconciles
	}
	return n
}

func (q queueStats) String() string {
	var parts []string
	for _, name := range intentControllers {
		st := q[name]
		if st.reconciles == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.0f (%.2f s queued, %.0f ms reconciling, mean)", name, st.reconciles,
			st.waited/max(st.queued, 1), 1000*st.worked/max(st.finished, 1)))
	}
	return strings.Join(parts, ", ")
}

// cpuUse is the CPU time this process (the bench and the in-process manager) and the cluster's
// API server, etcd and controller manager (garbage collection) have used since it was taken.
type cpuUse struct {
	pids  map[string]int
	start map[string]time.Duration
}

// cpuSeconds is CPU time by process.
type cpuSeconds map[string]time.Duration

func startCPU(e *env) *cpuUse {
	u := &cpuUse{pids: map[string]int{"manager+bench": os.Getpid()}}
	// hack/cluster.sh: kwokctl's work dir is beside the clusters' kubeconfigs.
	dir := filepath.Join(filepath.Dir(filepath.Dir(filepath.Dir(e.cluster.Kubeconfig))), "kwok", "clusters", e.cluster.Name, "pids")
	for name, file := range map[string]string{"apiserver": "kube-apiserver.pid", "etcd": "etcd.pid", "controller-manager": "kube-controller-manager.pid"} {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			u.pids[name] = pid
		}
	}
	u.start = u.now()
	return u
}

func (u *cpuUse) now() cpuSeconds {
	out := cpuSeconds{}
	for name, pid := range u.pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		out[name] = time.Duration(ut+st) * time.Second / 100 // USER_HZ
	}
	return out
}

func (u *cpuUse) since() cpuSeconds {
	out := cpuSeconds{}
	for name, d := range u.now() {
		out[name] = d - u.start[name]
	}
	return out
}

// per says the CPU time used by each process, in ms per binding.
func (c cpuSeconds) per(n int) string {
	names := slices.Sorted(maps.Keys(c))
	parts := make([]string, 0, len(names))
	for _, name := range names {
		parts = append(parts, fmt.Sprintf("%s %.1f ms", name, float64(c[name].Milliseconds())/float64(n)))
	}
	return strings.Join(parts, ", ") + " per binding"
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
	// The kinds the intents controller requires: Nimbus's API and the exceptions.
	var sources []string
	for _, group := range []string{intentv1alpha1.GroupVersion.Group, securityv1alpha1.GroupVersion.Group} {
		files, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "config", "crd", "bases", group+"_*.yaml"))
		if err != nil {
			return err
		}
		sources = append(sources, files...)
	}
	if len(sources) != len(intents.Kinds) {
		return fmt.Errorf("%d CRDs in config/crd/bases for the intents controller's %d kinds", len(sources), len(intents.Kinds))
	}
	for _, src := range sources {
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

// warmWatchCaches asks once for each custom kind the intents controller watches. The API server
// starts a custom kind's watch cache at the first request for it and refuses watches (429, retried
// after a second) until it is ready. In a cluster in use something has asked already (the engines'
// own controllers watch their kinds); here nothing has, and the controller's start would wait a
// second for the kinds it does not otherwise see created.
func warmWatchCaches(ctx context.Context, c client.Client) error {
	for _, gvk := range []schema.GroupVersionKind{intent.KubeArmorPolicyKind, intent.KyvernoPolicyKind, intent.KyvernoClusterPolicyKind,
		intentv1alpha1.GroupVersion.WithKind("ClusterSecurityIntentBinding"), intentv1alpha1.GroupVersion.WithKind("ClusterNimbusPolicy"),
		securityv1alpha1.GroupVersion.WithKind("SecurityIntentException")} {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := c.List(ctx, list, client.Limit(1)); err != nil {
			return err
		}
	}
	return nil
}

const (
	// clusterNamespaces is how many namespaces the bench's ClusterSecurityIntentBinding names.
	clusterNamespaces = 500
	clusterBinding    = "cb-bench"
	// clusterNewNamespace is named by the binding but made only once the others have their
	// policies: how long a namespace that appears later waits for its own.
	clusterNewNamespace = "cb-bench-new"
	clusterIdle         = 10 * time.Second
)

// clusterBindingBench runs the intents controller in-process as the manager's ServiceAccount under
// its generated RBAC, with its flags' defaults: one ClusterSecurityIntentBinding naming 500 existing
// namespaces, with one intent (denyExternalNetworkAccess) whose only engine policy is a
// NetworkPolicy, from the binding's creation until every namespace has its NetworkPolicy; then a
// namespace the binding names appears, and the time until it has its policies; then an idle
// period that must write nothing. The floor, in the same run and as the same identity: a bare
// client making the same 1000 creates (a NimbusPolicy and its NetworkPolicy per namespace) with 16
// writers.
func clusterBindingBench(ctx context.Context, e *env) ([]result, error) {
	scheme := manager.Scheme(intentv1alpha1.AddToScheme, securityv1alpha1.AddToScheme)
	c, err := intentsCluster(ctx, e, scheme)
	if err != nil {
		return nil, err
	}
	asManager, err := managerIdentity(ctx, e, scheme)
	if err != nil {
		return nil, err
	}
	if err := c.Create(ctx, &intentv1alpha1.SecurityIntent{ObjectMeta: metav1.ObjectMeta{Name: "cb-bench-egress"},
		Spec: intentv1alpha1.SecurityIntentSpec{Intent: intentv1alpha1.Intent{ID: intent.DenyExternalNetworkAccess, Action: "Block"}}}); err != nil {
		return nil, err
	}
	var objs []client.Object
	names := make([]string, 0, clusterNamespaces+1)
	for i := range clusterNamespaces {
		names = append(names, fmt.Sprintf("cb-bench-%03d", i))
		objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: names[i]}},
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cb-floor-%03d", i)}},
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cb-floor-writes-%03d", i)}})
	}
	if err := createAll(ctx, c, objs); err != nil {
		return nil, err
	}
	names = append(names, clusterNewNamespace)

	npName := intent.ClusterPolicyNamePrefix + clusterBinding
	netpolName := intent.PolicyName(npName, intent.DenyExternalNetworkAccess)
	progress, err := watchClusterBinding(ctx, e, scheme, npName, netpolName)
	if err != nil {
		return nil, err
	}
	defer progress.stop()

	cfg, counter := testenv.Counting(asManager.cfg)
	mgr, err := newManager(cfg, ctrl.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	opts := intents.Options{} // the flags' defaults, as the operator runs
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
	if err := waitControllersIdle(ctx); err != nil {
		return nil, fmt.Errorf("the controllers at rest before the binding: %w", err)
	}
	queues := gatherQueues()
	cpu := startCPU(e)
	counter.Reset()
	began := time.Now()
	if err := c.Create(ctx, &intentv1alpha1.ClusterSecurityIntentBinding{
		ObjectMeta: metav1.ObjectMeta{Name: clusterBinding},
		Spec: intentv1alpha1.ClusterSecurityIntentBindingSpec{
			Intents: []intentv1alpha1.MatchIntent{{Name: "cb-bench-egress"}},
			Selector: intentv1alpha1.ClusterMatchWorkloads{
				NsSelector:       intentv1alpha1.NamespaceSelector{MatchNames: names},
				WorkloadSelector: intentv1alpha1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			},
		},
	}); err != nil {
		return nil, err
	}
	if err := progress.waitFor(ctx, clusterNamespaces, false); err != nil {
		return nil, err
	}
	first, last := progress.times()
	used := cpu.since()
	if err := progress.waitFor(ctx, clusterNamespaces, true); err != nil {
		return nil, err
	}
	reported := progress.lastReport()
	work := gatherQueues().since(queues)
	writes := counter.Writes()
	requests := requestSummary(counter.Log())

	// A namespace the binding names appears.
	created := time.Now()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: clusterNewNamespace}}); err != nil {
		return nil, err
	}
	if err := progress.waitFor(ctx, clusterNamespaces+1, false); err != nil {
		return nil, err
	}
	newNP, newNetpol := progress.of(clusterNewNamespace)
	if err := progress.waitFor(ctx, clusterNamespaces+1, true); err != nil {
		return nil, err
	}
	// The binding's status lists it too, before the quiet period starts.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		csib := &intentv1alpha1.ClusterSecurityIntentBinding{}
		err := c.Get(ctx, client.ObjectKey{Name: clusterBinding}, csib)
		return err == nil && csib.Status.NumberOfNimbusPolicies == clusterNamespaces+1 && isReady(csib.Status.Conditions), err
	}); err != nil {
		return nil, fmt.Errorf("the binding's status: %w", err)
	}
	// And the intents have reported on it: their last status write is part of the work, not of the
	// steady state.
	if err := waitIntentsSettled(ctx, c); err != nil {
		return nil, err
	}

	counter.Reset()
	time.Sleep(clusterIdle)
	idleWrites := counter.Writes()
	stop()

	// The floors last, with the manager stopped, as the manager's identity: the same creates, and
	// the same writes (the creates and the status the controller wrote, taken from one of its
	// NimbusPolicies).
	written := &intentv1alpha1.NimbusPolicy{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: names[0], Name: npName}, written); err != nil {
		return nil, err
	}
	floorCPU := startCPU(e)
	floor, err := clusterBindingFloor(ctx, asManager.client, "cb-floor-", nil)
	if err != nil {
		return nil, err
	}
	floorUsed := floorCPU.since()
	floorWrites, err := clusterBindingFloor(ctx, asManager.client, "cb-floor-writes-", &written.Status)
	if err != nil {
		return nil, err
	}

	took, fromFirst := last.Sub(began), last.Sub(first)
	return []result{
		{metric: fmt.Sprintf("bare client as the manager's identity, the same %d creates (a NimbusPolicy and its NetworkPolicy per namespace), 16 writers", 2*clusterNamespaces),
			value: floor.Seconds(), unit: "s", note: "CPU " + floorUsed.per(clusterNamespaces) + " (per namespace)"},
		{metric: fmt.Sprintf("a ClusterSecurityIntentBinding over %d namespaces (denyExternalNetworkAccess): seconds from its creation until every namespace's NetworkPolicy exists", clusterNamespaces),
			value: took.Seconds(), unit: "s",
			note: fmt.Sprintf("%.2fx the bare client; %.0f namespaces/s; CPU %s (per namespace)", floor.Seconds()/took.Seconds(), clusterNamespaces/took.Seconds(), used.per(clusterNamespaces))},
		{metric: "… from the first NimbusPolicy until the last NetworkPolicy", value: fromFirst.Seconds(), unit: "s",
			note: fmt.Sprintf("%.2fx the bare client (the issue's measure); the first NimbusPolicy %.0f ms after the binding", floor.Seconds()/fromFirst.Seconds(), ms(first.Sub(began)))},
		{metric: fmt.Sprintf("bare client, the same %d writes (also each NimbusPolicy's status, as the controller wrote it), 16 writers", 3*clusterNamespaces),
			value: floorWrites.Seconds(), unit: "s"},
		{metric: "… from the binding's creation until every NimbusPolicy's status says Ready (the reports, after the enforcement)", value: reported.Sub(began).Seconds(), unit: "s",
			note: fmt.Sprintf("%.2fx the bare client making the same writes", floorWrites.Seconds()/reported.Sub(began).Seconds())},
		{metric: "a new namespace the binding names: seconds until its NimbusPolicy, its NetworkPolicy", value: newNetpol.Sub(created).Seconds(), unit: "s",
			note: fmt.Sprintf("NimbusPolicy after %.0f ms, NetworkPolicy after %.0f ms", ms(newNP.Sub(created)), ms(newNetpol.Sub(created)))},
		{metric: "API writes per namespace", value: float64(writes) / clusterNamespaces, unit: "requests",
			note: "the NimbusPolicy, its NetworkPolicy, its status; reconciles: " + work.String() + "; all requests: " + requests},
		{metric: fmt.Sprintf("API writes during %s at steady state", clusterIdle), value: float64(idleWrites), unit: "requests", note: "must be 0"},
	}, nil
}

// identity is a client configuration and a client authenticated as the manager's ServiceAccount.
type identity struct {
	cfg    *rest.Config
	client client.Client
}

// managerIdentity makes the manager's ServiceAccount (quartermaster-system/quartermaster-manager)
// with its generated ClusterRoles bound (the manager's own and the intents controller's, as
// config/rbac binds them) and returns a client configuration authenticated as it: the API server's
// authorization and admission cost what they cost the operator as installed, not admin's.
func managerIdentity(ctx context.Context, e *env, scheme *runtime.Scheme) (identity, error) {
	const ns, sa = "quartermaster-system", "quartermaster-manager"
	objs := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}},
	}
	for _, role := range []string{"quartermaster-manager", "quartermaster-intents"} {
		objs = append(objs, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: role},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}},
		})
	}
	for _, obj := range objs {
		if err := e.client.Create(ctx, obj); client.IgnoreAlreadyExists(err) != nil {
			return identity{}, err
		}
	}
	if _, err := e.cluster.Kubectl(ctx, "apply", "--server-side", "-f", "config/rbac/generated/manager.yaml", "-f", "config/rbac/generated/intents.yaml"); err != nil {
		return identity{}, err
	}
	kubeconfig, _, err := e.cluster.ServiceAccountKubeconfig(ctx, ns, sa, time.Hour)
	if err != nil {
		return identity{}, err
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return identity{}, err
	}
	cfg.QPS = -1 // as the manager's client: no client-side rate limit (the server's APF applies)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return identity{}, err
	}
	// The API server's RBAC authorizer sees new bindings a moment later.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		err := c.List(ctx, &intentv1alpha1.NimbusPolicyList{}, client.Limit(1))
		return err == nil, client.IgnoreNotFound(ignoreForbidden(err))
	})
	return identity{cfg: cfg, client: c}, err
}

func ignoreForbidden(err error) error {
	if apierrors.IsForbidden(err) {
		return nil
	}
	return err
}

// clusterProgress follows the bench's cluster binding through a watch: when each namespace got its
// NimbusPolicy and its NetworkPolicy.
type clusterProgress struct {
	cancel context.CancelFunc
	done   chan error

	mu       sync.Mutex
	np       map[string]time.Time // by namespace
	netpol   map[string]time.Time
	reported map[string]time.Time // when the NimbusPolicy's status first said Ready
	grew     chan struct{}        // closed and replaced at each change of the above
}

func watchClusterBinding(ctx context.Context, e *env, scheme *runtime.Scheme, npName, netpolName string) (*clusterProgress, error) {
	ca, err := cache.New(e.cluster.Config, cache.Options{Scheme: scheme, DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		return nil, err
	}
	p := &clusterProgress{np: map[string]time.Time{}, netpol: map[string]time.Time{}, reported: map[string]time.Time{}, grew: make(chan struct{})}
	for obj, name := range map[client.Object]string{&intentv1alpha1.NimbusPolicy{}: npName, &networkingv1.NetworkPolicy{}: netpolName} {
		inf, err := ca.GetInformer(ctx, obj)
		if err != nil {
			return nil, err
		}
		see := func(o any) {
			if m, ok := o.(metav1.Object); ok && m.GetName() == name && strings.HasPrefix(m.GetNamespace(), "cb-bench-") {
				p.see(o, m.GetNamespace())
			}
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: see, UpdateFunc: func(_, o any) { see(o) }}); err != nil {
			return nil, err
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	p.cancel, p.done = cancel, make(chan error, 1)
	go func() { p.done <- ca.Start(cctx) }()
	if !ca.WaitForCacheSync(cctx) {
		p.stop()
		return nil, errors.New("the bench's NimbusPolicy and NetworkPolicy watches did not sync")
	}
	return p, nil
}

func (p *clusterProgress) see(obj any, ns string) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := p.netpol
	if np, ok := obj.(*intentv1alpha1.NimbusPolicy); ok {
		seen = p.np
		if _, ok := p.reported[ns]; !ok && meta.IsStatusConditionTrue(np.Status.Conditions, "Ready") {
			p.reported[ns] = now
			close(p.grew)
			p.grew = make(chan struct{})
		}
	}
	if _, ok := seen[ns]; ok {
		return
	}
	seen[ns] = now
	close(p.grew)
	p.grew = make(chan struct{})
}

// waitFor returns once n namespaces have their NetworkPolicy (settled: and their NimbusPolicy's
// status says Ready).
func (p *clusterProgress) waitFor(ctx context.Context, n int, settled bool) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for {
		p.mu.Lock()
		have, nps, ready, grew := len(p.netpol), len(p.np), len(p.reported), p.grew
		p.mu.Unlock()
		if have >= n && (!settled || ready >= n) {
			return nil
		}
		select {
		case <-grew:
		case <-ctx.Done():
			return fmt.Errorf("%d namespaces have their NimbusPolicy, %d their NetworkPolicy, %d Ready, want %d: %w", nps, have, ready, n, ctx.Err())
		}
	}
}

// times are when the first NimbusPolicy and the last NetworkPolicy appeared.
func (p *clusterProgress) times() (first, last time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return earliest(p.np), latest(p.netpol)
}

// lastReport is when the last NimbusPolicy's status said Generated.
func (p *clusterProgress) lastReport() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return latest(p.reported)
}

func earliest(times map[string]time.Time) (first time.Time) {
	for _, t := range times {
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	return first
}

func latest(times map[string]time.Time) (last time.Time) {
	for _, t := range times {
		if t.After(last) {
			last = t
		}
	}
	return last
}

// of is when the namespace got its NimbusPolicy and its NetworkPolicy.
func (p *clusterProgress) of(ns string) (np, netpol time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.np[ns], p.netpol[ns]
}

func (p *clusterProgress) stop() {
	p.cancel()
	if err := <-p.done; err != nil {
		fmt.Fprintln(os.Stderr, "bench: cluster binding watch:", err)
	}
}

// clusterBindingFloor creates, with a bare client and 16 writers, exactly the objects the controller
// makes for the bench's cluster binding (a NimbusPolicy and its NetworkPolicy in each namespace, as
// the catalogue builds them), in namespaces of their own (prefix and a number), and returns how long
// that took. With st, it also writes st as each NimbusPolicy's status, after its NetworkPolicy.
func clusterBindingFloor(ctx context.Context, c client.Client, prefix string, st *intentv1alpha1.NimbusPolicyStatus) (time.Duration, error) {
	nodes, err := podCIDRs(ctx, c)
	if err != nil {
		return 0, err
	}
	rules := []intentv1alpha1.NimbusRules{{ID: intent.DenyExternalNetworkAccess, Rule: intentv1alpha1.Rule{RuleAction: "Block"}}}
	start := time.Now()
	err = parallel(16, clusterNamespaces, func(i int) error {
		np := &intentv1alpha1.NimbusPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("%s%03d", prefix, i), Name: intent.ClusterPolicyNamePrefix + clusterBinding},
			Spec:       intentv1alpha1.NimbusPolicySpec{Selector: intentv1alpha1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, NimbusRules: rules},
		}
		if err := c.Create(ctx, np); err != nil {
			return err
		}
		for _, p := range intent.ForNimbusPolicy(np, intent.Inputs{PodCIDRs: nodes}) {
			if err := c.Create(ctx, p.Object); err != nil {
				return err
			}
		}
		if st == nil {
			return nil
		}
		// As the controller writes it (status.Step: a merge patch, the RBAC it runs under has no update).
		created := np.DeepCopy()
		st.DeepCopyInto(&np.Status)
		return c.Status().Patch(ctx, np, client.MergeFrom(created))
	})
	return time.Since(start), err
}

// isReady reports a Ready=True condition.
func isReady(conds []metav1.Condition) bool {
	return meta.IsStatusConditionTrue(conds, "Ready")
}

// settled reports a Ready condition for the object's generation that is no longer waiting for
// what the object made to report.
func settled(conds []metav1.Condition, generation int64) bool {
	c := meta.FindStatusCondition(conds, "Ready")
	return c != nil && c.ObservedGeneration == generation && c.Reason != status.WaitingFor
}

// intentsCoalesce is longer than the controller's window (a second) in which the readiness changes
// of an intent's bindings make one reconcile of the intent.
const intentsCoalesce = 2 * time.Second

// waitIntentsSettled waits until every binding has reported on what it made (settled), and then
// every SecurityIntent has too and its status has not changed for intentsCoalesce: its last
// reconcile follows its bindings' last change by up to the controller's coalescing window.
func waitIntentsSettled(ctx context.Context, c client.Client) error {
	versions := map[string]string{} // intent name → resourceVersion
	since := time.Now()
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		sis, sibs := &intentv1alpha1.SecurityIntentList{}, &intentv1alpha1.SecurityIntentBindingList{}
		if err := c.List(ctx, sibs); err != nil {
			return false, err
		}
		for _, b := range sibs.Items {
			if !settled(b.Status.Conditions, b.Generation) {
				return false, nil
			}
		}
		if err := c.List(ctx, sis); err != nil {
			return false, err
		}
		ok := true
		for _, si := range sis.Items {
			if !settled(si.Status.Conditions, si.Generation) || versions[si.Name] != si.ResourceVersion {
				versions[si.Name], since, ok = si.ResourceVersion, time.Now(), false
			}
		}
		return ok && time.Since(since) >= intentsCoalesce, nil
	})
	if err != nil {
		return fmt.Errorf("every intent and binding settled: %w", err)
	}
	return nil
}

// intentsCluster prepares the cluster for an intents case (the intent and engine CRDs, the API
// server's watch caches warm) and returns an admin client of it.
func intentsCluster(ctx context.Context, e *env, scheme *runtime.Scheme) (client.Client, error) {
	c, err := client.New(e.cluster.Config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	if err := installIntentCRDs(ctx, e); err != nil {
		return nil, err
	}
	if err := warmWatchCaches(ctx, c); err != nil {
		return nil, err
	}
	return c, nil
}
