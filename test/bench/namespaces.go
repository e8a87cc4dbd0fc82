package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/quartermaster-dev/quartermaster/internal/controller/namespaces"
	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

const benchRequests = 1000

// namespacesBench submits 1000 requests at once to the namespaces controller running in-process
// (its API requests counted), and compares with a bare client doing the same writes.
func namespacesBench(ctx context.Context, e *env) ([]result, error) {
	const requestsNS = "bench-requests"
	if err := e.client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: requestsNS}}); err != nil {
		return nil, err
	}

	bare, err := bareNamespaceWrites(ctx, e, requestsNS, benchRequests, 16)
	if err != nil {
		return nil, fmt.Errorf("bare client: %w", err)
	}

	cfg, counter := testenv.Counting(e.cluster.Config)
	reg := namespaces.Controller()
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	reg.AddFlags(fs)
	if err := fs.Parse([]string{"--requests-namespace=" + requestsNS, "--namespace-defaults=" + defaultsFile()}); err != nil {
		return nil, err
	}
	if err := reg.Configured(); err != nil {
		return nil, err
	}
	// The cache as the manager binary builds it.
	cacheOpts, _ := manager.CacheOptions([]controllers.Controller{reg})
	mgr, err := newManager(cfg, ctrl.Options{Scheme: e.client.Scheme(), Cache: cacheOpts})
	if err != nil {
		return nil, err
	}
	if err := reg.Setup(mgr, nil); err != nil {
		return nil, err
	}
	stop, err := startManager(ctx, mgr, "namespaces")
	if err != nil {
		return nil, err
	}
	defer stop()
	counter.Reset()

	start := time.Now()
	if err := submitRequests(ctx, e, requestsNS, "bench-ns", benchRequests); err != nil {
		return nil, err
	}
	if err := waitServed(ctx, e, requestsNS, benchRequests); err != nil {
		return nil, err
	}
	served := time.Since(start)
	// Let the last status patches land before counting.
	time.Sleep(2 * time.Second)
	perNamespace := float64(counter.Total()) / benchRequests
	writesPerNamespace := float64(counter.Writes()) / benchRequests

	counter.Reset()
	const window = 60 * time.Second
	time.Sleep(window)
	steady := float64(counter.Total()) / window.Minutes()

	return []result{
		{metric: fmt.Sprintf("%d requests at once: seconds until every request is Ready", benchRequests), value: served.Seconds(), unit: "s"},
		{metric: "requests served per second", value: benchRequests / served.Seconds(), unit: "requests/s"},
		{metric: "API requests per namespace (reads + writes)", value: perNamespace, unit: "requests"},
		{metric: "API writes per namespace", value: writesPerNamespace, unit: "requests"},
		{metric: "bare client, same writes, 16 writers", value: bare.Seconds(), unit: "s",
			note: fmt.Sprintf("controller/bare time ratio %.2f: %.2f× the floor's throughput", served.Seconds()/bare.Seconds(), bare.Seconds()/served.Seconds())},
		{metric: fmt.Sprintf("steady state with %d namespaces", benchRequests), value: steady, unit: "API requests/min",
			note: "watches only; token refreshes come at 70-75% of --token-ttl"},
	}, nil
}

func submitRequests(ctx context.Context, e *env, requestsNS, prefix string, n int) error {
	return parallel(16, n, func(i int) error {
		return e.client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: requestsNS, Name: fmt.Sprintf("%s-%04d", prefix, i)}})
	})
}

// waitServed waits until n requests of requestsNS are Ready (their status annotation).
func waitServed(ctx context.Context, e *env, requestsNS string, n int) error {
	ready := 0
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 15*time.Minute, true, func(ctx context.Context) (bool, error) {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMapList"))
		if err := e.client.List(ctx, list, client.InNamespace(requestsNS)); err != nil {
			return false, err
		}
		ready = 0
		for _, cm := range list.Items {
			// (The bare client's ConfigMaps carry the ignore label and a Ready status of its own.)
			if cm.Labels[nsrequest.LabelIgnore] != "true" && cm.Annotations[nsrequest.AnnotationStatus] == string(nsrequest.StatusReady) {
				ready++
			}
		}
		return ready >= n, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %d requests to be Ready (%d are): %w", n, ready, err)
	}
	return nil
}

