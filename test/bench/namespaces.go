package main

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	ctrl "sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/quartermaster-dev/quartermaster/internal/controller/namespaces"
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
	mgr, err := newManager(cfg, ctrl.Options{Scheme: e.client.Scheme(), Cache: cache.Options{ByObject: reg.CacheByObject()}})
	if err != nil {
		return nil, err
	}
	if err := reg.Setup(mgr); err != nil {
		return nil, err
	}
	stop, err := startManager(ctx, mgr, "namespaces")
	if err != nil {
		return nil, err
	}
	defer stop()
	counter.Reset()

	start := time.Now()
	if err := submitRequests(ctx, e, requestsNS, benchRequests); err != nil {
		return nil, err
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 15*time.Minute, true, func(ctx context.Context) (bool, error) {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("SecretList"))
		if err := e.client.List(ctx, list, client.InNamespace(requestsNS), client.MatchingLabels{nsrequest.LabelManagedBy: nsrequest.ManagedByValue}); err != nil {
			return false, err
		}
		return len(list.Items) >= benchRequests, nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for %d Secrets: %w", benchRequests, err)
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
		{metric: fmt.Sprintf("%d requests at once: seconds until every Secret exists", benchRequests), value: served.Seconds(), unit: "s"},
		{metric: "requests served per second", value: benchRequests / served.Seconds(), unit: "requests/s"},
		{metric: "API requests per namespace (reads + writes)", value: perNamespace, unit: "requests"},
		{metric: "API writes per namespace", value: writesPerNamespace, unit: "requests"},
		{metric: "bare client, same writes, 16 writers", value: bare.Seconds(), unit: "s",
			note: fmt.Sprintf("controller/bare time ratio %.2f", served.Seconds()/bare.Seconds())},
		{metric: fmt.Sprintf("steady state with %d namespaces", benchRequests), value: steady, unit: "API requests/min",
			note: "watches only; token refreshes come at 70-75% of --token-ttl"},
	}, nil
}

func submitRequests(ctx context.Context, e *env, requestsNS string, n int) error {
	return parallel(16, n, func(i int) error {
		return e.client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: requestsNS, Name: fmt.Sprintf("bench-ns-%04d", i)}})
	})
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
		for _, obj := range nsrequest.NamespaceObjects("bare", name, defaults) {
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