// namespacesProcessBench runs the manager binary as its own process: the latency of single
// requests on an otherwise idle cluster, and its memory before and after serving requests.
func namespacesProcessBench(ctx context.Context, e *env) ([]result, error) {
	const requestsNS = "bench-requests-process"
	if err := e.client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: requestsNS}}); err != nil {
		return nil, err
	}
	p, err := startProcess(e, "--controllers=namespaces", "--requests-namespace="+requestsNS, "--namespace-defaults="+defaultsFile())
	if err != nil {
		return nil, err
	}
	defer func() { _ = p.stop() }() // the case's own stop reports an error; this one only cleans up
	cs, err := kubernetes.NewForConfig(e.cluster.Config)
	if err != nil {
		return nil, err
	}
	// The first request also waits for the manager to start; it is not counted.
	if _, err := requestAndWaitForSecret(ctx, e, cs, requestsNS, "bench-warmup", 2*time.Minute); err != nil {
		return nil, err
	}
	rssIdle, err := p.rssMiB()
	splitIdle := p.rssSplit()
	if err != nil {
		return nil, err
	}

	const single = 50
	latencies := make([]time.Duration, 0, single)
	for i := range single {
		d, err := requestAndWaitForSecret(ctx, e, cs, requestsNS, fmt.Sprintf("bench-single-%02d", i), time.Minute)
		if err != nil {
			return nil, err
		}
		latencies = append(latencies, d)
	}
	slices.Sort(latencies)
	percentile := func(q float64) time.Duration { return latencies[int(math.Ceil(q*float64(len(latencies))))-1] }

	// Two rounds of benchRequests at once; the RSS after each.
	served := []int{1 + single + benchRequests, 1 + single + 2*benchRequests}
	var rss, cpu [2]float64
	var split [2]string
	for i, round := range []string{"bench-a", "bench-b"} {
		cpuBefore, err := p.cpuSeconds()
		if err != nil {
			return nil, err
		}
		profiled := p.startCPUProfile(fmt.Sprintf("namespaces-%s.cpu", round), 20*time.Second)
		if err := submitRequests(ctx, e, requestsNS, round, benchRequests); err != nil {
			return nil, err
		}
		if err := waitServed(ctx, e, requestsNS, served[i]); err != nil {
			return nil, err
		}
		cpuAfter, err := p.cpuSeconds()
		if err != nil {
			return nil, err
		}
		if err := profiled(); err != nil { // after the CPU time is read: the profile's idle tail is not counted
			return nil, err
		}
		cpu[i] = cpuAfter - cpuBefore
		if rss[i], err = p.rssMiB(); err != nil {
			return nil, err
		}
		split[i] = p.rssSplit()
		if err := p.saveHeapProfile(fmt.Sprintf("namespaces-%d-requests.heap", served[i])); err != nil {
			return nil, err
		}
	}
	if err := p.stop(); err != nil {
		return nil, err
	}
	return []result{
		{metric: fmt.Sprintf("one request at a time (%d): ConfigMap created → Secret exists, p50", single), value: ms(percentile(0.5)), unit: "ms", note: "target ≤ 300 ms"},
		{metric: "the same, p99", value: ms(percentile(0.99)), unit: "ms", note: "target ≤ 1000 ms"},
		{metric: "manager RSS, started and 1 request served", value: rssIdle, unit: "MiB", note: splitIdle},
		{metric: fmt.Sprintf("manager RSS, %d requests served", served[0]), value: rss[0], unit: "MiB", note: "target ≤ 60 MB (57.2 MiB) at 1000; " + split[0]},
		{metric: fmt.Sprintf("manager RSS, %d requests served", served[1]), value: rss[1], unit: "MiB",
			note: fmt.Sprintf("growth %.1f MiB per 1000 (target ≤ 25 MB, 23.8 MiB); %s", rss[1]-rss[0], split[1])},
		{metric: fmt.Sprintf("manager CPU time serving %d requests submitted at once", benchRequests), value: (cpu[0] + cpu[1]) / 2, unit: "s",
			note: fmt.Sprintf("mean of the two rounds (%.2f, %.2f); user and system", cpu[0], cpu[1])},
	}, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// requestAndWaitForSecret creates the request name and returns how long its Secret took to appear,
// as a pipeline waiting on a watch sees it.
func requestAndWaitForSecret(ctx context.Context, e *env, cs kubernetes.Interface, requestsNS, name string, timeout time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	w, err := cs.CoreV1().Secrets(requestsNS).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		return 0, err
	}
	defer w.Stop()
	start := time.Now()
	if err := e.client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: requestsNS, Name: name}}); err != nil {
		return 0, err
	}
	for ev := range w.ResultChan() {
		if ev.Type == watch.Added || ev.Type == watch.Modified {
			return time.Since(start), nil
		}
	}
	return 0, fmt.Errorf("request %s: no Secret within %s", name, timeout)
}

// bareNamespaceWrites performs, with a plain client and no reads, the writes the controller makes
// for a request: namespace, ServiceAccount, RBAC, defaults, token, Secret, and the request's status
// patch. Its time is the floor for the controller's.
func bareNamespaceWrites(ctx context.Context, e *env, requestsNS string, n, writers int) (time.Duration, error) {
	defaults, err := nsrequest.LoadDefaults(defaultsFile())
	if err != nil {
		return 0, err
	}
	if err := parallel(writers, n, func(i int) error {
		return e.client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: requestsNS, Name: fmt.Sprintf("bare-%04d", i), Labels: map[string]string{nsrequest.LabelIgnore: "true"}}})
	}); err != nil {
		return 0, err
	}
	start := time.Now()
	err = parallel(writers, n, func(i int) error {
		name := fmt.Sprintf("bare-%04d", i)
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if err := e.client.Create(ctx, ns); err != nil {
			return err
		}
		var sa *corev1.ServiceAccount
		for _, obj := range nsrequest.NamespaceObjects("bare", name, &defaults.Profile) {
			obj.SetLabels(nil) // not the controller's
			if err := e.client.Create(ctx, obj); err != nil {
				return err
			}
			if s, ok := obj.(*corev1.ServiceAccount); ok {
				sa = s
			}
		}
		tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(86400))}}
		if err := e.client.SubResource("token").Create(ctx, sa, tr); err != nil {
			return err
		}
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: requestsNS, Name: name},
			Data: map[string][]byte{"token": []byte(tr.Status.Token)}}
		if err := controllerutil.SetOwnerReference(ns, secret, e.client.Scheme()); err != nil {
			return err
		}
		if err := e.client.Create(ctx, secret); err != nil {
			return err
		}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: requestsNS, Name: name}}
		patch := []byte(`{"metadata":{"annotations":{"quartermaster.dev/status":"Ready"}}}`)
		return e.client.Patch(ctx, cm, client.RawPatch("application/merge-patch+json", patch))
	})
	return time.Since(start), err
}

func defaultsFile() string {
	return filepath.Join(testenv.RepoRoot(), "config", "manager", "namespace-defaults.yaml")
}

// parallel runs f(0..n-1) on the given number of goroutines and returns the first error.
func parallel(workers, n int, f func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}
